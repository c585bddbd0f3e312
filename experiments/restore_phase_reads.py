"""Who reads what from the disk in each phase of a cold container restore with host warming: the
kernel's page-cache insertions (tracefs filemap:mm_filemap_add_to_page_cache, CLOCK_MONOTONIC, with
the inserting task) during `bench container`'s restore+hostwarm start in a pod (the whole page cache
dropped after the pod is made), split by the restore's milestones and by reader: the host warmer
(this process's threads) or anything else (the container's processes: criu, the restored server, the
entrypoint; and docker).

    PYTHONPATH=toolkit .venv/bin/python experiments/restore_phase_reads.py IMAGE SIZE REPS

Per phase (create → CONTAINER_STARTED → ENTRY_READY → RESTORE_DONE → FIRST_TOKEN): MiB per start by
reader and file kind (snapshot, image layers, docker's binaries, other host files). Then the files the
container side read itself during CRIU's phase (demand the warmer had not met), with when the host
warmer first read the same file in that start (or never). Needs root, tracefs and our dockerd."""
import collections
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

from coldstart.bench import containers as bc
from coldstart.containers import docker_api
from coldstart.warm.residency import drop_caches
from page_cache_trace import EVENT, TRACE, inode_names, kind, setup

LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\].*?\s(\d+\.\d+): mm_filemap_add_to_page_cache: dev (\d+):(\d+) "
                  r"ino ([0-9a-f]+) .*ofs=(\d+) order=(\d+)", re.M)
PHASES = ("CONTAINER_STARTED", "ENTRY_READY", "RESTORE_DONE", "FIRST_TOKEN")
MiB = 1 << 20

img, size, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = docker_api.client(None)
layers = docker_api.image_layers(c, img)
model, snap = bc.snapshot_in_container(c, img, size, Path("/var/tmp/coldstart-bench-container"))
setup(262144)

per_phase = collections.defaultdict(int)  # (phase, reader, ino) -> bytes
demand = collections.defaultdict(lambda: {"bytes": 0, "first": [], "host_first": [], "comm": collections.Counter()})
for rep in range(reps):
    with bc.pod_if(c, img, True) as pod:
        drop_caches()
        (TRACE / "trace").write_text("")
        EVENT.write_text("1")
        mine: set[int] = set()  # this process's threads (the host warmer's among them), polled: they end
        stop = threading.Event()
        poll = threading.Thread(target=lambda: [mine.update(int(t) for t in os.listdir("/proc/self/task"))
                                                for _ in iter(lambda: stop.wait(0.002), True)])
        poll.start()
        t0 = time.monotonic()
        r = bc.one_start(c, img, "restore+hostwarm", model, snap, layers, pod=pod)
        EVENT.write_text("0")
        stop.set()
        poll.join()
    ev = r.get("events") or {}
    print(f"rep {rep}: first token {r.get('first_token_s')} s; " +
          ", ".join(f"{p} {ev.get(p, float('nan')):.3f}" for p in PHASES), file=sys.stderr, flush=True)
    ends = [ev.get(p, 1e9) for p in PHASES]
    hf: dict[int, float] = {}
    rows = []
    for m in LINE.finditer((TRACE / "trace").read_text()):
        comm, tid, ts, ino = m[1].strip(), int(m[2]), float(m[3]) - t0, int(m[6], 16)
        if ts < 0:
            continue
        reader = "host warmer" if tid in mine else "container/docker"
        if reader == "host warmer":
            hf.setdefault(ino, ts)
        rows.append((ts, reader, comm, ino, 4096 << int(m[8])))
    for ts, reader, comm, ino, n in rows:
        phase = next((p for p, e in zip(PHASES, ends) if ts < e), "after")
        per_phase[(phase, reader, ino)] += n
        if phase == "RESTORE_DONE" and reader != "host warmer":
            d = demand[ino]
            d["bytes"] += n
            d["comm"][comm] += n
            if len(d["first"]) <= rep:
                d["first"].append(ts)
                d["host_first"].append(hf.get(ino))

names = inode_names({ino for (_, _, ino) in per_phase})

totals = collections.defaultdict(int)
for (phase, reader, ino), n in per_phase.items():
    totals[(phase, reader, kind(names.get(ino, "?"), "? (metadata, unnamed)"))] += n
print(f"{img} {size}: {reps} whole-cache restores with host warming in a pod; MiB per start")
print("| phase (until) | reader | file kind | MiB |\n|---|---|---|---|")
for ph in (*PHASES, "after"):
    for (p, reader, k), n in sorted(totals.items(), key=lambda kv: (kv[0][1], -kv[1])):
        if p == ph and n / reps >= 0.05:
            print(f"| {ph} | {reader} | {k} | {n / MiB / reps:.2f} |")
print("\nRead by the container side during CRIU's phase (ENTRY_READY → RESTORE_DONE), largest first: MiB per "
      "start, median first read (s), the host warmer's first read of the same file (s, median; never: -), readers")
for ino, d in sorted(demand.items(), key=lambda kv: -kv[1]["bytes"])[:40]:
    hfs = [x for x in d["host_first"] if x is not None]
    print(f"  {d['bytes'] / MiB / reps:7.2f}  {statistics.median(d['first']):.3f}  "
          f"{statistics.median(hfs) if hfs else float('nan'):.3f} ({len(hfs)}/{len(d['host_first'])})  "
          f"{names.get(ino, '?')}  {dict(d['comm'].most_common(3))}")
