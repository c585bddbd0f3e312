"""The kernel's CPU list form ('0-2,5'), shared by the loader's reader threads and the restore's
CPU masks (stages below and above each other both need it), and the one way a helper thread leaves
the one-core mask vLLM gives its worker (``widen_thread``)."""
from __future__ import annotations

import os
from pathlib import Path


def parse_cpus(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpus(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def online_cpus() -> set[int]:
    try:
        return parse_cpus(Path("/sys/devices/system/cpu/online").read_text())
    except OSError:
        return set(range(os.cpu_count() or 1))


def widen_thread() -> tuple[set[int], set[int]] | None:
    """Let the calling thread run on every online CPU (the kernel keeps only what the cpuset allows).
    A thread inherits its creator's mask, and vLLM binds its CPU worker to one core: helper threads
    started there (loader readers, weight packing, settling) would all share that core. Returns
    (mask before, mask after) when it widened, None when there was nothing to widen or it failed."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        mine = os.sched_getaffinity(0)
        want = online_cpus()
        if want <= mine:
            return None
        os.sched_setaffinity(0, want)
        return mine, os.sched_getaffinity(0)
    except OSError:
        return None
