"""Is a node profile recorded without warming as good a guide for the host warmer as one recorded by
a cold restore? A node's first restore records the profile its later replicas (and a container's host
warmer) follow. Until d9de334 only a restore that warmed recorded one; now, in a container (772c347),
a restore that finds the snapshot all cached, or leaves warming to the host, records one too (page
tables only when the host warms). Before, such a node kept following the shipped profile.

Profiles, each recorded once on this node, then put back before each measured start:
  cold     a restore container on a dropped page cache, no host warming (page tables + page cache)
  hostwarm a restore container warmed from the host on a dropped page cache (page tables only)
  cached   a restore container with the snapshot all in the page cache (page tables; the page cache
           shows nothing new)
  shipped  none of the node's own: the checkpoint's shipped profile.json
Measured: the cold container restore with host warming (the whole page cache dropped before each
start), interleaved, from the create call; the node has verified the snapshot (no digest check).

    PYTHONPATH=toolkit .venv/bin/python experiments/recorded_profile_kinds.py --size bench --reps 6 \\
        --out results/spot-checks/recorded-profile-kinds/bench.jsonl
    PYTHONPATH=toolkit .venv/bin/python experiments/recorded_profile_kinds.py \
        --table results/spot-checks/recorded-profile-kinds/*.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.bench.host import kept_if
from coldstart.warm.profile import load_profile
from coldstart.warm.residency import drop_caches
from coldstart.warm.snapshot import node_profile

KINDS = ("cold", "hostwarm", "cached", "shipped")


def _read_all(snap: Path) -> None:
    for f in sorted(p for p in snap.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def table(files: list[Path]) -> None:
    """Per model and profile: median first token and ENTRY_READY, and the paired difference from
    the cold-recorded profile's start of the same rep."""
    import statistics as st

    print("| model | profile | recorded ranges / MB / mapped files | first token (s), median | paired - cold (s), median (each) | ENTRY_READY (s), median | early files |")
    print("|---|---|---|---|---|---|---|")
    for path in files:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rec = {r["kind"]: r for r in rows if r.get("recorded")}
        runs = [r for r in rows if "rep" in r and r.get("restored")]
        cold = {r["rep"]: r["first_token_s"] for r in runs if r["kind"] == "cold"}
        for kind in KINDS:
            mine = [r for r in runs if r["kind"] == kind]
            if not mine:
                continue
            diffs = [round(r["first_token_s"] - cold[r["rep"]], 2) for r in mine if r["rep"] in cold]
            rc = rec.get(kind)
            made = (f"{rc['ranges']} / {rc['bytes'] / 1e6:.0f} / {rc['mapped_files']}" if rc else "(shipped)")
            paired = "" if kind == "cold" else f"{st.median(diffs):+.2f} ({', '.join(f'{d:+.2f}' for d in diffs)})"
            print(f"| {mine[0]['size']} | {kind} | {made} | {st.median(r['first_token_s'] for r in mine):.3f} | {paired} | "
                  f"{st.median(r['events']['ENTRY_READY'] for r in mine):.3f} | "
                  f"{st.median((r.get('host_warm') or {}).get('early', {}).get('files', 0) for r in mine):.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, nargs="+", help="print the table of these runs' rows, run nothing")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.table:
        return table(a.table)
    if a.out is None:
        ap.error("--out is required to run")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with kept_if(True), a.out.open("a") as f:
        case = bench_case(a.size, a.work)
        c, tag, layers, model, snap = case.client, case.image, case.layers, case.model, case.snap
        prof = node_profile(snap)
        saved: dict[str, bytes] = {}
        for kind in ("cold", "hostwarm", "cached"):
            prof.unlink(missing_ok=True)
            if kind == "cold":
                new_to_node(snap)  # (the first: the node verifies the snapshot once, here)
                row = one_start(c, tag, "restore", model, snap, layers)
            elif kind == "hostwarm":
                drop_caches()
                row = one_start(c, tag, "restore+hostwarm", model, snap, layers)
            else:
                _read_all(snap)
                row = one_start(c, tag, "restore", model, snap, layers)
            if not prof.exists():
                raise SystemExit(f"{kind}: no profile recorded ({(row.get('event_attrs') or {}).get('WARM_START')})")
            saved[kind] = prof.read_bytes()
            p = load_profile(prof)
            info = {"kind": kind, "recorded": True, "ranges": len(p.ranges), "bytes": p.bytes,
                    "mapped_files": len(p.mapped_files()), "sources": sorted({r.source for r in p.ranges}),
                    "warm_start": (row.get("event_attrs") or {}).get("WARM_START")}
            print(json.dumps(info), flush=True)
            f.write(json.dumps({"size": a.size, **info}) + "\n")
        for rep in range(a.reps):
            order = KINDS[rep % 4:] + KINDS[:rep % 4]
            for kind in order:
                prof.unlink(missing_ok=True)
                if kind in saved:
                    prof.write_bytes(saved[kind])
                drop_caches()
                row = one_start(c, tag, "restore+hostwarm", model, snap, layers)
                ev = row.get("events") or {}
                hw = row.get("host_warm") or {}
                print(json.dumps({"rep": rep, "kind": kind, "ft": row.get("first_token_s"), "restored": row.get("restored"),
                                  "entry_ready": ev.get("ENTRY_READY"), "restore_done": ev.get("RESTORE_DONE"),
                                  "early_files": (hw.get("early") or {}).get("files")}), flush=True)
                f.write(json.dumps({"size": a.size, "rep": rep, "kind": kind, "image": tag, **row}) + "\n")
                f.flush()
        prof.unlink(missing_ok=True)
        prof.write_bytes(saved["cold"])


if __name__ == "__main__":
    main()
