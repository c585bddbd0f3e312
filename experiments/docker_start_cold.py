"""Where a cold page cache slows a container's start before the entrypoint's code: docker's network
setup, or docker's own binaries?

    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_cold.py net IMAGE REPS
    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_cold.py pin IMAGE REPS
    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_cold.py runtime IMAGE REPS
    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_cold.py phases IMAGE REPS

A fresh container of IMAGE runs the interpreter (net: one line; pin: the entrypoint's imports before
ENTRY_READY, bench.containers.ENTRY_PROBE), timed from the docker-py create call on the host's
wall clock: the start call returned ("started"), Python's first line ("py"), the imports' end
("ready"). net: no network, our bridge network, and the bridge with a published port, each warm and
with the page cache dropped. pin: warm; dropped; dropped while docker's binaries (runc, the shim,
docker-proxy, containerd, dockerd, libc, libseccomp, ld.so) are locked in memory by `vmtouch -l`.
runtime: the pin mode's probe under each OCI runtime the daemon knows of runc and crun, warm and cold.
phases: warm, under each of those runtimes, the create call and the start call apart, with no network,
our bridge with a published port, and the restore container's settings (capabilities, tmpfs, shm).
Medians; the variants' order turns every repetition. Needs root and our dockerd."""
import os
import signal
import statistics
import subprocess
import sys
import time

from coldstart.bench.containers import ENTRY_PROBE
from coldstart.warm.residency import drop_caches
from coldstart.containers import docker_api

mode, img, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = docker_api.client(None)
net = docker_api.ensure_network(c)
PORT = {"8000/tcp": ("127.0.0.1", 18555)}
RUNTIMES = [rt for rt in ("runc", "crun") if rt in (c.info().get("Runtimes") or {})]  # runtime, phases
DOCKER = [p for p in ("/usr/sbin/runc", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/docker-proxy",
                      "/usr/bin/containerd", "/usr/sbin/dockerd", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                      "/usr/lib/x86_64-linux-gnu/libseccomp.so.2", "/lib64/ld-linux-x86-64.so.2") if os.path.exists(p)]


def start(code: str, **kw) -> dict:
    t0 = time.time()
    ctr = c.containers.create(img, ["-c", code], entrypoint=["python"], **kw)
    ctr.start()
    t2 = time.time()
    ctr.wait()
    out = [float(x) for x in ctr.logs().decode().split()]
    ctr.remove()
    return {"started": t2 - t0, "py": out[0] - t0, "ready": out[-1] - t0}


rows = []
if mode == "net":
    VS = {"none": dict(network_mode="none"), "bridge": dict(network=net), "bridge+port": dict(network=net, ports=PORT)}
    for rep in range(reps):
        for cache in ("warm", "cold"):
            for v in (list(VS) if rep % 2 == 0 else list(VS)[::-1]):
                if cache == "cold":
                    drop_caches()
                rows.append({"v": f"{cache} {v}", **start("import time; print(repr(time.time()))", **VS[v])})
elif mode == "runtime":
    VS = [(rt, cache) for rt in RUNTIMES for cache in ("warm", "cold")]
    for rep in range(reps):
        for rt, cache in (VS if rep % 2 == 0 else VS[::-1]):
            if cache == "cold":
                drop_caches()
            rows.append({"v": f"{rt} {cache}", **start(ENTRY_PROBE, network=net, ports=PORT, runtime=rt)})
elif mode == "phases":
    from coldstart.containers import run

    BR = dict(network=net, ports=PORT)
    VS = {"none": dict(network_mode="none"), "bridge+port": BR,
          "restore's settings": dict(BR, tmpfs=run.STATE_TMPFS, shm_size=run.SHM_SIZE, **run.RESTORE_SECURITY)}
    for rep in range(reps):
        for v in VS:
            for rt in RUNTIMES[::1 if rep % 2 == 0 else -1]:
                t0 = time.time()
                ctr = c.containers.create(img, ["-c", "import time; print(repr(time.time()))"], entrypoint=["python"],
                                          runtime=rt, **VS[v])
                t1 = time.time()
                ctr.start()
                t2 = time.time()
                ctr.wait()
                py = float(ctr.logs().decode().split()[0])
                ctr.remove()
                rows.append({"v": f"{rt} {v}", "created": t1 - t0, "started": t2 - t0, "py": py - t0})
else:
    VS = ["warm", "cold", "cold+docker-pinned"]
    for rep in range(reps):
        for v in (VS if rep % 2 == 0 else VS[::-1]):
            pin = None
            if v != "warm":
                drop_caches()
            if v == "cold+docker-pinned":
                pin = subprocess.Popen(["vmtouch", "-q", "-l", *DOCKER], stdout=subprocess.DEVNULL)
                time.sleep(1.0)
                drop_caches()
            try:
                rows.append({"v": v, **start(ENTRY_PROBE, network=net, ports=PORT)})
            finally:
                if pin:
                    pin.send_signal(signal.SIGINT)
                    pin.wait()
for v in dict.fromkeys(r["v"] for r in rows):
    s = [r for r in rows if r["v"] == v]
    print(f"{v:28} " + " ".join(f"{k} {statistics.median(r[k] for r in s):.3f}" for k in s[0] if k != "v"))
