"""What memory the guest has not touched lately costs on this VM, beside the same work on memory it
has. A cold restore fills the page cache with the snapshot (~2 GiB for the bench model) and the
restored worker packs its weights into fresh buffers (1.25 GiB); a warm restore finds the page cache
filled. On the 2-core VMs here the first touch of freed memory looked costly, so this measures,
in child processes, interleaved:

- anon: memset over a fresh 2 GiB anonymous mapping, then again over the same pages;
- shm: write 2 GiB into a new file in /dev/shm (page cache pages, no disk), then overwrite it;
- read: a 2 GiB file on the disk read cold, buffered (fills the page cache) and with O_DIRECT into
  one reused buffer (no page cache), with the CPU seconds the whole machine spent meanwhile.

    .venv/bin/python experiments/first_touch.py --reps 3 --file /var/tmp/coldstart-first-touch.bin \\
        > results/spot-checks/first-touch/raw.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time

from coldstart.warm.residency import drop_caches
from coldstart.bench.warm import host_cpu_busy_s as cpu_busy_s

GIB = 1 << 30
CHUNK = 8 << 20


def anon(n: int) -> dict:
    libc = ctypes.CDLL(None)
    m = mmap.mmap(-1, n)
    addr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    c0, t0 = cpu_busy_s(), time.perf_counter()
    libc.memset(addr, 1, ctypes.c_size_t(n))
    c1, t1 = cpu_busy_s(), time.perf_counter()
    libc.memset(addr, 2, ctypes.c_size_t(n))
    t2 = time.perf_counter()
    return {"first_s": round(t1 - t0, 4), "again_s": round(t2 - t1, 4), "first_cpu_s": round(c1 - c0, 3)}


def shm(n: int) -> dict:
    path = f"/dev/shm/coldstart-first-touch-{os.getpid()}"
    buf = b"\1" * CHUNK
    out = {}
    try:
        for key in ("first", "again"):
            c0, t0 = cpu_busy_s(), time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for off in range(0, n, CHUNK):
                    os.pwrite(fd, buf, off)
            finally:
                os.close(fd)
            out[f"{key}_s"] = round(time.perf_counter() - t0, 4)
            out[f"{key}_cpu_s"] = round(cpu_busy_s() - c0, 3)
    finally:
        os.unlink(path)
    return out


def read(path: str, direct: bool) -> dict:
    drop_caches()
    n = os.path.getsize(path)
    mm = mmap.mmap(-1, CHUNK)  # page-aligned, reused: O_DIRECT needs aligned buffers
    mv = memoryview(mm)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    c0, t0 = cpu_busy_s(), time.perf_counter()
    try:
        off = 0
        while off < n:
            got = os.preadv(fd, [mv], off)
            if got <= 0:
                break
            off += got
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    return {"seconds": round(dt, 4), "gib_s": round(n / GIB / dt, 3), "cpu_s": round(cpu_busy_s() - c0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--file", default="/var/tmp/coldstart-first-touch.bin", help="the disk file read (made once)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    n = int(a.gib * GIB)
    if a.child:
        kind, _, arg = a.child.partition(":")
        res = anon(n) if kind == "anon" else shm(n) if kind == "shm" else read(a.file, arg == "direct")
        print(json.dumps(res))
        return
    if not os.path.exists(a.file) or os.path.getsize(a.file) != n:
        with open(a.file, "wb") as f:
            for _ in range(n // CHUNK):
                f.write(os.urandom(CHUNK))
            f.flush()
            os.fsync(f.fileno())
    host = {"cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
            "cpus": os.cpu_count(), "kernel": os.uname().release, "gib": a.gib}
    print(json.dumps({"host": host, "argv": sys.argv[1:]}), flush=True)
    cases = ["anon", "shm", "read:buffered", "read:direct"]
    for rep in range(a.reps):
        for case in (cases if rep % 2 == 0 else cases[::-1]):
            out = subprocess.run([sys.executable, __file__, "--child", case, "--gib", str(a.gib), "--file", a.file],
                                 capture_output=True, text=True, check=True).stdout
            print(json.dumps({"case": case, "rep": rep, **json.loads(out.strip().splitlines()[-1])}), flush=True)


if __name__ == "__main__":
    main()
