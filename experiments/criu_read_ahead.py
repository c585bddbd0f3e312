"""Does asking for the restorer's page reads at once (pipeline.restore.ReadAhead) shorten a cold
CRIU restore? With our mmap patch the restorer still preadv's every private page run under 256 KiB,
thousands of them one after another (2855 reads, 109 MiB for the bench model); cold, each waits on
the disk.

And does the entrypoint's warmer, reading from the start, slow that restore down? Page cache dropped
before each, the variants' order turning each repetition (VARIANTS: the warmer reading after CRIU's
resume or from the start, no warming, neither change); `coldstart restore SNAP --no-serve`, the restored
server stopped after each. Prints
and writes one JSON line per restore (its events, from the entrypoint's summary line).

    .venv/bin/python experiments/criu_read_ahead.py SNAPSHOT --reps 3 \\
        --out results/spot-checks/criu-read-ahead/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from coldstart.warm.residency import drop_caches


VARIANTS = {  # name -> (environment, extra arguments of `coldstart restore`)
    "warm-after-criu": ({"COLDSTART_WARM_AFTER_CRIU": "1"}, []),  # the read-ahead + the warmer after CRIU
    "warm-from-start": ({"COLDSTART_WARM_AFTER_CRIU": "0"}, []),
    "no-warm": ({"COLDSTART_WARM_AFTER_CRIU": "1"}, ["--no-warm"]),
    "before": ({"COLDSTART_WARM_AFTER_CRIU": "0", "COLDSTART_CRIU_READ_AHEAD": "0"}, []),  # neither
    "warm-after-criu-2x2M": ({"COLDSTART_WARM_AFTER_CRIU": "1", "COLDSTART_WARM_SHAPE": "2x2"}, []),  # 2 x 2 MiB, not 8 x 8
    "warm-from-start-2x2M": ({"COLDSTART_WARM_AFTER_CRIU": "0", "COLDSTART_WARM_SHAPE": "2x2"}, []),
    # CRIU checks each mapped ELF's build-id (mmaps its first MiB: a cold fault reads around it)
    "no-warm-filesize": ({"COLDSTART_WARM_AFTER_CRIU": "1", "COLDSTART_CRIU_FILE_VALIDATION": "filesize"},
                         ["--no-warm"]),
}


def one(snap: Path, variant: str) -> dict:
    more, extra = VARIANTS[variant]
    env = {**os.environ, **more}
    exe = Path(sys.executable).parent / "coldstart"
    out = subprocess.run([str(exe), "restore", str(snap), "--no-serve", *extra], env=env, capture_output=True,
                         text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith('{"url"')), None)
    if line is None:
        return {"variant": variant, "error": (out.stderr or out.stdout).strip()[-300:]}
    summ = json.loads(line)
    try:  # --no-serve leaves the server running: stop its tree before the next start
        root = psutil.Process(summ["pid"])
        for p in [*root.children(recursive=True), root]:
            p.kill()
        psutil.wait_procs([root], timeout=30)
    except psutil.Error:
        pass
    return {"variant": variant, "restored": summ.get("restored"), "events": summ.get("events")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        names = [v for v in a.variants.split(",") if v]
        for rep in range(a.reps):
            for v in (names if rep % 2 == 0 else names[::-1]):
                drop_caches()
                row = {"rep": rep, **one(a.snapshot, v)}
                ev = row.get("events") or {}
                print(json.dumps({"rep": rep, "variant": v, "restore_s": ev.get("RESTORE_DONE", 0) - ev.get("RESTORE_ISSUED", 0),
                                  "first_token": ev.get("FIRST_TOKEN"), "error": row.get("error")}), flush=True)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
