"""On a host (no container), is recording the node's profile worth it for a restore that does not
warm (its snapshot all in the page cache, as right after a pull or a checkpoint)?

cost: restores of a snapshot all in the page cache, the node's profile removed before each, recording
  (COLDSTART_WARM_RECORD=force: start_recording beside no warmer) or not (off), interleaved; each once
  as the node's first (its record forgotten: the digest check reads every file) and once verified.
gain: cold restores (the whole page cache dropped), following the node's own profile (recorded once
  by a cold restore here) or the shipped one alone, interleaved.

    PYTHONPATH=toolkit .venv/bin/coldstart checkpoint MODEL_DIR --out SNAP
    PYTHONPATH=toolkit .venv/bin/python experiments/record_only_cost.py SNAP --reps 5 \\
        --out results/spot-checks/record-only-cost/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from coldstart.pipeline.integrity import NodeRecord
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.restore import RestoreOptions, restore
from coldstart.warm.residency import drop_caches
from coldstart.warm.snapshot import node_profile


def _read_all(snap: Path) -> None:
    for f in sorted(p for p in snap.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def _one(snap: Path, record: str) -> dict:
    os.environ["COLDSTART_WARM_RECORD"] = record
    res = restore(RestoreOptions(snapshot=snap), say=lambda s: None)
    try:
        ev = {e.name: round(e.t, 3) for e in res.timeline.events}
        ws = res.timeline.get("WARM_START")
        return {"restored": res.restored, "first_token_s": ev.get("FIRST_TOKEN"), "events": ev,
                "warm_start": ws.attrs if ws else None, "profile_saved": node_profile(snap).exists()}
    finally:
        res.stop()
        time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    snap, prof = a.snapshot, node_profile(a.snapshot)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with a.out.open("a") as f:
        def emit(row: dict) -> None:
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps({k: row[k] for k in ("part", "variant", "rep", "first_token_s") if k in row}
                             | ({"first_on_node": row["first_on_node"]} if "first_on_node" in row else {})), flush=True)

        for rep in range(a.reps):
            for v in (("force", "off") if rep % 2 == 0 else ("off", "force")):
                for first in (True, False):
                    if first:
                        NodeRecord().forget(snap, read_manifest(snap).files)
                    prof.unlink(missing_ok=True)
                    _read_all(snap)
                    emit({"part": "cost", "variant": "record" if v == "force" else "off", "rep": rep,
                          "first_on_node": first, **_one(snap, v)})
        prof.unlink(missing_ok=True)
        drop_caches()
        emit({"part": "gain", "variant": "recording", "rep": -1, **_one(snap, "auto")})
        if not prof.exists():
            raise SystemExit("the cold restore recorded no profile")
        saved = prof.read_bytes()
        for rep in range(a.reps):
            for v in (("node", "shipped") if rep % 2 == 0 else ("shipped", "node")):
                prof.unlink(missing_ok=True)
                if v == "node":
                    prof.write_bytes(saved)
                drop_caches()
                emit({"part": "gain", "variant": v, "rep": rep, **_one(snap, "off")})
        prof.write_bytes(saved)
    med = lambda xs: round(statistics.median(xs), 3)  # noqa: E731
    for part, first in (("cost", True), ("cost", False), ("gain", None)):
        by: dict[str, list[float]] = {}
        for r in rows:
            if r["part"] == part and r.get("first_on_node") is first and r["rep"] >= 0:
                by.setdefault(r["variant"], []).append(r["first_token_s"])
        print(part, "" if first is None else ("first on node" if first else "verified"),
              {k: (med(x), x) for k, x in by.items()})


if __name__ == "__main__":
    main()
