"""How should a cold copy into the weight arena read this disk? (results/spot-checks/read-shapes-avx2)

    .venv/bin/python experiments/cold_copy_shapes.py FLAT_DIR [ROUNDS]

Builds a WeightArena laid out like the flat file (as the engine's worker has), and per round, for
each variant in rotated order: drops the page cache, releases the arena (as sleep level 2 does, so
the copy pays the zero-fill faults the worker's does) and times coldstart.weights.loader.load_into
into it. Prints one line per load (seconds, GiB/s, busy CPU-seconds of this process) and the medians.
Arena: released (as after a sleep), +touched (every page faulted in before the clock starts: what
the faults cost), +thp (released, then MADV_HUGEPAGE: 2 MiB faults). Reads: buffered (2 readers,
own ranges), O_DIRECT as the loader's default (8 readers, own ranges, 16 MiB pieces, 1 MiB reads)
and from one shared queue of pieces in file order (the worker's copy); fio's O_DIRECT at 16 reads
in flight and with 8 jobs in the same rotation, for the device. The map reload's read for
comparison: the file mapped over the released arena and populated (MADV_POPULATE_READ) in 4 or 8
threads, with and without its MADV_WILLNEED first (results/spot-checks/read-shapes-intel).
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from coldstart.engine.arena import WeightArena, _madvise
from coldstart.weights.format import read_index, torch_dtype
from coldstart.weights.loader import load_into

MiB = 1 << 20
MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23
VARIANTS = {
    "buffered-t2-ranges": dict(direct=False),
    "odirect-t8-ranges-16M-1M": dict(direct=True),
    "odirect-t8-shared-16M-1M": dict(direct=True, layout="shared"),
    "odirect-t8-shared-16M-1M+touched": dict(direct=True, layout="shared", arena="touched"),
    "odirect-t8-shared-16M-1M+thp": dict(direct=True, layout="shared", arena="thp"),
    "buffered-t2-ranges+touched": dict(direct=False, arena="touched"),
    "buffered-t2-ranges+thp": dict(direct=False, arena="thp"),
    "fio-odirect-qd16-1M": dict(fio="--direct=1 --bs=1M --ioengine=io_uring --iodepth=16"),
    "fio-odirect-8jobs-1M": dict(fio="--direct=1 --bs=1M --ioengine=psync", jobs=8),
    "fio-odirect-4jobs-1M": dict(fio="--direct=1 --bs=1M --ioengine=psync", jobs=4),
    "fio-buffered-4jobs-1M": dict(fio="--direct=0 --bs=1M --ioengine=psync", jobs=4),
    "map-populate-t4": dict(map=dict(threads=4)),
    "map-populate-t8": dict(map=dict(threads=8)),
    "map-populate-t4-nowillneed": dict(map=dict(threads=4, willneed=False)),
}


def fio(path: Path, args: str, jobs: int = 1) -> float:
    """Seconds fio takes to read ``path`` with ``args`` (``jobs`` readers, each its own range): like
    bench.weights.fio_run, which has psync reads only, also with io_uring queue depths."""
    import json
    import subprocess

    part = path.stat().st_size // jobs // MiB * MiB
    cmd = ["fio", "--name=s", f"--filename={path}", "--readonly", "--rw=read", f"--numjobs={jobs}",
           "--group_reporting", "--output-format=json", *args.split()]
    if jobs > 1:
        cmd += [f"--size={part}", f"--offset_increment={part}"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["jobs"][0]["read"]
    return r["io_bytes"] / r["bw_bytes"]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(flat: Path, rounds: int) -> None:
    import torch

    index = read_index(flat)
    named = {e.name: torch.zeros(e.shape, dtype=torch_dtype(e.dtype)) for e in index.tensors}
    arena = WeightArena.build(named, index.alignment)
    size = Path(index.data_file).stat().st_size
    got = defaultdict(list)
    names = list(VARIANTS)
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            kw = dict(VARIANTS[name])
            prep = kw.pop("arena", "released")
            arena.release()
            if prep == "thp":
                _madvise(arena.addr, arena.size, MADV_HUGEPAGE)
            elif prep == "touched":
                _madvise(arena.addr, arena.size, MADV_POPULATE_WRITE)
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            if "fio" in kw:
                dt = fio(Path(index.data_file), kw["fio"], kw.get("jobs", 1))
                got[name].append((dt, 0.0))
                print(f"{r} {name:28s} {dt:.3f} s {size / dt / 2**30:.2f} GiB/s", flush=True)
                continue
            c0, t0 = cpu_s(), time.perf_counter()
            if "map" in kw:
                arena.map_file(index, **kw["map"])
                dt, dc = time.perf_counter() - t0, cpu_s() - c0
                got[name].append((dt, dc))
                print(f"{r} {name:28s} {dt:.3f} s {size / dt / 2**30:.2f} GiB/s cpu {dc:.2f} s", flush=True)
                continue
            st = load_into(index, named, **kw)
            dt, dc = time.perf_counter() - t0, cpu_s() - c0
            got[name].append((dt, dc))
            print(f"{r} {name:28s} {dt:.3f} s {size / dt / 2**30:.2f} GiB/s cpu {dc:.2f} s {st.mode}"
                  f"{' O_DIRECT' if kw['direct'] else ''} {' '.join(st.notes)}", flush=True)
    print(f"medians over {rounds} rounds ({size / 2**30:.2f} GiB):")
    for name in names:
        s = statistics.median(d for d, _ in got[name])
        c = statistics.median(c for _, c in got[name])
        print(f"  {name:28s} {s:.3f} s  {size / s / 2**30:.2f} GiB/s  cpu {c:.2f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
