"""Two checks of how this machine's disk is measured and asked for (results/spot-checks/disk-variance):

    .venv/bin/python experiments/disk_probes.py willneed FILE   # one WILLNEED call vs fsutil.will_need
    .venv/bin/python experiments/disk_probes.py sparse SNAP     # the disk probed on a sparse vs a dense file

``willneed``: 1 GiB of FILE asked for with one POSIX_FADV_WILLNEED call, then in pieces of 2 and 8 MiB
and with fsutil.will_need, the page cache dropped before each; resident bytes 1.5 s later.
``sparse``: bench.warm.best_bandwidth on the snapshot's longest file (the hot layout's parent pages
image, mostly holes) and on bench.warm.probe_file's choice, twice each, alternating.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from coldstart.bench.warm import best_bandwidth, probe_file
from coldstart.fsutil import will_need
from coldstart.warm.residency import resident_bytes

MiB = 1 << 20


def willneed(f: Path) -> None:
    n = min(1024 * MiB, f.stat().st_size)
    for how in ("one call", "2 MiB pieces", "8 MiB pieces", "fsutil.will_need"):
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        fd = os.open(f, os.O_RDONLY)
        t = time.monotonic()
        if how == "one call":
            os.posix_fadvise(fd, 0, n, os.POSIX_FADV_WILLNEED)
        elif how == "fsutil.will_need":
            will_need(fd, 0, n)
        else:
            step = int(how.split()[0]) * MiB
            for off in range(0, n, step):
                os.posix_fadvise(fd, off, min(step, n - off), os.POSIX_FADV_WILLNEED)
        dt = time.monotonic() - t
        os.close(fd)
        time.sleep(1.5)
        print(f"{how}: {n // MiB} MiB asked, the calls took {dt:.3f} s, resident 1.5 s later: "
              f"{resident_bytes(f)[0] // MiB} MiB", flush=True)


def sparse(snap: Path) -> None:
    files = [p for p in snap.rglob("*") if p.is_file()]
    longest, dense = max(files, key=lambda p: p.stat().st_size), probe_file(files)
    for f in (longest, dense, longest, dense):
        st, b = f.stat(), best_bandwidth(f)
        print(f"{f.relative_to(snap)}: {st.st_size / 2**30:.2f} GiB long, {st.st_blocks * 512 / 2**30:.2f} GiB on the "
              f"disk: O_DIRECT {b['odirect_gib_s']:.2f} GiB/s, buffered {b['buffered_gib_s']:.2f}", flush=True)


if __name__ == "__main__":
    {"willneed": willneed, "sparse": sparse}[sys.argv[1]](Path(sys.argv[2]))
