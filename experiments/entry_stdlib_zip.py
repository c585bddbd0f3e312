"""Does a zipped standard library shorten the entrypoint's cold start? The image's stdlib compiled
into one uncompressed python311.zip (sourceless .pyc; the path CPython puts first on sys.path),
mounted read-only into a container like the restore's that runs only the entrypoint's start
(bench.containers.ENTRY_PROBE); against the same container without it, warm and with the page cache
dropped, the order alternating.

    PYTHONPATH=toolkit .venv/bin/python experiments/entry_stdlib_zip.py IMAGE SNAPSHOT REPS WORKDIR > OUT.jsonl

WORKDIR (on the host) receives the zip. Needs root and our dockerd."""
import json
import statistics
import sys
import time
from pathlib import Path

from coldstart.bench import containers as bc
from coldstart.warm.residency import drop_caches
from coldstart.containers import docker_api, run
from coldstart.engine.launcher import free_port

MAKE_ZIP = """
import os, py_compile, sys, sysconfig, zipfile
os.chdir(sysconfig.get_paths()["stdlib"])
skip = {"site-packages", "lib-dynload", "test", "tests", "idlelib", "tkinter", "turtledemo", "__pycache__", "ensurepip", "lib2to3"}
with zipfile.ZipFile("/out/python311.zip", "w", zipfile.ZIP_STORED) as zf:
    for root, dirs, files in os.walk("."):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for f in sorted(x for x in files if x.endswith(".py")):
            src = os.path.join(root, f)
            try:
                py_compile.compile(src, cfile="/tmp/x.pyc", dfile=src, doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            except py_compile.PyCompileError:
                continue
            zf.write("/tmp/x.pyc", src[2:] + "c")
print(os.path.join(os.path.dirname(os.getcwd()), "python311.zip"))
"""

image, snap, reps, work = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]).resolve()
c = docker_api.client(None)
work.mkdir(parents=True, exist_ok=True)
zip_at = c.containers.run(image, ["-c", MAKE_ZIP], entrypoint=["python"], remove=True,
                          volumes={str(work): {"bind": "/out", "mode": "rw"}}).decode().split()[-1]


def one(zipped: bool) -> dict:
    vols = {str(snap): {"bind": "/snapshot", "mode": "ro"}}
    if zipped:
        vols[str(work / "python311.zip")] = {"bind": zip_at, "mode": "ro"}
    wall0, t0 = time.time(), time.monotonic()
    ctr = c.containers.create(image, ["-c", bc.ENTRY_PROBE], entrypoint=["python"], shm_size=run.SHM_SIZE,
                              network=docker_api.ensure_network(c), tmpfs=run.STATE_TMPFS,
                              ports={f"{run.CONTAINER_PORT}/tcp": ("127.0.0.1", free_port())}, volumes=vols,
                              **run.RESTORE_SECURITY)
    ctr.start()
    row = {"started_s": round(time.monotonic() - t0, 3), **bc._entry_times(ctr, wall0)}
    ctr.remove(force=True)
    return row


rows = []
for rep in range(reps):
    for cache in ("warm", "cold"):
        for z in ((False, True) if rep % 2 == 0 else (True, False)):
            if cache == "cold":
                drop_caches()
            else:
                one(z)  # unmeasured: the same files cached
            r = {**one(z), "cache": cache, "zip": z, "rep": rep}
            rows.append(r)
            print(json.dumps(r), flush=True)
for cache in ("warm", "cold"):
    for z in (False, True):
        rs = [r for r in rows if r["cache"] == cache and r["zip"] == z]
        med = {k: round(statistics.median(r[k] for r in rs), 3) for k in ("started_s", "exec_s", "entry_s")}
        print(json.dumps({"summary": True, "cache": cache, "zip": z, **med,
                          "python_s": round(statistics.median(r["entry_s"] - r["exec_s"] for r in rs), 3)}))
