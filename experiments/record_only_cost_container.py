"""In a container, what does recording the node's profile cost a restore that does not warm?

Since d9de334 a container restore records the node's profile without warming when the node has
none: warmed from the host (the default of `coldstart container restore`: page tables only) or
finding its snapshot all in the page cache (its own warmer skipped). `make demo`'s first container
restore (the snapshot cached by the checkpoint, the node's first digest check) then took 1.34 s
against 1.13 s a session before: different runs. This measures it paired.

Each start: the snapshot read whole into the page cache (the image's files as the starts before
left them), the node's profile removed; the restore container with COLDSTART_WARM_RECORD=auto (the
default: records) or off, interleaved; once as the node's first (its digest record forgotten: the
restore checks every file) and once verified. Methods: restore+hostwarm (the default) and restore
(the entrypoint warms: here it skips, all cached).

    PYTHONPATH=toolkit .venv/bin/python experiments/record_only_cost_container.py --sizes tiny,bench --reps 5 \\
        --out results/spot-checks/record-only-cost-container/raw.jsonl
    PYTHONPATH=toolkit .venv/bin/python experiments/record_only_cost_container.py \\
        --table results/spot-checks/record-only-cost-container/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from coldstart.bench.containers import bench_case, one_start
from coldstart.bench.host import kept_if
from coldstart.pipeline.integrity import NodeRecord
from coldstart.pipeline.manifest import read_manifest
from coldstart.warm import make_warmer
from coldstart.warm.profile import load_profile
from coldstart.warm.snapshot import node_profile

METHODS = ("restore+hostwarm", "restore")
VARIANTS = ("auto", "off")


def table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| model | method | restore | first token, recording (s) | first token, not (s) | paired difference, median (s) | each pair (s) | profile left |")
    print("|---|---|---|---|---|---|---|---|")
    for size in dict.fromkeys(r["size"] for r in rows):
        for m in METHODS:
            for first in (True, False):
                by = {v: {r["rep"]: r for r in rows if r["size"] == size and r["method"] == m
                          and r["first_on_node"] is first and r["record"] == v and r.get("restored")}
                      for v in VARIANTS}
                reps = sorted(set(by["auto"]) & set(by["off"]))
                if not reps:
                    continue
                on = [by["auto"][k]["first_token_s"] for k in reps]
                off = [by["off"][k]["first_token_s"] for k in reps]
                d = [a - b for a, b in zip(on, off)]
                left = sum(by["auto"][k]["profile_recorded"] for k in reps)
                print(f"| {size} | {m} | {'first on node' if first else 'verified'} | {statistics.median(on):.2f} | "
                      f"{statistics.median(off):.2f} | **{statistics.median(d):+.2f}** | "
                      f"{', '.join(f'{x:+.2f}' for x in d)} | {left}/{len(reps)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, help="print the table of this run's rows, run nothing")
    ap.add_argument("--sizes", default="tiny,bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.table:
        return table(a.table)
    if a.out is None:
        ap.error("--out is required to run")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with kept_if(True), a.out.open("a") as f:
        for size in a.sizes.split(","):
            case = bench_case(size, a.work)
            prof = node_profile(case.snap)
            kept = prof.read_bytes() if prof.exists() else None
            files = read_manifest(case.snap).files
            for rep in range(a.reps):
                for m in METHODS:
                    for v in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):
                        for first in (True, False):
                            if first:
                                NodeRecord().forget(case.snap, files)
                            prof.unlink(missing_ok=True)
                            make_warmer([case.snap]).start().wait()  # all of it in the page cache
                            row = one_start(case.client, case.image, m, case.model, case.snap, case.layers,
                                            env={"COLDSTART_WARM_RECORD": v})
                            row = {"size": size, "rep": rep, "method": m, "record": v, "first_on_node": first,
                                   "image": case.image, **row, "profile_recorded": prof.exists()}
                            if prof.exists():  # what the recorder itself cost (meta since 2026-12-05)
                                meta = load_profile(prof).meta
                                row["recorder"] = {k: meta.get(k) for k in ("samples", "seconds", "cpu_s")}
                            f.write(json.dumps(row) + "\n")
                            f.flush()
                            print(size, rep, m, v, "first" if first else "verified", row.get("first_token_s"),
                                  row.get("restored"), row["profile_recorded"], flush=True)
            prof.unlink(missing_ok=True)
            if kept is not None:  # the node's profile as it was
                prof.parent.mkdir(parents=True, exist_ok=True)
                prof.write_bytes(kept)


if __name__ == "__main__":
    main()
