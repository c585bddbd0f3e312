"""What shortens a cold map reload with the prepack beside it: a smaller populate piece, or packing
threads that yield the CPUs to the populating ones (nice)?

Why: the map reload's populating threads (4) each take 64 MiB of the weights file at a time, so the
file arrives in waves of 256 MiB, while the prepack walks the layers in file order. The layers of
the last wave can only be packed once it has arrived: with the bench model on the Intel AMX host
(results/reload-intel-3) the cold step took 0.82 s where reading the file at the device's median
takes 0.70 s and packing it warm 0.51 s. Smaller pieces make the last wave, and so the packing
left after the read, smaller; they also mean more populate calls. Measured (2026-11-28, first run):
the piece made no difference, and every reload ended with its populate: the read itself was slow
(1.3 GiB/s against 1.45-1.95 for fio), with the two packing threads busy on the two cores while the
populating threads wait for CPU after each read. Hence the second knob: the packing threads' nice.

Runs against the code of commit 2cafdf2: ``coldstart_reload``'s ``populate_piece_mib`` and ``prepack_nice``
existed for this script only and were removed after it (no effect measured).

Usage: .venv/bin/python experiments/reload_populate_piece.py OUT_DIR [REPS] [VARIANT ...]
VARIANT: PIECE_MIB[:NICE[:FILL[:OVERLAP[:WIDEN]]]] (default 64 16 4; FILL read:
WeightArena.map_file(fill="read"), which existed only in commit e4e391a, measured without a gain
and removed; OVERLAP 0: populate first, then pack, so that the read is timed alone as populate_s;
WIDEN 0: the populating threads keep the worker's one-core mask; map_file's widen existed only in
commit a0bf802, measured without a gain and removed). Bench model; one server; per round: the device limit
by fio, then each variant once, interleaved, the flat file evicted before each reload. Writes
OUT_DIR/raw.jsonl and prints a summary.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coldstart.bench.weights import fio_run, resident_fraction
from coldstart.engine.launcher import EngineSpec, free_port, start_engine
from coldstart.models.tiny import cached_model
from coldstart.warm.residency import evict_all

out = Path(sys.argv[1])
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
variants = sys.argv[3:] or ["64", "16", "4"]
out.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix="cs-piece-", dir="/var/tmp"))
spec = EngineSpec(model=cached_model("bench"), run_dir=work / "run", port=free_port(), sleep_mode=True)
eng = start_engine(spec)
rows = []
try:
    eng.wait_ready(1800)
    c = spec.client(timeout=900)
    canary = c.complete("The capital of France is", max_tokens=8).token_ids
    flat = work / "flat"
    c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(flat)})
    data = flat / "weights.flat"
    for rep in range(reps):
        c.sleep(level=2)  # unmaps the file: its pages can be evicted for fio
        best = 0.0
        for direct, bs in ((0, 16 << 20), (1, 1 << 20)):  # the faster of bench reload's two fio shapes
            evict_all([data])
            nb, secs = fio_run(data, direct, 4, bs)
            best = max(best, nb / secs / 2**30)
        rows.append({"rep": rep, "what": "device", "gib_s": round(best, 3),
                     "fio": "faster of buffered 4 x 16 MiB and O_DIRECT 4 x 1 MiB"})
        c.wake_up(["weights"])
        c.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": "map"})  # back to serving
        c.wake_up(["kv_cache"])
        for v in (variants if rep % 2 == 0 else variants[::-1]):
            piece, nice, fill, overlap, widen = (v.split(":") + ["", "", "", ""])[:5]
            c.sleep(level=2)
            c.wake_up(["weights"])
            evict_all([data])
            resident = resident_fraction([data])
            t = time.perf_counter()
            r = c.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": "auto",
                                                             "populate_piece_mib": int(piece),
                                                             "prepack_nice": int(nice or 0),
                                                             **({"populate_fill": fill} if fill else {}),
                                                             **({"overlap": overlap == "1"} if overlap else {}),
                                                             **({"populate_widen": widen == "1"} if widen else {})})[0]
            wall = time.perf_counter() - t
            c.wake_up(["kv_cache"])
            ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
            rows.append({"rep": rep, "what": "reload", "variant": v, "piece_mib": int(piece), "nice": int(nice or 0), "fill": fill or "fault", "resident_before": round(resident, 4),
                         "seconds": r.get("seconds_rpc"), "wall_s": round(wall, 4), "canary_ok": ok,
                         "gib_s": round(data.stat().st_size / r["seconds_rpc"] / 2**30, 3), "bytes": data.stat().st_size,
                         **{k: r.get(k) for k in ("mode", "auto_choice", "populate_s", "prepack_s",
                                                  "prepack_overlapped", "prepack_waited_s")}})
            print(json.dumps(rows[-1]), flush=True)
finally:
    eng.stop()
    if not os.environ.get("KEEP_WORK"):  # KEEP_WORK=1 keeps the flat dump (experiments/populate_vs_sendfile.py)
        shutil.rmtree(work, ignore_errors=True)
(out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
dev = statistics.median(r["gib_s"] for r in rows if r["what"] == "device")
data_bytes = rows[-1].get("bytes", 0)
print(f"device (fio, median of {reps}): {dev:.2f} GiB/s")
for v in variants:
    rs = [r for r in rows if r.get("variant") == v]
    s = statistics.median(r["seconds"] for r in rs)
    g = statistics.median(r["gib_s"] for r in rs)
    rd = statistics.median(data_bytes / r["populate_s"] / 2**30 for r in rs)
    print(f"{v:>10} (piece MiB[:nice[:fill[:overlap[:widen]]]]): cold reload {s:.3f} s, {g:.2f} GiB/s = {g / dev:.2f}x the device; "
          f"populate alone {rd:.2f} GiB/s = {rd / dev:.2f}x; "
          f"canary ok {sum(r['canary_ok'] for r in rs)}/{len(rs)}; modes {sorted({r['mode'] for r in rs})}")
