"""Restores of two snapshots of one model, interleaved: the default (packed GEMM handles kept in the
CRIU image, linear weights left out of the weights file) against `coldstart checkpoint
--packed-dump` (the handles' buffers beside the weights file, mapped back by the reload). First
token from the entrypoint's exec, page cache warm and dropped.

    PYTHONPATH=toolkit .venv/bin/python experiments/packed_dump_restore.py --reps 6 --out results/spot-checks/packed-dump-restore

The option was removed after this run (results/spot-checks/packed-dump-restore/README.md): run it at
commit 934ad28.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from coldstart.bench.host import line as host_line, watch
from coldstart.bench.pipeline import restore_from_exec
from coldstart.fsutil import write_results
from coldstart.models.tiny import cached_model
from coldstart.warm.residency import evict_all

VARIANTS = {"kept": [], "packed-dump": ["--packed-dump"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-packed-dump-restore"))
    a = ap.parse_args()
    watch()
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    coldstart = str(Path(sys.executable).with_name("coldstart"))
    snaps, sizes = {}, {}
    for v, extra in VARIANTS.items():
        snaps[v] = a.work / f"snap-{v}"
        subprocess.run([coldstart, "checkpoint", str(cached_model(a.size)), "--out", str(snaps[v]), *extra],
                       check=True, stdout=subprocess.DEVNULL)
        # bytes on disk (allocated: the slim weights file and the hot layout's parent images have holes)
        sizes[v] = {d: sum(p.stat().st_blocks * 512 for p in (snaps[v] / d).rglob("*") if p.is_file())
                    for d in ("criu", "weights")}
        restore_from_exec(snaps[v], ["--no-fallback", "--timeout", "900"])  # the first on this node: checks, profile
    rows = []
    for rep in range(a.reps):
        for cache in ("warm", "cold"):
            for v in VARIANTS:
                if cache == "cold":
                    evict_all([p for p in snaps[v].rglob("*") if p.is_file()])
                r = restore_from_exec(snaps[v], ["--no-fallback", "--timeout", "900"])
                wl = next((e for e in r["events"] if e["name"] == "WEIGHTS_LOADED"), {})
                row = {"variant": v, "cache": cache, "rep": rep, "restored": r["restored"],
                       "first_token_s": r["first_token_from_exec_s"], "phases": r["phases"],
                       "weights_loaded": {k: wl.get("attrs", {}).get(k) for k in
                                          ("mode", "packed_refilled", "packed_kept", "populated_bytes", "bytes_read")}}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    lines = [f"# Restore from exec: packed handles kept in the image vs --packed-dump ({a.size} model)", "",
             host_line(), "",
             "| variant | CRIU images on disk (MiB) | weights dir on disk (MiB) | cache | first token from exec (s) | each | "
             "weights_load (s) | canary (s) | restored |", "|---|---|---|---|---|---|---|---|---|"]
    for cache in ("warm", "cold"):
        for v in VARIANTS:
            sel = [r for r in rows if r["variant"] == v and r["cache"] == cache]
            ft = [r["first_token_s"] for r in sel if r["first_token_s"] is not None]
            med = lambda k: statistics.median(r["phases"].get(k, 0.0) for r in sel)  # noqa: E731
            lines.append(f"| {v} | {sizes[v]['criu'] / 2**20:.0f} | {sizes[v]['weights'] / 2**20:.0f} | {cache} | "
                         f"{statistics.median(ft):.3f} | {', '.join(f'{x:.2f}' for x in ft)} | "
                         f"{med('weights_load'):.3f} | {med('canary'):.3f} | "
                         f"{sum(r['restored'] for r in sel)}/{len(sel)} |")
    write_results(a.out, rows, "\n".join(lines) + "\n",
                  "PYTHONPATH=toolkit .venv/bin/python experiments/packed_dump_restore.py " + " ".join(sys.argv[1:]))
    print("\n".join(lines))
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
