"""A node's first restore of a snapshot with and without the node's recorded access profile, with and
without the digest check (results/spot-checks/first-on-node-io, profile.jsonl).

Each start as `bench container`'s first-on-node start (the node forgets the snapshot, page cache
dropped, one restore container without host warming), except that the ``prof-`` variants put the
node's recorded profile back first; ``-off``: COLDSTART_VERIFY=off. The first run records the profile
if the node has none. The VM's free page reporting off for the run.

    PYTHONPATH=toolkit .venv/bin/python experiments/first_on_node_profile.py SIZE REPS OUT.jsonl
"""
import json, sys
from pathlib import Path
from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.bench.host import kept_if
from coldstart.warm.snapshot import node_profile
size, reps, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
V = {"noprof-check": (False, {}), "prof-check": (True, {}), "noprof-off": (False, {"COLDSTART_VERIFY": "off"}),
     "prof-off": (True, {"COLDSTART_VERIFY": "off"})}
with kept_if(True), open(out, "w") as f:
    c, tag, layers, model, snap = bench_case(size, Path("/var/tmp/coldstart-bench-container"), say=print)
    prof = node_profile(snap)
    if not prof.exists():
        new_to_node(snap)
        print("recording", one_start(c, tag, "restore", model, snap, layers).get("first_token_s"))
    assert prof and prof.exists(), prof
    saved = prof.read_bytes()
    names = list(V)
    for rep in range(reps):
        for v in (names if rep % 2 == 0 else names[::-1]):
            keep, env = V[v]
            new_to_node(snap)
            if keep:
                prof.parent.mkdir(parents=True, exist_ok=True); prof.write_bytes(saved)
            row = {"size": size, "variant": v, "rep": rep, **one_start(c, tag, "restore", model, snap, layers, env=env)}
            ev = row.get("events") or {}; at = row.get("event_attrs") or {}
            print(json.dumps({"v": v, "ft": row.get("first_token_s"), "RD": ev.get("RESTORE_DONE"), "WK": ev.get("WAKE_KV"),
                              "VER": ev.get("VERIFIED"), "warm": at.get("WARM_START"), "restored": row.get("restored")}), flush=True)
            f.write(json.dumps(row) + "\n")
    prof.write_bytes(saved)
