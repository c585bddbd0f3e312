"""A cold node starting a pod: does dropping the page cache before the pod's sandbox starts (as on a
node whose cache is cold when kubelet starts a pod: the sandbox first, then the containers) rather
than after (bench container --network pod) change what a container restore loses to a warm one?

    PYTHONPATH=toolkit .venv/bin/python experiments/pod_cold_node.py IMAGE SIZES REPS OUT.jsonl [keep-memory]

The sandbox runs a pause program of its own image (experiments/pause.c, static, the image holds only
it), as kubelet's does: its start reads docker's runtime files (shim, runtime), not the app image's.
Variants, alternating, restore + host warming, timed from the restore's create call as everywhere:
  warm          the pod made, one unmeasured restore, then the measured one (the bound's warm restore)
  drop-then-pod the whole page cache dropped, then the pause pod made (unmeasured), then the restore
  pod-then-drop the pause pod made, then the whole page cache dropped (bench container's cold pod)
One line per start in OUT (bench.containers.one_start's row), medians per variant on stdout."""
import contextlib
import hashlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from coldstart.bench import containers as bc
from coldstart.bench import host
from coldstart.containers import docker_api, run
from coldstart.engine.launcher import free_port
from coldstart.warm.residency import drop_caches

HERE = Path(__file__).resolve().parent


def pause_image(c) -> str:
    """experiments/pause.c built static and imported as the only file of an image, tagged by its source."""
    src = (HERE / "pause.c").read_bytes()
    tag = f"coldstart-pause:{hashlib.sha256(src).hexdigest()[:16]}"
    if c.images.list(name=tag):
        return tag
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "pause"
        subprocess.run(["gcc", "-Os", "-static", "-s", "-o", str(exe), str(HERE / "pause.c")], check=True)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(exe, arcname="pause")
        c.api.import_image_from_data(buf.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    return tag


def make_pod(c, image: str):
    ctr = c.containers.create(image, [], entrypoint=["/pause"], cap_drop=["ALL"], runtime=docker_api.oci_runtime(c),
                              network=docker_api.ensure_network(c),
                              ports={f"{run.CONTAINER_PORT}/tcp": ("127.0.0.1", free_port())})
    ctr.start()
    ctr.reload()
    return ctr


image, sizes, reps, out_path = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
keep = len(sys.argv) > 5 and sys.argv[5] == "keep-memory"
c = docker_api.client(None)
pause = pause_image(c)
layers = docker_api.image_layers(c, image)
cases = {}
for size in sizes:
    model, snap = bc.snapshot_in_container(c, image, size, Path("/var/tmp/coldstart-bench-container"))
    cases[size] = (model, snap)
    bc.new_to_node(snap)
    r = bc.one_start(c, image, "restore", model, snap, layers)
    print("first on node", size, r.get("first_token_s"), r.get("error") or "", flush=True)

VARIANTS = ("warm", "drop-then-pod", "pod-then-drop")
rows = []
with host.memory_kept() if keep else contextlib.nullcontext(), open(out_path, "a") as out:
    for rep in range(reps):
        for size, (model, snap) in cases.items():
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for name in order:
                pod = None
                try:
                    if name == "drop-then-pod":
                        drop_caches()
                        pod = make_pod(c, pause)
                    else:
                        pod = make_pod(c, pause)
                        if name == "warm":
                            bc.one_start(c, image, "restore", model, snap, layers, pod=pod)
                        else:
                            drop_caches()
                    r = bc.one_start(c, image, "restore+hostwarm", model, snap, layers, pod=pod)
                finally:
                    if pod is not None:
                        pod.remove(force=True)
                r.update(size=size, variant=name, rep=rep)
                out.write(json.dumps(r) + "\n")
                out.flush()
                rows.append(r)
                print(size, name, rep, r.get("first_token_s"), r.get("error") or "", flush=True)

MILESTONES = ("CONTAINER_STARTED", "ENTRY_PYTHON", "ENTRY_READY", "RESTORE_DONE", "WEIGHTS_LOADED", "FIRST_TOKEN")
for size in cases:
    for name in VARIANTS:
        rs = [r for r in rows if r["size"] == size and r["variant"] == name and r.get("first_token_s")]
        if not rs:
            continue
        ms = {m: statistics.median(r["events"][m] for r in rs if m in (r.get("events") or {}))
              for m in MILESTONES if any(m in (r.get("events") or {}) for r in rs)}
        print(size, name, "first token median", statistics.median(r["first_token_s"] for r in rs),
              "all", sorted(r["first_token_s"] for r in rs),
              "read GiB", round(statistics.median(r["disk_read_bytes"] for r in rs) / 2**30, 3),
              "milestones", {k: round(v, 3) for k, v in ms.items()})
