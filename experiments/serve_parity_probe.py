"""Where does a restored server's decode time go? A quick probe beside `coldstart bench serve`.

Three servers of one model up at once: stock (vLLM's CPU worker, cold boot), ours-cold (coldstart's
sleep worker, cold boot: vLLM's loader, weights in anonymous memory, never checkpointed) and restored
(`coldstart restore SNAP`, weights mapped from the flat file). In rounds, each server in rotated
order decodes the same greedy request (fixed length, ignore-eos); seconds per request. Then
ours-cold reloads with ``map`` and restored with ``copy`` (a sleep/wake/reload cycle each) and the
rounds repeat: the 2×2 tells the worker's cost, the restore's cost and the mapping's cost apart.

    .venv/bin/python experiments/serve_parity_probe.py SNAPSHOT MODEL --rounds 4 --tokens 64 --out FILE.jsonl
    .venv/bin/python experiments/serve_parity_probe.py SNAPSHOT MODEL --rounds 4 --tokens 1 --prompt-words 60 ...
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from coldstart.bench.pipeline import kill_restored
from coldstart.bench.serve import _cycle, _restore
from coldstart.engine.client import EngineClient
from coldstart.engine.launcher import EngineSpec, free_port, start_engine

PROMPT = "The capital of France is"


def _cold(model: Path, ours: bool):
    spec = EngineSpec(model=model, run_dir=Path(tempfile.mkdtemp(prefix="coldstart-probe-")), port=free_port(),
                      sleep_mode=ours, **({} if ours else {"worker_cls": ""}))
    eng = start_engine(spec, new_pidns=True)
    eng.wait_ready(1800)
    return eng, spec.base_url


def _streamed(url: str, prompt: str, tokens: int) -> tuple[int, list[float]]:
    """One streamed greedy completion (as vLLM's serving benchmark asks for it): chunks and the
    gaps between them (seconds; the first is the time to the first chunk)."""
    import requests

    c = EngineClient(url)
    body = {"model": c.model(), "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    gaps, last, n = [], time.perf_counter(), 0
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                now = time.perf_counter()
                gaps.append(now - last)
                last, n = now, n + 1
    return n, gaps


def _rounds(urls: dict[str, str], rounds: int, tokens: int, phase: str, out, prompt: str = PROMPT,
            stream: bool = False) -> None:
    names = list(urls)
    for rnd in range(rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            c = EngineClient(urls[name], timeout=600)
            t0 = time.perf_counter()
            if stream:
                n, gaps = _streamed(urls[name], prompt, tokens)
                row = {"phase": phase, "server": name, "round": rnd, "tokens": n, "stream": True,
                       "seconds": round(time.perf_counter() - t0, 4), "first_s": round(gaps[0], 4) if gaps else None,
                       "median_gap_s": round(statistics.median(gaps[1:]), 5) if len(gaps) > 1 else None}
            else:
                ids = c.complete(prompt, max_tokens=tokens, ignore_eos=True).token_ids
                row = {"phase": phase, "server": name, "round": rnd, "tokens": len(ids),
                       "seconds": round(time.perf_counter() - t0, 4), "ids_head": ids[:8]}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=0,
                    help="a prompt of this many words instead of the short one (prefill-heavy with --tokens 1)")
    ap.add_argument("--stream", action="store_true", help="stream the answers (SSE, as vLLM's serving benchmark does)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    prompt = " ".join(["The capital of France is Paris and"] * max(1, a.prompt_words // 6)) if a.prompt_words else PROMPT
    engines, pid = [], None
    try:
        stock, stock_url = _cold(a.model, ours=False)
        engines.append(stock)
        ours, ours_url = _cold(a.model, ours=True)
        engines.append(ours)
        pid, rest_url, _ = _restore(a.snapshot)
        urls = {"stock": stock_url, "ours-cold": ours_url, "restored": rest_url}
        with a.out.open("w") as out:
            _rounds(urls, a.rounds, a.tokens, "as started", out, prompt, a.stream)
            info = {"ours-cold": _cycle(ours_url, a.snapshot, mode="map"),
                    "restored": _cycle(rest_url, a.snapshot, mode="copy")}
            out.write(json.dumps({"cycles": {k: {x: v.get(x) for x in ("mode", "seconds")} for k, v in info.items()}})
                      + "\n")
            _rounds(urls, a.rounds, a.tokens, "after cycle (ours-cold: map, restored: copy)", out, prompt, a.stream)
    finally:
        for e in engines:
            e.stop(timeout=30)
        if pid is not None:
            kill_restored(pid)
    rows = [json.loads(x) for x in a.out.read_text().splitlines()]
    for phase in dict.fromkeys(r["phase"] for r in rows if "phase" in r):
        by = {}
        for r in rows:
            if r.get("phase") == phase:
                by.setdefault(r["server"], []).append(r["seconds"])
        base = statistics.median(by["stock"])
        print(phase + ": " + "; ".join(f"{k} {statistics.median(v):.3f} s ({base / statistics.median(v):.3f}× stock's "
                                       "speed)" for k, v in by.items()))


if __name__ == "__main__":
    main()
