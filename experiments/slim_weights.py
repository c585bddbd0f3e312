"""A kept-handles snapshot with and without the plain copy of the weights only the handles read.

With the packed GEMM handles kept through the checkpoint, a snapshot held the linear weights twice:
packed in the CRIU image and plain in the flat weights file. `coldstart checkpoint` now leaves the
plain copy out by default (--slim-weights; --full-weights keeps it). For one model, both in one run:
the snapshot on disk (allocated bytes), the artifact as `coldstart push` would store it (zstd packs,
registry.artifact.build_index: no registry needed), the chunks a lazy restore prefetches first; then
a host restore of each, warm, giving 64 greedy tokens for 4 prompts (the same answers from both, and
after one sleep(2) / wake / reload cycle of the slim one), with the restore's first token and the
cycle's reload.

    .venv/bin/python experiments/slim_weights.py --model /var/cache/coldstart/models/bench-seed0 \\
        --work /var/tmp/coldstart-slim --out results/spot-checks/slim-weights/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

PROMPTS = ("The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,")


def allocated(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="where the two snapshots are written (replaced)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint, reload_weights
    from coldstart.pipeline.restore import RestoreOptions, restore
    from coldstart.registry.artifact import build_index, shipped_profile

    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        rows.append(row)

    emit({"host": platform.node(), "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                                                 if ln.startswith("model name")), "?"),
          "cpus": os.cpu_count(), "kernel": platform.release(), "model": a.model.name})
    snaps = {}
    for variant in ("full", "slim"):
        out = a.work / variant
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        m, _ = checkpoint(CheckpointOptions(model=a.model, out=out, keep_packed=True,
                                            slim_weights=variant == "slim"), say=lambda s: None)
        snaps[variant] = (out, m)
        ix = build_index(out, extra=shipped_profile(out), compress="zstd")
        flat = out / m.weights["flat"]
        emit({"variant": variant, "checkpoint_s": round(time.monotonic() - t0, 1),
              "kept_linears": m.weights.get("kept_linears"), "omitted": m.weights.get("omitted", 0),
              "omitted_bytes": m.weights.get("omitted_bytes", 0), "layout_child_bytes": (m.layout or {}).get("child_bytes"),
              "disk_bytes": allocated(out), "weights_file_bytes": flat.stat().st_size,
              "weights_file_disk_bytes": flat.stat().st_blocks * 512,
              "packs_bytes": ix.bytes, "profiled_stored_bytes": sum(c.stored for c in ix.chunks[:ix.profiled])})
    answers = {}
    for variant, (snap, m) in snaps.items():
        restore(RestoreOptions(snapshot=snap, fallback=False), say=lambda s: None).stop()  # caches warm
        res = restore(RestoreOptions(snapshot=snap, fallback=False), say=lambda s: None)
        try:
            c = res.client(timeout=600)
            got = [c.complete(p, max_tokens=a.tokens, seed=0).token_ids for p in PROMPTS]
            answers[variant] = got
            ev = {e.name: e for e in res.timeline.events}
            row = {"variant": variant, "restored": res.restored, "canary_ok": res.canary_ok,
                   "first_token_s": ev["FIRST_TOKEN"].t if "FIRST_TOKEN" in ev else None,
                   "weights_loaded": ev["WEIGHTS_LOADED"].attrs if "WEIGHTS_LOADED" in ev else None,
                   "tokens": [len(t) for t in got]}
            if variant == "slim":
                t0 = time.monotonic()
                c.sleep(level=2)
                st = c.collective_rpc("coldstart_state")[0]
                c.wake_up(["weights"])
                r = reload_weights(c, snap, m.weights)[0]
                c.wake_up(["kv_cache"])
                row["cycle"] = {"seconds": round(time.monotonic() - t0, 3), "rss_asleep": st["rss"],
                                "kept_linears": st["last"]["kept_linears"],
                                "reload": {k: r.get(k) for k in ("mode", "packed_kept", "handles_only", "prepacked_linears",
                                                                 "populated_bytes", "seconds_rpc")}}
                row["cycle_same_answers"] = [c.complete(p, max_tokens=a.tokens, seed=0).token_ids
                                             for p in PROMPTS] == got
            emit(row)
        finally:
            res.stop()
    emit({"same_answers_full_slim": answers.get("full") == answers.get("slim")})
    with open(a.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
