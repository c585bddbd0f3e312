"""Why is a container restore's weight reload slower with host warming than warm, even after the
host warmer has read the whole weights file? (results/container-load: the warmer was done 1.2-1.4 s
after the create call, the reload ran from ~1.1 s to 2.3-2.7 s, against 0.85 s warm.)

Three starts of the bench model's hot snapshot, host warming on (HostWarm's defaults), page cache:
``cold`` (dropped), ``weights`` (dropped, then the weights file read whole before the create call:
the reload finds every byte it needs; the rest is as cold) and ``warm`` (a plain warm restore).
If ``weights`` reloads like ``warm``, the reload waits for the weights' arrival; if like ``cold``,
it is slowed by what else the cold restore does meanwhile (the restored processes' faults, the
warmer's CPU). ``cold-noverlap``: ``cold`` with the map reload prepacking only after its populate
(COLDSTART_PREPACK_OVERLAP=0 in the container), to see what the overlap gains there.

    .venv/bin/python experiments/reload_after_warm.py --reps 3 \\
        --out results/spot-checks/host-warm-shape/bench-reload-after-warm.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.warm.residency import drop_caches
from coldstart.bench.gpu import warm_file
from coldstart.pipeline.manifest import read_manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--variants", default="cold,weights,warm")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work)
    weights = snap / read_manifest(snap).weights["flat"]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    variants = [v for v in a.variants.split(",") if v]
    with open(a.out, "w") as out:
        # the first restore on this node: verifies every file, records the profile the host warms from
        new_to_node(snap)
        first = one_start(c, tag, "restore", model, snap, layers)
        out.write(json.dumps({"size": a.size, "variant": "first-on-node", **first}) + "\n")
        for rep in range(a.reps):
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                if v == "warm":
                    one_start(c, tag, "restore", model, snap, layers)  # prewarm
                    row = one_start(c, tag, "restore", model, snap, layers)
                else:
                    drop_caches()
                    if v == "weights":  # (cold, cold-noverlap: nothing more)
                        warm_file(weights)
                    env = {"COLDSTART_PREPACK_OVERLAP": "0"} if v == "cold-noverlap" else None
                    row = one_start(c, tag, "restore+hostwarm", model, snap, layers, env=env)
                ev, attrs = row.get("events") or {}, row.get("event_attrs") or {}
                w = attrs.get("WEIGHTS_LOADED") or {}
                print(json.dumps({"variant": v, "rep": rep, "first_token_s": row.get("first_token_s"),
                                  "wake": ev.get("WAKE_WEIGHTS"), "weights": ev.get("WEIGHTS_LOADED"),
                                  "populate_s": w.get("populate_s"), "prepack_s": w.get("prepack_s"),
                                  "overlapped": w.get("prepack_overlapped", False),
                                  "resident_at_start": w.get("resident_at_start"),
                                  "host_warm_s": (row.get("host_warm") or {}).get("seconds"),
                                  "read_gib": round((row.get("disk_read_bytes") or 0) / 2**30, 2)}), flush=True)
                out.write(json.dumps({"size": a.size, "variant": v, "rep": rep, **row}) + "\n")


if __name__ == "__main__":
    main()
