"""Does the canary's answer stay within its tolerance when a client's request shares its forward pass?

A restore could let the requests its closed gate holds into the engine beside the canary (their
answers held until the canary passes), so that the first client's answer comes with the canary's
instead of one forward pass after it. That is only safe if the canary's logprobs do not move with
what it is batched with. This starts a server of MODEL, records the canary alone, then, with the
scheduler paused (vLLM's /pause?mode=keep), queues the canary beside a client's request of several
prompt lengths, resumes, and compares.

    PYTHONPATH=toolkit .venv/bin/python experiments/canary_batched.py MODEL [--reps N] > out.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from coldstart.engine.client import EngineClient
from coldstart.engine.launcher import EngineSpec, start_engine
from coldstart.netutil import free_port
from coldstart.pipeline.canary import _max_diff
from coldstart.pipeline.checkpoint import DEFAULT_CANARY

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls watch from the old oak tree".split()


def prompt_of(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/canary-batched"))
    a = ap.parse_args()
    port = free_port()
    spec = EngineSpec(device="cpu", model=a.model.resolve(), run_dir=a.run_dir, port=port,
                      kv_cache_bytes=256 << 20, sleep_mode=True, load_format=None, extra_args=[])
    eng = start_engine(spec, new_pidns=True)
    try:
        print(json.dumps({"ready_s": round(eng.wait_ready(900), 1)}), flush=True)
        c = EngineClient(spec.base_url, token=spec.control_token)
        ref = c.score(DEFAULT_CANARY)
        for _ in range(2):
            again = c.score(DEFAULT_CANARY)
            print(json.dumps({"case": "alone", "diff": max(_max_diff(again.prompt_logprobs, ref.prompt_logprobs),
                                                           _max_diff(again.token_logprobs, ref.token_logprobs))}),
                  flush=True)
        users = {"same": DEFAULT_CANARY, "short": "Once upon a time",
                 "w50": prompt_of(50), "w200": prompt_of(200), "w500": prompt_of(500)}
        for rep in range(a.reps):
            for name, prompt in users.items():
                for paused in (True, False):
                    out: dict = {}

                    def user() -> None:
                        try:
                            c.complete(prompt, max_tokens=4)
                        except Exception as e:  # noqa: BLE001
                            out["user_error"] = str(e)[:200]
                        out["user_s"] = time.monotonic() - t0

                    def canary() -> None:
                        out["canary"] = c.score(DEFAULT_CANARY)
                        out["canary_s"] = time.monotonic() - t0

                    if paused:
                        c._req("POST", "/pause", params={"mode": "keep", "clear_cache": "false"})
                    t0 = time.monotonic()
                    ts = [threading.Thread(target=user), threading.Thread(target=canary)]
                    for t in ts:
                        t.start()
                    if paused:
                        time.sleep(0.3)
                        t0 = time.monotonic()
                        c._req("POST", "/resume")
                    for t in ts:
                        t.join()
                    got = out["canary"]
                    d = max(_max_diff(got.prompt_logprobs, ref.prompt_logprobs),
                            _max_diff(got.token_logprobs, ref.token_logprobs))
                    print(json.dumps({"case": name, "paused": paused, "rep": rep, "diff": d,
                                      "same_token": got.token_ids == ref.token_ids,
                                      "user_s": round(out["user_s"], 3), "canary_s": round(out["canary_s"], 3),
                                      **({"user_error": out["user_error"]} if "user_error" in out else {})}),
                          flush=True)
    finally:
        eng.stop()


if __name__ == "__main__":
    sys.exit(main())
