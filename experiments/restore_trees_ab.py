"""Host restores of one snapshot by two checkouts of coldstart, alternating: which code restores
faster. `python experiments/restore_trees_ab.py SNAPSHOT REPS [--cold] LABEL=TREE LABEL=TREE...`
(each TREE a checkout whose toolkit/ is put first on PYTHONPATH; the snapshot must fit both: same
venv, same criu). Each restore: `python -m coldstart restore SNAPSHOT --no-serve --timeline-out F`,
its server stopped after; --cold drops the page cache before each. Prints one JSON line per restore: label, round, the timeline's events
(seconds from the entrypoint's exec)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(tree: str, snap: str, cold: bool) -> dict:
    if cold:  # the whole page cache, as after a node's boot
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "tl.jsonl"
        env = {**os.environ, "PYTHONPATH": str(Path(tree) / "toolkit")}
        env.pop("COLDSTART_T0", None)
        p = subprocess.run([sys.executable, "-m", "coldstart", "restore", snap, "--no-serve", "--timeline-out",
                            str(out)], env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0 or not out.exists():
            raise SystemExit(f"restore by {tree} failed: {p.stderr[-2000:]}")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    events = {r["name"]: r["t"] for r in rows}
    pid = next(r["attrs"]["pid"] for r in rows if r["name"] == "READY")
    os.kill(int(pid), signal.SIGTERM)
    for _ in range(100):  # its port and the snapshot's files free again before the next
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    return events


def main() -> None:
    cold = "--cold" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--cold"]
    snap, reps, trees = args[0], int(args[1]), [a.split("=", 1) for a in args[2:]]
    for r in range(reps):
        order = trees if r % 2 == 0 else trees[::-1]
        for label, tree in order:
            print(json.dumps({"label": label, "round": r, "cold": cold, "events": one(tree, snap, cold)}), flush=True)


if __name__ == "__main__":
    main()
