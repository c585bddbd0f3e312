"""Several replicas restored at once on one host: does libgomp's spin-wait cost them the CPU, and
what would a passive wait cost the serving?

The in-process executor's torch threads use every CPU of each replica, and libgomp spins at each
barrier before it sleeps. Two snapshots of the bench model: checkpointed as is, and with
OMP_WAIT_POLICY=PASSIVE in the checkpoint's environment (the server inherits it; a restored
process keeps the policy it started with). ``conc``: 1 and 4 restores of each started together
(page cache warm), the machine's user and system CPU-seconds over each batch (/proc/stat) and the
slowest first token from exec. ``serve``: each snapshot restored in turn, settled, then vLLM's
serving benchmark (64-token prompts, 128 output tokens; 4 prompts at concurrency 1, 16 at 8),
rounds alternating the order.

    PYTHONPATH=toolkit .venv/bin/python experiments/omp_wait_policy.py conc REPS
    PYTHONPATH=toolkit .venv/bin/python experiments/omp_wait_policy.py serve ROUNDS

VARIANTS=spin,spin10k compares libgomp's default spin with a shorter one (GOMP_SPINCOUNT=10000).
Snapshots under WORK (default /var/tmp/coldstart-omp-wait), made once.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

from coldstart.bench.pipeline import _read, kill_restored, restore_from_exec
from coldstart.bench.serve import _restore, _served_name, _settled, vllm_bench
from coldstart.engine.launcher import free_port
from coldstart.models.tiny import cached_model

WORK = Path(os.environ.get("WORK", "/var/tmp/coldstart-omp-wait"))
VARIANTS = {"spin": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
            "spin10k": {"GOMP_SPINCOUNT": "10000"}}  # libgomp's default spin is 300000 rounds
# which variants a run compares (default: the first two); e.g. VARIANTS=spin,spin10k
CHOSEN = os.environ.get("VARIANTS", "spin,passive").split(",")


def snapshot(variant: str) -> Path:
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    out = WORK / f"bench-{variant}"
    if not (out / "manifest.json").exists():
        with mock.patch.dict(os.environ, VARIANTS[variant]):  # the server inherits the checkpoint's environment
            checkpoint(CheckpointOptions(model=cached_model("bench"), out=out, port=free_port()), say=lambda s: None)
    return out


def _stat() -> dict[str, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"user": v[0] + v[1], "system": v[2] + v[5] + v[6]}


def conc(reps: int) -> None:
    snaps = {v: snapshot(v) for v in CHOSEN}
    for rep in range(reps):
        for v, snap in (snaps.items() if rep % 2 == 0 else reversed(snaps.items())):
            for n in (1, 4):
                _read(p for p in snap.rglob("*") if p.is_file())
                s0 = _stat()
                with ThreadPoolExecutor(n) as pool:
                    got = list(pool.map(lambda i: restore_from_exec(snap), range(n)))
                s1 = _stat()
                tck = os.sysconf("SC_CLK_TCK")
                print(json.dumps({"part": "conc", "variant": v, "n": n, "rep": rep,
                                  "slowest_s": max(r["first_token_from_exec_s"] or 0 for r in got),
                                  "restored": sum(bool(r["restored"]) for r in got),
                                  **{f"{k}_cpu_s": round((s1[k] - s0[k]) / tck, 2) for k in s0}}), flush=True)


def serve(rounds: int) -> None:
    snaps = {v: snapshot(v) for v in CHOSEN}
    model = cached_model("bench")
    work = Path(tempfile.mkdtemp(prefix="omp-serve-"))
    for rnd in range(rounds):
        for v in (list(snaps) if rnd % 2 == 0 else list(snaps)[::-1]):
            pid, url, _ = _restore(snaps[v])
            try:
                _settled(url)
                name = _served_name(url)
                for c, n in ((1, 4), (8, 16)):
                    r = vllm_bench(url, name, model, c, n, 64, 128, work / f"{v}-{rnd}-{c}.json")
                    print(json.dumps({"part": "serve", "variant": v, "round": rnd, "concurrency": c,
                                      "output_tok_s": round(r["output_throughput"], 2),
                                      "median_tpot_ms": round(r["median_tpot_ms"], 2)}), flush=True)
            finally:
                kill_restored(pid)
        time.sleep(1)


if __name__ == "__main__":
    {"conc": conc, "serve": serve}[sys.argv[1]](int(sys.argv[2]))
