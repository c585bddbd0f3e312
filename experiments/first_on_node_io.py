"""The first restore of a snapshot on a node: the digest check's reads beside the restore's, in the
normal or the idle I/O class.

Why: a node's first restore of a snapshot checks every file's digests before it serves (integrity.py),
reading the whole snapshot beside the restore (results/container-avx512-26: bench 3.20 s from the
create call against 1.26 s for a cold restore with host warming, tiny 1.82 s against 0.94 s). The
warmers read in the idle I/O class because, with mq-deadline on a disk marked rotational, a restore's
small read waited behind bulk reads sorted by sector (docs/warm.md); the check's 8 readers still read
in the normal class.

Each start: the node forgets the snapshot (its verified record and access profile), the page cache is
dropped, one restore container (no host warming; `bench container`'s first-on-node start), timed from
the create call to the first completion through the published port. Variants (the restore container's
environment), interleaved, the order reversed every other round:
  be    the check in the normal class (the default)
  idle  COLDSTART_VERIFY_IOPRIO=idle: the check's readers in the idle class
  off   COLDSTART_VERIFY=off: no check at all (what the restore alone costs on a new node)

Runs against commit 019b3ec, where the switch COLDSTART_VERIFY_IOPRIO existed for this script; since
the next commit the check reads in the normal class and the variable is ignored.

    PYTHONPATH=toolkit .venv/bin/python experiments/first_on_node_io.py --sizes tiny,bench --reps 4 --keep-memory --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.bench.host import kept_if

VARIANTS = {"be": {}, "idle": {"COLDSTART_VERIFY_IOPRIO": "idle"}, "off": {"COLDSTART_VERIFY": "off"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,bench")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--variants", default="be,idle,off")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-memory", action="store_true", help="the VM's free page reporting off (bench.host.memory_kept)")
    a = ap.parse_args()
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with kept_if(a.keep_memory), open(a.out, "w") as out:
        for size in [s.strip() for s in a.sizes.split(",") if s.strip()]:
            c, tag, layers, model, snap = bench_case(size, a.work, say=lambda m: print(m, flush=True))
            for rep in range(a.reps):
                for v in (variants if rep % 2 == 0 else variants[::-1]):
                    new_to_node(snap)
                    row = {"size": size, "variant": v, "rep": rep, "image": tag,
                           **one_start(c, tag, "restore", model, snap, layers, env=VARIANTS[v])}
                    ev, attrs = row.get("events") or {}, row.get("event_attrs") or {}
                    print(json.dumps({"size": size, "variant": v, "rep": rep, "first_token_s": row.get("first_token_s"),
                                      "restore_done": ev.get("RESTORE_DONE"), "server_up": ev.get("SERVER_UP"),
                                      "wake_kv": ev.get("WAKE_KV"), "verified": ev.get("VERIFIED"),
                                      "verify": attrs.get("VERIFIED"),
                                      "read_gib": round((row.get("disk_read_bytes") or 0) / 2**30, 2),
                                      "cpu_s": row.get("cpu_busy_s"), "restored": row.get("restored"),
                                      "error": row.get("error") or row.get("fallback_reason")}), flush=True)
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
