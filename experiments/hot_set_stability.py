"""Is the set of image pages a restore needs the same from one restore to the next?

Restores SNAPSHOT ``--reps`` times (page cache dropped, `coldstart restore --no-serve`) and reads, at
READY, each restored process's page table over its pages-*.img mappings: the pages written (copied
on write, so certainly touched) and the 64 KiB blocks mapped at all. Prints each set's size and its
overlap with the previous restore's (intersection / union), per process by its PID in the restore's
namespace (CRIU keeps the dumped PIDs). A stable set is what storing the needed pages together
(diet-executor README, "The floors") would rely on.

``--no-readahead``: the exact set. The disk's ``read_ahead_kb`` is 0 for the restores (put back
after) and the restore does not warm, so every fault on the images reads its own page and the
kernel's fault-around can only map pages some fault already read: what is mapped is what was
touched. Slow (one read per page), a measurement only. It changes a host-wide setting: run it on a
machine to itself.

Also at READY: the bytes of pages-*.img in the page cache (what was read of the images, by the
warmer, CRIU or the faults' readahead) beside the bytes of them the node's access profile names
(what the warmer was asked for first). ``--restore-arg`` passes options to the restore (e.g.
``--warm-rest=never``: nothing past the profile is warmed, so the difference is readahead).

    cd experiments && ../.venv/bin/python hot_set_stability.py SNAPSHOT --reps 4 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import kill_restored
from coldstart.bench.warm import block_device
from coldstart.warm.residency import resident_bytes
from coldstart.warm.snapshot import node_profile
from diet_floor import PAGES, image_pages_present, restore_live
from first_token_pages import ns_pid


def page_sets(root: int) -> tuple[set, set]:
    """(written pages, mapped 64 KiB blocks) as (namespace PID, page or block number) pairs."""
    written, blocks, ns = set(), set(), {}
    for pid, _, _, page, _, w in image_pages_present(root):
        nspid = ns[pid] if pid in ns else ns.setdefault(pid, ns_pid(pid))
        blocks.add((nspid, page >> 4))
        if w:
            written.add((nspid, page))
    return written, blocks


@contextlib.contextmanager
def readahead_kb(path: Path, kb: int | None):
    """The read_ahead_kb of the disk holding ``path`` set to ``kb`` for the block (None: unchanged)."""
    if kb is None:
        yield
        return
    dev = Path("/sys/class/block") / block_device(path)
    knob = (dev.parent if (dev / "partition").exists() else dev).resolve() / "queue" / "read_ahead_kb"
    if not knob.exists():
        knob = Path("/sys/block") / dev.resolve().parent.name / "queue" / "read_ahead_kb"
    old = knob.read_text().strip()
    knob.write_text(str(kb))
    try:
        yield
    finally:
        knob.write_text(old)


def profile_pages_bytes(snap: Path) -> int | None:
    """Bytes of pages-*.img ranges in the node's access profile of ``snap``."""
    prof = node_profile(snap)
    if prof is None or not prof.exists():
        return None
    return sum(r["length"] for r in json.loads(prof.read_text())["ranges"] if PAGES.search("/" + r["file"]))


def overlap(x: set, y: set) -> float:
    return round(len(x & y) / len(x | y), 4) if x | y else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--no-readahead", action="store_true", help="the exact set (see above): slow")
    ap.add_argument("--restore-arg", action="append", default=[], help="passed to `coldstart restore` (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    prev = None
    extra = (["--no-warm"] if a.no_readahead else []) + a.restore_arg
    with open(a.out, "w") as out, readahead_kb(a.snapshot, 0 if a.no_readahead else None):
        for rep in range(a.reps):
            drop_caches()
            t0 = time.monotonic()
            summ, p = restore_live(a.snapshot, extra)
            wall = time.monotonic() - t0
            if not summ.get("pid"):
                raise SystemExit(f"restore {rep} failed: {(p.stderr or p.stdout).strip()[-400:]}")
            root = int(summ["pid"])
            cur = page_sets(root)
            resident = sum(resident_bytes(f)[0] for f in (a.snapshot / "criu").glob("pages-*.img"))
            kill_restored(root)
            ft = (summ.get("attrs") or {}).get("FIRST_TOKEN") or {}
            row = {"rep": rep, "no_readahead": a.no_readahead, "restore_wall_s": round(wall, 2),
                   "pages_mapped_bytes": ft.get("pages_mapped_bytes"), "pages_written_bytes": ft.get("pages_written_bytes"),
                   "written_pages": len(cur[0]), "mapped_blocks_64k": len(cur[1]),
                   "pages_files_cached_bytes": resident, "profile_pages_bytes": profile_pages_bytes(a.snapshot),
                   "restore_args": extra}
            if prev is not None:
                row.update(written_overlap_with_previous=overlap(cur[0], prev[0]),
                           blocks_overlap_with_previous=overlap(cur[1], prev[1]),
                           written_new_vs_previous=len(cur[0] - prev[0]))
            prev = cur
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
