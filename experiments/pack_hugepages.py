"""Does backing the packed GEMM handles with huge pages make vLLM's oneDNN packing cheaper?

Why: on a host whose disk reads faster than the CPUs pack (AMD EPYC Zen 5, 2026-11-29), a cold
weight reload is bound by the packing (results/reload-avx512-2), and the packing faults in one fresh
4 KiB page per 4 KiB of handle it writes. glibc's ``glibc.malloc.hugetlb=1`` tunable asks for
transparent huge pages for malloc's mappings, which would fault 2 MiB at a time.

Each variant runs in a fresh process (the tunable is read at start): four bench-model-shaped bf16
weights packed with vLLM's ``create_onednn_mm``, three rounds of (handles freed and the heap trimmed
before, as a sleep leaves it; freed without a trim), one packing thread. The first round is the case
a reload after a restore meets: the process has not packed before.

Usage: PYTHONPATH=toolkit .venv/bin/python experiments/pack_hugepages.py OUT_DIR
Writes OUT_DIR/raw.jsonl and prints it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import ctypes, json, resource, time
import torch
import vllm._custom_ops as ops
torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")
shapes = [(11264, 2048), (2048, 5632), (3072, 2048), (2048, 2048)]  # bench: gate_up, down, qkv, o
ws = [torch.randn(n, k).to(torch.bfloat16) for n, k in shapes]
nbytes = sum(w.numel() * 2 for w in ws)
for rnd in range(3):
    for trimmed in (True, False):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t, c = time.perf_counter(), time.process_time()
        hs = [ops.create_onednn_mm(w.t(), 32) for w in ws]
        print(json.dumps({"round": rnd, "trimmed_before": trimmed, "bytes": nbytes,
                          "seconds": round(time.perf_counter() - t, 4), "cpu_s": round(time.process_time() - c, 4),
                          "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}), flush=True)
        del hs
        if trimmed:
            libc.malloc_trim(0)
"""


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant, tunables in (("4k", None), ("hugetlb", "glibc.malloc.hugetlb=1"),
                              ("4k", None), ("hugetlb", "glibc.malloc.hugetlb=1")):
        env = dict(os.environ)
        env.pop("GLIBC_TUNABLES", None)
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
        for line in res.stdout.splitlines():
            if line.startswith("{"):
                rows.append({"variant": variant, **json.loads(line)})
    with open(out / "raw.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
            print(json.dumps(r))


if __name__ == "__main__":
    main()
