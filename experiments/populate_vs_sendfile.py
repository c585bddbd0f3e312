"""How fast does a cold weights file come in through a private mapping, by page faults or by reads?

Why: the map reload populates the mapped weights file with MADV_POPULATE_READ in 4 threads of 64 MiB
pieces, and its cold step is its read: 0.75-0.97x the device (fio) in three runs of
results/spot-checks/reload-populate-piece. Page faults on a mapping read around the fault
(read_ahead_kb), while read(2)-like calls get the kernel's sequential readahead. The warmers fill
the page cache with sendfile(2) to /dev/null (no copy to user space); a populate after that only
maps cached pages (a warm map reload took 0.02 s).

Usage: .venv/bin/python experiments/populate_vs_sendfile.py FILE OUT_DIR [ROUNDS] [CELLS]
No server: the file mapped MAP_PRIVATE in this process, evicted before each cell, cells in a
shuffled order each round, fio (the faster of bench reload's two shapes) in every round.
CELLS: comma-separated KIND:THREADS:PIECE_MIB (default: the four of the first run). KIND
"populate-thp": the mapping madvised MADV_HUGEPAGE first, so that a fault reads ahead into 2 MiB
page-cache folios where the file system has them (ext4 on kernel >= 6.16) instead of 4 KiB pages;
each cell also records this process's CPU seconds (the faults' kernel work is charged to it).
"odirect" / "odirect-thp": no mapping of the file; the threads read their pieces with O_DIRECT, one
preadv each, into a fresh anonymous region the file's size (a copy reload's arena after a sleep
released it), for "-thp" madvised MADV_HUGEPAGE first: the same bytes reach memory in 2 MiB pages,
so each request carries a few large segments instead of one per 4 KiB page (the queue takes 254).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from _ranges import cpu_seconds, device_gib_s, over_threads, pieces
from coldstart.engine.arena import MADV_HUGEPAGE, MADV_POPULATE_READ, MAP_PRIVATE, PROT_READ, _libc, _madvise
from coldstart.warm.residency import evict_all, read_into_cache

path, out = Path(sys.argv[1]), Path(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
size = path.stat().st_size


def run_threads(threads: int, piece: int, fn) -> None:
    over_threads(threads, pieces(size, piece), fn)


def odirect_cell(huge: bool, threads: int, piece: int) -> float:
    import mmap

    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    dest = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(dest)
    try:
        t = time.perf_counter()
        if huge:
            dest.madvise(MADV_HUGEPAGE)
        run_threads(threads, piece, lambda o, n: os.preadv(fd, [view[o:o + n]], o))
        return time.perf_counter() - t
    finally:
        view.release()
        dest.close()
        os.close(fd)


def cell(kind: str, threads: int, piece: int) -> float:
    if kind.startswith("odirect"):
        return odirect_cell(kind == "odirect-thp", threads, piece)
    fd = os.open(path, os.O_RDONLY)
    addr = _libc.mmap(None, size, PROT_READ, MAP_PRIVATE, fd, 0)
    try:
        t = time.perf_counter()
        if kind == "populate-thp":
            _madvise(addr, size, MADV_HUGEPAGE)
        if kind in ("populate", "populate-thp"):
            run_threads(threads, piece, lambda o, n: _madvise(addr + o, n, MADV_POPULATE_READ))
        elif kind == "sendfile+populate":  # a descriptor per thread (its own readahead state), as map_file(fill="read")
            local = threading.local()

            def both(o, n):
                if not hasattr(local, "fd"):
                    local.fd = os.open(path, os.O_RDONLY)
                    fds.append(local.fd)
                read_into_cache(local.fd, o, n)
                _madvise(addr + o, n, MADV_POPULATE_READ)
            fds: list[int] = []
            run_threads(threads, piece, both)
            for f in fds:
                os.close(f)
        return time.perf_counter() - t
    finally:
        _libc.munmap(addr, size)
        os.close(fd)


cells = [("populate", 4, 64 << 20), ("sendfile+populate", 4, 64 << 20), ("sendfile+populate", 2, 64 << 20),
         ("sendfile+populate", 4, 8 << 20)]
if len(sys.argv) > 4:
    cells = [(k, int(t), int(m) << 20) for k, t, m in (c.split(":") for c in sys.argv[4].split(","))]
rows = []
for rnd in range(rounds):
    rows.append({"round": rnd, "cell": "device", "gib_s": round(device_gib_s(path, ((0, 16 << 20), (1, 1 << 20))), 3)})
    order = cells[:]
    random.Random(rnd).shuffle(order)
    for kind, threads, piece in order:
        evict_all([path])
        cpu = cpu_seconds()
        secs = cell(kind, threads, piece)
        rows.append({"round": rnd, "cell": f"{kind} {threads}x{piece >> 20}M", "seconds": round(secs, 4),
                     "gib_s": round(size / secs / 2**30, 3), "cpu_s": round(cpu_seconds() - cpu, 3)})
    print(json.dumps(rows[-len(cells) - 1:]), flush=True)
out.mkdir(parents=True, exist_ok=True)
(out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
dev = {r["round"]: r["gib_s"] for r in rows if r["cell"] == "device"}
print(f"{path.name}, {size / 2**30:.2f} GiB; device median {statistics.median(dev.values()):.2f} GiB/s")
for name in dict.fromkeys(r["cell"] for r in rows if r["cell"] != "device"):
    rs = [r for r in rows if r["cell"] == name]
    paired = statistics.median(r["gib_s"] / dev[r["round"]] for r in rs)
    print(f"{name:28s} {statistics.median(r['gib_s'] for r in rs):.2f} GiB/s, paired {paired:.2f}x the device, "
          f"CPU {statistics.median(r.get('cpu_s', 0) for r in rs):.2f} s")
