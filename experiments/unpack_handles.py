"""Can a node get the plain linear weights back from vLLM's packed oneDNN handles, exactly and fast?

Why: with the packed GEMM handles kept through the checkpoint (docs/engine.md), the bench model's
artifact holds its linear weights twice, packed in the CRIU image and plain in the flat weights
file, which only a later sleep/wake cycle or a weights dump reads (README, "Snapshot diet": -36%
instead of halved). If the plain weights can be rebuilt from the handles, the artifact need not
carry them. A GEMM against the identity does it: I @ W^T = W^T, each output one weight times 1.0
plus zeros, exact in bf16 with any accumulation.

For every linear layer shape of the bench model as vLLM builds it (merged qkv and gate_up, the
LM head), random bf16 weights: pack (ops.create_onednn_mm, as vLLM's CPU dispatch does), rebuild
with ops.onednn_mm against row blocks of the identity, compare bit for bit, time both.

    .venv/bin/python experiments/unpack_handles.py --out results/spot-checks/unpack-handles/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

# (out_features, in_features) per layer of the bench model (hidden 2048, intermediate 5632, 32 heads,
# 8 KV heads of 64, 12 layers, vocab 32000), as vLLM merges them; then the LM head
LAYER = [("qkv_proj", 3072, 2048), ("o_proj", 2048, 2048), ("gate_up_proj", 11264, 2048), ("down_proj", 2048, 5632)]
LAYERS = 12
HEAD = ("lm_head", 32000, 2048)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=512, help="rows of the identity per GEMM")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from vllm import _custom_ops as ops

    from coldstart.engine import xstate

    xstate.ask_amx()
    torch.manual_seed(0)
    shapes = LAYER * LAYERS + [HEAD]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    total = {"bytes": 0, "pack_s": 0.0, "unpack_s": 0.0, "exact": 0, "layers": 0}
    eyes: dict[int, torch.Tensor] = {}
    with open(a.out, "w") as out:
        for name, n, k in shapes:
            w = torch.randn(n, k, dtype=torch.bfloat16)
            t = time.perf_counter()
            h = ops.create_onednn_mm(w.t(), 32)
            pack_s = time.perf_counter() - t
            eye = eyes.setdefault(k, torch.eye(k, dtype=torch.bfloat16))
            t = time.perf_counter()
            back = torch.cat([ops.onednn_mm(h, eye[i:i + a.block], None) for i in range(0, k, a.block)])
            unpack_s = time.perf_counter() - t
            exact = torch.equal(back, w.t())
            row = {"layer": name, "out": n, "in": k, "bytes": w.numel() * 2, "pack_s": round(pack_s, 4),
                   "unpack_s": round(unpack_s, 4), "exact": exact}
            out.write(json.dumps(row) + "\n")
            total["bytes"] += row["bytes"]
            total["pack_s"] += pack_s
            total["unpack_s"] += unpack_s
            total["exact"] += int(exact)
            total["layers"] += 1
            del w, h, back
        total = {**total, "pack_s": round(total["pack_s"], 3), "unpack_s": round(total["unpack_s"], 3),
                 "threads": torch.get_num_threads(),
                 "unpack_gib_s": round(total["bytes"] / 2**30 / total["unpack_s"], 3) if total["unpack_s"] else None}
        out.write(json.dumps({"total": total}) + "\n")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
