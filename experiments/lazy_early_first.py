"""Does a lazily mounted restore reach its first token sooner when the artifact opens with the hot
child's pages needed before the canary (registry.artifact._first_ranges, the manifest's
``layout.early``)?

With the packed handles kept, the bench model's hot child is 1.3 GB; a restore needs 99 MiB of it
before its canary's forward pass. The artifact's chunk order is the order a lazy mount prefetches
in. One snapshot pushed twice to one registry behind a shaped link: in the default order (early
ranges, then the restorer's runs, i.e. the whole child, then the profile) and as before
(COLDSTART_WARM_HOT_FIRST=0 while pushing: the child in file order first). Then alternating lazy +
prefetch restores of each on an emptied node (bench.lazy.one_start: page cache dropped, chunk cache
and node state removed), timed from the spawn of `coldstart restore`. The node's access profile of
the snapshot, which push ships, is recorded first where there is none (bench.lazy.record_profile).

    .venv/bin/python experiments/lazy_early_first.py --snapshot /var/tmp/coldstart-slim/slim \\
        --rates 1,10 --reps 3 --out results/spot-checks/lazy-early-first/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from unittest import mock

from coldstart.bench.lazy import _artifact_sizes, one_start, record_profile
from coldstart.criu.layout import HOT_FIRST_ENV
from coldstart.registry import artifact, link, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snapshot", type=Path, required=True, help="a hot-layout snapshot whose profile this node recorded")
    ap.add_argument("--rates", default="1", help="link rates in Gbit/s, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-lazy-early"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    snap = a.snapshot.resolve()
    if not artifact.shipped_profile(snap):  # push ships this node's profile of it: record one first
        record_profile(snap)
    with open(a.out, "w") as out:
        def emit(row: dict) -> None:
            print(json.dumps({k: v for k, v in row.items() if k != "events"}), flush=True)
            out.write(json.dumps(row) + "\n")

        emit({"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(), "snapshot": snap.name,
              "early_bytes": json.loads((snap / "manifest.json").read_text()).get("layout", {}).get("early_bytes")})
        for rate in [float(r) for r in a.rates.split(",")]:
            with link.make_link(rate) as L:
                srv = server.start(a.work / f"registry-{rate:g}", 5000, host=L.addr, netns=L.netns)
                try:
                    refs = {}
                    for order, env in (("early-first", {}), ("file-order", {HOT_FIRST_ENV: "0"})):
                        ref = f"http://{L.addr}:5000/snapshots/bench-{order}:bench"
                        with mock.patch.dict(os.environ, env):
                            pr = artifact.push(snap, ref, compress="zstd")
                        refs[order] = ref
                        emit({"rate_gbit": rate, "order": order, "push_s": pr.seconds, **_artifact_sizes(ref)})
                    orders = list(refs)
                    for rep in range(a.reps):
                        for order in (orders if rep % 2 == 0 else orders[::-1]):
                            row = one_start("lazy+prefetch", refs[order], snap, a.work / "node-state", L.node_if,
                                            dict(os.environ))
                            emit({"rate_gbit": rate, "order": order, "rep": rep, **row})
                finally:
                    srv.stop()


if __name__ == "__main__":
    main()
