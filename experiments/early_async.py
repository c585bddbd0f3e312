"""The host warmer's early reads asked for all at once instead of one after another? In a cold
container restore with host warming, the early reader (containers.run.HostWarm) reads ~220 MB of
small files and page runs at ~0.8 GiB/s, one read at a time, where the disk reads a large file at
1.7-1.9 GiB/s (results/spot-checks/host-warm-alone). posix_fadvise(WILLNEED) queues a range's read
and returns: asked for every file and range first, the disk gets them all in flight.

    early:  the early reader's work alone, page cache dropped before each, variants interleaved
    whole:  HostWarm as `container restore` starts it (early reader + bulk), with and without
            HostWarm(early_ask=True), an option of the commit that added results/spot-checks/early-ask
            (removed in the next commit: not kept)

    DOCKER_HOST=unix:///var/lib/coldstart-docker/docker.sock PYTHONPATH=toolkit .venv/bin/python \\
        experiments/early_async.py early IMAGE SNAPSHOT 8
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from coldstart.bench.warm import block_device, device_read_bytes
from coldstart.containers import docker_api, run
from coldstart.fsutil import data_extents
from coldstart.warm.base import early_ranges
from coldstart.warm.residency import drop_caches


def _ask(paths: list[Path], ranges) -> int:
    """WILLNEED for every file's data and every range; returns the bytes asked for."""
    n = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for a, b in data_extents(fd):
                os.posix_fadvise(fd, a, b - a, os.POSIX_FADV_WILLNEED)
                n += b - a
        finally:
            os.close(fd)
    fds: dict[Path, int] = {}
    try:
        for path, off, length in ranges:
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            os.posix_fadvise(fds[path], off, length, os.POSIX_FADV_WILLNEED)
            n += length
    finally:
        for fd in fds.values():
            os.close(fd)
    return n


def _sync(paths: list[Path], ranges) -> int:
    n = 0
    for p in paths:
        try:
            n += run._read_data(p)
        except OSError:
            continue
    return n + run._read_ranges(ranges)


def early(snap: Path, remap, reps: int) -> None:
    dev = block_device(snap)
    hot = sorted((snap / "criu").glob("pages-*.img")) if (snap / "criu" / "parent").is_dir() else []
    variants = ("sync", "async", "async-then-sync")
    for rep in range(reps):
        for name in (variants if rep % 2 == 0 else variants[::-1]):
            drop_caches()
            r0, t0 = device_read_bytes(dev), time.monotonic()
            paths = run.early_files(snap, remap)
            t_list = time.monotonic() - t0
            ranges = early_ranges(hot)
            out = {"variant": name, "rep": rep, "files": len(paths), "ranges": len(ranges),
                   "list_s": round(t_list, 3)}
            if name == "sync":
                out["bytes"] = _sync(paths, ranges)
            else:
                out["bytes"] = _ask(paths, ranges)
                out["asked_s"] = round(time.monotonic() - t0, 3)
                if name == "async-then-sync":
                    _sync(paths, ranges)  # waits for what is still in flight
            out["total_s"] = round(time.monotonic() - t0, 3)
            out["disk_read"] = device_read_bytes(dev) - r0
            out["gib_s"] = round(out["disk_read"] / 2**30 / out["total_s"], 2)
            print(json.dumps(out), flush=True)


def whole(snap: Path, layers, reps: int) -> None:
    dev = block_device(snap)
    variants = {"default": {}, "ask-first": {"early_ask": True}}
    for rep in range(reps):
        for name, kw in (variants.items() if rep % 2 == 0 else list(variants.items())[::-1]):
            drop_caches()
            r0, t0 = device_read_bytes(dev), time.monotonic()
            hw = run.HostWarm(snap, layers, **kw)
            hw.container_started()
            st = hw.wait()
            t = time.monotonic() - t0
            rd = device_read_bytes(dev) - r0
            print(json.dumps({"variant": name, "rep": rep, "total_s": round(t, 3), "early": hw.early,
                              "bulk_bytes": st.bytes, "disk_read": rd, "gib_s": round(rd / 2**30 / t, 2)}), flush=True)


def main() -> None:
    mode, tag, snap = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    layers = docker_api.image_layers(docker_api.client(None), tag)
    remap = docker_api.layer_remap(layers)
    if mode == "early":
        early(snap, remap, int(sys.argv[4]))
    else:
        whole(snap, layers, int(sys.argv[4]))


if __name__ == "__main__":
    main()
