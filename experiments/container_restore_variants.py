"""Cold container restores under variants given as JSON: the host warmer's shape (run.HostWarm's
keywords), the restore container's environment, warm or cold page cache.

    PYTHONPATH=toolkit .venv/bin/python experiments/container_restore_variants.py IMAGE SIZES REPS OUT.jsonl VARIANTS [keep-memory]

VARIANTS: {"name": {"method": "restore" | "restore+hostwarm" (default), "cache": "warm" | "cold"
(default: page cache dropped before the start) | "cold-snapshot" (after one unmeasured restore, only
the snapshot's files evicted), "env": {...}, "forget": [paths under the node dir
removed before the start, e.g. "criu-kdat"], "runtime": the OCI runtime its containers run under
(default: docker_api.oci_runtime's choice), "pod": true (the container joins a pod's network
namespace, run.create_pod, made before the page cache is dropped), "process_from": {"tiny": PROFILE, ...}
(the node's profile for the start gets the entrypoint's own files, source "process", of that recorded
profile instead of its own: e.g. one recorded by older code), "queue_kb": the max_sectors_kb of the
disk under the snapshots for this start (coldstart.weights.queue; put back at the end), any other
key: HostWarm's}}. The
snapshots are `coldstart bench container`'s (made in IMAGE under /var/tmp/coldstart-bench-container
when missing); each is first restored once as new to the node (its access profile recorded), then
the variants alternate, REPS times. A warm variant follows one unmeasured restore of its own. One
line per start in OUT (bench.containers.one_start's row), a summary per variant on stdout.
keep-memory: the starts run with the VM's free page reporting off (bench.host.memory_kept)."""
import contextlib
import json
import shutil
import statistics
import sys
from pathlib import Path

from coldstart.bench import containers as bc
from coldstart.bench import host
from coldstart.warm.residency import drop_caches, evict_all
from coldstart.containers import docker_api
from coldstart.state import node_dir
from coldstart.warm import where
from coldstart.weights import queue

image, sizes, reps, out_path, variants = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
c = docker_api.client(None)
layers = docker_api.image_layers(c, image)
cases = {}
for size in sizes:
    model, snap = bc.snapshot_in_container(c, image, size, Path("/var/tmp/coldstart-bench-container"))
    cases[size] = (model, snap)
    bc.new_to_node(snap)
    r = bc.one_start(c, image, "restore", model, snap, layers)
    print("first on node", size, r.get("first_token_s"), r.get("error") or "", flush=True)
recorded = {size: json.loads(where.node_profile(snap).read_text()) for size, (_, snap) in cases.items()}


def use_profile(size: str, snap: Path, v: dict) -> None:
    """The node's profile as recorded, or with the entrypoint's files of v["process_from"][size]."""
    prof = dict(recorded[size])
    src = (v.get("process_from") or {}).get(size)
    if src:
        other = json.loads(Path(src).read_text())
        own = [r for r in other["ranges"] if r.get("source") == "process"]
        prof["ranges"] = own + [r for r in prof["ranges"] if r.get("source") != "process"]
        prof["files"] = {**prof["files"], **{r["file"]: other["files"][r["file"]] for r in own}}
    where.node_profile(snap).write_text(json.dumps(prof))


rows = []
keep = len(sys.argv) > 6 and sys.argv[6] == "keep-memory"
qdir = queue.queue_dir(Path("/var/tmp/coldstart-bench-container"))
queue0 = queue.current_kb(qdir)
with contextlib.ExitStack() as stack, open(out_path, "a") as out:
    stack.callback(queue.apply, qdir, queue0)  # the disk's queue as found, even after a failed start
    if keep:
        stack.enter_context(host.memory_kept())
    for rep in range(reps):
        for size, (model, snap) in cases.items():
            for name, v in variants.items():
                method, env = v.get("method", "restore+hostwarm"), v.get("env")
                shape = {k: x for k, x in v.items()
                         if k not in ("method", "cache", "env", "forget", "runtime", "pod", "process_from", "queue_kb")}
                queue.apply(qdir, v.get("queue_kb", queue0))
                if "runtime" in v:  # what oci_runtime answers for this daemon from now on
                    docker_api._runtimes_seen[str(c.api.base_url)] = v["runtime"]
                forget = lambda: [shutil.rmtree(node_dir() / f, ignore_errors=True) for f in v.get("forget", [])]  # noqa: E731
                forget()
                use_profile(size, snap, v)
                with bc.pod_if(c, image, v.get("pod", False)) as pod:
                    if v.get("cache") in ("warm", "cold-snapshot"):
                        bc.one_start(c, image, method, model, snap, layers, env=env, pod=pod)
                        forget()
                        if v["cache"] == "cold-snapshot":
                            evict_all([snap])
                    else:
                        drop_caches()
                    r = bc.one_start(c, image, method, model, snap, layers, host_warm=shape, env=env, pod=pod)
                r.update(size=size, variant=name, rep=rep, max_sectors_kb=queue.current_kb(qdir))
                out.write(json.dumps(r) + "\n")
                out.flush()
                rows.append(r)
for size in cases:
    for name in variants:
        rs = [r for r in rows if r["size"] == size and r["variant"] == name and "first_token_s" in r]
        ev = lambda a, b: [round(r["events"][b] - r["events"][a], 3) for r in rs if a in r.get("events", {})]  # noqa: E731
        es = [r for r in rows if r["size"] == size and r["variant"] == name and "entry_s" in r]
        if es:
            print(size, name, "started", statistics.median(r["started_s"] for r in es), "exec",
                  statistics.median(r["exec_s"] for r in es), "entry", statistics.median(r["entry_s"] for r in es))
        print(size, name, "first token median", statistics.median([r["first_token_s"] for r in rs]) if rs else None,
              "all", sorted(r["first_token_s"] for r in rs), "reload", ev("WAKE_WEIGHTS", "WEIGHTS_LOADED"),
              "canary", ev("WAKE_KV", "VERIFIED"))
