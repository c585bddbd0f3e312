"""Earlier `coldstart bench reload` runs, read again: the default cold reload against two readings of
the device limit from the same probes. The table's (each round, the fastest of four fio shapes at each
probe, the two probes averaged) is a maximum of noisy probes; `coldstart bench load` takes its limit
as one configuration, the fastest by its median over the run, paired per repetition. No new
measurement: each run's raw.jsonl.

    PYTHONPATH=toolkit .venv/bin/python experiments/reload_limit_shapes.py results/reload-intel-packed ...
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from coldstart.bench.pipeline import best_shape, device_probes


def main() -> None:
    print("| run | device limit, fastest shape per round (median GiB/s) | each shape's median GiB/s | "
          "best shape | reload / device limit (paired median) | reload / best shape (paired median, each round) |")
    print("|---|---|---|---|---|---|")
    for d in map(Path, sys.argv[1:]):
        rows = [json.loads(ln) for ln in (d / "raw.jsonl").read_text().splitlines() if ln.strip()]
        limit = device_probes(rows, "")
        shapes = sorted({r["detail"]["fio"] for r in rows if r["method"] == "device"})
        med = {s: statistics.median(device_probes(rows, s).values()) for s in shapes}
        name, per = best_shape(rows)
        cold = [r for r in rows if r["cache"] == "cold" and r["method"] == "auto" and r["rep"] in limit]
        vs_lim = [r["bytes"] / 2**30 / r["seconds"] / limit[r["rep"]] for r in cold]
        vs_one = [r["bytes"] / 2**30 / r["seconds"] / per[r["rep"]] for r in cold if r["rep"] in per]
        print(f"| {d.name} | {statistics.median(limit.values()):.2f} | "
              f"{'; '.join(f'{s} {v:.2f}' for s, v in med.items())} | {name} | {statistics.median(vs_lim):.2f} | "
              f"**{statistics.median(vs_one):.2f}** ({', '.join(f'{x:.2f}' for x in vs_one)}) |")


if __name__ == "__main__":
    main()
