"""Does reading a cold file beside docker's start delay it, and does the reads' I/O class decide it?

    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_beside_reads.py IMAGE FILE REPS [MIB] [keep-memory] [VARIANTS]

Docker's binaries and IMAGE stay cached (one unmeasured start first), as on a node that runs
containers; before each start FILE (e.g. a snapshot's pages image) is evicted. Variants: nothing
beside the start ("none"); one thread reading FILE's first MIB MiB (default 256) into the page cache
from the create call on (sendfile, as the host warmer does), in the normal I/O class ("be") or the
idle class ("idle"); the same reads with FILE cached ("cached"); no reads, one thread hashing for
0.055 s, about as long as the reads take ("cpu"); the same bytes read with O_DIRECT, the disk busy
and the page cache untouched ("direct"); as many bytes of a sparse file's holes, the page cache
filled with no disk read ("holes"). VARIANTS: a comma list of them (default none,be,idle,cpu,cached). A container of IMAGE with our bridge network and a published port runs one
line of Python; times from the create call on the host's wall clock: the start call returned
("started"), Python's first line ("py"), the reader done ("read"). Medians; the order turns every
repetition. keep-memory: the VM's free page reporting off, free memory touched first
(bench.host.memory_kept). Needs root and our dockerd."""
import contextlib
import os
import statistics
import sys
import threading
import time

from coldstart.bench import host
from coldstart.containers import docker_api
from coldstart.warm.base import background_io
from coldstart.warm.residency import evict, read_into_cache

img, path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
nbytes = (int(sys.argv[4]) if len(sys.argv) > 4 else 256) << 20
c = docker_api.client(None)
net = docker_api.ensure_network(c)
PORT = {"8000/tcp": ("127.0.0.1", 18556)}


def reader(cls: str, out: dict, t0: float) -> None:
    if cls == "cpu":  # no reads: one core busy (sha256 releases the GIL) for as long as the reads took
        import hashlib

        buf = bytes(4 << 20)
        while time.time() - t0 < CPU_S:
            hashlib.sha256(buf).digest()
        out["read"] = time.time() - t0
        return
    if cls == "direct":  # the same bytes from the disk, past the page cache (O_DIRECT)
        import mmap

        buf = mmap.mmap(-1, 8 << 20)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for off in range(0, nbytes, 8 << 20):
                os.preadv(fd, [buf], off)
        finally:
            os.close(fd)
        out["read"] = time.time() - t0
        return
    if cls == "holes":  # page cache filled with no disk read: a sparse file's holes
        fd = os.open(HOLES, os.O_RDONLY)
        try:
            read_into_cache(fd, 0, nbytes)
        finally:
            os.close(fd)
        out["read"] = time.time() - t0
        return
    if cls == "idle":
        background_io("idle")
    fd = os.open(path, os.O_RDONLY)
    try:
        read_into_cache(fd, 0, nbytes)
    finally:
        os.close(fd)
    out["read"] = time.time() - t0


def start(variant: str) -> dict:
    if variant == "cached":  # the same reads, from the page cache
        fd = os.open(path, os.O_RDONLY)
        read_into_cache(fd, 0, nbytes)
        os.close(fd)
    else:
        evict(path)
        evict(HOLES)
    out: dict = {}
    t0 = time.time()
    th = None
    if variant != "none":
        th = threading.Thread(target=reader, args=(variant, out, t0))
        th.start()
    ctr = c.containers.create(img, ["-c", "import time; print(repr(time.time()))"], entrypoint=["python"],
                              network=net, ports=PORT, runtime=docker_api.oci_runtime(c))
    ctr.start()
    out["started"] = time.time() - t0
    ctr.wait()
    out["py"] = float(ctr.logs().decode().split()[0]) - t0
    ctr.remove()
    if th is not None:
        th.join()
    return out


keep = len(sys.argv) > 5 and sys.argv[5] == "keep-memory"
VS = sys.argv[6].split(",") if len(sys.argv) > 6 else ["none", "be", "idle", "cpu", "cached"]
HOLES = "/var/tmp/docker-start-beside-reads.holes"
with open(HOLES, "wb") as f:
    f.truncate(nbytes)
CPU_S = 0.055
rows = []
with host.memory_kept() if keep else contextlib.nullcontext():
    start("none")  # docker and the image cached
    for rep in range(reps):
        for v in (VS if rep % 2 == 0 else VS[::-1]):
            rows.append({"v": v, **start(v)})
            print(rows[-1], flush=True)
for v in VS:
    rs = [r for r in rows if r["v"] == v]
    print(v, {k: round(statistics.median(r[k] for r in rs), 3) for k in ("started", "py", "read") if k in rs[0]},
          "started:", sorted(round(r["started"], 3) for r in rs))
