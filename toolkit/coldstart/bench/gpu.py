"""The GPU benchmarks of the kit, each beside the limit measured in the same run (docs/gpu.md).

* ``loader``: our loader into preallocated CUDA tensors, cold and warm page cache, against the
  pinned host-to-device copy bandwidth and the file's read bandwidth (the two limits it cannot
  beat), and against safetensors' own load to CUDA (the reference users have today).
* ``cuda_checkpoint``: the driver's checkpoint API on a process holding 1, 4, 16 GiB of device
  memory: seconds per step (lock, checkpoint, restore, unlock), device memory released, contents
  verified after restore.
* ``criu_cuda``: that process checkpointed by the driver, dumped and restored by our patched CRIU,
  resumed on the GPU and verified; once with our own driver calls around CRIU, once through
  CRIU's CUDA plugin (which runs a ``cuda-checkpoint`` command: ours, ``coldstart.engine.cuda_checkpoint``).

Every function returns records (dicts) for results.jsonl; a failure is a record with ``error``.
"""
from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

GiB = 1 << 30
MiB = 1 << 20
Say = Callable[[str], None]
TOOLKIT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# page cache


def warm_file(path: Path, block: int = 64 * MiB) -> None:
    buf = bytearray(block)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass


def resident(path: Path) -> float:
    from coldstart.warm.residency import sampled_resident_fraction

    try:
        return round(sampled_resident_fraction(path), 4)
    except Exception:  # noqa: BLE001
        return -1.0


def _cache(path: Path, cache: str) -> float:
    """Put ``path`` in the asked page-cache state; returns the sampled resident fraction."""
    if cache == "cold":
        from coldstart.warm.residency import drop_caches

        drop_caches()
    else:
        warm_file(path)
    return resident(path)


# ------------------------------------------------------------------------------------------------
# limits


def h2d_bandwidth(total: int = 4 * GiB, buf: int = 256 * MiB, reps: int = 3) -> dict[str, Any]:
    """Pinned host -> device copy bandwidth (GiB/s), best of ``reps`` runs of ``total`` bytes."""
    import torch

    src = torch.empty(buf, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(buf, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    best = 0.0
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            for _ in range(total // buf):
                dst.copy_(src, non_blocking=True)
        stream.synchronize()
        best = max(best, total / (time.perf_counter() - t0) / GiB)
    return {"h2d_gib_s": round(best, 3), "bytes": total, "buffer": buf}


def file_read_bandwidth(path: Path, *, threads: int, cache: str, o_direct: bool, piece: int = 16 * MiB,
                        step: int = 1 * MiB) -> dict[str, Any]:
    """Read the whole file with ``threads`` threads, each its own contiguous range, into reused
    page-aligned buffers (no destination: the file's own read bandwidth)."""
    size = path.stat().st_size
    res = _cache(path, cache)
    per = -(-size // threads)
    per = -(-per // 4096) * 4096
    errs: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if o_direct else 0))
            try:
                m = mmap.mmap(-1, piece)
                mv = memoryview(m)
                off, end = i * per, min(size, (i + 1) * per)
                while off < end:
                    n = min(piece, end - off)
                    want = -(-n // 4096) * 4096 if o_direct else n
                    done = 0
                    while done < n:
                        k = min(step, want - done) if o_direct else min(step, n - done)
                        got = os.preadv(fd, [mv[done:done + k]], off + done)
                        if got <= 0:
                            break
                        done += got
                    off += n
            finally:
                os.close(fd)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    secs = time.perf_counter() - t0
    if errs:
        raise errs[0]
    return {"gib_s": round(size / secs / GiB, 3), "seconds": round(secs, 4), "resident_before": res,
            "o_direct": o_direct, "threads": threads}


# ------------------------------------------------------------------------------------------------
# loader


def make_data(work: Path, gib: float, say: Say, device: str = "cuda") -> dict[str, Any]:
    """A model-shaped set of tensors (bf16 matrices of 16-256 MiB, small fp32 vectors) written as our
    flat dump and as one safetensors file; a copy on ``device`` is kept as the reference for
    bit-exact checks."""
    import torch
    from safetensors.torch import save_file

    from coldstart.weights.dump import dump_tensors

    total = int(gib * GiB)
    sizes = [256 * MiB, 128 * MiB, 64 * MiB, 16 * MiB]
    named: dict[str, Any] = {}
    i = done = 0
    g = torch.Generator(device=device).manual_seed(0)
    while done < total:
        nb = min(sizes[i % len(sizes)], total - done)
        rows = max(1, nb // 2 // 4096)
        t = torch.randint(-32768, 32767, (rows, 4096), dtype=torch.int16, device=device, generator=g).view(torch.bfloat16)
        named[f"layers.{i}.weight"] = t
        named[f"layers.{i}.norm"] = torch.randn(4096, dtype=torch.float32, device=device, generator=g)
        done += t.numel() * 2 + 4096 * 4
        i += 1
    cpu = {k: v.cpu() for k, v in named.items()}
    flat_dir = work / "flat"
    st_path = work / "model.safetensors"
    if flat_dir.exists():
        shutil.rmtree(flat_dir)
    t0 = time.perf_counter()
    dump_tensors(cpu.items(), flat_dir)
    t1 = time.perf_counter()
    save_file(cpu, str(st_path))
    t2 = time.perf_counter()
    os.sync()
    say(f"  data: {len(cpu)} tensors, {done / GiB:.2f} GiB; flat written in {t1 - t0:.1f} s, safetensors in {t2 - t1:.1f} s")
    return {"ref": named, "flat": flat_dir, "safetensors": st_path, "bytes": done, "tensors": len(cpu)}


def _equal(dest: dict[str, Any], ref: dict[str, Any]) -> str:
    """'' when every tensor is bit-identical to the reference, else the first that differs."""
    import torch

    for k, v in ref.items():
        d = dest.get(k)
        if d is None or d.shape != v.shape or not torch.equal(d.view(torch.uint8), v.view(torch.uint8)):
            return f"tensor {k} differs"
    return ""


# loader configurations measured against each other: name -> load_into arguments beyond the defaults
LOADER_CASES: dict[str, dict[str, Any]] = {
    "coldstart": {},  # the defaults (what the GPU worker's reload uses)
    "coldstart_verify": {"verify": True},
    "coldstart_buffered": {"direct": False},  # cold only: the default picks O_DIRECT for a cold file
    "coldstart_coord": {"copies": "coordinator"},  # the defaults, but one thread issues every copy (until 11-26)
    "coldstart_t16_c32": {"threads": 16, "chunk_bytes": 32 * MiB},  # warm only (a sweep)
    "coldstart_t24": {"threads": 24},  # warm only
}
ONE_CACHE = {"coldstart_buffered": "cold", "coldstart_direct": "cold", "coldstart_t16_c32": "warm",
             "coldstart_t24": "warm", "read_direct": "cold", "read_buffered_t24": "warm"}
# into host memory (the GPU machine's CPU as one more host for the loader; bench "loader_cpu")
CPU_LOADER_CASES: dict[str, dict[str, Any]] = {
    "coldstart": {},  # the defaults for a CPU destination (what `coldstart bench load` measures)
    "coldstart_verify": {"verify": True},
    "coldstart_buffered": {"direct": False},  # cold only
    "coldstart_direct": {"direct": True},  # cold only
    # 16 readers forced: the default's on a 16-CPU machine, and the reference where it has fewer
    "coldstart_t16": {"threads": 16},
}


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def loader_bench(work: Path, *, gib: float = 4.0, reps: int = 3, threads: int = 8, loader_threads: int | None = None,
                 device: str = "cuda", say: Say = print) -> list[dict]:
    """Loader into ``device`` memory (cuda, or cpu: host memory) vs its limits and vs safetensors,
    cold and warm page cache, interleaved. The limits: the file's read bandwidth and, into CUDA, the
    pinned host-to-device copy. ``threads``: the file-read limit's base thread count;
    ``loader_threads``: forced on every loader case that names none (None: the loader's own default,
    which is what the ``coldstart`` case measures)."""
    from safetensors.torch import load_file

    from coldstart.weights.loader import alloc_like_index, default_threads, load_into

    data = make_data(work, gib, say, device=device)
    flat, stp, ref, nbytes = data["flat"], data["safetensors"], data["ref"], data["bytes"]
    data_file = flat / "weights.flat"
    dest = alloc_like_index(flat, device=device)
    cases = LOADER_CASES if device == "cuda" else CPU_LOADER_CASES
    rows: list[dict] = []
    base = {"bench": "loader" if device == "cuda" else "loader_cpu", "bytes": nbytes, "tensors": data["tensors"],
            "threads": threads, "loader_default_threads": default_threads(device)}

    def rec(case: str, cache: str, rep: int, **kw) -> None:
        r = dict(base, case=case, cache=cache, rep=rep, **kw)
        rows.append(r)
        say(f"  {case:<22} {cache:<4} rep {rep}: " + ", ".join(f"{k}={v}" for k, v in kw.items()))

    if device == "cuda":
        rows.append(dict(base, case="h2d_pinned", cache="-", rep=0, **h2d_bandwidth()))
        say(f"  pinned H2D: {rows[-1]['h2d_gib_s']} GiB/s")
    reads = {"read_buffered": (threads, False), "read_buffered_t16": (16, False), "read_buffered_t24": (24, False),
             "read_direct": (threads, True)}
    one_cache = dict(ONE_CACHE)
    mem = None
    if device == "cpu":
        # warm, the limit of a load into host memory is the copy out of the page cache into a touched
        # buffer of the model's size (bench load's limit-mem), not a read into a reused small one
        from coldstart.bench.weights import MemLimit

        mem = MemLimit(data_file)
        reads.update({f"read_mem_t{n}": (n, False) for n in (4, 8, 16)})
        one_cache.update({"read_buffered": "cold", "read_buffered_t16": "cold",
                          "read_buffered_t24": "never",  # (24 threads: more than the GPU machines' 16 CPUs)
                          **{f"read_mem_t{n}": "warm" for n in (4, 8, 16)}})
    for rep in range(reps):
        for cache in ("cold", "warm"):
            order = [*reads, *cases, "safetensors"]
            if rep % 2:
                order.reverse()
            for case in order:
                if one_cache.get(case, cache) != cache:  # cells measured under one cache state only
                    continue
                try:
                    if case.startswith("read_mem"):
                        res = _cache(data_file, cache)
                        t0 = time.perf_counter()
                        mem.run(reads[case][0], 64 * MiB)
                        secs = time.perf_counter() - t0
                        rec(case, cache, rep, gib_s=round(data_file.stat().st_size / secs / GiB, 3), seconds=round(secs, 4),
                            resident_before=res, read_threads=reads[case][0])
                    elif case in reads:
                        n, direct = reads[case]
                        r = file_read_bandwidth(data_file, threads=n, cache=cache, o_direct=direct)
                        rec(case, cache, rep, gib_s=r["gib_s"], seconds=r["seconds"], resident_before=r["resident_before"],
                            read_threads=n)
                    elif case in cases:
                        kw = dict({"threads": loader_threads} if loader_threads else {}, **cases[case])
                        for t in dest.values():
                            t.zero_()
                        _sync(device)
                        res = _cache(data_file, cache)
                        t0 = time.perf_counter()
                        st = load_into(flat, dest, **kw)
                        _sync(device)
                        secs = time.perf_counter() - t0
                        bad = _equal(dest, ref) if rep == 0 else ""
                        rec(case, cache, rep, gib_s=round(nbytes / secs / GiB, 3), seconds=round(secs, 4),
                            resident_before=res, o_direct=st.o_direct, mode=st.mode, buffers=st.buffers,
                            read_threads=st.threads, verify=st.verify, wait_s=round(st.wait_s, 3),
                            copy_s=round(st.copy_s, 3), read_s=round(st.read_s, 3), verify_s=round(st.verify_s, 3),
                            alloc_s=round(st.alloc_s, 4), chunk_bytes=st.chunk_bytes, copies=st.copies,
                            checked=rep == 0, mismatch=bad)
                    else:
                        res = _cache(stp, cache)
                        t0 = time.perf_counter()
                        out = load_file(str(stp), device="cuda:0" if device == "cuda" else "cpu")
                        if device == "cpu":  # mapped lazily: copied into the model's tensors, as a load does
                            for k in list(out):
                                dest[k].copy_(out.pop(k))  # (no tensor left holding the mapping: the next
                            out = dest                     # cold cell could not drop its pages)
                        _sync(device)
                        secs = time.perf_counter() - t0
                        bad = _equal(out, ref) if rep == 0 else ""
                        out = None
                        rec(case, cache, rep, gib_s=round(nbytes / secs / GiB, 3), seconds=round(secs, 4),
                            resident_before=res, checked=rep == 0, mismatch=bad)
                except Exception as e:  # noqa: BLE001 - one failed cell must not end the run
                    rec(case, cache, rep, error=f"{type(e).__name__}: {e}")
    del dest
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------------
# a process holding GPU memory


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{TOOLKIT}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(TOOLKIT)
    return env


class Holder:
    """``coldstart.gpu.holder`` in its own session, driven by signals and files (it may be dumped
    and restored by CRIU: then it is no longer our child, and its stdio must not be ours)."""

    def __init__(self, nbytes: int, work: Path, *, log: bool = True, host_bytes: int = 0):
        self.dir = work
        work.mkdir(parents=True, exist_ok=True)
        for f in ("ready.json", "verify.json"):
            (work / f).unlink(missing_ok=True)
        err = open(work / "holder.log", "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "coldstart.gpu.holder", "--bytes", str(nbytes),
                                      "--host-bytes", str(host_bytes), "--dir", str(work)],
                                     stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                     env=_env(), start_new_session=True, cwd="/")
        if log:
            err.close()
        self.pid = self.proc.pid
        self.checks = 0

    def wait_ready(self, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready.json").exists():
            if self.proc.poll() is not None:
                tail = (self.dir / "holder.log").read_text(errors="replace")[-800:] if (self.dir / "holder.log").exists() else ""
                raise RuntimeError(f"holder exited with {self.proc.returncode}: {tail.strip()}")
            if time.monotonic() > deadline:
                raise RuntimeError("holder not ready in time")
            time.sleep(0.05)
        return json.loads((self.dir / "ready.json").read_text())

    def verify(self, timeout: float = 300.0, *, full: bool = False) -> dict:
        """Ask the holder to check its device memory (``full``: and its host memory); returns its
        verify.json."""
        self.checks += 1
        os.kill(self.pid, signal.SIGUSR2 if full else signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while True:
            p = self.dir / "verify.json"
            if p.exists():
                d = json.loads(p.read_text())
                if d.get("n", 0) >= self.checks:
                    return d
            if not _alive(self.pid):
                raise RuntimeError(f"holder {self.pid} died before answering")
            if time.monotonic() > deadline:
                raise RuntimeError("holder did not answer the verify request in time")
            time.sleep(0.05)

    def stop(self) -> None:
        _kill_wait(self.pid)
        try:
            self.proc.wait(timeout=1)
        except Exception:  # noqa: BLE001 - a restored holder is not our child
            pass


def _kill_wait(pid: int, sigs: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL), each_s: float = 2.5) -> None:
    """Send each signal in turn until ``pid`` is gone, waiting up to ``each_s`` after each, so that
    the PID is free when this returns (a restore at the same PID comes next)."""
    for sig in sigs:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + each_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.025)
        if not _alive(pid):
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gpu_used_bytes() -> int:
    """Device 0's used memory per NVML (-1 when nvidia-ml-py is absent)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return -1


def cuda_checkpoint_bench(work: Path, *, sizes_gib: tuple[float, ...] = (1, 4, 16), reps: int = 2,
                          say: Say = print) -> list[dict]:
    from coldstart.engine import cuda_checkpoint as driver

    rows: list[dict] = []
    for gib in sizes_gib:
        n = int(gib * GiB)
        h = None
        try:
            h = Holder(n, work / f"holder-{gib:g}g")
            ready = h.wait_ready()
            for rep in range(reps):
                used0 = gpu_used_bytes()
                s = driver.suspend(h.pid)
                state_ck = driver.get_state(h.pid)
                used1 = gpu_used_bytes()
                r = driver.resume(h.pid)
                state_run = driver.get_state(h.pid)
                used2 = gpu_used_bytes()
                v = h.verify()
                row = {"bench": "cuda_checkpoint", "gib": gib, "rep": rep, "fill_s": ready["fill_s"],
                       "lock_s": round(s.first, 4), "checkpoint_s": round(s.second, 4),
                       "restore_s": round(r.first, 4), "unlock_s": round(r.second, 4),
                       "checkpoint_gib_s": round(gib / s.second, 3) if s.second else None,
                       "restore_gib_s": round(gib / r.first, 3) if r.first else None,
                       "state_after_checkpoint": state_ck, "state_after_restore": state_run,
                       "gpu_used_before": used0, "gpu_used_checkpointed": used1, "gpu_used_restored": used2,
                       "released_gib": round((used0 - used1) / GiB, 3) if used0 >= 0 else None,
                       "verified": v["ok"], "verify_s": v["seconds"], "verify_error": v.get("error", ""),
                       "bad_regions": v.get("n_bad", 0)}
                rows.append(row)
                say(f"  {gib:g} GiB rep {rep}: lock {row['lock_s']} s, checkpoint {row['checkpoint_s']} s, "
                    f"restore {row['restore_s']} s, unlock {row['unlock_s']} s, released {row['released_gib']} GiB, "
                    f"verified {row['verified']}")
        except Exception as e:  # noqa: BLE001
            rows.append({"bench": "cuda_checkpoint", "gib": gib, "error": f"{type(e).__name__}: {e}"})
            say(f"  {gib:g} GiB: ERROR {e}")
        finally:
            if h is not None:
                h.stop()
    return rows


# ------------------------------------------------------------------------------------------------
# CRIU + CUDA


def _error_lines(log: Path, n: int = 12) -> str:
    """CRIU's error and warning lines (its log is long; these say why)."""
    lines = log.read_text(errors="replace").splitlines()
    picked = [ln for ln in lines if "Error" in ln or "Warn" in ln or "err" in ln.lower()[:40]]
    return "\n".join((picked or lines)[-n:])


def shim_dir(work: Path) -> Path:
    """A directory holding a ``cuda-checkpoint`` command (ours) for CRIU's CUDA plugin: the one
    GpuCheckpointTools.find() falls back to where NVIDIA's utility is absent."""
    from coldstart.engine.cuda_checkpoint import command_dir

    return command_dir(work / "shim")


def _pages_read(images: Path) -> int:
    """Bytes of the pages images (the child's and parent/'s) in the page cache: what a restore from
    a dropped cache read."""
    from coldstart.warm.residency import resident_bytes

    return sum(resident_bytes(p)[0] for d in (images, images / "parent") for p in d.glob("pages-*.img"))


def _make_hot(images: Path, h: Holder, opts: dict, work: Path) -> dict[str, Any]:
    """The pipeline's hot layout (pipeline/layout.py) on a GPU process: a recording restore from a
    dropped cache, the CUDA state restored and the device memory checked (what the process does
    before its 'first token'), the touched pages read from the page tables, the images split."""
    from coldstart.warm.residency import drop_caches
    from coldstart.criu import layout
    from coldstart.criu.restore import RestoreOptions, restore
    from coldstart.engine import cuda_checkpoint as driver
    from coldstart.warm.residency import residency_vector

    drop_caches()  # a page cached before the recording would be mapped by fault-around untouched
    t0 = time.perf_counter()
    os.environ[layout.RECORD_ENV] = "1"
    try:
        r = restore(images, RestoreOptions(**opts, mmap_pages=0, detach=True, work_dir=work))
    finally:
        os.environ.pop(layout.RECORD_ENV, None)
    try:
        driver.resume(r.pid)
        v = h.verify()
        if not v["ok"]:
            raise RuntimeError(f"the recording restore's process failed its check: {v.get('error')}")
        read = {p.name: residency_vector(p) for p in images.glob("pages-*.img")}
        hot = layout.record(images, layout.tree_pids(r.pid), read)
    finally:
        _kill_wait(r.pid, (signal.SIGKILL,), each_s=5.0)
    record_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    facts = layout.split(images, hot)
    return {"record_s": round(record_s, 4), "split_s": round(time.perf_counter() - t0, 4),
            "child_bytes": facts.total_child_bytes, "parent_bytes": facts.parent_bytes}


def criu_cuda_bench(work: Path, criu: Path, *, gib: float = 1.0, host_gib: float = 0.0, plugin_dir: Path | None = None,
                    modes: tuple[str, ...] = ("driver", "driver_cold", "plugin", "hot"), say: Say = print) -> list[dict]:
    """Dump and restore a GPU process with our patched CRIU, its CUDA state checkpointed first.

    ``driver``: our driver calls around CRIU (images in the page cache, as right after the dump);
    ``driver_cold``: the same with the page cache dropped before the restore (a node that did not
    dump it); ``plugin``: CRIU's CUDA plugin does the CUDA steps inside dump and restore; ``hot``:
    driver_cold from the hot layout (a recording restore, then the images split; docs/criu.md).
    The process also holds ``host_gib`` of host memory that its check reads only in the last, full
    check: the restore need not read it, as a served process's first token does not need most of its
    memory; ``pages_read_bytes`` is what the cold restores read before the device check passed."""
    from coldstart.criu.dump import DumpOptions, dump
    from coldstart.criu.restore import RestoreOptions, restore
    from coldstart.engine import cuda_checkpoint as driver

    rows: list[dict] = []
    simple = dict(criu_path=criu, tcp_established=False, shell_job=False, ext_unix_sk=False, file_locks=False,
                  network_lock=None)
    for mode in modes:
        if mode == "plugin" and not (plugin_dir and (plugin_dir / "cuda_plugin.so").exists()):
            rows.append({"bench": "criu_cuda", "mode": mode, "error": "no cuda_plugin.so in the pack"})
            continue
        row: dict[str, Any] = {"bench": "criu_cuda", "mode": mode, "gib": gib, "host_gib": host_gib, "criu": str(criu)}
        wd = work / f"criu-{mode}"
        shutil.rmtree(wd, ignore_errors=True)
        h = Holder(int(gib * GiB), wd / "holder", log=False, host_bytes=int(host_gib * GiB))
        restored_pid = None
        old_path = os.environ.get("PATH", "")
        try:
            row["fill_s"] = h.wait_ready()["fill_s"]
            row["verified_before"] = h.verify()["ok"]
            extra: list[str] = []
            if mode == "plugin":
                extra = ["-L", str(plugin_dir)]
                os.environ["PATH"] = f"{shim_dir(wd)}:{old_path}"
            else:  # driver, driver_cold, hot
                s = driver.suspend(h.pid)
                row.update(lock_s=round(s.first, 4), checkpoint_s=round(s.second, 4),
                           state_before_dump=driver.get_state(h.pid))
            d = dump(h.pid, wd / "images", DumpOptions(**simple, link_remap=False, ghost_limit=None,
                                                       skip_in_flight=False, extra_args=extra))
            row.update(dump_s=round(d.seconds, 4), pages_bytes=d.pages_bytes, images_bytes=d.total_bytes)
            say(f"  criu {mode}: dumped {d.pages_bytes / GiB:.2f} GiB of pages in {d.seconds:.2f} s")
            try:
                h.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            checks_at_dump = h.checks
            if mode == "hot":
                row.update(_make_hot(wd / "images", h, simple, wd / "record"))
                h.checks = checks_at_dump  # the next restore is the dumped process again
                (h.dir / "verify.json").unlink(missing_ok=True)
                say(f"  criu hot: {row['child_bytes'] / GiB:.2f} GiB of {row['parent_bytes'] / GiB:.2f} GiB touched "
                    f"(recording {row['record_s']} s, split {row['split_s']} s)")
            cold = mode in ("driver_cold", "hot")
            if cold:
                from coldstart.warm.residency import drop_caches

                drop_caches()
            row["images_resident"] = resident(max((wd / "images").glob("pages-*.img"), key=lambda f: f.stat().st_size))
            t0 = time.perf_counter()
            r = restore(wd / "images", RestoreOptions(**simple, mmap_pages=0, detach=True, work_dir=wd / "restore",
                                                      extra_args=extra))
            restored_pid = r.pid
            row.update(restore_s=round(time.perf_counter() - t0, 4), restored_pid=r.pid, same_pid=r.pid == h.pid)
            if mode != "plugin":
                row["state_after_restore"] = driver.get_state(r.pid)
                u = driver.resume(r.pid)
                row.update(cuda_restore_s=round(u.first, 4), unlock_s=round(u.second, 4))
            row["state_running"] = driver.get_state(r.pid)
            v = h.verify()
            row["to_verified_s"] = round(time.perf_counter() - t0, 4)
            row.update(verified=v["ok"], verify_error=v.get("error", ""), bad_regions=v.get("n_bad", 0),
                       verify_s=v["seconds"])
            if cold:
                row["pages_read_bytes"] = _pages_read(wd / "images")
            full = h.verify(full=True)
            row.update(verified_full=full["ok"], host_ok=full.get("host_ok"))
            say(f"  criu {mode}: restored pid {r.pid} in {row['restore_s']} s; verified {v['ok']} {v.get('error', '')}"
                + (f"; read {row['pages_read_bytes'] / GiB:.2f} GiB of pages" if cold else "")
                + f"; full check {full['ok']} {full.get('error', '')}")
        except Exception as e:  # noqa: BLE001 - the exact error is the finding
            row["error"] = f"{type(e).__name__}: {e}"
            say(f"  criu {mode}: ERROR {row['error']}")
            for key, log in (("dump_log_tail", wd / "images.dump-failed.log"),
                             ("record_log_tail", wd / "record" / "restore.log"),
                             ("restore_log_tail", wd / "restore" / "restore.log")):
                if log.exists():
                    row[key] = _error_lines(log)
        finally:
            os.environ["PATH"] = old_path
            if restored_pid:
                try:
                    os.kill(restored_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            h.stop()
        rows.append(row)
    return rows
