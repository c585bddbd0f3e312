"""A/B: `coldstart restore --no-serve` of snapshots checkpointed with and without --keep-packed,
alternating, warm (after one unmeasured restore) and cold (page cache dropped; the entrypoint's own
warming). Wall time from the exec of the entrypoint to its exit at READY, and the timeline's
FIRST_TOKEN and weights step. Host-level (no container); the snapshots are made beforehand:

    coldstart checkpoint MODEL --out A --keep-packed; coldstart checkpoint MODEL --out B --no-keep-packed
    .venv/bin/python experiments/keep_packed_ab.py --snap kept=A --snap repack=B --reps 3 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coldstart.warm.residency import drop_caches


def stop_tree(snap: Path) -> None:
    """Kill the restored server: its PID namespace's unshare (--kill-child takes the tree with it)."""
    needle = f"-D {snap}/criu".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if cmd.startswith(b"/usr/bin/unshare") and needle in cmd:
            os.kill(int(pid), signal.SIGKILL)
    time.sleep(1.0)


def restore(snap: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        tl = Path(f.name)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "coldstart", "restore", str(snap), "--no-serve", "--no-fallback",
                        "--timeline-out", str(tl)], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    ev = {}
    for line in tl.read_text().splitlines():
        r = json.loads(line)
        ev[r["name"]] = r
    tl.unlink()
    stop_tree(snap)
    if p.returncode != 0:
        raise SystemExit(f"restore of {snap} failed: {p.stderr.strip().splitlines()[-1:]}")
    w = ev.get("WEIGHTS_LOADED", {})
    return {"wall_s": round(wall, 3), "first_token_s": ev["FIRST_TOKEN"]["t"],
            "weights_step_s": round(w.get("t", 0) - ev["WAKE_WEIGHTS"]["t"], 3),
            "canary_s": round(ev["CANARY_OK"]["t"] - ev["WAKE_KV"]["t"], 3),
            "weights_attrs": w.get("attrs", {}), "events": {k: round(v["t"], 3) for k, v in ev.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snap", action="append", required=True, help="label=snapshot dir")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    snaps = {k: Path(v).resolve() for k, v in (s.split("=", 1) for s in a.snap)}
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "raw.jsonl", "a") as out:
        for rep in range(a.reps):
            for label, snap in snaps.items():
                for cache in ("warm", "cold"):
                    if cache == "warm":
                        restore(snap)  # prewarm, unmeasured
                    else:
                        drop_caches()
                    row = {"snap": label, "cache": cache, "rep": rep, **restore(snap)}
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
