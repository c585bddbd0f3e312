"""What a benchmark saw of its host, for the line under each table: the machine, and what else ran.

These machines are shared and small (2 cores): a CI run or a build beside a benchmark moves its
figures. A fixed "shared machine" remark says nothing; the watch records what was observed instead:
the 1-minute load average and the processes outside this benchmark that used a sizeable share of a
core, sampled every few seconds on a daemon thread for the whole command (``coldstart bench ...``
starts it). The benchmark's own children, and containers (whose processes docker, not we, parents:
on this node they are the benchmark's), are not "other".
"""
from __future__ import annotations

import os
import socket
import statistics
import threading
from dataclasses import dataclass, field

MIN_CORES = 0.3  # a process using at least this share of one core over a sample is "heavy"
EVERY_S = 3.0


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

    def describe(self) -> str:
        """'load average (1 min) median 1.9, max 2.4; other heavy processes seen: ...' (or 'none')."""
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


def watch() -> HostWatch:
    """The process's watch, started on first use (the bench command group starts it)."""
    global _active
    if _active is None:
        _active = HostWatch().start()
    return _active


def line(*parts: str) -> str:
    """The host line of a benchmark table: CPU, cores, kernel, host name, ``parts``, and what the
    watch observed; CPU-measured (the GPU kit writes its own)."""
    from coldstart.pipeline import hostfacts

    h = hostfacts.collect()
    head = f"Host: {h.cpu_model}, {os.cpu_count()} cores, kernel {h.kernel} ({socket.gethostname()})"
    extra = "".join(f"; {p}" for p in parts if p)
    seen = watch().describe()
    return f"{head}{extra}. {seen[:1].upper()}{seen[1:]}. CPU-measured; unverified on GPU."
