"""The host warmer's early reader alone, on a dropped page cache, no container: how long its list
takes (early_files: each file looked up through the image's layers) and how fast its reads land,
beside the bulk readers or without them, one read after another or all asked for first.

    PYTHONPATH=toolkit .venv/bin/python experiments/early_reader_alone.py IMAGE SNAPSHOT [VARIANT]

VARIANT: contains "nobulk" (HostWarm's bulk readers not started) and/or "hint" (HostWarm's
``early_hint``: every early read queued at once with POSIX_FADV_WILLNEED before the reads; the option
existed only for results/spot-checks/early-reader-queue: commit 6f17a18)."""
import sys
import time
from pathlib import Path

from coldstart.containers import docker_api, run
from coldstart.warm.residency import drop_caches

c = docker_api.client(None)
layers = docker_api.image_layers(c, sys.argv[1])
snap = Path(sys.argv[2])
variant = sys.argv[3] if len(sys.argv) > 3 else ""
log: list[tuple[float, float, str, int]] = []  # (start, end, file, bytes), s from the warmer's start
t0 = 0.0
read_data, list_files = run._read_data, run.early_files


def logged_read(p, cancelled):
    t = time.monotonic()
    n = read_data(p, cancelled)
    log.append((t - t0, time.monotonic() - t0, str(p), n))
    return n


def timed_list(s, remap):
    t = time.monotonic()
    out = list_files(s, remap)
    print("early_files list", round(time.monotonic() - t, 3), "s", len(out), "files")
    return out


run._read_data, run.early_files = logged_read, timed_list
if "nobulk" in variant:
    run.HostWarm._run = lambda self, s, r: None
drop_caches()
t0 = time.monotonic()
hw = run.host_warm(snap, layers, **({"early_hint": True} if "hint" in variant else {}))
hw._early_t.join()
print("early", hw.early)
hw.cancel()
hw.wait()
for m in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
    done = [x for x in log if x[1] <= m]
    print(f"by {m:.1f}s: {len(done)} files {sum(x[3] for x in done) >> 20} MiB")
print("first read starts at", round(log[0][0], 3) if log else None)
for a, b, p, n in sorted(log, key=lambda x: -(x[1] - x[0]))[:12]:
    print(f"{a:.3f}-{b:.3f} {n >> 10:7d} KiB {p[-90:]}")
