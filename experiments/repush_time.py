"""How long a push takes the first time and again (nothing changed), compressed and as is: a test
registry on 127.0.0.1 (registry.server, unshaped), TREE pushed twice per compression to its own
repository. A second push reuses the sizes of the chunks' frames and the packs the registry has
from the index the ref already names, so it hashes the tree and sends nothing.

    .venv/bin/python experiments/repush_time.py --tree "$(readlink -f .venv)" \\
        --out results/spot-checks/repush/venv.jsonl
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from coldstart.engine.launcher import free_port
from coldstart.registry import artifact, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="coldstart-repush-", dir=a.work))
    srv = server.start(store, free_port())
    try:
        with open(a.out, "w") as out:
            for compress in ("zstd", "none"):
                ref = f"{srv.host}/repush/{compress}:v1"
                for attempt in ("first", "again"):
                    r = artifact.push(a.tree, ref, compress=compress)
                    row = {"tree": a.tree.name, "compress": compress, "push": attempt, "seconds": r.seconds,
                           "uploaded": r.uploaded, "blobs": r.blobs, "uploaded_bytes": r.uploaded_bytes,
                           "total_bytes": r.total_bytes}
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
    finally:
        srv.stop()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
