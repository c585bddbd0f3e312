"""The disk and the CPUs over one container restore: bytes read, reads completed and requests in
flight (/proc/diskstats of the snapshot's device) and the CPUs' user, system and idle shares
(/proc/stat) every 50 ms, beside the entrypoint's events, for one variant of
experiments/host_warm_shape.py (page cache dropped first; ``--warm``: not). Where is the disk
idle, where does it read slowly, and is it the disk or the two cores the restore waits for?
Run it after host_warm_shape.py has made the snapshot's first restore on this node (its profile).

    .venv/bin/python experiments/container_disk_timeline.py --size bench --variant started-8x8M-early \\
        --out results/spot-checks/host-warm-shape/timeline-early.json
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from coldstart.bench.containers import one_start, bench_case
from coldstart.warm.residency import drop_caches
from coldstart.bench.warm import block_device
from coldstart.pipeline.manifest import read_manifest
from coldstart.warm.residency import PAGE, residency_vector

import host_warm_shape as hws


def sample(dev: str, stop: threading.Event, out: list, weights: Path | None = None, pages: tuple[Path, ...] = (),
           every: float = 0.05) -> None:
    """(seconds, sectors read, reads completed, ms spent reading, requests in flight, (user, system,
    idle + iowait) jiffies of all CPUs, bytes of ``weights`` and of ``pages`` in the page cache),
    every ``every`` s."""
    t0 = time.monotonic()
    while not stop.is_set():
        cached = int(residency_vector(weights).sum()) * PAGE if weights else 0
        cached_pages = sum(int(residency_vector(p).sum()) for p in pages) * PAGE
        with open("/proc/stat") as f:
            c = [int(x) for x in f.readline().split()[1:8]]
        cpu = (c[0] + c[1], c[2] + c[5] + c[6], c[3] + c[4])
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if p[2] == dev:
                    out.append((round(time.monotonic() - t0, 3), int(p[5]), int(p[3]), int(p[6]), int(p[11]), cpu, cached, cached_pages))
                    break
        time.sleep(every)


def weights_file(snap: Path) -> Path | None:
    """The snapshot's flat weights file (the map reload's source), as its manifest names it."""
    m = read_manifest(snap)
    return snap / m.weights["flat"] if m.weights.get("flat") else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--variant", default="started-8x8M-early")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--warm", action="store_true", help="leave the page cache as it is (after a restore: warm)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work)
    shape = hws.VARIANTS[a.variant]
    if not a.warm:
        drop_caches()
    samples: list = []
    stop = threading.Event()
    t = threading.Thread(target=sample, args=(block_device(snap), stop, samples, weights_file(snap),
                                                     tuple(sorted((snap / "criu").glob("pages-*.img")))), daemon=True)
    t.start()
    row = one_start(c, tag, "restore" if shape is None else "restore+hostwarm", model, snap, layers,
                    host_warm=shape, env=hws.CONTAINER_ENV.get(a.variant))
    stop.set()
    t.join()
    s0 = samples[0]
    rows = []
    for prev, cur in zip(samples, samples[1:]):
        dt = cur[0] - prev[0]
        jiffies = [b - a for a, b in zip(prev[5], cur[5])]
        busy = [round(j / max(sum(jiffies), 1) * 2, 2) for j in jiffies[:2]]  # cores' worth (of 2)
        rows.append({"t": cur[0], "mib_s": round((cur[1] - prev[1]) * 512 / 2**20 / dt),
                     "reads": cur[2] - prev[2], "inflight": cur[4], "read_mib": round((cur[1] - s0[1]) * 512 / 2**20),
                     "user_cores": busy[0], "sys_cores": busy[1], "weights_cached_mib": cur[6] >> 20,
                     "pages_cached_mib": cur[7] >> 20})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"variant": a.variant, "run": row, "disk": rows}, indent=1))
    print("first token", row.get("first_token_s"), json.dumps({k: round(v, 2) for k, v in (row.get("events") or {}).items()}))
    for r in rows:
        if r["t"] <= (row.get("first_token_s") or 10) + 0.2:
            print(f'{r["t"]:6.2f} {r["mib_s"]:6d} MiB/s {r["reads"]:5d} reads {r["inflight"]:4d} in flight '
                  f'{r["read_mib"]:6d} MiB  cpu user {r["user_cores"]:.2f} sys {r["sys_cores"]:.2f} '
                  f'cached: weights {r["weights_cached_mib"]:5d} MiB, CRIU pages {r["pages_cached_mib"]:5d} MiB')


if __name__ == "__main__":
    main()
