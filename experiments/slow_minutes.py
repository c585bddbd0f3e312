"""What slows this VM's disk for minutes at a time: the disk, the guest's memory, or the device's
writes into it? (results/spot-checks/slow-minutes)

Every few seconds, for DURATION seconds, the page cache of FILE dropped before each read of its first
SPAN: fio buffered (4 jobs x 1 MiB); fio O_DIRECT (4 jobs x 1 MiB, each job into one reused buffer);
4 threads of 1 MiB O_DIRECT reads, each block into its own place in an anonymous SPAN touched at the
start and kept (in 4 KiB pages, then one in 2 MiB pages: MADV_HUGEPAGE); the map reload's read (SPAN
mapped MAP_PRIVATE, MADV_POPULATE_READ in 4 threads x 64 MiB), then the same with the mapping
madvised MADV_HUGEPAGE (2 MiB page-cache folios); O_DIRECT into a fresh region; then the CPU writes a fresh anonymous SPAN once and the kept
one again. Each line: seconds since start, the nine rates in GiB/s, the CPU's steal and iowait over
the sample, and the MiB the guest's free page reporting has handed back since boot.

    PYTHONPATH=toolkit .venv/bin/python experiments/slow_minutes.py FILE [DURATION_S] [SPAN_MB] [--keep-memory] > out.txt

--keep-memory: as the benchmarks' flag, free page reporting off and the free memory touched first.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from coldstart.bench.host import memory_kept, page_reporting


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _fio(path: str, span: int, direct: bool) -> float:
    _evict(path)
    out = subprocess.run(
        ["fio", "--name=r", f"--filename={path}", "--rw=read", "--bs=1M", "--numjobs=4",
         "--ioengine=psync", f"--direct={int(direct)}", "--readonly", f"--size={span // 4}",
         f"--offset_increment={span // 4}", "--group_reporting", "--invalidate=0",
         "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    read = json.loads(out)["jobs"][0]["read"]
    return read["io_bytes"] / (read["runtime"] / 1000) / 2**30


def _direct_into(path: str, dest: mmap.mmap, threads: int = 4, block: int = 1 << 20) -> float:
    """GiB/s reading the head of ``path`` (len(dest) bytes) with O_DIRECT, ``threads`` threads of
    ``block``-sized preads, each block into its own place in ``dest``: the bytes land in as much
    memory as they fill, as a reload's do, not in fio's one reused buffer per job."""
    _evict(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    view = memoryview(dest)
    per = len(dest) // threads

    def run(i: int) -> None:
        for off in range(i * per, (i + 1) * per, block):
            os.preadv(fd, [view[off:off + block]], off)

    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads)))
        dt = time.perf_counter() - t
    finally:
        view.release()
        os.close(fd)
    return len(dest) / dt / 2**30


def _populate(path: str, span: int, huge: bool, threads: int = 4, piece: int = 64 << 20) -> float:
    """GiB/s of the map reload's read: SPAN of the file mapped MAP_PRIVATE, MADV_POPULATE_READ in
    ``threads`` threads of ``piece``; with ``huge`` the mapping madvised MADV_HUGEPAGE first, so that
    the page cache fills 2 MiB folios."""
    from coldstart.engine.arena import MADV_POPULATE_READ, MAP_PRIVATE, PROT_READ, _libc, _madvise

    _evict(path)
    fd = os.open(path, os.O_RDONLY)
    addr = _libc.mmap(None, span, PROT_READ, MAP_PRIVATE, fd, 0)
    try:
        t = time.perf_counter()
        if huge:
            _madvise(addr, span, 14)  # MADV_HUGEPAGE
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda o: _madvise(addr + o, min(piece, span - o), MADV_POPULATE_READ),
                          range(0, span, piece)))
        dt = time.perf_counter() - t
    finally:
        _libc.munmap(addr, span)
        os.close(fd)
    return span / dt / 2**30


def _memset_rate(m: mmap.mmap) -> float:
    buf = (ctypes.c_char * len(m)).from_buffer(m)
    t = time.perf_counter()
    ctypes.memset(buf, 1, len(m))
    dt = time.perf_counter() - t
    del buf
    return len(m) / dt / 2**30


def _anon_touch(span: int) -> float:
    """GiB/s writing a fresh anonymous region once: guest page faults, and the hypervisor's where
    it must back the pages again."""
    m = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    rate = _memset_rate(m)
    m.close()
    return rate


def _reported_mib() -> int:
    info = page_reporting()
    return info["reported_kib"] >> 10 if info else -1


def _cpu() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def main() -> None:
    path = sys.argv[1]
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 480
    span = (int(sys.argv[3]) if len(sys.argv) > 3 else 512) << 20
    keep = "--keep-memory" in sys.argv
    with memory_kept(say=lambda m: print("#", m, flush=True)) if keep else contextlib.nullcontext():
        _series(path, duration, span)


def _series(path: str, duration: float, span: int) -> None:
    kept = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _memset_rate(kept)
    kept_huge = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    kept_huge.madvise(mmap.MADV_HUGEPAGE)
    _memset_rate(kept_huge)
    print(f"# {path}: {span >> 20} MiB per read; GiB/s: fio buffered, fio O_DIRECT, O_DIRECT "
          "into a kept region (4 KiB pages), into a kept one in 2 MiB pages, the populate, the populate into 2 MiB folios, O_DIRECT into a fresh one, a fresh region written, the kept one written again; steal and "
          "iowait jiffies per sample", flush=True)
    start = time.monotonic()
    while time.monotonic() - start < duration:
        c0, t0 = _cpu(), time.monotonic()
        buffered = _fio(path, span, direct=False)
        direct = _fio(path, span, direct=True)
        into_kept = _direct_into(path, kept)
        into_huge = _direct_into(path, kept_huge)
        pop = _populate(path, span, huge=False)
        pop_huge = _populate(path, span, huge=True)
        fresh = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        into_fresh = _direct_into(path, fresh)
        fresh.close()
        anon = _anon_touch(span)
        again = _memset_rate(kept)
        c1 = _cpu()
        print(f"{t0 - start:6.1f} s  buffered {buffered:.2f}  direct {direct:.2f}  direct-into-kept {into_kept:.2f}  direct-into-kept-2M {into_huge:.2f}"
              f"  populate {pop:.2f}  populate-2M {pop_huge:.2f}"
              f"  direct-into-fresh {into_fresh:.2f}  anon {anon:.2f}  rewrite {again:.2f}"
              f"  steal {c1[7] - c0[7]}  iowait {c1[4] - c0[4]}"
              f"  reported {_reported_mib()} MiB", flush=True)
        time.sleep(2)


if __name__ == "__main__":
    main()
