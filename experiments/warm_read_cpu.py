"""The CPU and the disk bytes a warming read method costs. Each method reads cold (page cache dropped
before each, methods interleaved) either FILES whole with the native warmer (2 readers x 2 MiB, the
host's shape) or, with ``--host-warm SNAPSHOT``, what the host's warming of a container restore
reads (containers.run.HostWarm: the early files, the node's profile's ranges, the weights; the
image's layers from docker). Wall time, the process's user and system time, all CPUs' user, system
and iowait over the read (/proc/stat) and the bytes the disk read (/proc/diskstats): on a 2-core
host the warmer's CPU is the restore's, and bytes past what the restore needs are disk time.
``sendfile-noexact``: sendfile with readahead left on for the profile's short runs too.

    .venv/bin/python experiments/warm_read_cpu.py FILE [FILE ...] --reps 3 --out OUT.jsonl
    .venv/bin/python experiments/warm_read_cpu.py --host-warm SNAPSHOT --reps 3 --out OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from pathlib import Path

from coldstart.warm.residency import drop_caches
from coldstart.bench.warm import block_device, device_read_bytes
from coldstart.warm import native
from coldstart.warm.base import MiB
from coldstart.warm.native import NativeWarmer


def _cpus() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:8]]


def _read(files: list[Path], snapshot: Path | None, layers, method: str, threads: int, chunk: int) -> dict:
    if snapshot is None:
        st = NativeWarmer(files, threads=threads, chunk=chunk, method=method, profile=None).start().wait()
        return {"bytes": st.bytes, "errors": st.errors}
    from coldstart.containers.run import HostWarm

    hw = HostWarm(snapshot, layers, after_start=False, threads=threads, chunk=chunk, method=method)
    st = hw.wait()
    return {"bytes": st.bytes if st else None, "errors": st.errors if st else hw.error, "early": hw.early}


def one(files: list[Path], snapshot: Path | None, layers, dev: str, method: str, threads: int, chunk: int) -> dict:
    base, exact = method.removesuffix("-noexact"), not method.endswith("-noexact")
    native.EXACT_RUN = 8 * MiB if exact else 0
    drop_caches()
    time.sleep(0.5)
    c0, r0, d0, t0 = _cpus(), resource.getrusage(resource.RUSAGE_SELF), device_read_bytes(dev), time.monotonic()
    got = _read(files, snapshot, layers, base, threads, chunk)
    wall = time.monotonic() - t0
    r1, c1, d1 = resource.getrusage(resource.RUSAGE_SELF), _cpus(), device_read_bytes(dev)
    d = [(b - a) / os.sysconf("SC_CLK_TCK") for a, b in zip(c0, c1)]
    return {"method": method, "threads": threads, "chunk": chunk, **got, "wall_s": round(wall, 3),
            "disk_read_bytes": d1 - d0, "disk_gib_s": round((d1 - d0) / wall / 2**30, 3),
            "proc_user_s": round(r1.ru_utime - r0.ru_utime, 3), "proc_sys_s": round(r1.ru_stime - r0.ru_stime, 3),
            "cpus_user_s": round(d[0] + d[1], 2), "cpus_sys_s": round(d[2] + d[5] + d[6], 2),
            "cpus_iowait_s": round(d[4], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--host-warm", type=Path, help="a container snapshot: read what HostWarm reads for it")
    ap.add_argument("--methods", default="sendfile,sendfile-noexact,pread")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-mib", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not a.files and a.host_warm is None:
        ap.error("name FILES or --host-warm SNAPSHOT")
    layers = None
    if a.host_warm is not None:
        from coldstart.containers import docker_api, image

        c = docker_api.client(None)  # the image the container benchmarks build from this tree
        layers = docker_api.image_layers(c, image.app_image(c, Path(__file__).resolve().parents[1], say=print).tag)
    dev = block_device(a.host_warm or a.files[0])
    methods = a.methods.split(",")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    with open(a.out, "w") as out:
        head = {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "device": dev,
                "files": [p.name for p in a.files],  # names only: no paths of this machine in results
                "host_warm": "/".join(a.host_warm.parts[-2:]) if a.host_warm else None}
        out.write(json.dumps(head) + "\n")
        for rep in range(a.reps):
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                row = {"rep": rep, **one(a.files, a.host_warm, layers, dev, m, a.threads, a.chunk_mib * MiB)}
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
