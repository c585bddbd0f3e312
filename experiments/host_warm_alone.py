"""The host warmer alone, without a container: how fast does `HostWarm` (containers.run) read a
snapshot's profile on a dropped page cache, and when? In a cold container restore of the bench model
the first token follows the end of the host's reads (results/container-intel-14), which read at
1.3-1.4 GiB/s against the disk's 1.7-1.9 in the probes around each start.

    shapes:   whole page cache dropped before each, the shapes interleaved (order reversed every other round)
    timeline: one warm, the block device's read bytes sampled every 20 ms

    DOCKER_HOST=unix:///var/lib/coldstart-docker/docker.sock PYTHONPATH=toolkit .venv/bin/python \\
        experiments/host_warm_alone.py shapes IMAGE SNAPSHOT 6 \\
        '{"2x2": {}, "3x2": {"threads": 3}, "4x2": {"threads": 4}, "4x4": {"threads": 4, "chunk": 4194304}, "6x2": {"threads": 6}}'
    ... experiments/host_warm_alone.py timeline IMAGE SNAPSHOT

(stream.jsonl's "_early_list" variant ran with the code of 8c42a9b, which read the early files as
they were found; removed after: no gain.)
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from coldstart.bench.warm import block_device, device_read_bytes
from coldstart.containers import docker_api, run
from coldstart.warm.residency import drop_caches


def _warm(snap: Path, layers, shape: dict):
    hw = run.host_warm(snap, layers, **shape)
    hw.container_started()
    return hw, hw.wait()


def shapes(snap: Path, layers, reps: int, variants: dict) -> None:
    dev = block_device(snap)
    for rep in range(reps):
        for name, shape in (variants.items() if rep % 2 == 0 else list(variants.items())[::-1]):
            drop_caches()
            r0, t0 = device_read_bytes(dev), time.monotonic()
            hw, st = _warm(snap, layers, shape)
            t = time.monotonic() - t0
            rd = device_read_bytes(dev) - r0
            print(json.dumps({"shape": name, "rep": rep, "total_s": round(t, 3), "bulk_bytes": st.bytes,
                              "bulk_s": round(st.seconds, 3), "early": hw.early, "disk_read": rd,
                              "gib_s": round(rd / 2**30 / t, 2)}), flush=True)


def timeline(snap: Path, layers) -> None:
    dev = block_device(snap)
    drop_caches()
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), device_read_bytes(dev)))
            time.sleep(0.02)

    th = threading.Thread(target=sample)
    th.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    hw, _ = _warm(snap, layers, {})
    print("total", round(time.monotonic() - t0, 3), "early", hw.early)
    time.sleep(0.05)
    stop.set()
    th.join()
    base = samples[0][1]
    for (ta, ba), (tb, bb) in zip(samples, samples[1:]):
        if tb >= t0 - 0.03:
            print(f"{tb - t0:6.3f} {(bb - ba) / (tb - ta) / 2**30:6.2f} GiB/s  cum {(bb - base) / 2**20:7.0f} MiB")


def main() -> None:
    mode, tag, snap = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    layers = docker_api.image_layers(docker_api.client(None), tag)
    if mode == "shapes":
        shapes(snap, layers, int(sys.argv[4]), json.loads(sys.argv[5]))
    else:
        timeline(snap, layers)


if __name__ == "__main__":
    main()
