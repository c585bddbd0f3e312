"""Measurements behind docs/engine.md (CPU): server start time, RSS awake vs asleep, the cost of
keeping plain linear weights. Raw jsonl + table.md + COMMAND under results/engine-*/.

    python -m coldstart.engine.measure sleep MODEL_DIR [--out results/engine-sleep] [--reps 1]
    python -m coldstart.engine.measure gemm [--out results/engine-gemm] [--reps 15]
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "the model loads weights from disk and"


def _write(out: Path, rows: list[dict], table: str, argv: list[str]) -> None:
    from coldstart.fsutil import write_results

    write_results(out, rows, table, ".venv/bin/python -m coldstart.engine.measure " + " ".join(argv))


def measure_sleep(model: Path, reps: int, kv_mb: int) -> list[dict]:
    """Start the server (our sleep worker), dump, sleep(2), wake+reload; RSS of worker and tree."""
    import psutil

    from coldstart.engine.launcher import EngineSpec, find_worker_pid, free_port, start_engine

    rows = []
    for rep in range(reps):
        work = Path(tempfile.mkdtemp(prefix="coldstart-measure-"))
        spec = EngineSpec(model=model, run_dir=work / "run", port=free_port(), kv_cache_bytes=kv_mb << 20)
        eng = start_engine(spec)
        rec: dict = {"rep": rep, "model": str(model), "kv_cache_bytes": kv_mb << 20, "host": platform.node()}
        try:
            rec["ready_s"] = round(eng.wait_ready(1800), 2)
            c = spec.client(timeout=900)
            t = time.monotonic()
            ref = c.complete(PROMPT, max_tokens=16, ignore_eos=True)
            rec["first_completion_s"] = round(time.monotonic() - t, 3)
            w = psutil.Process(find_worker_pid(eng))
            rec["weights_bytes"] = c.collective_rpc("coldstart_weights_bytes")[0]
            rec["dump"] = c.collective_rpc("coldstart_dump_weights", args=[str(work / "flat")])[0]
            rec["worker_rss_awake"] = w.memory_info().rss
            rec["tree_rss_awake"] = sum(psutil.Process(p).memory_info().rss for p in eng.pids())
            c.sleep(2)
            rec["worker_rss_asleep"] = w.memory_info().rss
            rec["tree_rss_asleep"] = sum(psutil.Process(p).memory_info().rss for p in eng.pids())
            rec["sleep"] = c.collective_rpc("coldstart_state")[0]["last"]
            c.wake_up(["weights"])
            rec["reload"] = c.collective_rpc("coldstart_reload", args=[str(work / "flat")])[0]
            c.wake_up(["kv_cache"])
            rec["identical_after_reload"] = c.complete(PROMPT, max_tokens=16, ignore_eos=True) == ref
        finally:
            eng.stop()
            shutil.rmtree(work, ignore_errors=True)
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def sleep_table(rows: list[dict]) -> str:
    mib = 2 ** 20

    def med(key):
        return statistics.median(r[key] for r in rows)

    drop = statistics.median(r["worker_rss_awake"] - r["worker_rss_asleep"] for r in rows)
    return "\n".join([
        f"# Sleep level 2 on CPU (our worker), {rows[0]['model']}, {len(rows)} run(s), medians",
        "",
        "| figure | value |",
        "|---|---|",
        f"| server start → /health (s) | {med('ready_s'):.1f} |",
        f"| parameters (MiB) | {med('weights_bytes') / mib:.1f} |",
        f"| KV cache (MiB) | {rows[0]['kv_cache_bytes'] / mib:.0f} |",
        f"| worker RSS awake (MiB) | {med('worker_rss_awake') / mib:.1f} |",
        f"| worker RSS asleep, level 2 (MiB) | {med('worker_rss_asleep') / mib:.1f} |",
        f"| worker RSS drop (MiB) | {drop / mib:.1f} |",
        f"| released by madvise: weights + buffers / KV (MiB) | "
        f"{statistics.median(r['sleep']['weights_released'] for r in rows) / mib:.1f} / "
        f"{statistics.median(r['sleep']['kv_released'] for r in rows) / mib:.1f} |",
        f"| whole tree RSS awake → asleep (MiB) | {med('tree_rss_awake') / mib:.0f} → {med('tree_rss_asleep') / mib:.0f} |",
        f"| reload ({rows[0]['reload'].get('mode', 'copy')} mode; s, GiB/s) | "
        f"{statistics.median(r['reload']['seconds'] for r in rows):.3f}, "
        f"{statistics.median(r['reload'].get('gib_per_s', r['reload'].get('gib_s', 0.0)) for r in rows):.2f} |",
        f"| output identical after reload | {all(r['identical_after_reload'] for r in rows)} |",
        "",
        "CPU-measured on a shared, noisy 2-core VM. Worker RSS from /proc (psutil).",
        "",
    ])


def measure_gemm(reps: int) -> list[dict]:
    """F.linear on the plain weight (what our worker runs) vs vLLM's oneDNN prepacked handle."""
    import torch
    from vllm import _custom_ops as ops

    torch.manual_seed(0)
    rows = []
    for n, k in ((5632, 2048), (2048, 5632), (6144, 2048), (32000, 2048)):
        w = torch.randn(n, k, dtype=torch.bfloat16)
        handle = ops.create_onednn_mm(w.t(), 32)
        for m in (1, 16, 128):
            x = torch.randn(m, k, dtype=torch.bfloat16)
            fns = {"F.linear": lambda: torch.nn.functional.linear(x, w), "oneDNN": lambda: ops.onednn_mm(handle, x, None)}
            times: dict[str, list[float]] = {name: [] for name in fns}
            for f in fns.values():
                f()
            for _ in range(reps):  # interleaved, so load drift hits both alike
                for name, f in fns.items():
                    t = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t)
            row = {"N": n, "K": k, "M": m, **{f"{name}_ms": round(statistics.median(v) * 1e3, 4)
                                               for name, v in times.items()}}
            row["ratio"] = round(row["F.linear_ms"] / row["oneDNN_ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def gemm_table(rows: list[dict]) -> str:
    lines = ["# bf16 GEMM: F.linear on the plain weight (our sleep worker) vs vLLM's oneDNN prepacked weight",
             "", "| N×K (weight) | M (tokens) | F.linear ms | oneDNN ms | F.linear / oneDNN |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['N']}×{r['K']} | {r['M']} | {r['F.linear_ms']:.3f} | {r['oneDNN_ms']:.3f} | {r['ratio']:.2f} |")
    lines += ["", f"Median ratio over all shapes: {statistics.median(r['ratio'] for r in rows):.2f} "
              "(> 1: our worker's GEMM is slower). CPU-measured on a shared, noisy 2-core VM; medians of "
              "interleaved repetitions.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m coldstart.engine.measure")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sleep")
    s.add_argument("model", type=Path)
    s.add_argument("--out", type=Path, default=Path("results/engine-sleep"))
    s.add_argument("--reps", type=int, default=1)
    s.add_argument("--kv-mb", type=int, default=256)
    g = sub.add_parser("gemm")
    g.add_argument("--out", type=Path, default=Path("results/engine-gemm"))
    g.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    if a.what == "sleep":
        rows = measure_sleep(a.model.resolve(), a.reps, a.kv_mb)
        _write(a.out, rows, sleep_table(rows), argv)
    else:
        rows = measure_gemm(a.reps)
        _write(a.out, rows, gemm_table(rows), argv)
    print((a.out / "table.md").read_text())


if __name__ == "__main__":
    main()
