"""Does the page cache's readahead window (read_ahead_kb) decide how fast the map reload's populate
reads a cold file, beside the largest request size (max_sectors_kb) that `weights tune-queue` sets?
(results/spot-checks/read-ahead-populate)

    PYTHONPATH=toolkit .venv/bin/python experiments/read_ahead_populate.py FILE [ROUNDS] > out.txt

No server. Per round: fio's O_DIRECT 4 jobs x 1 MiB read of FILE (the one-shape device limit, under
max_sectors_kb 512 and the node's read_ahead_kb), then in a shuffled order each (max_sectors_kb,
read_ahead_kb) cell: FILE's first 1.25 GiB populated cold as the map reload reads it
(coldstart.weights.queue.populate_cold). Both settings are put back at the end. Prints each round,
then each cell's median GiB/s and its median paired against the round's fio read.
"""
from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

from coldstart.bench.weights import fio_run
from coldstart.warm.residency import evict_all
from coldstart.weights import queue

path = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
q = queue.queue_dir(path)
span = min(path.stat().st_size // 4096 * 4096, 1280 << 20)
ra = q / "read_ahead_kb"
ra0, ms0 = int(ra.read_text()), queue.current_kb(q)
cells = [(ms, r) for ms in (4096, 512) for r in (2048, 8192, 32768)]
res: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
dev: list[float] = []
try:
    for rnd in range(rounds):
        order = cells[:]
        random.Random(rnd).shuffle(order)
        queue.apply(q, 512)
        ra.write_text(f"{ra0}\n")
        evict_all([path])
        nb, secs = fio_run(path, 1, 4, 1 << 20)
        dev.append(nb / secs / 2**30)
        for ms, r in order:
            queue.apply(q, ms)
            ra.write_text(f"{r}\n")
            res[(ms, r)].append(span / queue.populate_cold(path, span) / 2**30)
        print(rnd, f"dev {dev[-1]:.2f}", " ".join(f"{ms}/{r}:{res[(ms, r)][-1]:.2f}" for ms, r in cells), flush=True)
finally:
    queue.apply(q, ms0)
    ra.write_text(f"{ra0}\n")
for c in cells:
    print(f"max_sectors_kb {c[0]}, read_ahead_kb {c[1]}: {statistics.median(res[c]):.2f} GiB/s, "
          f"paired {statistics.median(a / d for a, d in zip(res[c], dev)):.2f}x fio O_DIRECT 4 x 1 MiB")
