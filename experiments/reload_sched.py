"""Does the cold map reload (prepack beside the populate) read faster when the CPU scheduler lets
the populating threads run the moment their reads complete?

Why: on the 2-core Intel AMX host the populate alone reads the weights file at 0.91-0.96x the
device, and beside the two packing threads at 0.75-0.97x (results/spot-checks/reload-populate-piece):
after each read the populating thread must wait for a core the packing holds, and nice 10 or 19
for the packing did not change that. Variants: ``idle``: the packing threads run as SCHED_IDLE
(any normal thread preempts them at once on waking); ``fifo``: the populating threads run as
SCHED_FIFO 1 (root); ``idle+fifo`` both; ``default`` neither. Runs against commit ba91525: ``coldstart_reload``'s
``prepack_sched`` and ``populate_sched`` existed for this script only and were removed after it.

Usage: .venv/bin/python experiments/reload_sched.py OUT_DIR [REPS] [VARIANT ...]
Bench model; one server; per round: the device limit by fio, then each variant once, interleaved
(the order reversed every other round), the flat file evicted before each reload. Writes
OUT_DIR/raw.jsonl and prints a summary.
"""
from __future__ import annotations

import json
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
variants = sys.argv[3:] or ["default", "idle", "fifo", "idle+fifo"]
out.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix="cs-sched-", dir="/var/tmp"))
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
            c.sleep(level=2)
            c.wake_up(["weights"])
            evict_all([data])
            resident = resident_fraction([data])
            t = time.perf_counter()
            r = c.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": "auto",
                                                             "prepack_sched": "idle" if "idle" in v else "",
                                                             "populate_sched": "fifo" if "fifo" in v else ""})[0]
            wall = time.perf_counter() - t
            c.wake_up(["kv_cache"])
            ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
            rows.append({"rep": rep, "what": "reload", "variant": v, "resident_before": round(resident, 4),
                         "seconds": r.get("seconds_rpc"), "wall_s": round(wall, 4), "canary_ok": ok,
                         "gib_s": round(data.stat().st_size / r["seconds_rpc"] / 2**30, 3), "bytes": data.stat().st_size,
                         **{k: r.get(k) for k in ("mode", "auto_choice", "populate_s", "prepack_s",
                                                  "prepack_overlapped", "prepack_waited_s")}})
            print(json.dumps(rows[-1]), flush=True)
finally:
    eng.stop()
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
    paired = statistics.median(data_bytes / r["seconds"] / 2**30 / d["gib_s"] for r in rs
                               for d in rows if d["what"] == "device" and d["rep"] == r["rep"])
    print(f"{v:>10}: paired {paired:.2f}x; cold reload {s:.3f} s, {g:.2f} GiB/s = {g / dev:.2f}x the device; "
          f"populate alone {rd:.2f} GiB/s = {rd / dev:.2f}x; "
          f"canary ok {sum(r['canary_ok'] for r in rs)}/{len(rs)}; modes {sorted({r['mode'] for r in rs})}")
