"""Where a first push's time goes: hashing and compressing (build_index), the pack digests, the
upload to a registry on this host, with the frames kept (the default) and made again
(keep_bytes=0), alternating, each to a fresh registry.

    python experiments/push_phases.py SNAPSHOT_DIR            # a snapshot, pushed as `coldstart push` does
    python experiments/push_phases.py --runtime [--reps 1]    # this venv, as a runtime
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from coldstart.engine.launcher import free_port
from coldstart.registry import artifact, server


def one(tree: Path, runtime: bool, keep_bytes: int | None) -> dict:
    d = Path(tempfile.mkdtemp(prefix="push-phases-"))
    srv = server.start(d / "registry", free_port())
    spans: dict[str, float] = {}
    real_b, real_p = artifact.build_index, artifact.pack_digests

    def timed(name, fn):
        def run(*a, **k):
            t0 = time.monotonic()
            try:
                return fn(*a, **k)
            finally:
                spans[name] = time.monotonic() - t0
        return run

    artifact.build_index, artifact.pack_digests = timed("hash+compress", real_b), timed("pack digests", real_p)
    try:
        t0 = time.monotonic()
        if runtime:
            res = artifact.push(tree, f"{srv.host}/runtimes/x:v1", ranges=[("bin/python", 0, 1)], small_first=False,
                                kind=artifact.RUNTIME_KIND, profile=False, keep_bytes=keep_bytes)
        else:
            res = artifact.push(tree, f"{srv.host}/snapshots/x:v1", keep_bytes=keep_bytes)
        total = time.monotonic() - t0
    finally:
        artifact.build_index, artifact.pack_digests = real_b, real_p
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    spans["upload"] = total - sum(spans.values())
    return {"total": total, **spans, "packs_mib": res.total_bytes / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", nargs="?", type=Path)
    ap.add_argument("--runtime", action="store_true", help="push this venv as a runtime")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    tree = Path(os.path.realpath(sys.prefix)) if a.runtime else a.tree
    if tree is None:
        ap.error("a tree to push, or --runtime")
    print(f"# {tree.name if not a.runtime else 'venv'}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, kernel {platform.release()}")
    print("| rep | frames | total (s) | hash+compress (s) | pack digests (s) | upload (s) | packs (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for rep in range(a.reps):
        for label, keep in (("kept", None), ("made again", 0)) if rep % 2 == 0 else (("made again", 0), ("kept", None)):
            r = one(tree, a.runtime, keep)
            print(f"| {rep} | {label} | {r['total']:.1f} | {r['hash+compress']:.1f} | {r['pack digests']:.1f} | "
                  f"{r['upload']:.1f} | {r['packs_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
