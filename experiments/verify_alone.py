"""A snapshot's full digest check alone (integrity.verify, mode full) on a dropped page cache: wall
time, bytes read from the disk, CPU seconds, for a number of readers per file and a read size.

Run as root from the repo root (the disk is vda; results/spot-checks/first-on-node):
    PYTHONPATH=toolkit .venv/bin/python experiments/verify_alone.py SNAPSHOT READERS READ_MIB
"""
import os
import sys
import time
from pathlib import Path

from coldstart.pipeline import integrity
from coldstart.pipeline.manifest import read_manifest


def disk_read() -> int:
    return int(open("/sys/block/vda/stat").read().split()[2]) * 512


snap, threads = Path(sys.argv[1]), int(sys.argv[2])
integrity.READ = int(sys.argv[3]) << 20
m = read_manifest(snap)
os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
r0, c0, t = disk_read(), os.times(), time.perf_counter()
integrity.verify(snap, dict(m.files), "full", threads=threads)
dt, c1, r1 = time.perf_counter() - t, os.times(), disk_read()
print(threads, sys.argv[3], "MiB", round(dt, 2), "s", "disk", round((r1 - r0) / 2**30, 2), "GiB",
      round((r1 - r0) / 2**30 / dt, 2), "GiB/s cpu", round(c1.user + c1.system - c0.user - c0.system, 2), flush=True)
