"""Does the CPU prepack pay for its page faults? The restored worker rebuilds vLLM's packed GEMM
handles at every wake (engine/sleep_worker.prepack_linears): about 0.75 s of a warm bench-model
restore on the AMD host. The handles are fresh allocations, so every 4 KiB page of their 1.25 GiB
is a page fault. This times the same dispatch, on weights of the bench model's shapes, in child
processes with and without glibc's `glibc.malloc.hugetlb=1` tunable (malloc then asks for
transparent huge pages with madvise), interleaved, and counts the faults.

    .venv/bin/python experiments/prepack_thp.py --reps 5 > results/spot-checks/prepack-thp/raw.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# the bench model (models/bench-seed0): 12 layers of qkv, o, gate_up, down; and lm_head
HIDDEN, INTER, LAYERS, VOCAB, QKV = 2048, 5632, 12, 32000, (32 + 2 * 8) * 64
SHAPES = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)] * LAYERS + [(VOCAB, HIDDEN)]


def anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def child(reps: int, threads: int) -> None:
    import torch

    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    torch.manual_seed(0)
    layers = []
    for n, k in SHAPES:
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch.bfloat16) * 0.02, requires_grad=False)
        layers.append(m)
    libc = ctypes.CDLL(None)
    x = torch.randn(4, HIDDEN, dtype=torch.bfloat16)
    for rep in range(reps):
        for m in layers:
            m.cpu_linear = None
        gc.collect()
        libc.malloc_trim(0)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda m: dispatch_cpu_unquantized_gemm(m, False), layers))
        dt = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        t1 = time.perf_counter()
        y = layers[1].cpu_linear(x, layers[1].weight, None)  # one call: the handle works
        call = time.perf_counter() - t1
        print(json.dumps({"rep": rep, "prepack_s": round(dt, 4), "minor_faults": faults,
                          "anon_huge_mib": anon_huge_kib() // 1024, "layers": len(layers),
                          "first_call_s": round(call, 5), "out_ok": bool(torch.isfinite(y).all())}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="children per variant, interleaved")
    ap.add_argument("--inner", type=int, default=3, help="prepacks per child (the first is not a re-pack)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.inner, a.threads)
        return
    host = {"cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
            "cpus": len(os.sched_getaffinity(0)), "kernel": os.uname().release,
            "thp": open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()}
    print(json.dumps({"host": host, "argv": sys.argv[1:]}), flush=True)
    variants = {"default": None, "hugetlb": "glibc.malloc.hugetlb=1"}
    for rep in range(a.reps):
        for name in (list(variants) if rep % 2 == 0 else list(variants)[::-1]):
            env = dict(os.environ)
            env.pop("GLIBC_TUNABLES", None)
            if variants[name]:
                env["GLIBC_TUNABLES"] = variants[name]
            out = subprocess.run([sys.executable, __file__, "--child", "--inner", str(a.inner), "--threads", str(a.threads)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                if line.startswith("{"):
                    print(json.dumps({"variant": name, "child": rep, **json.loads(line)}), flush=True)


if __name__ == "__main__":
    main()
