"""What the gate middleware costs a request once open: the same tiny-model server started twice, with
vLLM's dev mode and our gate (every dev-mode server of ours since the control token) and without
either (a cold boot's settings); per server, alternating rounds of 100 GET /v1/models and 10 greedy
16-token completions, each request timed by the client.

    PYTHONPATH=toolkit .venv/bin/python experiments/gate_overhead.py ROUNDS > OUT.txt
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from coldstart.engine.launcher import EngineSpec, free_port, start_engine
from coldstart.models.tiny import cached_model


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    model = cached_model("tiny")
    servers = {}
    for name, dev in (("gate", True), ("plain", False)):
        spec = EngineSpec(model=model, run_dir=Path(tempfile.mkdtemp(prefix="cs-gate-")), port=free_port(),
                          sleep_mode=dev, dev_mode=dev)
        eng = start_engine(spec)
        eng.wait_ready(900)
        servers[name] = (eng, spec.client(timeout=120))
    try:
        res = {n: {"models": [], "complete": []} for n in servers}
        for r in range(rounds):
            for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                c = servers[name][1]
                c.models()  # warm the connection
                res[name]["models"] += timed(c.models, 100)
                res[name]["complete"] += timed(lambda: c.complete("The capital of France is", max_tokens=16), 10)
        print(f"tiny model, {rounds} alternating rounds; medians (ms)")
        for name, d in res.items():
            print(f"{name}: GET /v1/models {statistics.median(d['models']) * 1e3:.3f} (n={len(d['models'])}), "
                  f"16-token completion {statistics.median(d['complete']) * 1e3:.2f} (n={len(d['complete'])})")
    finally:
        for eng, _ in servers.values():
            eng.stop()


if __name__ == "__main__":
    main()
