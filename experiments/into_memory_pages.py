"""Does the device read into memory as fast as fio reads into its reused buffers, when that memory is
in 2 MiB pages? (results/spot-checks/into-memory-pages)

    PYTHONPATH=toolkit .venv/bin/python experiments/into_memory_pages.py FILE [ROUNDS] > out.txt

No server. Per round, FILE evicted before each cell, cells shuffled: fio O_DIRECT 4 jobs x 1 MiB and
buffered 4 jobs x 1 MiB (bench reload's probes), and `bench.weights.DirectIntoMemory` (4 threads of 1
MiB O_DIRECT reads, each into its own place in a touched buffer the file's size, kept) with the
buffer in 4 KiB pages and in 2 MiB pages (MADV_HUGEPAGE before it is touched). Prints each round and
each cell's median GiB/s, paired against fio's O_DIRECT read in its round.
"""
from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

from coldstart.bench.weights import DirectIntoMemory, fio_run
from coldstart.warm.residency import evict_all

path = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
readers = {"into 4 KiB pages": DirectIntoMemory(path), "into 2 MiB pages": DirectIntoMemory(path, huge=True)}
with open("/proc/self/smaps_rollup") as f:
    print("#", " ".join(line.split(":")[0] + line.split(":")[1].strip() for line in f if "AnonHuge" in line))


def cell(name: str) -> float:
    evict_all([path])
    if name.startswith("fio"):
        nb, secs = fio_run(path, int("O_DIRECT" in name), 4, 1 << 20)
    else:
        nb, secs = readers[name].run()
    return nb / secs / 2**30


names = ["fio O_DIRECT 4 x 1 MiB", "fio buffered 4 x 1 MiB", *readers]
res: dict[str, list[float]] = {n: [] for n in names}
for rnd in range(rounds):
    order = names[:]
    random.Random(rnd).shuffle(order)
    for n in order:
        res[n].append(cell(n))
    print(rnd, "  ".join(f"{n}: {res[n][-1]:.2f}" for n in names), flush=True)
ref = res[names[0]]
for n in names:
    print(f"{n}: median {statistics.median(res[n]):.2f} GiB/s, paired "
          f"{statistics.median(a / b for a, b in zip(res[n], ref)):.2f}x fio O_DIRECT")
