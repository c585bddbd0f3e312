"""Does a head start on the bulk reads bring a cold container restore's first token sooner? Over a
cold start with host warming the disk reads 0.4-0.6 GiB/s for its first 0.5 s (the early reader's
small files, docker's start; the bulk reader is still making its plan: ~870 files through the
image's layers), then 1.1-1.5 GiB/s until the host warmer is through, and the bench model's first
token follows the last of the packed weights. ``head`` (containers.run.HostWarm): a third reader
that reads the hot child's page file (the packed weights, 1.27 GB for bench) whole from the create
call, in the idle I/O class, before the plan exists.

The first runs used the toolkit of 07ba8ca (`git checkout 07ba8ca -- toolkit`: ``--head ahead`` or
``exact``); since then HostWarm's ``head`` is "auto" by default (on only where the node holds the
image's files) and ``--head off`` / ``on`` compare the default against it
(results/spot-checks/host-warm-head/README.md).

Whole page cache dropped before each start, restore + host warming, the two variants interleaved
(order turned around every repetition), in a pod's network namespace (what kubelet runs).

    PYTHONPATH=toolkit .venv/bin/python experiments/host_warm_head.py --sizes bench,tiny --reps 5 \\
        --out results/spot-checks/host-warm-head/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start, pod_if
from coldstart.bench.host import memory_kept
from coldstart.warm.residency import drop_caches
from coldstart.warm.snapshot import node_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--head", default="on", help="HostWarm's head against its default: on | off | auto; at 07ba8ca "
                    "ahead (sendfile, the kernel's readahead) or exact (1 MiB at a time)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f, memory_kept():  # (as bench container --keep-memory)
        for size in a.sizes.split(","):
            case = bench_case(size, a.work)
            prof = node_profile(case.snap)
            if prof is None or not prof.exists():  # the first restore on the node records the profile
                new_to_node(case.snap)
                one_start(case.client, case.image, "restore", case.model, case.snap, case.layers)
            for rep in range(a.reps):
                for variant in (("default", "head") if rep % 2 == 0 else ("head", "default")):
                    with pod_if(case.client, case.image, True) as pod:
                        drop_caches()
                        row = one_start(case.client, case.image, "restore+hostwarm", case.model, case.snap,
                                        case.layers, host_warm={"head": a.head} if variant == "head" else None, pod=pod)
                    row = {"size": size, "rep": rep, "variant": variant if variant == "default" else f"head-{a.head}", "image": case.image, **row}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    ev = row.get("events") or {}
                    print(size, rep, variant, row.get("first_token_s"), row.get("restored"),
                          {k: ev.get(k) for k in ("CONTAINER_STARTED", "ENTRY_READY", "RESTORE_DONE", "WEIGHTS_LOADED",
                                                  "FIRST_TOKEN")},
                          (row.get("host_warm") or {}).get("head"), flush=True)


if __name__ == "__main__":
    main()
