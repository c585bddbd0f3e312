"""How much of a cold container restore's extra time comes before the restore's own code runs?

A fresh container of the runtime image runs only the entrypoint's interpreter and the imports it
does before ENTRY_READY (coldstart.main, pipeline.entry, pipeline.restore), timed from the docker-py
create call on the host's wall clock: to the first line of Python ("exec": docker's create and
start, the interpreter's own start) and the imports. Variants, interleaved: page cache warm;
dropped; dropped with the host warmer (containers.run.HostWarm, its defaults, as in a
restore+hostwarm start) running from the create call; the same with the early files' mapped ELF
files (libpython, the extensions) moved to the head of its list.

    PYTHONPATH=toolkit .venv/bin/python experiments/entry_cold_probe.py IMAGE SNAPSHOT REPS

IMAGE: the app image (bench.containers.bench_case builds it); SNAPSHOT: a snapshot checkpointed in
it whose node profile is recorded (one restore after new_to_node). Needs root and our dockerd."""
import json, sys, time, statistics
from pathlib import Path
from unittest import mock
from coldstart.containers import docker_api, run
from coldstart.warm.residency import drop_caches

img, snap, reps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
c = docker_api.client(None)
layers = docker_api.image_layers(c, img)
CODE = ("import time,os;t=time.time();import coldstart.main, coldstart.pipeline.entry, coldstart.pipeline.restore;"
        "print(repr(t), repr(time.time()))")
orig = run.early_files

def elf_first(snapshot, remap=None):
    fs = orig(snapshot, remap)
    is_elf = lambda p: ".so" in p.name or p.name.startswith("libpython")
    n_proc = next((i for i, p in enumerate(fs) if p.name == "manifest.json"), 0)
    proc = fs[:n_proc]
    return [p for p in proc if is_elf(p)] + [p for p in proc if not is_elf(p)] + fs[n_proc:]

rows = []
VS = ["warm", "cold", "early", "early-elf-first"]
for rep in range(reps):
    for v in (VS if rep % 2 == 0 else VS[::-1]):
        if v != "warm":
            drop_caches()
        t0 = time.time()
        w = None
        with mock.patch.object(run, "early_files", elf_first if v == "early-elf-first" else orig):
            if v not in ("cold", "warm"):
                w = run.host_warm(snap, layers)
            ctr = c.containers.create(img, ["-c", CODE], entrypoint=["python"])
            ctr.start()
            if w: w.container_started()
            ctr.wait()
            if w: w.wait()
        out = ctr.logs().decode().split()
        ctr.remove()
        ts, te = float(out[0]), float(out[1])
        rows.append({"v": v, "exec": round(ts - t0, 3), "imports": round(te - ts, 3), "total": round(te - t0, 3),
                     "early_s": (w.early or {}).get("seconds") if w else None})
        print(json.dumps(rows[-1]), flush=True)
for v in VS:
    s = [r for r in rows if r["v"] == v]
    print(v, "exec", statistics.median(r["exec"] for r in s), "imports", statistics.median(r["imports"] for r in s),
          "total", statistics.median(r["total"] for r in s))
