"""How long a pod sandbox (run.create_pod: create, start, inspect) takes, warm and with the page cache
dropped, alternating; 4 each.

    PYTHONPATH=toolkit .venv/bin/python experiments/pod_start_time.py IMAGE
"""
import json, statistics, sys, time
from coldstart.containers import docker_api, run
from coldstart.engine.launcher import free_port
from coldstart.warm.residency import drop_caches
c = docker_api.client(None)
image = sys.argv[1]
out = {"warm": [], "cold": []}
for rep in range(4):
    for cache in ("warm", "cold"):
        if cache == "cold":
            drop_caches()
        t0 = time.monotonic()
        pod = run.create_pod(c, image, free_port())
        out[cache].append(round(time.monotonic() - t0, 3))
        pod.remove(force=True)
print(json.dumps({k: {"each": v, "median": statistics.median(v)} for k, v in out.items()}))
