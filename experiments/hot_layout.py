"""Does the hot layout (pipeline/layout.py: the pages a restore touches stored together, the rest
in a parent image mapped lazily) make a restore read less and start sooner?

Makes SNAPSHOT-hot from SNAPSHOT (a copy, recorded and split as `coldstart checkpoint` would), gives
each snapshot one restore so that both have a node profile, then alternates restores of the two:
``--reps`` cold (page cache dropped) and as many warm. Per restore: first token from exec, bytes
read from the disk, pages images in the page cache at READY (child and parent), and the CRIU
pages the restored tree mapped or wrote (FIRST_TOKEN attrs).

``--restore-arg --warm-rest=never``: nothing is warmed past what the restore needs first, and the
entrypoint exits at its first token, so the pages images in the page cache afterwards are what the
restore read before its first token. ``--cold-only`` skips the warm restores.

    cd experiments && ../.venv/bin/python hot_layout.py SNAPSHOT --reps 4 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import restore_from_exec
from coldstart.bench.warm import block_device, device_read_bytes
from coldstart.pipeline.layout import make_hot
from coldstart.pipeline.manifest import read_manifest, write_manifest
from coldstart.warm.residency import resident_bytes


def hot_copy(snap: Path) -> Path:
    """SNAPSHOT-hot: a copy of ``snap`` in the hot layout (made once)."""
    out = snap.with_name(snap.name + "-hot")
    if out.exists():
        return out
    staging = snap.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(["cp", "-a", str(snap), str(staging)], check=True)
    m = read_manifest(staging)
    t0 = time.monotonic()
    m.files, m.layout = make_hot(staging, m.files, say=print)
    m.created_at += "+hot"  # a snapshot of its own: its own node profile (warm.snapshot_id)
    print(json.dumps({"made": str(out), "seconds": round(time.monotonic() - t0, 2), **m.layout}), flush=True)
    write_manifest(staging, m)
    staging.rename(out)
    return out


def image_cached(snap: Path) -> dict:
    criu = snap / "criu"
    return {"child_or_flat": sum(resident_bytes(f)[0] for f in criu.glob("pages-*.img")),
            "parent": sum(resident_bytes(f)[0] for f in criu.glob("parent/pages-*.img"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--restore-arg", action="append", default=[], help="passed to every measured restore")
    ap.add_argument("--cold-only", action="store_true")
    a = ap.parse_args()
    snaps = {"dumped": a.snapshot.absolute(), "hot": hot_copy(a.snapshot.absolute())}
    dev = block_device(a.snapshot)
    rows = []
    for name, snap in snaps.items():  # the first restore records each one's node profile
        r = restore_from_exec(snap)
        print(json.dumps({"layout": name, "first_restore": True, "restored": r["restored"],
                          "fallback": r["fallback"]}), flush=True)
    for rep in range(a.reps):
        for cold in (True,) if a.cold_only else (True, False):
            for name in (list(snaps) if rep % 2 == 0 else list(snaps)[::-1]):
                snap = snaps[name]
                if cold:
                    drop_caches()
                else:
                    restore_from_exec(snap)  # warm: the previous restore was of the other snapshot
                r0 = device_read_bytes(dev)
                r = restore_from_exec(snap, extra=a.restore_arg)
                ft = next((e.get("attrs") or {} for e in r["events"] if e["name"] == "FIRST_TOKEN"), {})
                rows.append({"layout": name, "cold": cold, "rep": rep, "restored": r["restored"],
                             "fallback": r["fallback"], "first_token_from_exec_s": r["first_token_from_exec_s"],
                             "disk_read_bytes": device_read_bytes(dev) - r0, "image_cached_after": image_cached(snap),
                             "pages_mapped_bytes": ft.get("pages_mapped_bytes"),
                             "pages_written_bytes": ft.get("pages_written_bytes"), "phases": r["phases"]})
                print(json.dumps(rows[-1]), flush=True)
    with open(a.out, "w") as out:
        for r in rows:
            out.write(json.dumps(r) + "\n")
        for name in snaps:
            for cold in (True, False):
                mine = [r for r in rows if r["layout"] == name and r["cold"] == cold and r["restored"]]
                if not mine:
                    continue
                s = {"layout": name, "cold": cold, "n": len(mine),
                     "median_first_token_from_exec_s": statistics.median(r["first_token_from_exec_s"] for r in mine),
                     "median_disk_read_bytes": statistics.median(r["disk_read_bytes"] for r in mine)}
                print(json.dumps(s))
                out.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
