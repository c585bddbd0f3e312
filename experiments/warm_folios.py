"""Does the snapshot warmer read faster when its reads fill 2 MiB page-cache folios?

Why: the map reload's populate read 1.12x faster with its mapping madvised MADV_HUGEPAGE (all of
the file in 2 MiB folios against about 60% without; results/spot-checks/huge-folios/folios) on the
Intel VM, whose hypervisor charges the device's writes into guest memory per page
(results/spot-checks/slow-minutes). The native warmer fills the page cache with sendfile(2) to
/dev/null (readahead picks the folio sizes) or, as method ``populate``, with MADV_POPULATE_READ on a
transient mapping per chunk, which could be advised MADV_HUGEPAGE first.

Usage: .venv/bin/python experiments/warm_folios.py FILE OUT_DIR [ROUNDS] [CELLS]
CELLS: comma-separated METHOD:THREADS:CHUNK_MIB (default: each method at the host warmer's 2 x 2 MiB
(containers.run.HOST_SHAPE) and the native warmer's 8 x 8 MiB). No server: FILE evicted before each
cell, read whole in CHUNK pieces handed out in order to THREADS threads sharing one descriptor (as
the warmer's readers take a plan's ranges), cells shuffled per round, fio's fastest of two shapes in
every round for the device.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from _ranges import cpu_seconds, device_gib_s, over_threads, pieces
from coldstart.warm.residency import evict_all, populate_fd, read_into_cache

path, out = Path(sys.argv[1]), Path(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
size = path.stat().st_size

METHODS = {"sendfile": read_into_cache, "populate": populate_fd, "populate-huge": partial(populate_fd, huge=True)}


def cell(method: str, threads: int, chunk: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    fn = METHODS[method]
    try:
        t = time.perf_counter()
        over_threads(threads, pieces(size, chunk), lambda o, n: fn(fd, o, n))
        return time.perf_counter() - t
    finally:
        os.close(fd)


cells = [(m, t, c << 20) for t, c in ((2, 2), (8, 8)) for m in METHODS]
if len(sys.argv) > 4:
    cells = [(m, int(t), int(c) << 20) for m, t, c in (x.split(":") for x in sys.argv[4].split(","))]
rows = []
for rnd in range(rounds):
    rows.append({"round": rnd, "cell": "device", "gib_s": round(device_gib_s(path, ((0, 1 << 20), (1, 1 << 20))), 3)})
    order = cells[:]
    random.Random(rnd).shuffle(order)
    for method, threads, chunk in order:
        evict_all([path])
        cpu = cpu_seconds()
        secs = cell(method, threads, chunk)
        rows.append({"round": rnd, "cell": f"{method} {threads}x{chunk >> 20}M", "seconds": round(secs, 4),
                     "gib_s": round(size / secs / 2**30, 3), "cpu_s": round(cpu_seconds() - cpu, 3)})
    print(json.dumps(rows[-len(cells) - 1:]), flush=True)
out.mkdir(parents=True, exist_ok=True)
(out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
dev = {r["round"]: r["gib_s"] for r in rows if r["cell"] == "device"}
print(f"{path.name}, {size / 2**30:.2f} GiB, {rounds} rounds; device (fio, fastest of buffered and O_DIRECT, "
      f"4 jobs, 1 MiB) median {statistics.median(dev.values()):.2f} GiB/s")
for name in dict.fromkeys(r["cell"] for r in rows if r["cell"] != "device"):
    rs = [r for r in rows if r["cell"] == name]
    vs = [r["gib_s"] / dev[r["round"]] for r in rs]
    print(f"{name}: {statistics.median(r['gib_s'] for r in rs):.2f} GiB/s, {statistics.median(vs):.2f}x the device "
          f"(paired), CPU {statistics.median(r['cpu_s'] for r in rs):.3f} s")
