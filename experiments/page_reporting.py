"""Cold container restores with the VM's free page reporting on, then off (bench.host.memory_kept):
does the memory a dropped page cache hands back to the hypervisor slow the restore that follows?

    PYTHONPATH=toolkit .venv/bin/python experiments/page_reporting.py IMAGE SIZE REPS > OUT.jsonl

IMAGE's `bench container` snapshot of SIZE (made when missing). REPS cold starts with host warming
(page cache dropped before each) with the reporting as the VM has it, then REPS with it off and the
free memory touched once; the setting is put back at the end. Per start: first token and the
canary's phase (WAKE_KV to VERIFIED) from the create call, the host warmer's seconds, the CPU ticks
of the whole host by kind (/proc/stat) and the KiB the guest reported meanwhile. Needs root, our
dockerd and a kernel with page reporting."""
import json
import statistics
import sys
from pathlib import Path

from coldstart.bench import containers as bc
from coldstart.bench import host
from coldstart.warm.residency import drop_caches
from coldstart.containers import docker_api

image, size, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = docker_api.client(None)
layers = docker_api.image_layers(c, image)
model, snap = bc.snapshot_in_container(c, image, size, Path("/var/tmp/coldstart-bench-container"))
KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def ticks() -> dict:
    with open("/proc/stat") as f:
        return dict(zip(KINDS, (int(x) for x in f.readline().split()[1:9])))


def block(reporting: str) -> list[dict]:
    rows = []
    for rep in range(reps):
        drop_caches()
        t0, r0 = ticks(), host.page_reporting()
        r = bc.one_start(c, image, "restore+hostwarm", model, snap, layers)
        t1, r1 = ticks(), host.page_reporting()
        ev = r.get("events") or {}
        row = {"reporting": reporting, "rep": rep, "first_token_s": r.get("first_token_s"),
               "canary_s": round(ev["VERIFIED"] - ev["WAKE_KV"], 3) if "VERIFIED" in ev and "WAKE_KV" in ev else None,
               "host_warm_s": round((r.get("host_warm") or {}).get("seconds") or 0, 3), "restored": r.get("restored"),
               "reported_kib": r1["reported_kib"] - r0["reported_kib"], **{k: t1[k] - t0[k] for k in KINDS}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


before = host.page_reporting()
if before is None:
    sys.exit("this kernel has no free page reporting")
rows = block(f"as found (order {before['order']})")
with host.memory_kept(say=lambda m: print(m, file=sys.stderr)):
    rows += block("off, memory touched")
for name in dict.fromkeys(r["reporting"] for r in rows):
    rs = [r for r in rows if r["reporting"] == name]
    print(json.dumps({"summary": name, **{k: statistics.median(r[k] for r in rs)
                                            for k in ("first_token_s", "canary_s", "user", "system", "reported_kib")}}))
