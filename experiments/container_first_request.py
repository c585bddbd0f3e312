"""Why does the bench model's first completion through a container's port come ~1.3 s after the
entrypoint's FIRST_TOKEN (results/container), when outside a container the first request after the
canary costs a forward pass (results/spot-checks/first-requests)?

Warm page cache, one restore container at a time (each after one unmeasured restore of the same
snapshot), in variants of the entrypoint's options that change what it does after its first token:
the default (the rest of the snapshot warmed after the first token), `--warm-rest never`, and
`--no-warm`. For each start: seconds from the create call to the first 1-token completion through
the published port, the entrypoint's events, and a second completion timed right after the first.

    .venv/bin/python experiments/container_first_request.py --size bench --reps 3 \\
        --out results/spot-checks/container-first-request/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from coldstart.bench.containers import bench_case
from coldstart.containers.run import first_completion, summary
from coldstart.containers import run
from coldstart.engine.launcher import free_port

VARIANTS = {"default": [], "warm-rest-never": ["--warm-rest", "never"], "no-warm": ["--no-warm"]}


def one(c, tag: str, snap: Path, model: Path, extra: list[str]) -> dict:
    port = free_port()
    t0, wall0 = time.monotonic(), time.time()
    ctr = run.create_restore(c, tag, snap, model, port, env={"COLDSTART_T0": repr(wall0)}, extra=extra)
    created = time.monotonic() - t0
    try:
        ctr.start()
        started = time.monotonic() - t0
        t1 = first_completion(port, str(model), t0 + 900, ctr)
        t2 = first_completion(port, str(model), t0 + 900, ctr)
        summ = run.with_host_events(summary(ctr, time.monotonic() + 60), created, started)
        ev = summ.get("events") or {}
        return {"first_completion_s": round(t1 - t0, 3), "second_completion_s": round(t2 - t1, 3),
                "gap_after_first_token_s": round(t1 - t0 - ev["FIRST_TOKEN"], 3) if "FIRST_TOKEN" in ev else None,
                "restored": summ.get("restored"), "events": ev}
    finally:
        ctr.remove(force=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, _, model, snap = bench_case(a.size, a.work, say=lambda m: print(m, flush=True))
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        one(c, tag, snap, model, [])  # the first on this node: verifies, records the profile
        for rep in range(a.reps):
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                one(c, tag, snap, model, [])  # warm: whatever ran before, the snapshot is cached now
                row = {"size": a.size, "variant": v, "rep": rep, **one(c, tag, snap, model, VARIANTS[v])}
                print(json.dumps({k: row[k] for k in row if k != "events"}), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
