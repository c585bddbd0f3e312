"""Is the forward pass after a cold map reload slower only once, or for as long as the weights stay
mapped? (results/spot-checks/first-pass-after-map)

    .venv/bin/python experiments/first_pass_after_map.py ROUNDS [CELLS] > raw.jsonl

One sleep-mode server of the bench model (as `coldstart bench reload` starts it). Per round, each
cell in rotated order: sleep(2) -> wake weights -> evict (cold) or read (warm) the flat file ->
coldstart_reload(mode) -> wake KV -> three 8-token greedy completions in a row, each timed, with the minor page faults of the
server's processes during it; a
``+settle`` cell then copies the mapped weights into anonymous memory (coldstart_settle, as a
restore does after its first token) and times three more. One JSON line per cell.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from coldstart.bench.pipeline import _model, _read, served_with_flat
from coldstart.warm.residency import evict_all

CELLS = [("copy", "cold"), ("map", "cold"), ("map+settle", "cold"), ("copy", "warm"), ("map", "warm")]
if len(sys.argv) > 2:  # a subset, e.g. "copy:warm,map:warm"
    CELLS = [tuple(x.split(":")) for x in sys.argv[2].split(",")]
PROMPT = "The capital of France is"


def minor_faults(pids: list[int]) -> int:
    """Minor page faults of the server's processes so far (/proc/PID/stat's minflt)."""
    n = 0
    for pid in pids:
        try:
            n += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
        except OSError:
            pass
    return n


def completions(c, pids: list[int], n: int = 3) -> list[list[float]]:
    """[seconds, minor faults] of ``n`` 8-token completions in a row."""
    out = []
    for _ in range(n):
        f0, t = minor_faults(pids), time.perf_counter()
        c.complete(PROMPT, max_tokens=8)
        out.append([round(time.perf_counter() - t, 4), minor_faults(pids) - f0])
    return out


def main(rounds: int) -> None:
    import shutil

    import psutil

    work = Path("/var/tmp/coldstart-first-pass")
    shutil.rmtree(work, ignore_errors=True)  # (served_with_flat dumps the weights anew)
    eng, c, canary, flat = served_with_flat(_model("bench"), work)
    files = [flat / "weights.flat"]
    root = psutil.Process(eng.root_pid)
    pids = [root.pid] + [p.pid for p in root.children(recursive=True)]
    try:
        for r in range(rounds):
            for k in range(len(CELLS)):
                mode, cache = CELLS[(k + r) % len(CELLS)]
                c.sleep(level=2)
                c.wake_up(["weights"])
                evict_all(files) if cache == "cold" else _read(files)
                t = time.perf_counter()
                res = c.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": mode.split("+")[0],
                                                                   "packed": False})[0]
                reload_s = time.perf_counter() - t
                c.wake_up(["kv_cache"])
                row = {"round": r, "mode": mode, "cache": cache, "reload_s": round(reload_s, 4),
                       "got": res.get("mode"), "after": completions(c, pids)}
                if mode.endswith("+settle"):
                    t = time.perf_counter()
                    c.collective_rpc("coldstart_settle")
                    while c.collective_rpc("coldstart_state")[0].get("settle", {}).get("state") == "running":
                        time.sleep(0.05)
                    row["settle_s"] = round(time.perf_counter() - t, 4)
                    row["after_settle"] = completions(c, pids)
                print(json.dumps(row), flush=True)
    finally:
        eng.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
