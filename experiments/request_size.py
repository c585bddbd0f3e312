"""Does the device's largest request size (max_sectors_kb) decide how fast a cold file comes in?
(results/spot-checks/request-size)

    PYTHONPATH=toolkit .venv/bin/python experiments/request_size.py FILE OUT_DIR [ROUNDS]

No server. Per round, in a shuffled order, under each max_sectors_kb (the device's current value,
1024, 512, 256): FILE's first 1.25 GiB (or all of it) populated cold as the map reload reads
(coldstart.weights.queue's probe read: MADV_POPULATE_READ, 4 threads x 64 MiB pieces); and fio's
O_DIRECT 4 jobs x 1 MiB and buffered 4 jobs x 16 MiB reads of the whole file under the current value
and 512. The queue is put back at the end. Prints medians and each cell paired against the populate
under the current value; writes OUT_DIR/raw.jsonl.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

from coldstart.bench.weights import fio_run
from coldstart.warm.residency import evict_all
from coldstart.weights import queue

path, out = Path(sys.argv[1]), Path(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
size = path.stat().st_size
span = min(size - size % 4096, 1280 << 20)
q = queue.queue_dir(path)
cur = queue.current_kb(q)
cells = [(f"populate ms{kb}", kb, None) for kb in dict.fromkeys((cur, 1024, 512, 256))]
cells += [(f"fio {'O_DIRECT 4x1M' if d else 'buffered 4x16M'} ms{kb}", kb, (d, 4, (1 << 20) if d else (16 << 20)))
          for kb in dict.fromkeys((cur, 512)) for d in (1, 0)]
rows = []
try:
    for rnd in range(rounds):
        order = cells[:]
        random.Random(rnd).shuffle(order)
        for name, kb, fio in order:
            queue.apply(q, kb)
            if fio:
                evict_all([path])
                nb, secs = fio_run(path, *fio)
            else:
                nb, secs = span, queue.populate_cold(path, span)
            rows.append({"round": rnd, "cell": name, "max_sectors_kb": kb, "gib_s": round(nb / 2**30 / secs, 3)})
        print(json.dumps(rows[-len(cells):]), flush=True)
finally:
    queue.apply(q, cur)
out.mkdir(parents=True, exist_ok=True)
(out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
base = {r["round"]: r["gib_s"] for r in rows if r["cell"] == f"populate ms{cur}"}
print(f"{path.name}: {span / 2**30:.2f} GiB populated, whole file for fio; device {q.parent.name}, "
      f"max_sectors_kb {cur} before and after; {rounds} rounds")
for name, _, _ in cells:
    v = [r["gib_s"] for r in rows if r["cell"] == name]
    paired = statistics.median(r["gib_s"] / base[r["round"]] for r in rows if r["cell"] == name)
    print(f"{name:28s} median {statistics.median(v):.2f} GiB/s (min {min(v):.2f}, max {max(v):.2f}), "
          f"paired {paired:.2f}x populate ms{cur}")
