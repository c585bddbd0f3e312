"""Fewer processes in the snapshot: vLLM-CPU's default layout (API server, EngineCore, a
multiproc-executor Worker: three ~600 MB processes of torch and vLLM state, results/snapshot-anatomy)
against its in-process executor (``--distributed-executor-backend uni`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which vLLM's CPU platform requires for it: the worker runs
inside EngineCore). Both public knobs of vLLM; nothing else changes.

For each layout: checkpoint the model, the CRIU pages' total (the anatomy's "dumped"), then restores
with a dropped page cache: seconds to the first token, CRIU pages mapped in before it
(``pages_mapped_bytes``), bytes read from the disk; and the canary's text and a 64-token greedy
completion of several prompts, which must match across layouts.

    .venv/bin/python experiments/diet_executor.py --model /var/cache/coldstart/models/tiny-seed0 \\
        --work /var/tmp/coldstart-diet --reps 3 --out results/spot-checks/diet-executor/tiny.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.warm import block_device, device_read_bytes

LAYOUTS = {  # (environment, engine args after `--`); an executor named there overrides coldstart's default
    "mp": ({}, ["--distributed-executor-backend", "mp"]),  # vLLM-CPU's default: the multiproc executor
    # coldstart's default since EngineSpec.in_process_worker (it sets VLLM_ENABLE_V1_MULTIPROCESSING=0 too)
    "uni": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["--distributed-executor-backend", "uni"]),
}
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,"]
CLI = [str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "coldstart")]


def _complete(url: str, model: str, prompt: str) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        p = psutil.Process(pid)
        for c in p.children(recursive=True) + [p]:
            c.kill()
    except psutil.NoSuchProcess:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-diet"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layouts", default="mp,uni")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    layouts = [x for x in a.layouts.split(",") if x]
    with open(a.out, "w") as out:
        snaps = {}
        for name in layouts:
            env, args = LAYOUTS[name]
            snap = a.work / name
            shutil.rmtree(snap, ignore_errors=True)
            t0 = time.monotonic()
            p = subprocess.run([*CLI, "checkpoint", str(a.model), "--out", str(snap), "--", *args],
                               env={**os.environ, **env}, capture_output=True, text=True)
            if p.returncode != 0:
                row = {"layout": name, "checkpoint_error": p.stderr.strip()[-800:]}
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
                continue
            pages = sum(f.stat().st_size for f in (snap / "criu").glob("pages-*.img"))
            nproc = len(list((snap / "criu").glob("core-*.img")))
            size = sum(f.stat().st_size for f in snap.rglob("*") if f.is_file())
            row = {"layout": name, "checkpoint_s": round(time.monotonic() - t0, 1), "pages_bytes": pages,
                   "snapshot_bytes": size, "core_images": nproc}
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            snaps[name] = snap
        dev = block_device(a.work)
        for rep in range(a.reps):
            for name in (list(snaps) if rep % 2 == 0 else list(snaps)[::-1]):
                drop_caches()
                r0 = device_read_bytes(dev)
                t0 = time.monotonic()
                tl = a.work / f"timeline-{name}-{rep}.jsonl"
                tl.unlink(missing_ok=True)
                p = subprocess.run([*CLI, "restore", str(snaps[name]), "--no-serve", "--no-fallback",
                                    "--timeline-out", str(tl)], capture_output=True, text=True, timeout=600)
                wall = time.monotonic() - t0
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"url"')]
                summ = json.loads(lines[-1]) if lines else {}
                attrs = {}
                if tl.exists():
                    for ln in tl.read_text().splitlines():
                        e = json.loads(ln)
                        attrs[e["name"]] = e.get("attrs") or {}
                row = {"layout": name, "rep": rep, "wall_s": round(wall, 3), "read_bytes": device_read_bytes(dev) - r0,
                       "restored": summ.get("restored"), "events": summ.get("events"),
                       "pages_mapped_bytes": attrs.get("FIRST_TOKEN", {}).get("pages_mapped_bytes"),
                       "canary_ok": summ.get("canary_ok")}
                if summ.get("url"):
                    if rep == 0:
                        row["completions"] = [_complete(summ["url"], str(a.model), q) for q in PROMPTS]
                    if summ.get("pid"):
                        _kill_tree(int(summ["pid"]))
                else:
                    row["error"] = (p.stderr or p.stdout).strip()[-800:]
                print(json.dumps({k: v for k, v in row.items() if k != "events"}), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
