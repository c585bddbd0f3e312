"""What a benchmark saw of its host, for the line under each table: the machine, and what else ran.

These machines are shared and small (2 cores): a CI run or a build beside a benchmark moves its
figures. A fixed "shared machine" remark says nothing; the watch records what was observed instead:
the 1-minute load average and the processes outside this benchmark that used a sizeable share of a
core, sampled every few seconds on a daemon thread for the whole command (``coldstart bench ...``
starts it). The benchmark's own children, and containers (whose processes docker, not we, parents:
on this node they are the benchmark's), are not "other".

On a VM whose balloon device reports free pages (virtio-balloon free page reporting), the memory a
dropped page cache frees goes back to the hypervisor, and the next process to touch it there pays
for it being backed again: measured on the Zen 5 VM (results/spot-checks/page-reporting), a cold
bench restore's canary took 0.56 s (median; up to 1.3) instead of 0.23. The watch records how much the
guest reported during the run, and ``memory_kept`` turns the reporting off for a run.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path

MIN_CORES = 0.3  # a process using at least this share of one core over a sample is "heavy"
EVERY_S = 3.0
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")
REPORTING_OFF_ORDER = 11  # above x86-64's largest buddy order (10): no free block is ever that large


def page_reporting() -> dict | None:
    """The guest kernel's free page reporting: the order of the free blocks it reports and the KiB
    reported since boot. None where the kernel has none (not a VM, or no balloon driver)."""
    try:
        return {"order": int((PAGE_REPORTING / "page_reporting_order").read_text()),
                "reported_kib": int((PAGE_REPORTING / "reported_kib").read_text())}
    except (OSError, ValueError):
        return None


def _touch_free_memory(margin: int) -> int:
    """Write every page of all but ``margin`` bytes of the available memory once, in a child process
    that then exits: the hypervisor backs those pages again, and the guest, reporting off, keeps
    them. Returns the bytes touched."""
    import subprocess
    import sys

    import psutil

    n = max(0, psutil.virtual_memory().available - margin)
    if n:
        subprocess.run([sys.executable, "-c", "import mmap, sys\n"
                        "n = int(sys.argv[1]); m = mmap.mmap(-1, n)\n"
                        "for off in range(0, n, 1 << 26):\n"
                        "    m[off:off + min(1 << 26, n - off)] = b'\\1' * min(1 << 26, n - off)\n", str(n)],
                       check=True)
    return n


KEEP_MEMORY_HELP = ("on a VM whose balloon reports free pages: turn the reporting off for the run and touch the "
                    "free memory once first, so that a dropped page cache is not also memory the hypervisor must "
                    "back again (the setting is put back at the end; the table says which it was)")


def kept_if(keep: bool, say=print):
    """``memory_kept`` when a benchmark's --keep-memory asks for it, else nothing."""
    return memory_kept(say=say) if keep else contextlib.nullcontext()


@contextlib.contextmanager
def memory_kept(margin: int = 2 << 30, say=print):
    """Within: the guest keeps the memory it frees (free page reporting off, its order set above the
    largest) and its free memory has been touched once, so that a dropped page cache is a cold
    cache and not also memory the hypervisor must back again. The order is put back on exit. A
    host without page reporting: nothing to do."""
    before = page_reporting()
    if before is None:
        say("memory kept: this kernel reports no free pages (nothing to turn off)")
        yield None
        return
    order = PAGE_REPORTING / "page_reporting_order"
    try:
        order.write_text(f"{REPORTING_OFF_ORDER}\n")
    except OSError as e:
        from coldstart.errors import ColdstartError

        raise ColdstartError(f"cannot turn free page reporting off ({order}: {e.strerror}): needs root") from None
    try:
        say(f"memory kept: free page reporting off until the run ends (a killed run leaves it off: "
            f"`echo {before['order']} > {order}` puts it back); touching the free memory once (about a second "
            "per GiB on a VM that had handed it back)")
        touched = _touch_free_memory(margin)
        say(f"memory kept: {touched / 2**30:.1f} GiB touched")
        watch().memory_kept = True
        yield {"order_was": before["order"], "touched_bytes": touched}
    finally:
        now = page_reporting()
        if now is not None:  # what the guest reported while it was off (none expected: no block is that large)
            watch().kept_kib += now["reported_kib"] - before["reported_kib"]
        order.write_text(f"{before['order']}\n")


def _in_container(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return "docker" in text or "containerd" in text


@dataclass
class HostWatch:
    every: float = EVERY_S
    min_cores: float = MIN_CORES
    loads: list[float] = field(default_factory=list)
    heavy: dict[str, float] = field(default_factory=dict)  # "name (pid)" -> the most cores seen
    samples: int = 0
    reporting0: dict | None = field(default_factory=page_reporting)  # when the watch started
    memory_kept: bool = False  # memory_kept() turned the reporting off for (part of) the run
    kept_kib: int = 0  # KiB reported while memory_kept() had it off

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> "HostWatch":
        self._t = threading.Thread(target=self._run, name="coldstart-host-watch", daemon=True)
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join(self.every + 1)

    def _ours(self) -> set[int]:
        import psutil

        me = psutil.Process()
        try:
            return {me.pid, *(p.pid for p in me.children(recursive=True))}
        except psutil.Error:
            return {me.pid}

    def _run(self) -> None:
        import psutil

        procs: dict[int, psutil.Process] = {}
        while True:
            self.loads.append(os.getloadavg()[0])
            ours = self._ours()
            seen = set()
            for p in psutil.process_iter(["name"]):
                seen.add(p.pid)
                if p.pid in ours:
                    continue
                q = procs.setdefault(p.pid, p)
                try:
                    cores = q.cpu_percent(None) / 100.0  # since the last sample (0.0 the first time)
                except psutil.Error:
                    continue
                if cores >= self.min_cores and not _in_container(p.pid):
                    key = f"{p.info.get('name') or '?'} ({p.pid})"
                    self.heavy[key] = max(self.heavy.get(key, 0.0), cores)
            for pid in set(procs) - seen:
                del procs[pid]
            self.samples += 1
            if self._stop.wait(self.every):
                return

    def reporting(self) -> str:
        """What the guest's free page reporting did over the run ("" where there is none)."""
        now = page_reporting()
        if now is None or self.reporting0 is None:
            return ""
        gib = (now["reported_kib"] - self.reporting0["reported_kib"]) / 2**20
        if self.memory_kept:  # the run's setup (image builds, checkpoints) ran with the reporting on
            kept = self.kept_kib / 2**20
            return ("; the VM's free page reporting turned off for the measurements, free memory touched first "
                    f"(--keep-memory): {kept:.1f} GiB handed back to the hypervisor while it was off, "
                    f"{gib - kept:.1f} GiB before or after (with the reporting on)")
        state = "off" if now["order"] >= REPORTING_OFF_ORDER else f"on (order {now['order']})"
        return f"; the VM's free page reporting {state}: {gib:.1f} GiB handed back to the hypervisor during the run"

    def describe(self) -> str:
        """'load average (1 min) median 1.9, max 2.4; other heavy processes seen: ...' (or 'none'),
        and what the guest's free page reporting handed back."""
        return self._load() + self.reporting()

    def _load(self) -> str:
        if not self.loads:
            la = os.getloadavg()
            return f"load average at the end {la[0]:.1f}/{la[1]:.1f}/{la[2]:.1f}"
        out = (f"load average (1 min) over the run: median {statistics.median(self.loads):.1f}, "
               f"max {max(self.loads):.1f}; ")
        if not self.heavy:
            return out + f"other processes using ≥ {self.min_cores:.1f} of a core: none seen ({self.samples} samples)"
        top = sorted(self.heavy.items(), key=lambda kv: -kv[1])[:6]
        return (out + f"other processes seen using ≥ {self.min_cores:.1f} of a core ({self.samples} samples): "
                + ", ".join(f"{k} up to {v:.1f}" for k, v in top))


_active: HostWatch | None = None


def _sigterm(signum, frame) -> None:
    raise KeyboardInterrupt()


def unwind_on_sigterm() -> None:
    """A benchmark killed with SIGTERM unwinds as on ^C: its ``finally`` blocks stop the servers it
    started and remove its staging dirs (with the default action, a `bench reload` killed so left its
    vLLM server running, holding a core and GiBs of memory)."""
    signal.signal(signal.SIGTERM, _sigterm)


def watch() -> HostWatch:
    """The process's watch, started on first use (the bench command group starts it)."""
    global _active
    if _active is None:
        _active = HostWatch().start()
    return _active


def cpu_kind(cpuinfo: str | None = None) -> str:
    """The CPU's family and model and its widest matrix or vector unit, e.g. "family 25 model 17,
    AVX-512 BF16": the hosts change between sessions and share one model name ("AMD EPYC"), and
    these decide the kernels vLLM runs and so which figures compare."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    first = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.split("\n\n")[0].splitlines())}
    flags = set(first.get("flags", "").split())
    unit = next((name for flag, name in (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"),
                                         ("avx2", "AVX2")) if flag in flags), "")
    fam = f"family {first['cpu family']} model {first['model']}" if "cpu family" in first and "model" in first else ""
    return ", ".join(x for x in (fam, unit) if x)


def disk_queue(path: str = "/var/tmp") -> str:
    """The block queue of the disk under the benchmarks' scratch dirs, e.g. "disk vda: max_sectors_kb 512,
    read_ahead_kb 8192": both decide how fast the page cache fills (coldstart weights tune-queue)."""
    from coldstart.errors import ColdstartError
    from coldstart.weights import queue

    try:
        q = queue.settings(queue.queue_dir(path))
        return f"disk {q['device']}: max_sectors_kb {q['max_sectors_kb']}, read_ahead_kb {q['read_ahead_kb']}"
    except (OSError, ValueError, ColdstartError):
        return ""


def line(*parts: str) -> str:
    """The host line of a benchmark table: CPU (its kind: cpu_kind), cores, kernel, host name, ``parts``,
    and what the watch observed; CPU-measured (the GPU kit writes its own)."""
    from coldstart.pipeline import hostfacts

    h = hostfacts.collect()
    kind = cpu_kind()
    head = (f"Host: {h.cpu_model}{f' ({kind})' if kind else ''}, {os.cpu_count()} cores, kernel {h.kernel} "
            f"({socket.gethostname()})")
    extra = "".join(f"; {p}" for p in (*parts, disk_queue()) if p)
    seen = watch().describe()
    return f"{head}{extra}. {seen[:1].upper()}{seen[1:]}. CPU-measured; unverified on GPU."
