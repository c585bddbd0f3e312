"""Spot check: is the cold-cache cost of digests-with-the-node-record (results/artifact) an ordering
artifact of `coldstart bench artifact` (which always runs --no-verify first)? Alternates the order of
the two variants per repetition, page cache dropped before each restore, first token from exec.

    .venv/bin/python experiments/integrity_order_spotcheck.py SNAPSHOT_DIR [REPS]
"""
import json
import statistics
import sys
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import restore_from_exec

snap, reps = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4
rows = []
for rep in range(reps):
    order = ["recorded", "off"] if rep % 2 == 0 else ["off", "recorded"]
    for pos, vm in enumerate(order):
        drop_caches()
        r = restore_from_exec(snap, ["--no-verify"] if vm == "off" else [])
        rows.append({"variant": vm, "rep": rep, "position": pos, **r})
        print(json.dumps(rows[-1]), flush=True)
for vm in ("off", "recorded"):
    xs = [r["first_token_from_exec_s"] for r in rows if r["variant"] == vm]
    print(f"# {vm}: median first token from exec {statistics.median(xs):.3f} s over {len(xs)}", flush=True)
