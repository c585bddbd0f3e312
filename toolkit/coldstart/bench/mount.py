"""``coldstart bench mount``: read throughput of one large file through the lazy mount (registry
artifact → coldstart-lazyfs) against the same file on the local disk, sequential and random.

States, each read with the page cache dropped unless named so:
- ``local``: the file on this machine's disk (the reference every other row is set against);
- ``local page-cached``: the same, read again from the page cache;
- ``mount uncached``: a fresh mount over an emptied chunk cache: every chunk crosses the loopback
  link from the registry and is BLAKE3-checked before it is returned (prefetch off, so the reads
  alone drive the fetches);
- ``mount cached``: a fresh mount over the full chunk cache (what a node that fetched the artifact
  before sees): reads go kernel → FUSE → daemon → cache file on disk;
- ``mount page-cached``: the cached mount read again (the daemon opens files with keep-cache).

Sequential: the whole file in 1 MiB reads. Random: 4 KiB reads at uniformly drawn 4 KiB-aligned
offsets (one seed for every state), with POSIX_FADV_RANDOM so that readahead does not turn them into
sequential reads.
"""
from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path
from typing import Callable

Say = Callable[[str], None]
MiB = 1 << 20
STATES = ("local", "local page-cached", "mount uncached", "mount cached", "mount page-cached")


def make_file(path: Path, size: int) -> None:
    """Incompressible bytes (a model's weights are close to that), written once and kept."""
    if path.exists() and path.stat().st_size == size:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as f:
        for _ in range(size // (64 * MiB)):
            f.write(os.urandom(64 * MiB))
        f.write(os.urandom(size % (64 * MiB)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_seq(path: Path, block: int = MiB) -> dict:
    buf = bytearray(block)
    n = 0
    t0 = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                break
            n += got
    s = time.monotonic() - t0
    return {"bytes": n, "seconds": round(s, 4), "mib_s": round(n / MiB / s, 1)}


def read_random(path: Path, count: int, block: int = 4096, seed: int = 7) -> dict:
    size = path.stat().st_size
    rng = random.Random(seed)
    offs = [rng.randrange(size // block) * block for _ in range(count)]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        t0 = time.monotonic()
        for off in offs:
            os.pread(fd, block, off)
        s = time.monotonic() - t0
    finally:
        os.close(fd)
    return {"bytes": count * block, "seconds": round(s, 4), "reads_s": round(count / s),
            "mib_s": round(count * block / MiB / s, 2)}


def run_bench(work: Path, size: int, reps: int, random_reads: int, say: Say) -> list[dict]:
    from coldstart.warm.residency import drop_caches
    from coldstart.engine.launcher import free_port
    from coldstart.registry import artifact, mount, server

    src = work / "src"
    make_file(src / "blob.bin", size)
    srv = server.start(work / "registry", free_port())
    rows: list[dict] = []
    cache = work / "lazy-cache"
    os.environ["COLDSTART_LAZY_CACHE"] = str(cache)
    try:
        ref = f"http://{srv.host}/bench/blob:1"
        artifact.push(src, ref)
        for rep in range(reps):
            for state in STATES:
                for kind in ("seq", "random"):
                    if state == "mount uncached":
                        shutil.rmtree(cache, ignore_errors=True)
                    fill = state in ("local page-cached", "mount cached", "mount page-cached")
                    m = None
                    if state.startswith("mount"):
                        m = mount.mount(ref, work / "mnt", prefetch=False)
                    path = (m.mountpoint if m else src) / "blob.bin"
                    try:
                        if fill:
                            read_seq(path)  # fills the chunk cache (and the page cache)
                        if not state.endswith("page-cached"):
                            drop_caches()
                        r = read_seq(path) if kind == "seq" else read_random(path, random_reads)
                    finally:
                        if m:
                            m.unmount()
                    rows.append({"rep": rep, "state": state, "kind": kind, "file_bytes": size, **r})
                    say(str(rows[-1]))
    finally:
        srv.stop()
    return rows


def render(rows: list[dict], host: str, command: str) -> str:
    import statistics

    med = {(s, k): statistics.median(r["mib_s"] for r in rows if r["state"] == s and r["kind"] == k)
           for s in STATES for k in ("seq", "random")}
    rps = {s: statistics.median(r["reads_s"] for r in rows if r["state"] == s and r["kind"] == "random")
           for s in STATES}
    size = rows[0]["file_bytes"] / 2**30
    reps = len({r["rep"] for r in rows})
    L = ["# Lazy mount read throughput vs the local disk", "", f"`{command}`", "", host, "",
         f"One {size:g} GiB file of random bytes; medians of {reps} runs. Page cache dropped before each read "
         "unless the state says page-cached. Sequential: 1 MiB reads of the whole file. Random: 4 KiB reads at "
         "uniform 4 KiB-aligned offsets, POSIX_FADV_RANDOM. `mount uncached`: every chunk fetched from the "
         "registry over loopback and BLAKE3-checked (prefetch off); `mount cached`: a fresh mount over a full "
         "node chunk cache.", "",
         "| state | sequential (MiB/s) | vs local | random 4 KiB (reads/s) | random (MiB/s) | vs local |",
         "|---|---|---|---|---|---|"]
    for s in STATES:
        L.append(f"| {s} | {med[s, 'seq']:.0f} | {med[s, 'seq'] / med['local', 'seq']:.2f}x | {rps[s]:.0f} | "
                 f"{med[s, 'random']:.2f} | {med[s, 'random'] / med['local', 'random']:.2f}x |")
    c = med["mount cached", "seq"] / med["local", "seq"]
    per = lambda s: ", ".join(f"{r['mib_s']:.0f}" for r in rows if r["state"] == s and r["kind"] == "seq")  # noqa: E731
    L += ["", f"Sequential MiB/s per run, in run order: local {per('local')}; mount cached {per('mount cached')}. "
          "This VM's disk is a file on its host: how much of it the host has cached varies from run to run, "
          "so the local figure is noisy; the median is the reference.", "",
          f"Target: cached sequential read ≥ 0.8× the local disk: **{c:.2f}×** "
          + ("(met)." if c >= 0.8 else "(missed).")]
    return "\n".join(L) + "\n"
