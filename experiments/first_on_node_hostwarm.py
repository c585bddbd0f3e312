"""A node's first container restore of a snapshot, warmed by its own entrypoint or from the host
(`coldstart container restore`'s default): both now record the node's profile (d9de334: the
host-warmed one from the restored tree's page tables). What does each cost the first start, and does
each leave a profile behind?

Each start as `bench container`'s first-on-node start: the node forgets the snapshot (its digest
record and profile), the whole page cache dropped, one restore container; the two variants
interleaved. The row adds what the start left in the node's store (profile_recorded, its ranges,
bytes and sources).

    PYTHONPATH=toolkit .venv/bin/python experiments/first_on_node_hostwarm.py --sizes bench,tiny --reps 4 \\
        --out results/spot-checks/first-on-node-hostwarm/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.bench.host import kept_if
from coldstart.warm.profile import load_profile
from coldstart.warm.snapshot import node_profile

METHODS = ("restore", "restore+hostwarm")


def table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| model | method | first token (s), per start | median | VERIFIED (s), median | profile recorded | ranges / MB, median | sources |")
    print("|---|---|---|---|---|---|---|---|")
    for size in dict.fromkeys(r["size"] for r in rows):
        for m in METHODS:
            mine = [r for r in rows if r["size"] == size and r["method"] == m and r.get("restored")]
            if not mine:
                continue
            ft = [r["first_token_s"] for r in mine]
            ver = [r["events"].get("VERIFIED") for r in mine if r["events"].get("VERIFIED") is not None]
            rec = [r for r in mine if r["profile_recorded"]]
            srcs = sorted({s for r in rec for s in r["profile_sources"]})
            print(f"| {size} | {m} | {', '.join(f'{x:.2f}' for x in ft)} | **{statistics.median(ft):.2f}** | "
                  f"{statistics.median(ver):.2f} | {len(rec)}/{len(mine)} | "
                  f"{statistics.median(r['profile_ranges'] for r in rec):.0f} / "
                  f"{statistics.median(r['profile_bytes'] for r in rec) / 1e6:.0f} | {', '.join(srcs)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, help="print the table of this run's rows, run nothing")
    ap.add_argument("--sizes", default="bench")
    ap.add_argument("--reps", type=int, default=4)
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
            for rep in range(a.reps):
                for m in (METHODS if rep % 2 == 0 else METHODS[::-1]):
                    new_to_node(case.snap)
                    row = one_start(case.client, case.image, m, case.model, case.snap, case.layers)
                    got = {"profile_recorded": prof.exists()}
                    if prof.exists():
                        p = load_profile(prof)
                        got.update(profile_ranges=len(p.ranges), profile_bytes=p.bytes,
                                   profile_sources=sorted({r.source for r in p.ranges}))
                    row = {"size": size, "rep": rep, "method": m, "image": case.image, **row, **got}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(size, rep, m, row.get("first_token_s"), row.get("restored"), got, flush=True)
            if kept is not None:  # the node's profile as it was
                prof.parent.mkdir(parents=True, exist_ok=True)
                prof.write_bytes(kept)


if __name__ == "__main__":
    main()
