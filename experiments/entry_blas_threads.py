"""The restore entrypoint with numpy's OpenBLAS at one thread (coldstart.warm's import) against
OpenBLAS's default of one thread per CPU: CPU seconds the entrypoint and the children it waits for
used, and first token from exec. Warm page cache, the variants alternated.

``openblas-default`` sets OPENBLAS_NUM_THREADS to the CPU count in the entrypoint's environment,
which is what OpenBLAS picks unset (coldstart.warm leaves a variable already set alone); the
restored server keeps the environment it was dumped with either way.

    cd experiments && ../.venv/bin/python entry_blas_threads.py SNAPSHOT --reps 8 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
from pathlib import Path

from coldstart.bench.pipeline import restore_from_exec

VARIANTS = {"one-thread": None, "openblas-default": str(os.cpu_count())}


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = []
    restore_from_exec(a.snapshot)  # unmeasured: page cache and node records warm
    for rep in range(a.reps):
        for name in (list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]):
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
            if VARIANTS[name]:
                os.environ["OPENBLAS_NUM_THREADS"] = VARIANTS[name]
            c0 = children_cpu_s()
            r = restore_from_exec(a.snapshot)
            rows.append({"variant": name, "rep": rep, "restored": r["restored"],
                         "entrypoint_cpu_s": round(children_cpu_s() - c0, 4),
                         "first_token_from_exec_s": r["first_token_from_exec_s"]})
            print(json.dumps(rows[-1]), flush=True)
    os.environ.pop("OPENBLAS_NUM_THREADS", None)
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for name in VARIANTS:
            mine = [r for r in rows if r["variant"] == name and r["restored"]]
            summary = {"variant": name, "n": len(mine),
                       "median_entrypoint_cpu_s": statistics.median(r["entrypoint_cpu_s"] for r in mine),
                       "median_first_token_from_exec_s": statistics.median(r["first_token_from_exec_s"] for r in mine)}
            print(json.dumps(summary))
            f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
