"""Would warming exactly the image pages a restore touches beat warming the node's recorded profile?

The node's profile (warm/profile.py) records the image pages a restore had mapped: with readahead
on, whole 64 KiB fault-around blocks, merged across gaps under 256 KiB. This experiment records the
exact set once, by a restore with the disk's ``read_ahead_kb`` at 0 and no warming (each fault
reads its own page, fault-around maps only pages already read: hot_set_stability.py
``--no-readahead``), and writes a second profile: the same ranges for every other file, the image
pages replaced by the exact pages (merged across gaps under ``--gap`` KiB). Then cold restores
(page cache dropped) alternate between the two profiles: first token from exec, bytes read from
the disk, image bytes in the page cache at READY. The node's own profile is put back at the end.
The readahead setting is host-wide: run it on a machine to itself.

    cd experiments && ../.venv/bin/python exact_profile.py SNAPSHOT --reps 4 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import kill_restored, restore_from_exec
from coldstart.bench.warm import block_device, device_read_bytes
from coldstart.warm.residency import resident_bytes
from coldstart.warm.snapshot import node_profile
from diet_floor import PAGES, image_pages_present, restore_live
from hot_set_stability import readahead_kb


def exact_pages(snap: Path) -> dict[str, list[int]]:
    """Image file (relative to the snapshot) -> sorted page offsets a restore touched."""
    drop_caches()
    with readahead_kb(snap, 0):
        summ, p = restore_live(snap, ["--no-warm"])
    if not summ.get("pid"):
        raise SystemExit(f"recording restore failed: {(p.stderr or p.stdout).strip()[-400:]}")
    root = int(summ["pid"])
    pages: dict[str, set[int]] = {}
    for _, _, name, _, off, _ in image_pages_present(root):
        pages.setdefault("criu/" + name, set()).add(off)
    kill_restored(root)
    return {k: sorted(v) for k, v in pages.items()}


def exact_profile(original: dict, pages: dict[str, list[int]], gap: int) -> dict:
    """``original`` with its image-page ranges replaced by ``pages`` merged across gaps under ``gap``."""
    exact = []
    for rel, offs in sorted(pages.items()):
        start = prev = offs[0]
        for o in offs[1:] + [None]:
            if o is None or o - (prev + 4096) >= gap:
                exact.append({"file": rel, "offset": start, "length": prev + 4096 - start, "t": 0.0, "source": "exact"})
                if o is not None:
                    start = o
            if o is not None:
                prev = o
    ranges, placed = [], False
    for r in original["ranges"]:
        if PAGES.search("/" + r["file"]):
            if not placed:
                ranges += [{**x, "t": r["t"]} for x in exact]
                placed = True
            continue
        ranges.append(r)
    return {**original, "ranges": ranges, "meta": {**original.get("meta", {}), "exact_pages": True}}


def image_bytes(profile: dict) -> tuple[int, int]:
    rs = [r for r in profile["ranges"] if PAGES.search("/" + r["file"])]
    return sum(r["length"] for r in rs), len(rs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--gap", type=int, default=16, help="KiB: exact runs closer than this become one range")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    path = node_profile(a.snapshot)
    if path is None or not path.exists():
        raise SystemExit("no node profile for this snapshot yet: restore it once first")
    original_text = path.read_text()
    original = json.loads(original_text)
    profiles = {"recorded": original, "exact": exact_profile(original, exact_pages(a.snapshot), a.gap << 10)}
    dev = block_device(a.snapshot)
    rows = []
    try:
        for name, prof in profiles.items():
            b, n = image_bytes(prof)
            rows.append({"profile": name, "image_bytes": b, "image_ranges": n})
            print(json.dumps(rows[-1]), flush=True)
        for rep in range(a.reps):
            for name in (list(profiles) if rep % 2 == 0 else list(profiles)[::-1]):
                path.write_text(json.dumps(profiles[name]))
                drop_caches()
                r0 = device_read_bytes(dev)
                r = restore_from_exec(a.snapshot)
                cached = sum(resident_bytes(f)[0] for f in (a.snapshot / "criu").glob("pages-*.img"))
                ft = next((e.get("attrs") or {} for e in r["events"] if e["name"] == "FIRST_TOKEN"), {})
                rows.append({"profile": name, "rep": rep, "restored": r["restored"],
                             "first_token_from_exec_s": r["first_token_from_exec_s"],
                             "disk_read_bytes": device_read_bytes(dev) - r0, "image_cached_bytes_after": cached,
                             "pages_mapped_bytes": ft.get("pages_mapped_bytes"),
                             "pages_written_bytes": ft.get("pages_written_bytes")})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        path.write_text(original_text)
    with open(a.out, "w") as out:
        for r in rows:
            out.write(json.dumps(r) + "\n")
        for name in profiles:
            mine = [r for r in rows if r.get("profile") == name and r.get("restored")]
            s = {"profile": name, "n": len(mine),
                 "median_first_token_from_exec_s": statistics.median(r["first_token_from_exec_s"] for r in mine),
                 "median_disk_read_bytes": statistics.median(r["disk_read_bytes"] for r in mine)}
            print(json.dumps(s))
            out.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
