"""`bench reload`'s bound line: each cold default reload against its own round's device probe, and
against max(the file at that speed, the host's busy CPU-seconds over the cores)."""
from __future__ import annotations

import os

from coldstart.bench.pipeline import _reload_bound


def test_the_bound_names_the_cpu_where_the_step_needed_more_cpu_than_disk_time() -> None:
    cores = os.cpu_count() or 1
    gib = 1 << 30
    rows = [  # round 0: the disk reads the GiB in 0.5 s, the step used 1.6 s x cores of CPU
        {"cache": "cold", "method": "auto", "rep": 0, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0,
         "host_cpu_busy_s": 0.8 * cores},
        # round 1: the disk is the larger (1 s), the step took 1.25 s
        {"cache": "cold", "method": "auto", "rep": 1, "bytes": gib, "seconds": 1.25, "wall_seconds": 1.25,
         "host_cpu_busy_s": 0.1 * cores},
        {"cache": "warm", "method": "auto", "rep": 0, "bytes": gib, "seconds": 0.1, "host_cpu_busy_s": 1.0},
    ]
    text = " ".join(_reload_bound(rows, {0: 2.0, 1: 1.0}))
    assert "(each: 0.50, 0.80)" in text  # against the device alone
    assert "(each: 0.80, 0.80)" in text and "larger in 1 of 2 rounds" in text
    assert _reload_bound(rows, {}) == []  # no device probe: no line
