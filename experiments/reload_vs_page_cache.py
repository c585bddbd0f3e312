"""Earlier `coldstart bench reload` runs, read again: the default cold reload against the page cache's
rate in its round (fio's fastest buffered shape, the table's line since 2026-12-05) and against
O_DIRECT's, from each run's raw.jsonl (its device probes: four fio shapes before each round and
after its default's cold reload). Also how fio's own shapes score against the run's device limit
(the fastest of the four, per round): the ceiling for any one read shape on that disk.

    PYTHONPATH=toolkit .venv/bin/python experiments/reload_vs_page_cache.py results/reload-intel-packed \\
        results/reload-intel-packed-2 results/reload-intel-packed-3 results/reload-avx512-packed results/reload-avx512-packed-2
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from coldstart.bench.pipeline import device_probes


def main() -> None:
    print("| run | reload / page cache (median, each round) | reload / device limit | O_DIRECT / buffered | "
          "each fio shape / device limit (median) |")
    print("|---|---|---|---|---|")
    for d in map(Path, sys.argv[1:]):
        rows = [json.loads(ln) for ln in (d / "raw.jsonl").read_text().splitlines() if ln.strip()]
        buf, dio = device_probes(rows, "buffered"), device_probes(rows, "O_DIRECT")
        shapes = sorted({r["detail"]["fio"] for r in rows if r["method"] == "device"})
        per_shape = {s: device_probes(rows, s) for s in shapes}
        limit = device_probes(rows, "")  # the run's own device limit: every shape, the fastest, per round
        ours = {r["rep"]: r["bytes"] / 2**30 / r["seconds"] for r in rows if r["cache"] == "cold" and r["method"] == "auto"}
        reps = [rep for rep in ours if rep in buf]
        vs_buf = [ours[rep] / buf[rep] for rep in reps]
        vs_lim = [ours[rep] / limit[rep] for rep in reps]
        ratio = [dio[rep] / buf[rep] for rep in reps if rep in dio]
        fio = "; ".join(f"{s} {statistics.median(v[rep] / limit[rep] for rep in reps if rep in v):.2f}"
                        for s, v in per_shape.items())
        print(f"| {d.name} | {statistics.median(vs_buf):.2f} ({', '.join(f'{x:.2f}' for x in vs_buf)}) | "
              f"{statistics.median(vs_lim):.2f} | {statistics.median(ratio):.2f} | {fio} |")


if __name__ == "__main__":
    main()
