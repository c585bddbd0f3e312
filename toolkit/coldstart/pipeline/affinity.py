"""CPU affinity of the server's threads across a checkpoint: CRIU 4.2.1 does not carry it.

Why: vLLM's CPU executor binds its worker's OpenMP threads to cores (``VLLM_CPU_OMP_THREADS_BIND=auto``
keeps one core per worker for the API server and EngineCore: on a 2-core host the worker gets core 0).
CRIU's core image holds a thread's nice, policy and priority but not its CPU mask, so a restored
worker runs unbound, beside the processes vLLM meant to keep off its cores. The checkpoint records
every thread's mask that is narrower than the host's online CPUs, by the thread's ID inside the
server's PID namespace (CRIU restores those IDs); the restore sets them again, on the CPUs of that
list that it may use itself. The restored OpenMP runtime keeps the thread count it was started
with: a snapshot restored on a bigger host still computes on the checkpoint host's number of cores.
"""
from __future__ import annotations

import os
from pathlib import Path

from coldstart.cpulist import format_cpus, online_cpus, parse_cpus

PROC = Path("/proc")


def threads(pids: list[int]):
    """(host TID, TID inside the innermost PID namespace, allowed CPUs) of every thread of ``pids``."""
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(PROC / str(pid) / "task")]
        except OSError:
            continue
        for tid in tids:
            ns_tid, cpus = None, None
            try:
                for line in (PROC / str(pid) / "task" / str(tid) / "status").read_text().splitlines():
                    if line.startswith("NSpid:"):
                        ns_tid = int(line.split()[-1])
                    elif line.startswith("Cpus_allowed_list:"):
                        cpus = parse_cpus(line.split(":", 1)[1])
            except OSError:
                continue
            if ns_tid is not None and cpus is not None:
                yield tid, ns_tid, cpus


def record(pids: list[int]) -> dict[str, str]:
    """{namespace TID: CPU list} for every thread of the tree bound to fewer than the online CPUs."""
    every = online_cpus()
    return {str(ns): format_cpus(cpus) for _tid, ns, cpus in threads(pids) if cpus and cpus < every}


def apply(pids: list[int], recorded: dict[str, str]) -> tuple[int, str]:
    """Bind the restored threads (host ``pids``) as ``recorded``, on the CPUs of each list that this
    process may use. Returns (threads bound, why some were not: "" when none was left out)."""
    if not recorded:
        return 0, ""
    mine = os.sched_getaffinity(0)
    done, missing, outside = 0, 0, 0
    seen: set[str] = set()
    for tid, ns, _cpus in threads(pids):
        want = recorded.get(str(ns))
        if want is None:
            continue
        seen.add(str(ns))
        cpus = parse_cpus(want) & mine
        if not cpus:
            outside += 1
            continue
        try:
            os.sched_setaffinity(tid, cpus)
            done += 1
        except OSError:
            missing += 1  # the thread exited meanwhile
    missing += len(set(recorded) - seen)
    why = []
    if outside:
        why.append(f"{outside} thread(s) recorded on CPUs this host does not give us: left unbound")
    if missing:
        why.append(f"{missing} recorded thread(s) not found")
    return done, "; ".join(why)
