"""Does the host warmer's kept plan (containers.run.HostPlans) bring a cold container restore's first
token sooner? Before its first read the host warmer works out what to read: the early reader's list
(~850 files looked up through the image's layers) and the bulk reader's plan (~870 files, the node's
0.3 MB profile): 0.15-0.3 s of Python on each of two threads while docker starts the container on
the same two cores, the disk nearly idle meanwhile. From the second container of a (snapshot, image)
pair on, the node keeps both.
Runs against the toolkit of c100670 only (`git checkout c100670 -- toolkit`: containers.run.HostPlans,
removed after: no gain, results/spot-checks/host-plans-kept/README.md).

Cold page cache (the whole cache dropped before each start), restore + host warming, interleaved:
"made" (the node's kept plans removed first: the warmer makes them, as before) and "kept". One
unmeasured restore first if the node has no profile of the snapshot (the first on the node: it
records one), then one unmeasured host warm start (keeps the plans).

    PYTHONPATH=toolkit .venv/bin/python experiments/host_plans_kept.py --sizes bench,tiny --reps 6 \\
        --out results/spot-checks/host-plans-kept/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.state import node_dir
from coldstart.warm.residency import drop_caches
from coldstart.warm.snapshot import node_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="bench")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        for size in a.sizes.split(","):
            case = bench_case(size, a.work)
            prof = node_profile(case.snap)
            if prof is None or not prof.exists():  # (a snapshot just checkpointed is all cached: it records nothing)
                new_to_node(case.snap)
                one_start(case.client, case.image, "restore", case.model, case.snap, case.layers)
            if prof is None or not prof.exists():
                raise SystemExit(f"{case.snap}: the first restore on this node recorded no profile")
            one_start(case.client, case.image, "restore+hostwarm", case.model, case.snap, case.layers)
            for rep in range(a.reps):
                for variant in (("made", "kept") if rep % 2 == 0 else ("kept", "made")):
                    if variant == "made":
                        shutil.rmtree(node_dir() / "host-plans", ignore_errors=True)
                    drop_caches()
                    row = one_start(case.client, case.image, "restore+hostwarm", case.model, case.snap, case.layers)
                    row = {"size": size, "rep": rep, "variant": variant, "image": case.image, **row}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    hw = row.get("host_warm") or {}
                    print(size, rep, variant, row.get("first_token_s"), row.get("restored"), hw.get("plan_kept"),
                          (hw.get("early") or {}).get("kept_list"), flush=True)


if __name__ == "__main__":
    main()
