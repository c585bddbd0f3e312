"""A process that holds GPU memory with known contents, for checkpoint tests: ``python3 -m
coldstart.gpu.holder --bytes N --dir D``.

It talks to the driver directly (ctypes on libcuda, no torch: a small process for CRIU to dump),
fills N bytes of device memory with seeded random data, writes ``D/ready.json`` and then waits for
signals: SIGUSR1 copies everything back, checks each region's digest and writes ``D/verify.json``;
SIGUSR2 does the same and also checks ``--host-bytes`` of seeded host memory that nothing else reads
(the part of a served process a restore does not need before its first token); SIGTERM ends it. Signals and files, not pipes, because the process is dumped and restored by CRIU
and its parent changes. It uses pageable host memory only (no pinned mappings for CRIU to meet).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

REGION = 256 << 20  # bytes filled per copy: a region's first 8 bytes hold its index, the rest a seeded block


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import xxhash

    from coldstart.engine.cuda_checkpoint import check, libcuda

    p = argparse.ArgumentParser(prog="coldstart.gpu.holder")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host-bytes", type=int, default=0)
    a = p.parse_args(argv)
    sigs = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    cu = libcuda()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    dptr = ctypes.c_uint64()
    n = int(a.bytes)
    t0 = time.perf_counter()
    check(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(n)), f"cuMemAlloc({n})")
    block = np.frombuffer(np.random.default_rng(a.seed).bytes(min(REGION, n)), dtype=np.uint8).copy()
    digests: list[int] = []
    off = 0
    while off < n:
        k = min(REGION, n - off)
        block[:8] = np.frombuffer(int(off // REGION).to_bytes(8, "little"), dtype=np.uint8)[: min(8, k)]
        part = block[:k]
        check(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr.value + off), part.ctypes.data_as(ctypes.c_void_p),
                                 ctypes.c_size_t(k)), "cuMemcpyHtoD")
        digests.append(xxhash.xxh3_64_intdigest(part))
        off += k
    del block
    host = np.frombuffer(np.random.default_rng(a.seed + 1).bytes(a.host_bytes), dtype=np.uint8) if a.host_bytes else None
    host_digest = xxhash.xxh3_64_intdigest(host) if host is not None else 0
    _write_json(a.dir / "ready.json", {"pid": os.getpid(), "bytes": n, "regions": len(digests),
                                       "fill_s": round(time.perf_counter() - t0, 4)})
    buf = np.empty(min(REGION, n), dtype=np.uint8)
    count = 0
    while True:
        sig = signal.sigwait(sigs)
        if sig == signal.SIGTERM:
            return 0
        count += 1
        t0 = time.perf_counter()
        bad: list[int] = []
        err = ""
        try:
            check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            off = 0
            for i, want in enumerate(digests):
                k = min(REGION, n - off)
                check(cu.cuMemcpyDtoH_v2(buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(dptr.value + off),
                                         ctypes.c_size_t(k)), "cuMemcpyDtoH")
                if xxhash.xxh3_64_intdigest(buf[:k]) != want:
                    bad.append(i)
                off += k
        except Exception as e:  # noqa: BLE001 - reported to the controller, which decides
            err = str(e)
        host_ok = None
        if sig == signal.SIGUSR2 and host is not None:
            host_ok = xxhash.xxh3_64_intdigest(host) == host_digest
            if not host_ok:
                err = (err + "; " if err else "") + "host memory differs from what was written"
        _write_json(a.dir / "verify.json", {"n": count, "ok": not bad and not err, "bad_regions": bad[:20],
                                            "n_bad": len(bad), "error": err, "pid": os.getpid(), "host_ok": host_ok,
                                            "seconds": round(time.perf_counter() - t0, 4)})


if __name__ == "__main__":
    sys.exit(main())
