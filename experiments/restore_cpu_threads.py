"""Which threads use the 2 CPUs while a container restore runs to its first token: warm, against cold
with host warming (results/container-prepack-wait: cold, the prepack runs slower without waiting
for its weights). Every thread of the machine is sampled (utime + stime from /proc/*/task/*/stat,
every 50 ms) from just before the create call; a thread's CPU seconds up to the first token are
summed by (process name, thread name), so the kernel's threads count too.

    .venv/bin/python experiments/restore_cpu_threads.py --reps 3 \\
        --out results/spot-checks/restore-cpu-threads/raw.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

from coldstart.bench.containers import one_start, bench_case
from coldstart.warm.residency import drop_caches

HZ = os.sysconf("SC_CLK_TCK")
# process and thread names carry numbers (kworker/1:2, cs-populate-3): grouped without them
_DIGITS = re.compile(r"\d+")


def _group(process: str, thread: str) -> str:
    """'process/thread' without numbers; the kernel's workers as one group each."""
    if process.startswith(("kworker", "ksoftirqd", "kswapd", "kcompactd", "khugepaged")):
        return "kernel/" + _DIGITS.sub("N", process.split("/")[0].split("-")[0])
    return f"{_DIGITS.sub('N', process)}/{_DIGITS.sub('N', thread)}"


def _comm(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def threads_cpu() -> dict[int, tuple[str, str, float]]:
    """tid -> (process name, thread name, CPU seconds so far)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        pname = _comm(f"/proc/{pid}/comm")
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            fields = s[s.rindex(")") + 2:].split()
            out[int(tid)] = (pname, name, (int(fields[11]) + int(fields[12])) / HZ)
    return out


class Sampler:
    """The CPU each thread has used since start(), up to a given second (samples every ``every``)."""

    def __init__(self, every: float = 0.05):
        self.every = every
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()

    def start(self) -> "Sampler":
        self.t0 = time.monotonic()
        self.base = threads_cpu()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.monotonic() - self.t0, threads_cpu()))

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def used_until(self, t: float) -> dict[str, float]:
        """CPU seconds by 'process/thread' (digits dropped) from start to ``t`` s after it."""
        last: dict[int, tuple[str, str, float]] = {}
        for ts, snap in self.samples:
            if ts > t:
                break
            last.update(snap)  # a thread that has ended keeps its last sample
        out: dict[str, float] = defaultdict(float)
        for tid, (p, n, cpu) in last.items():
            before = self.base.get(tid)  # (by tid: a kworker's name changes with its work item)
            d = cpu - (before[2] if before is not None else 0.0)
            if d > 0:
                out[_group(p, n)] += d
        return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    one_start(c, tag, "restore", model, snap, layers)  # the node's first restore: profile, digests
    by_variant: dict[str, list[dict]] = defaultdict(list)
    with open(a.out, "w") as out:
        for rep in range(a.reps):
            for v in (["warm", "cold"] if rep % 2 == 0 else ["cold", "warm"]):
                if v == "warm":
                    one_start(c, tag, "restore", model, snap, layers)  # prewarm
                else:
                    drop_caches()
                s = Sampler().start()
                row = one_start(c, tag, "restore" if v == "warm" else "restore+hostwarm", model, snap, layers)
                s.stop()
                ev = row.get("events") or {}
                # (the sampler's clock starts just before the create call: within a few ms of it)
                to_ft = s.used_until(ev.get("FIRST_TOKEN", row.get("first_token_s") or 0))
                weights = s.used_until(ev.get("WEIGHTS_LOADED", 0))
                wake = s.used_until(ev.get("WAKE_WEIGHTS", 0))
                during = {k: round(weights.get(k, 0) - wake.get(k, 0), 3) for k in weights}
                rec = {"variant": v, "rep": rep, "first_token_s": row.get("first_token_s"),
                       "wake_s": ev.get("WAKE_WEIGHTS"), "weights_loaded_s": ev.get("WEIGHTS_LOADED"),
                       "cpu_to_first_token": {k: round(x, 3) for k, x in sorted(to_ft.items(), key=lambda kv: -kv[1])},
                       "cpu_during_weights": dict(sorted(during.items(), key=lambda kv: -kv[1]))}
                by_variant[v].append(rec)
                out.write(json.dumps(rec) + "\n")
                out.flush()
                top = list(rec["cpu_during_weights"].items())[:6]
                print(f"{v} rep {rep}: first token {rec['first_token_s']} s; during the weights step: "
                      + ", ".join(f"{k} {x:.2f}" for k, x in top), flush=True)
    for v, recs in by_variant.items():
        keys = {k for r in recs for k in r["cpu_during_weights"]}
        med = {k: statistics.median(r["cpu_during_weights"].get(k, 0) for r in recs) for k in keys}
        print(v, "median CPU-s during the weights step:",
              ", ".join(f"{k} {x:.2f}" for k, x in sorted(med.items(), key=lambda kv: -kv[1])[:12]))


if __name__ == "__main__":
    main()
