"""What does a restored server's first request cost, and is it the restore's or vLLM's?

In the container benchmark (results/container) the bench model's first completion through the
port came 1.3 s (warm) to 1.9 s (cold) after the entrypoint's own FIRST_TOKEN (the canary), while
the tiny model's came 0.05 s after it. This probe sends one server a fixed sequence of 1-token
completions, one at a time, and records each one's seconds and the page faults the server's process
tree took meanwhile: the canary's prompt, then prompts of other lengths, each twice. It does so for
a restored server (`coldstart restore SNAP --no-serve`, the default options) and for a stock server
of the same model (vLLM's own CPU worker, cold boot), in that order, one at a time.

    .venv/bin/python experiments/first_requests.py --size bench --out results/spot-checks/first-requests/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import psutil

from coldstart.bench.cli import _snapshots
from coldstart.bench.pipeline import kill_restored
from coldstart.bench.serve import _restore, _start_stock
from coldstart.engine.client import EngineClient
from coldstart.engine.launcher import free_port
from coldstart.pipeline.manifest import read_manifest

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of ``pid`` and its descendants so far."""
    mi = ma = 0
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            mi += int(fields[7])
            ma += int(fields[9])
        except (OSError, IndexError, ValueError):
            pass
    return mi, ma


def _sequence(canary: str) -> list[tuple[str, str]]:
    seq = [("canary", canary)] * 2
    for n in (6, 20, 60):
        seq += [(f"{n} words", " ".join(WORDS[i % len(WORDS)] for i in range(n)))] * 2
    return seq


def probe(server: str, url: str, pid: int, canary: str, out) -> None:
    c = EngineClient(url, timeout=600)
    for i, (label, prompt) in enumerate(_sequence(canary)):
        f0 = _faults(pid)
        t0 = time.perf_counter()
        r = c.complete(prompt, max_tokens=1, seed=0)
        secs = time.perf_counter() - t0
        f1 = _faults(pid)
        row = {"server": server, "i": i, "prompt": label, "answer": r.token_ids,
               "seconds": round(secs, 4), "minor_faults": f1[0] - f0[0], "major_faults": f1[1] - f0[1]}
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-serve"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--restore-args", default="", help="extra `coldstart restore` arguments (space-separated)")
    a = ap.parse_args()
    (size, model, snap), = _snapshots(a.size, a.work, print)
    canary = read_manifest(snap).canary.prompt
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        out.write(json.dumps({"host": os.uname().release, "cpus": os.cpu_count(), "size": size}) + "\n")
        pid, url, events = _restore(snap, a.restore_args.split() if a.restore_args else None)
        out.write(json.dumps({"server": "restored", "events": events}) + "\n")
        try:
            probe("restored", url, pid, canary, out)
        finally:
            kill_restored(pid)
        eng, url = _start_stock(model, free_port())
        try:
            probe("stock", url, eng.root_pid, canary, out)
        finally:
            eng.stop(timeout=30)


if __name__ == "__main__":
    main()
