"""The first restore of a snapshot on a node: what its digest check costs, and in which order and
with how many readers it should read.

Why: a restore checks the digests of every file this node has not verified (integrity.py), and the
first one on a node verifies them all before it serves: results/container-intel-7 put the bench
model's first start at 4.78 s against 1.29 s warm and 1.69-2.17 s cold for the later ones, its
VERIFIED event 3.6 s after the create call. The check read the files in group order (CRIU's
metadata, then the rest) but, inside a group, smallest first, so the parent images (mapped lazily,
mostly never touched) came before the hot child's pages the restore needs first, with 2 readers.

Each start: the node's record of the snapshot forgotten, its access profile deleted, the page
cache dropped, then one restore container (no host warming), as `coldstart bench container`'s
first-on-node start. Variants (the restore container's environment): ORDER:THREADS, ORDER ``size``
(the old order) or ``restore`` (metadata, then what the restore reads in bulk, then the rest).
Runs against commit f796a47: CS_VERIFY_ORDER and CS_VERIFY_THREADS existed there for this script;
since the next commit the restore's order and 8 readers are fixed and the variables are ignored.

    .venv/bin/python experiments/first_on_node.py --reps 4 --variants size:2,restore:2,restore:4 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.warm.snapshot import node_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="size:2,restore:2,restore:4")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work, say=lambda m: print(m, flush=True))
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        for rep in range(a.reps):
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                order, threads = v.split(":")
                new_to_node(snap)
                row = {"size": a.size, "variant": v, "rep": rep,
                       **one_start(c, tag, "restore", model, snap, layers,
                                   env={"CS_VERIFY_ORDER": order, "CS_VERIFY_THREADS": threads})}
                prof = node_profile(snap)
                row["profile_meta"] = json.loads(prof.read_text()).get("meta", {}) if prof else {}
                ev, attrs = row.get("events") or {}, row.get("event_attrs") or {}
                print(json.dumps({"variant": v, "rep": rep, "first_token_s": row.get("first_token_s"),
                                  "verified": ev.get("VERIFIED"), "verify_s": (attrs.get("VERIFIED") or {}).get("seconds"),
                                  "restore_done": ev.get("RESTORE_DONE"), "wake_kv": ev.get("WAKE_KV"),
                                  "read_gib": round((row.get("disk_read_bytes") or 0) / 2**30, 2),
                                  "cpu_s": row.get("cpu_busy_s"), "restored": row.get("restored"),
                                  "profile": row["profile_meta"],
                                  "error": row.get("error") or row.get("fallback_reason")}), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
