"""Does the block device's I/O scheduler decide the page cache's cold read rate (and how far it falls
behind O_DIRECT) on this VM's disk?

This VM's virtio disk comes up with mq-deadline and marked rotational; NVMe disks, what GPU nodes
read snapshots from, come up with `none`. Our reload maps the weights file (reads through the page
cache) and reached 0.92-0.98x fio's buffered rate but only 0.77-0.91x the device's best (O_DIRECT)
rate in seven runs (docs/engine.md). For each round and scheduler (alternating), the page cache
dropped before each: fio's four shapes of `bench reload`'s device probe on FILE, and a 4 KiB read's
latency while 2 readers x 2 MiB (the host warmer's shape) stream the same file. The scheduler is put
back as it was on exit.

    PYTHONPATH=toolkit .venv/bin/python experiments/io_scheduler.py FILE --rounds 5 \\
        --out results/spot-checks/io-scheduler/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

from coldstart.bench.weights import fio_run
from coldstart.warm.residency import drop_caches

SHAPES = ((0, 4, 16 << 20, "buffered 4x16M"), (0, 4, 1 << 20, "buffered 4x1M"),
          (1, 4, 1 << 20, "direct 4x1M"), (1, 8, 1 << 20, "direct 8x1M"))


def sched_path(file: Path) -> Path:
    """/sys/block/<disk>/queue/scheduler of the disk holding ``file`` (a partition's parent)."""
    dev = os.stat(file).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    for d in (sys_dev, sys_dev.parent):
        if (d / "queue" / "scheduler").exists():
            return d / "queue" / "scheduler"
    raise SystemExit(f"no scheduler file for {file}'s device")


def current(p: Path) -> str:
    return p.read_text().split("[")[1].split("]")[0]


def small_reads_beside_bulk(file: Path, n: int = 40) -> dict:
    """4 KiB O_DIRECT reads at spread offsets (one at a time) while two threads read the file in 2 MiB
    buffered chunks from its start: the waits a restore's own reads see beside the host warmer."""
    size = file.stat().st_size
    stop = threading.Event()
    done = [0]

    def bulk(k: int) -> None:
        fd = os.open(file, os.O_RDONLY)
        try:
            off = k * (2 << 20)
            while not stop.is_set() and off < size:
                done[0] += len(os.pread(fd, 2 << 20, off))
                off += 2 * (2 << 20)
        finally:
            os.close(fd)

    ts = [threading.Thread(target=bulk, args=(k,)) for k in range(2)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    time.sleep(0.05)
    fd = os.open(file, os.O_RDONLY | os.O_DIRECT)
    import mmap

    buf = mmap.mmap(-1, 4096)
    waits = []
    try:
        for i in range(n):
            off = (size // 2 + i * (size // (2 * n))) // 4096 * 4096
            a = time.monotonic()
            os.preadv(fd, [buf], off)
            waits.append(time.monotonic() - a)
    finally:
        os.close(fd)
        stop.set()
        for t in ts:
            t.join()
    secs = time.monotonic() - t0
    waits.sort()
    return {"small_reads": n, "small_p50_ms": round(waits[n // 2] * 1e3, 2),
            "small_p90_ms": round(waits[int(n * 0.9)] * 1e3, 2), "bulk_gib_s": round(done[0] / secs / 2**30, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scheds", default="mq-deadline,none")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    sp = sched_path(a.file)
    was = current(sp)
    scheds = a.scheds.split(",")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        with a.out.open("a") as f:
            for rnd in range(a.rounds):
                for s in (scheds if rnd % 2 == 0 else scheds[::-1]):
                    sp.write_text(s)
                    row = {"round": rnd, "scheduler": current(sp), "file": a.file.name}
                    for direct, jobs, bs, what in SHAPES:
                        drop_caches()
                        nb, secs = fio_run(a.file, direct, jobs, bs)
                        row[what] = round(nb / secs / 2**30, 3)
                    drop_caches()
                    row.update(small_reads_beside_bulk(a.file))
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(json.dumps(row), flush=True)
    finally:
        sp.write_text(was)
    for s in scheds:
        mine = [r for r in rows if r["scheduler"] == s]
        print(s, {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("round", "scheduler", "file")})


if __name__ == "__main__":
    main()
