"""Where a cold container restore's CRIU phase goes: one restore container, page cache dropped, with
or without host warming, CRIU at -v4. Prints the entrypoint's events, COLDSTART_T0 and the absolute
birth/modification times of the files in CRIU's work dir (restore.log is created when CRIU opens its
log and last written when it ends), and saves CRIU's log as ./container-criu-restore-MODE.log.

    .venv/bin/python experiments/container_criu_log.py hw --size bench
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from coldstart.bench.containers import bench_case
from coldstart.containers.run import first_completion, summary
from coldstart.warm.residency import drop_caches
from coldstart.containers import run
from coldstart.engine.launcher import free_port

WORK_DIR = "/run/coldstart/restores/*/criu"  # the restore's CRIU work dir inside the container


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("hw", "none"), help="hw: the host warms the snapshot; none: it does not")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work)
    drop_caches()
    port = free_port()
    t0, wall0 = time.monotonic(), time.time()
    warmer = run.host_warm(snap, layers) if a.mode == "hw" else None
    ctr = run.create_restore(c, tag, snap, model, port, host_warms=warmer is not None,
                             env={"COLDSTART_T0": repr(wall0), "COLDSTART_CRIU_LOG_LEVEL": "4"})
    try:
        ctr.start()
        if warmer is not None:
            warmer.container_started()
        print("first token", round(first_completion(port, str(model), t0 + 300, ctr) - t0, 3))
        print(json.dumps(summary(ctr, time.monotonic() + 60).get("events")))
        print("COLDSTART_T0", wall0)
        stat = f'cd {WORK_DIR} && stat -c "%n %.9W %.9Y" restore.log restored.pid notify.sh stats-restore'
        print(ctr.exec_run(["sh", "-c", stat]).output.decode())
        log = ctr.exec_run(["sh", "-c", f"cat {WORK_DIR}/restore.log"]).output
        Path(f"container-criu-restore-{a.mode}.log").write_bytes(log)
    finally:
        if warmer is not None:
            warmer.container_started()
            warmer.wait()
        ctr.remove(force=True)


if __name__ == "__main__":
    main()
