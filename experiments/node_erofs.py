"""Would a compressed read-only image halve a snapshot on the node's disk, and what does a restore
from it cost? Issue 16's "total image size halved" is met as shipped (zstd packs in the registry)
but not on the node, where the mmap restore maps the CRIU pages files as they are.

For each model, the container benchmark's snapshot (hot layout, the defaults) is packed into an
EROFS image (``--compressor``: lz4hc, or zstd with make setup's mkfs.erofs 1.8.6) and mounted
read-only (pipeline.nodeimage, `coldstart snapshot pack` and `mount`; the kernel decompresses on
page-in). Then,
alternating, container restores from the plain directory and from the mount: cold (page cache
dropped, host warming) and warm, each timed from the docker-py create call to the first
completion through the published port. One unmeasured restore from each first (the first on
this node verifies every file and records the profile).

    .venv/bin/python experiments/node_erofs.py --sizes tiny,bench --reps 4 \\
        --out results/spot-checks/node-erofs/raw.jsonl
    .venv/bin/python experiments/node_erofs.py --sizes tiny,bench --reps 4 --compressor zstd \\
        --out results/spot-checks/node-erofs-zstd/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from coldstart.bench.containers import bench_case, one_start
from coldstart.warm.residency import drop_caches
from coldstart.bench.warm import device_read_bytes
from coldstart.pipeline import nodeimage
from coldstart.pipeline.nodeimage import allocated_bytes as allocated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,bench")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--compressor", default="lz4hc")
    ap.add_argument("--cluster", type=int, default=65536, help="mkfs.erofs -C: the physical cluster, bytes")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--store", type=Path, default=Path("/var/tmp/coldstart-node-erofs"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.store.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        def put(row: dict) -> None:
            print(json.dumps({k: v for k, v in row.items() if k not in ("events", "attrs")}), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()

        for size in [s.strip() for s in a.sizes.split(",") if s.strip()]:
            c, tag, layers, model, snap = bench_case(size, a.work, say=lambda m: print(m, flush=True))
            img, mnt = a.store / f"{size}.erofs", a.store / f"{size}-mnt"
            if os.path.ismount(mnt):  # left by an interrupted run
                nodeimage.unmount(mnt)
            img.unlink(missing_ok=True)
            secs = nodeimage.pack(snap, img, compressor=a.compressor, cluster=a.cluster)["seconds"]
            nodeimage.mount(img, mnt)
            criu_plain = allocated(snap / "criu")
            put({"size": size, "what": "sizes", "snapshot_allocated": allocated(snap), "criu_allocated": criu_plain,
                 "weights_allocated": allocated(snap / "weights"), "erofs_image": img.stat().st_size,
                 "mkfs_s": round(secs, 1), "compressor": a.compressor, "cluster": a.cluster})
            where = {"plain": snap, "erofs": mnt}
            for name, path in where.items():  # the first on this node: verifies, records the profile
                drop_caches()
                put({"size": size, "store": name, "what": "first-on-node",
                     **one_start(c, tag, "restore", model, path, layers)})
            for rep in range(a.reps):
                for name in (("plain", "erofs") if rep % 2 == 0 else ("erofs", "plain")):
                    path = where[name]
                    drop_caches()
                    r0 = device_read_bytes("vda")
                    row = one_start(c, tag, "restore+hostwarm", model, path, layers)
                    put({"size": size, "store": name, "what": "cold", "rep": rep,
                         "vda_read_bytes": device_read_bytes("vda") - r0, **row})
                    put({"size": size, "store": name, "what": "warm", "rep": rep,
                         **one_start(c, tag, "restore", model, path, layers)})
            nodeimage.unmount(mnt)


if __name__ == "__main__":
    main()
