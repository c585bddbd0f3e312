"""How many host readers for a node that runs containers, where only the snapshot is cold? There
the bench model's first token comes 0.02-0.07 s after the host warmer is through, and the warmer
reads the snapshot's 1.24 GiB at ~1.2 GiB/s against the disk's 1.57 (results/container-intel-pod-12).
With the whole cache dropped, 3 or 4 readers instead of 2 moved the first token within the spread
(results/spot-checks/host-warm-readers), but there docker's and the entrypoint's cold reads share
the disk; with only the snapshot cold they are cached.

Each start: one unmeasured restore of the snapshot (docker, the image, the node dir as a restore
leaves them), the snapshot's files evicted, then restore + host warming with THREADS readers x 2 MiB
(containers.run.HostWarm ``threads``), in a pod's network namespace; the variants interleaved, their
order turned around every repetition.

    PYTHONPATH=toolkit .venv/bin/python experiments/host_warm_readers_snapshot.py --size bench --threads 2,3,4 \\
        --reps 4 --out results/spot-checks/host-warm-readers-snapshot/raw.jsonl

``--shapes '[{}, {"head": "ahead"}]'`` instead compares whole HostWarm shapes (keyword arguments;
``head`` needs the toolkit of 07ba8ca, results/spot-checks/host-warm-head).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start, pod_if
from coldstart.bench.host import memory_kept
from coldstart.warm.residency import evict_all
from coldstart.warm.snapshot import node_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--threads", default="2,3,4")
    ap.add_argument("--shapes", default=None, help="JSON list of HostWarm keyword dicts (instead of --threads)")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    case = bench_case(a.size, a.work)
    prof = node_profile(case.snap)
    if prof is None or not prof.exists():  # the first restore on the node records the profile
        new_to_node(case.snap)
        one_start(case.client, case.image, "restore", case.model, case.snap, case.layers)
    variants = json.loads(a.shapes) if a.shapes else [{"threads": int(t)} for t in a.threads.split(",")]
    with a.out.open("a") as f, memory_kept():  # (as bench container --keep-memory)
        for rep in range(a.reps):
            for shape in (variants if rep % 2 == 0 else variants[::-1]):
                with pod_if(case.client, case.image, True) as pod:
                    one_start(case.client, case.image, "restore", case.model, case.snap, case.layers, pod=pod)
                    evict_all([case.snap])
                    row = one_start(case.client, case.image, "restore+hostwarm", case.model, case.snap, case.layers,
                                    host_warm=shape, pod=pod)
                row = {"size": a.size, "rep": rep, "threads": shape.get("threads", 2), "shape": shape, "cache": "cold-snapshot",
                       "image": case.image, **row}
                f.write(json.dumps(row) + "\n")
                f.flush()
                hw = row.get("host_warm") or {}
                ev = row.get("events") or {}
                print(a.size, rep, json.dumps(shape), row.get("first_token_s"), row.get("restored"),
                      round(hw.get("seconds") or 0, 3), round(ev.get("WEIGHTS_LOADED", 0), 3),
                      round(ev.get("FIRST_TOKEN", 0), 3), flush=True)


if __name__ == "__main__":
    main()
