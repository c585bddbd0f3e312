"""How much of a cold map reload's populate lands in 2 MiB page-cache folios, with and without
MADV_HUGEPAGE on the mapping?

Why: the map reload advises its mapping MADV_HUGEPAGE (WeightArena.map_file ``huge``) because on the
Intel VM reads that land in pages of their own are what the hypervisor charges for
(results/spot-checks/slow-minutes) and the advice read 1.04-1.07x faster paired. This shows what the
advice changes in the page cache: a 2 MiB folio mapped at a 2 MiB-aligned address of the mapping is
mapped by one PMD, so /proc/self/smaps' FilePmdMapped counts the bytes that came in as 2 MiB folios.

Usage: .venv/bin/python experiments/folio_sizes.py FILE OUT_DIR [ROUNDS]
No server: the file mapped MAP_PRIVATE in this process (mmap aligns a mapping this large to 2 MiB),
evicted before each cell, then populated like map_file (MADV_WILLNEED over it, MADV_POPULATE_READ in 4
threads of 64 MiB pieces), with and without MADV_HUGEPAGE first, in a shuffled order each round.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from _ranges import cpu_seconds, over_threads, pieces
from coldstart.engine.arena import (MADV_HUGEPAGE, MADV_POPULATE_READ, MADV_WILLNEED, MAP_PRIVATE, PROT_READ,
                                    _libc, _madvise)
from coldstart.warm.residency import evict_all

path, out = Path(sys.argv[1]), Path(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
size = path.stat().st_size
PIECE, THREADS = 64 << 20, 4


def smaps_kib(addr: int) -> dict[str, int]:
    """The kB fields of the smaps entry that covers ``addr``."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= addr < hi:
                fields = {}
                for x in lines[i + 1:]:
                    if x.startswith("VmFlags:"):
                        return fields
                    k, v, *_ = x.split()
                    fields[k.rstrip(":")] = int(v)
    raise RuntimeError(f"nothing mapped at {addr:#x}")


def cell(huge: bool) -> dict:
    fd = os.open(path, os.O_RDONLY)
    addr = _libc.mmap(None, size, PROT_READ, MAP_PRIVATE, fd, 0)
    try:
        t = time.perf_counter()
        if huge:
            _madvise(addr, size, MADV_HUGEPAGE)
        _madvise(addr, size, MADV_WILLNEED)
        over_threads(THREADS, pieces(size, PIECE), lambda o, n: _madvise(addr + o, n, MADV_POPULATE_READ))
        secs = time.perf_counter() - t
        f = smaps_kib(addr)
        return {"seconds": round(secs, 4), "gib_s": round(size / secs / 2**30, 3), "aligned_2m": addr % (2 << 20) == 0,
                "rss_kib": f["Rss"], "pmd_mapped_kib": f["FilePmdMapped"],
                "pmd_share": round(f["FilePmdMapped"] / f["Rss"], 4) if f["Rss"] else 0.0}
    finally:
        _libc.munmap(addr, size)
        os.close(fd)


rows = []
for rnd in range(rounds):
    order = [False, True]
    random.Random(rnd).shuffle(order)
    for huge in order:
        evict_all([path])
        cpu = cpu_seconds()
        row = {"round": rnd, "cell": "hugepage" if huge else "plain", **cell(huge)}
        row["cpu_s"] = round(cpu_seconds() - cpu, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
out.mkdir(parents=True, exist_ok=True)
(out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
print(f"{path.name}, {size / 2**30:.2f} GiB, {rounds} rounds")
for name in ("plain", "hugepage"):
    rs = [r for r in rows if r["cell"] == name]
    print(f"{name}: in 2 MiB folios median {statistics.median(r['pmd_share'] for r in rs):.1%} "
          f"(min {min(r['pmd_share'] for r in rs):.1%}), {statistics.median(r['gib_s'] for r in rs):.2f} GiB/s, "
          f"CPU {statistics.median(r['cpu_s'] for r in rs):.3f} s")
pairs = [p["seconds"] / h["seconds"] for p, h in zip((r for r in rows if r["cell"] == "plain"),
                                                      (r for r in rows if r["cell"] == "hugepage"))]
print(f"plain / hugepage time, paired per round: median {statistics.median(pairs):.3f}, "
      f"hugepage faster in {sum(x > 1 for x in pairs)} of {len(pairs)}")
