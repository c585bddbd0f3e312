"""Shapes of the packed refill (a reload after sleep(2) that reads the packed handles' buffers back
from the packed dump instead of packing again), cold, interleaved, with the device probed in each
round: the two arenas (plain weights, packed buffers) populated side by side or one after the other,
and the populating threads.

    PYTHONPATH=toolkit .venv/bin/python experiments/packed_refill_shapes.py --reps 4 --out results/spot-checks/packed-refill-shapes
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from coldstart.bench.host import line as host_line, watch
from coldstart.bench.pipeline import served_with_flat
from coldstart.bench.weights import fio_run
from coldstart.fsutil import write_results
from coldstart.models.tiny import cached_model
from coldstart.warm.residency import evict_all

VARIANTS = {"beside": {}, "after": {"overlap": False}, "beside-p8": {"populate_threads": 8},
            "beside-p2": {"populate_threads": 2}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-packed-refill"))
    a = ap.parse_args()
    watch()  # the host's load over the run, for the table's host line
    variants = a.variants.split(",")
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    eng, c, canary, flat = served_with_flat(cached_model("bench"), a.work)
    rows = []
    try:
        c.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat)})
        files = [flat / "weights.flat", *sorted(flat.glob("packed-*/weights.flat"))]
        for rep in range(a.reps):
            evict_all([files[0]])
            nb, secs = fio_run(files[0], 1, 4, 1 << 20)
            dev = nb / 2**30 / secs
            for v in variants:
                c.sleep(level=2)
                c.wake_up(["weights"])
                evict_all(files)
                r = c.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": "auto", **VARIANTS[v]})[0]
                c.wake_up(["kv_cache"])
                ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
                row = {"variant": v, "rep": rep, "device_gib_s": round(dev, 3), "seconds": r["seconds_rpc"],
                       "bytes": r.get("bytes_read"), "canary_ok": ok,
                       "detail": {k: r.get(k) for k in ("mode", "populate_s", "packed_populate_s", "packed_refilled",
                                                        "error")}}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        eng.stop()
    lines = ["# Packed refill shapes, cold (bench model)", "", host_line(), "",
             "| variant | reload (s) | × device (paired) | runs | canary ok |", "|---|---|---|---|---|"]
    for v in variants:
        sel = [r for r in rows if r["variant"] == v]
        x = [r["bytes"] / 2**30 / r["device_gib_s"] / r["seconds"] for r in sel]
        lines.append(f"| {v} | {statistics.median(r['seconds'] for r in sel):.3f} | {statistics.median(x):.2f} "
                     f"({', '.join(f'{y:.2f}' for y in x)}) | {len(sel)} | {all(r['canary_ok'] for r in sel)} |")
    write_results(a.out, rows, "\n".join(lines) + "\n",
                  "PYTHONPATH=toolkit .venv/bin/python experiments/packed_refill_shapes.py " + " ".join(sys.argv[1:]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
