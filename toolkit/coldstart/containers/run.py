"""Checkpoint, restore and naive containers (docker-py through docker_api's client).

Security, measured (experiments/container_least_caps.py, results/containers-least-caps,
docs/containers.md):
- the checkpoint starts its server with no capabilities (``--server-caps none``). CRIU gives every
  restored task back its dumped set and can only lower its own, so such a snapshot restores under
  whatever CRIU itself needs; a server dumped holding a capability the restoring container lacks
  made the restore hang;
- the restore container drops every capability and adds only ``criu.caps.RESTORE_NEEDS``, under
  docker's default seccomp profile;
- the checkpoint container of the hot layout (the default; it restores the snapshot once) has the
  restore's set plus SETPCAP (setpriv empties the server's bounding set; CRIU's dump needed no
  SYS_PTRACE: it holds a superset of the server's capabilities); the dumped layout's needs only
  SETPCAP, SYS_ADMIN and SYS_CHROOT (CHECKPOINT_CAPS_DUMPED); either has no seccomp filter (CRIU must
  suspend the tasks' filters to dump).

Network: every container is on our bridge network (docker_api.NETWORK: its own network namespace,
like a pod) with the server's port published on the host's loopback. The checkpoint's server
listens on the container's port on every interface (``--listen 0.0.0.0``), so a restore serves it
with no relay; its gate (coldstart.engine.gate) holds the network's requests until the restore's canary
passed. Each replica has its own network namespace: any number of one snapshot run at once. Or a
container joins a pod's (``create_pod``: a container that only holds a network namespace and the
published port, as a Kubernetes pod's sandbox does), and docker sets up no network at its start.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coldstart.containers import docker_api
from coldstart.containers.helpers import RESTORE_FILES
from coldstart.criu import images as _images
from coldstart.criu.caps import RESTORE_NEEDS
from coldstart.errors import ColdstartError
from coldstart.fsutil import data_extents, sampled_resident_fraction, write_atomic
from coldstart.pipeline.checkpoint import hf_model_dir
from coldstart.pipeline.events import EventName
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.restore import HOST_WARMS_ENV, ReadAhead, fetch_snapshot_rest, snapshot_prefetch, warm_paths
from coldstart.state import node_dir, state_dir
# the warmer's modules are imported here, not in HostWarm: it runs inside the timed window that starts at
# the create call (after a dropped page cache, importing them, numpy among them, took 2.5 s there)
from coldstart.warm import native as _native
from coldstart.warm import snapshot as _snapshot
from coldstart.warm import start_warming
from coldstart.warm.base import WarmStats, background_io, early_ranges
from coldstart.warm.profile import load_profile
from coldstart.warm.residency import exact_pipe, read_into_cache

_PRELOADED = (_native, _snapshot, _images)  # start_warming imports them lazily: here they load before the clock

CONTAINER_PORT = 8000  # the port a server listens on inside every container (the image's COLDSTART_PORT)
RESTORE_CAPS = sorted(RESTORE_NEEDS)
# the hot layout's checkpoint restores the snapshot once (its recording restore): the restore's set,
# and SETPCAP to start the server without capabilities; the dumped layout's needs only SYS_ADMIN,
# SYS_CHROOT and SETPCAP (results/containers-least-caps/round3.jsonl, docs/containers.md)
CHECKPOINT_CAPS = sorted({*RESTORE_NEEDS, "SETPCAP"})
CHECKPOINT_CAPS_DUMPED = ["SETPCAP", "SYS_ADMIN", "SYS_CHROOT"]
RESTORE_SECURITY: dict[str, Any] = {"cap_drop": ["ALL"], "cap_add": RESTORE_CAPS}  # docker's default seccomp
CHECKPOINT_SECURITY: dict[str, Any] = {"cap_drop": ["ALL"], "cap_add": CHECKPOINT_CAPS,
                                       "security_opt": ["seccomp=unconfined"]}
STATE_TMPFS = {"/run/coldstart": "rw,exec,size=4g"}  # per-replica state: overlay upper dirs need a non-overlay fs
NODE_MOUNT = "/var/lib/coldstart-node"  # the host's node dir inside a restore container (COLDSTART_NODE_DIR)
LAZY_MOUNT = "/var/lib/coldstart-lazy"  # the host's lazy mount's daemon log and index, inside (create_restore)
VOLUME_PREFIX = "volume:"  # a snapshot in a docker named volume: volume:NAME (checkpoint --out, restore)
VOLUME_SNAPSHOT = "snapshot"  # ... in this directory of the volume (published there by a rename)
SHM_SIZE = "1g"  # vLLM's shared-memory buffers need more than docker's 64 MiB default
CHECKPOINT_TIMEOUT_S = 900  # a checkpoint container still running then is stopped and named


@dataclass(frozen=True)
class CheckpointRun:
    exit_code: int
    logs: str
    seconds: float
    snapshot: Path | None  # on the host (None: in a volume whose data this host cannot see)
    caps: list[str]  # what the checkpoint's container was granted
    volume: str | None = None  # the named volume that holds it (in VOLUME_SNAPSHOT)


def volume_name(arg: str | Path) -> str | None:
    """NAME for ``volume:NAME`` (a docker named volume), None for anything else (a host path)."""
    s = str(arg)
    if not s.startswith(VOLUME_PREFIX):
        return None
    name = s[len(VOLUME_PREFIX):]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]+", name):
        raise ColdstartError(f"{s}: a docker volume's name is [A-Za-z0-9][A-Za-z0-9_.-]+")
    return name


def require_volume(c, name: str) -> None:
    """One line where docker has no volume ``name`` (a create call would make it, empty)."""
    if not docker_api.volume_exists(c, name):
        raise ColdstartError(f"docker has no volume {name} (`coldstart container checkpoint MODEL --out "
                             f"{VOLUME_PREFIX}{name}` makes one)")


def volume_snapshot(c, name: str) -> Path | None:
    """Where this host sees the snapshot in volume ``name`` (docker_api.volume_path), or None."""
    held = docker_api.volume_path(c, name)
    return held / VOLUME_SNAPSHOT if held is not None else None


def checkpoint_security(extra: list[str] | None = None) -> dict[str, Any]:
    """The checkpoint container's settings for ``coldstart checkpoint`` given ``extra``: with
    ``--layout dumped`` the smaller set, since no restore runs in it; otherwise the hot layout's."""
    args = list(extra or [])
    layout = next((a.split("=", 1)[1] for a in args if a.startswith("--layout=")), None)
    if "--layout" in args and args.index("--layout") + 1 < len(args):
        layout = args[args.index("--layout") + 1]
    caps = CHECKPOINT_CAPS_DUMPED if layout == "dumped" else CHECKPOINT_CAPS
    return {**CHECKPOINT_SECURITY, "cap_add": list(caps)}


def security_without(cap: str) -> dict[str, Any]:
    """The restore's settings less one capability (to show what its absence does)."""
    return {**RESTORE_SECURITY, "cap_add": [c for c in RESTORE_CAPS if c != cap]}


def host_snapshot(snapshot: Path) -> Path:
    """``snapshot`` resolved, checked to be a directory on the host (or an image of one from `coldstart
    snapshot pack`: ``image_mount``) before a container mounts it (models: hf_model_dir): docker
    creates a missing bind-mount source as an empty root-owned directory. What is in it is the
    restore's to check, and a broken one falls back inside the container."""
    from coldstart.pipeline.nodeimage import is_image

    snapshot = Path(snapshot).resolve()
    if snapshot.is_file() and not is_image(snapshot):
        raise ColdstartError(f"snapshot {snapshot} is a file but not an image written by `coldstart snapshot "
                             "pack` (a snapshot is a directory)")
    if not (snapshot.is_dir() or snapshot.is_file()):
        raise ColdstartError(f"snapshot {snapshot}: no such directory on this host")
    return snapshot


def image_mount(image: Path) -> Path:
    """The host's read-only mount of a packed snapshot image, made if missing: the one `coldstart
    restore IMAGE` uses (pipeline.nodeimage.mounted: one per image under the node dir, shared by every
    restore of it, host or container, and left mounted), bound into the container like a directory."""
    from coldstart.pipeline.nodeimage import mounted

    return mounted(Path(image).resolve())


def checkpoint(c, image: str, model: Path, out: Path | str, *, extra: list[str] | None = None) -> CheckpointRun:
    """``coldstart checkpoint`` inside a container: the model mounted read-only at its own path,
    ``out``'s parent mounted read-write at /out (the snapshot is published there by a rename), or
    for ``out`` = volume:NAME that named volume (created by docker if missing; the snapshot in its
    VOLUME_SNAPSHOT directory), the restore's state tmpfs as in a restore container (``--layout
    hot`` restores the snapshot once); the least capabilities for the layout asked for
    (checkpoint_security)."""
    import requests  # (docker-py's own HTTP client; imported with docker, lazily)

    model, vol = hf_model_dir(model), volume_name(out)
    if vol:
        held = volume_snapshot(c, vol)
        if held is not None and held.exists():
            raise ColdstartError(f"volume {vol} already holds a snapshot: remove the volume "
                                 f"(docker volume rm {vol}) or choose another name")
        target, inside = {vol: {"bind": "/out", "mode": "rw"}}, f"/out/{VOLUME_SNAPSHOT}"
    else:
        out = Path(out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        target, inside = {str(out.parent): {"bind": "/out", "mode": "rw"}}, f"/out/{out.name}"
    cmd = ["checkpoint", str(model), "--out", inside, "--port", str(CONTAINER_PORT),
           "--listen", "0.0.0.0", "--server-caps", "none", *(extra or [])]
    security = checkpoint_security(extra)
    t0 = time.monotonic()
    ctr = _create(c, image, cmd, entrypoint=["coldstart"], shm_size=SHM_SIZE, network=docker_api.ensure_network(c),
                  tmpfs=STATE_TMPFS, volumes={str(model): {"bind": str(model), "mode": "ro"}, **target},
                  environment={"TMPDIR": "/out"}, runtime=docker_api.oci_runtime(c), **security)
    start(ctr)
    try:
        try:
            res = ctr.wait(timeout=CHECKPOINT_TIMEOUT_S)
        except requests.exceptions.RequestException:  # docker-py's wait past its timeout
            raise ColdstartError(f"checkpoint container {ctr.name} did not finish within {CHECKPOINT_TIMEOUT_S} s: "
                                 f"{_last_log_line(ctr)}") from None
        logs = ctr.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        ctr.remove(force=True)
    snapshot = volume_snapshot(c, vol) if vol else out
    return CheckpointRun(int(res.get("StatusCode", -1)), logs, time.monotonic() - t0, snapshot, security["cap_add"], vol)


def create_restore(c, image: str, snapshot: Path | str, model: Path, host_port: int, *, name: str | None = None,
                   extra: list[str] | None = None, security: dict[str, Any] | None = None,
                   env: dict[str, str] | None = None, node: Path | None | bool = True,
                   host_warms: bool = False, entrypoint: list[str] | None = None, lazy=None, pod=None):
    """A created (not started) container whose entrypoint restores ``snapshot`` (a directory, or a packed
    image: ``image_mount``; bound read-only at /snapshot; or volume:NAME, a named volume holding one:
    ``checkpoint``), with a tmpfs for its per-replica state and its port published on 127.0.0.1:``host_port``.
    ``node``: the host's node dir (True: this host's ``state.node_dir()``; False/None: none) mounted
    read-write at NODE_MOUNT, so that replicas share verification records and the access profile
    (without it every container re-hashes the whole snapshot and records its profile again).
    ``host_warms``: the caller warms the snapshot from the host (``host_warm``), so the entrypoint
    leaves the profile's ranges to it (pipeline.restore.HOST_WARMS_ENV; an ``env`` that sets it wins).
    ``entrypoint``: another program (its argv) in the same container, e.g. the benchmark's probe of the
    entrypoint's own start. ``lazy``: ``snapshot`` is this lazy mount of the host's (registry.mount.Mount):
    its daemon's log and index are bound read-only, so that the entrypoint names a chunk the registry
    serves damaged and, found after READY, replaces the restored server by a cold boot, as on a host.
    ``pod``: a running ``create_pod`` container whose network namespace this one joins (``host_port``
    is then the pod's, published when the pod was made).
    Creating and starting are separate so that the caller can time each (and warm in between)."""
    vol, model = volume_name(snapshot), hf_model_dir(model)
    if vol:
        require_volume(c, vol)
        source, arg0 = vol, f"/snapshot/{VOLUME_SNAPSHOT}"
    else:
        snapshot = host_snapshot(snapshot)
        if snapshot.is_file():
            snapshot = image_mount(snapshot)
        source, arg0 = str(snapshot), "/snapshot"
    volumes = {source: {"bind": "/snapshot", "mode": "ro"}, str(model): {"bind": str(model), "mode": "ro"}}
    env = dict(env or {})
    if host_warms:
        env.setdefault(HOST_WARMS_ENV, "1")
    if node:
        host_node = node_dir() if node is True else Path(node)
        host_node.mkdir(parents=True, exist_ok=True)
        volumes[str(host_node.resolve())] = {"bind": NODE_MOUNT, "mode": "rw"}
        env["COLDSTART_NODE_DIR"] = NODE_MOUNT
    if lazy is not None:
        from coldstart.registry.mount import INDEX_ENV, LOG_ENV, REF_ENV

        for host, inside, var in ((lazy.damage.log, f"{LAZY_MOUNT}/daemon.log", LOG_ENV),
                                  (lazy.damage.index, f"{LAZY_MOUNT}/index.json", INDEX_ENV)):
            volumes[str(host)] = {"bind": inside, "mode": "ro"}
            env[var] = inside
        env[REF_ENV] = lazy.damage.name
    argv = [arg0, *(extra or [])] if entrypoint is None else entrypoint[1:]
    kw = {} if entrypoint is None else {"entrypoint": entrypoint[:1]}
    return _create(c, image, argv, name=name, shm_size=SHM_SIZE, **kw, **_network(c, host_port, pod),
                   tmpfs=STATE_TMPFS, environment=env, volumes=volumes, runtime=docker_api.oci_runtime(c),
                   **(RESTORE_SECURITY if security is None else security))


def _network(c, host_port: int, pod) -> dict[str, Any]:
    """A container's own network namespace on our bridge with its port published, or ``pod``'s."""
    if pod is not None:
        return {"network_mode": f"container:{pod.id}"}
    return {"network": docker_api.ensure_network(c), "ports": {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", host_port)}}


def create_pod(c, image: str, host_port: int, *, name: str | None = None):
    """A started container that only holds a network namespace (our bridge, CONTAINER_PORT published on
    127.0.0.1:``host_port``) for others to join, as a Kubernetes pod's sandbox does before kubelet
    creates the pod's containers. A container that joins it (``create_restore(pod=...)``) has no
    network set up at its start: docker neither makes its veth nor runs its own binary as the
    network's prestart hook (docs/containers.md, "Pod-shaped containers")."""
    ctr = _create(c, image, ["infinity"], entrypoint=["sleep"], name=name, cap_drop=["ALL"],
                  runtime=docker_api.oci_runtime(c), **_network(c, host_port, None))
    try:
        ctr.start()
        ctr.reload()
    except BaseException:
        ctr.remove(force=True)
        raise
    return ctr


def pod_port(pod) -> int:
    """The host port a ``create_pod`` container publishes CONTAINER_PORT on."""
    return int(pod.attrs["HostConfig"]["PortBindings"][f"{CONTAINER_PORT}/tcp"][0]["HostPort"])


def find_pod(c, name: str):
    """The running container ``name`` (or id) as a pod to join: one line where docker has none, where it
    is not running (a stopped sandbox has no network namespace to join), or where it does not publish
    CONTAINER_PORT (nothing would reach the server)."""
    import docker

    try:
        pod = c.containers.get(name)
    except docker.errors.NotFound:
        raise ColdstartError(f"docker has no container {name} (`coldstart container pod --name {name}` makes "
                             "a pod)") from None
    if pod.status != "running":
        raise ColdstartError(f"pod {name} is {pod.status}, not running: its network namespace cannot be joined")
    if not (pod.attrs["HostConfig"].get("PortBindings") or {}).get(f"{CONTAINER_PORT}/tcp"):
        raise ColdstartError(f"pod {name} does not publish port {CONTAINER_PORT}, where the server listens "
                             "(`coldstart container pod` publishes it)")
    return pod


def _create(c, image: str, argv: list[str], **kw):
    """docker's create call; a refusal (the name taken, the image gone) is one line naming the container."""
    import docker

    try:
        return c.containers.create(image, argv, **kw)
    except docker.errors.APIError as e:
        raise ColdstartError(f"docker could not create container {kw.get('name') or 'for ' + image}: "
                             f"{e.explanation or e}") from None


def with_host_events(summary: dict, created_s: float | None, started_s: float | None) -> dict:
    """The entrypoint's summary line with the host's part of the timeline added to its events, on the
    same clock (the create call is 0, CONTAINER_START): CONTAINER_CREATE when the create call
    returned, CONTAINER_STARTED when the start call did."""
    events = dict(summary.get("events") or {})
    for name, t in ((EventName.CONTAINER_CREATE, created_s), (EventName.CONTAINER_STARTED, started_s)):
        if t is not None:
            events[name.value] = round(t, 6)
    return {**summary, "events": dict(sorted(events.items(), key=lambda kv: kv[1]))}


def first_completion(port: int, model: str, deadline: float, ctr) -> float:
    """Poll a 1-token completion until it answers; returns the monotonic time it did. A container
    that exits first, or no answer by ``deadline``, is one line (with the last line of its log)."""
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 1,
                       "temperature": 0}).encode()
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        ctr.reload()
        if ctr.status not in ("created", "running"):
            raise ColdstartError(f"container {ctr.name} {ctr.status} before its first completion: "
                                 f"{_last_log_line(ctr)} (docker logs {ctr.name})")
        time.sleep(0.05)
    raise ColdstartError(f"container {ctr.name}: no first completion on port {port} before the deadline: "
                         f"{_last_log_line(ctr)} (docker logs {ctr.name})")


def _last_log_line(ctr) -> str:
    """A failed server's reason from its container's log: the last exception line (with the indented
    line after it, where pydantic puts the detail), else the last line."""
    lines = [ln for ln in ctr.logs().decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return "its log is empty"
    at = next((i for i in range(len(lines) - 1, -1, -1) if re.match(r"[\w.]+(Error|Exception)\b", lines[i])), None)
    if at is None:
        return lines[-1].strip()[:400]
    why = lines[at].strip()
    if at + 1 < len(lines) and lines[at + 1].startswith(" ") and "For further information" not in lines[at + 1]:
        why += " " + lines[at + 1].strip().split(" [type=")[0]
    return why[:400]


def summary(ctr, deadline: float) -> dict:
    """The entrypoint's one-line JSON summary ({"url", "restored", "fallback_reason", ...}). A container
    that exits without printing it, or none by ``deadline``, is one line (with the last line of its log)."""
    while True:
        line = _summary_line(ctr)
        if line:
            return json.loads(line)
        ctr.reload()
        if ctr.status not in ("created", "running"):
            line = _summary_line(ctr)  # printed right before it exited
            if line:
                return json.loads(line)
            raise ColdstartError(f"container {ctr.name} {ctr.status} without its summary line: "
                                 f"{_last_log_line(ctr)} (docker logs {ctr.name})")
        if time.monotonic() >= deadline:
            raise ColdstartError(f"container {ctr.name}: no summary line before the deadline: "
                                 f"{_last_log_line(ctr)} (docker logs {ctr.name})")
        time.sleep(0.1)


def _summary_line(ctr) -> str | None:
    return next((ln for ln in ctr.logs().decode(errors="replace").splitlines() if ln.startswith('{"url"')), None)


def start_restore(c, image: str, snapshot: Path, model: Path, host_port: int, **kw):
    """``create_restore`` and start it; returns the running container (the caller removes it)."""
    ctr = create_restore(c, image, snapshot, model, host_port, **kw)
    start(ctr)
    return ctr


def mount_for_container(ref: str):
    """A lazy mount of ``ref`` on the host for one restore container (registry.mount); hand it to
    ``own_mount`` once the container exists. As for a restore on the host, the daemon prefetches
    only the chunks the access profile names (COLDSTART_LAZY_PREFETCH overrides), and ``fetch_rest``
    asks for the rest once the container serves: a prefetch of every chunk from the mount on queues
    chunks the restore does not need before the ones its faults wait for."""
    from coldstart.registry.mount import mount, mount_point_for

    return mount(ref, mount_point_for(ref, "container-"), prefetch=snapshot_prefetch())


def fetch_rest(mnt, summary: dict) -> bool | None:
    """Once the container's restored server serves (its summary line): have the mount's daemon fetch
    every chunk it has not, so that the server no longer needs the registry or the link (a daemon gone
    with chunks unfetched is a SIGBUS on the restored server's next fault). None: nothing to do (the
    daemon fetched everything from the start, the restore fell back, or COLDSTART_LAZY_RUNTIME_REST=leave)."""
    return fetch_snapshot_rest(mnt) if summary.get("restored") else None


def own_mount(mnt, ctr) -> None:
    """Record that ``ctr`` uses ``mnt``: the host's command returns while the container serves, so a
    later ``gc_container_mounts`` unmounts it once the container is removed."""
    write_atomic(_owner_file(mnt.mountpoint), ctr.id + "\n")


def gc_container_mounts(c) -> list[Path]:
    """Unmount the lazy mounts made for restore containers (``own_mount``) that this daemon no longer
    has; returns their mount points. Docker cannot tell us when a container goes, so every
    `container restore REF` first cleans up after the ones before it."""
    import docker

    from coldstart.registry.mount import unmount_left

    gone = []
    for owner in sorted((state_dir() / "mounts").glob("*.container")):
        try:
            c.containers.get(owner.read_text().strip())
            continue
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, OSError):
            continue  # not ours to judge now
        mp = owner.with_suffix("")
        if not unmount_left(mp):
            continue
        owner.unlink(missing_ok=True)
        gone.append(mp)
    return gone


def _owner_file(mountpoint: Path) -> Path:
    return Path(mountpoint).with_name(Path(mountpoint).name + ".container")


def start(ctr) -> None:
    """Start a created container; if docker refuses (a port taken meanwhile, a runtime error), the
    container is removed and its reason is one line."""
    import docker

    try:
        ctr.start()
    except docker.errors.APIError as e:
        try:
            ctr.remove(force=True)
        except docker.errors.APIError:
            pass  # (the reason to report is the start's)
        raise ColdstartError(f"docker could not start container {ctr.name}: {e.explanation or e}") from None


HOST_SHAPE = (2, 2 << 20)  # the host's bulk readers x chunk (HostWarm)
HEAD_CHUNK = 2 << 20  # HostWarm's head reader: sendfile calls of this size (the kernel reads ahead of them)
HEAD_MIN = 256 << 20  # ... and the smallest child page file it takes (bench 1.27 GB: sooner; tiny 58 MB: later)
IMAGE_CRIU = "/usr/local/sbin/criu"  # where the image has criu (image.py): the probe of a warm node


class HostWarm:
    """Warming on the host, overlapped with the container's create and start. The plan (opening and
    sizing ~1000 files through the image's layers: over a second after a dropped page cache) is
    made on a thread, so the create call is not delayed by it. With a profile: its ranges first,
    then the weights file whole (the reload maps it when it is in the page cache, and reads it
    with O_DIRECT after the restore otherwise), except when the snapshot kept its packed handles
    (manifest ``weights.kept_linears``: the reload reads only the profile's few MB of the file, and
    1.3 GB more of reads would queue before the pages the restore waits for); the rest of the
    snapshot is the entrypoint's, after its first token. The bulk reads start at once, beside the
    early reader, in the idle I/O class: with the VM's memory reclaim out of the way that brought a
    bench model's first token 0.05 s sooner than holding them back (8 of 10 pairs; tiny: no
    difference; results/spot-checks/host-warm-gates, run 4) and did not delay the entrypoint's
    start. ``after_start`` holds them until docker's start call has returned (the caller says so
    with ``container_started()``) and ``wait_early`` until the early reader is done (off by default;
    to compare: results/spot-checks/host-warm-shape, host-warm-gates).

    ``early``: from the create call, one reader takes first, whole, the few tens of MB that the
    entrypoint reads one small read at a time before CRIU runs (early_files: the entrypoint's own
    Python files, the snapshot's manifest and CRIU metadata, the restore's helper programs and their
    libraries), in the normal I/O class. Behind a queue of bulk reads in that class those small
    reads took about a second of a cold restore. ``early_criu``: the early reader then reads what
    CRIU reads rather than maps too (ELF heads, page runs: +86 MB); off, no gain measured
    (bench-earlycriu).
    The early reader then reads the hot layout's child pages that the restore touches before its
    canary's forward pass (warm.base.early_ranges), so that CRIU and the wake need not wait behind
    the rest of the child (with the packed handles kept, 1.3 GB that only that forward pass reads).
    ``bulk``: "profile" (the default: the profile's ranges, then the weights) or "weights" (the
    weights file only; slower: it delayed the entrypoint's start by a second, bench-early-weights).
    ``threads``, ``chunk``, ``method``, ``io_class``: the native warmer's readers, chunk in flight,
    read method (``sendfile``, its default: no copy to user space, CPU the restore needs on a small
    host; or ``pread``, ``populate``) and I/O class (its default "idle": the bulk reads yield to the restore's
    own; the early reads stay in the normal class: they are what the restore waits for). Readers x
    chunk default to 2 x 2 MiB (HOST_SHAPE), not the native warmer's 8 x 8 MiB: on the AVX-512 VM's
    disk 2 x 2 MiB read at 1.8-2.0 GiB/s against 0.9-1.35, a 4 KiB read beside them waited 5 ms
    (p90) against 28-54, and CRIU's phase of a cold container restore took 0.37 s against 0.86
    (bench-overlap.jsonl). ``criu_runs``: also ask, at the create call, for what CRIU
    itself reads before the restored tree runs (pipeline.restore.ReadAhead: the heads of the image's
    ELF files it checks, ~100 MiB of page runs); off by default: it gained nothing there
    (bench-criu-runs), the entrypoint's own read-ahead asks for the same at its restore call.
    ``head``: "auto" (default), "on" or "off": a reader of the hot child's page file from the create
    call, before the bulk reader's plan exists; "auto" only on a node that holds the image's files
    (_read_head)."""

    def __init__(self, snapshot: Path, layers: list[Path] | None = None, *, after_start: bool = False,
                 threads: int | None = HOST_SHAPE[0], chunk: int | None = HOST_SHAPE[1], method: str | None = None,
                 io_class: str | None = None, criu_runs: bool = False,
                 early: bool = True, early_criu: bool = False, bulk: str = "profile", wait_early: bool = False,
                 head: str = "auto"):
        if head not in ("auto", "on", "off"):  # both before any reader starts
            raise ValueError(f"head must be auto, on or off, not {head!r}")
        if bulk not in ("profile", "weights"):
            raise ValueError(f"bulk must be profile or weights, not {bulk!r}")
        self.ahead = None
        remap = docker_api.layer_remap(layers) if layers else None
        if criu_runs:
            self.ahead = ReadAhead(Path(snapshot) / "criu", remap)
        self.warmer = None
        self._started = threading.Event() if after_start else None
        self._early_done = threading.Event() if early else None
        self._wait_early = early and wait_early
        self.gate = threading.Event() if (after_start or self._wait_early) else None
        self._shape = {k: v for k, v in (("threads", threads), ("chunk", chunk), ("method", method),
                                         ("io_class", io_class)) if v}
        self.stats: WarmStats | None = None
        self.early: dict | None = None
        self.error: str | None = None
        self._cancelled = False
        self._early_t = None
        self._early_criu = early_criu
        self._bulk = bulk
        if early:
            self._early_t = threading.Thread(target=self._read_early, args=(Path(snapshot), remap),
                                             name="coldstart-host-warm-early", daemon=True)
            self._early_t.start()
        self._t = threading.Thread(target=self._run, args=(Path(snapshot), remap), name="coldstart-host-warm",
                                   daemon=True)
        self._t.start()
        self.head: dict | None = None
        self._head_t = None
        if head != "off":
            self._head_t = threading.Thread(target=self._read_head, args=(Path(snapshot), remap, head),
                                            name="coldstart-host-warm-head", daemon=True)
            self._head_t.start()

    def _read_head(self, snapshot: Path, remap, head: str) -> None:
        """``head``: from the create call, before the bulk reader's plan exists, one reader takes the
        hot layout's child page file (the packed weights: 1.27 GB of the bench model's 1.46) whole,
        in file order, in the idle I/O class. "auto": only where the node already holds the image's
        files (its criu binary in the page cache: a node that runs containers), where the disk is
        the snapshot's alone, and only for a child page file of at least HEAD_MIN. There, with only
        the snapshot cold, the bench model's first token came 0.12 s sooner (7 of 8 pairs) and the
        tiny model's (58 MB) 0.02 s later; with the whole page cache dropped the same reads held the
        entrypoint's and CRIU's cold reads back (the virtual disk serves requests in arrival order,
        whatever their I/O class) and the first token came no sooner
        (results/spot-checks/host-warm-head)."""
        t0 = time.monotonic()
        n, skipped = 0, None
        try:
            sizes = {p: p.stat().st_size for p in (snapshot / "criu").glob("pages-*.img")}
            if not sizes or not (snapshot / "criu" / "parent").is_dir():
                skipped = "not a hot layout"
                return
            pages = max(sizes, key=sizes.get)
            size = sizes[pages]
            if head == "auto":
                if size < HEAD_MIN:
                    skipped = f"a child page file under {HEAD_MIN >> 20} MiB"
                    return
                probe = remap(Path(IMAGE_CRIU)) if remap is not None else None
                if probe is None or sampled_resident_fraction(probe, 32) < 0.5:
                    skipped = "the image's files are not in the page cache"
                    return
            background_io("idle")
            fd = os.open(pages, os.O_RDONLY | os.O_CLOEXEC)
            try:
                for off in range(0, size, HEAD_CHUNK):
                    if self._cancelled:
                        break
                    n += read_into_cache(fd, off, min(HEAD_CHUNK, size - off))
            finally:
                os.close(fd)
        except OSError as e:
            skipped = f"{type(e).__name__}: {e}"  # a hint: the bulk reader reads the same
        finally:
            self.head = {"bytes": n, "seconds": round(time.monotonic() - t0, 3), "skipped": skipped}

    def _open_gate(self) -> None:
        waits = (self._started, self._early_done if self._wait_early else None)
        if self.gate is not None and all(e is None or e.is_set() for e in waits):
            self.gate.set()

    def _read_early(self, snapshot: Path, remap) -> None:
        t0 = time.monotonic()
        n = files = 0
        try:
            for p in early_files(snapshot, remap):
                if self._cancelled:
                    break
                try:
                    n += _read_data(p, lambda: self._cancelled)
                    files += 1
                except OSError:
                    continue  # a hint: the restore reads (and names) it anyway
            if self._early_criu and not self._cancelled:
                n += _read_criu_first(snapshot / "criu", remap, lambda: self._cancelled)
            if not self._cancelled:  # (early_ranges: none where COLDSTART_WARM_HOT_FIRST=0)
                n += _read_ranges(early_ranges(sorted((snapshot / "criu").glob("pages-*.img"))
                                               if (snapshot / "criu" / "parent").is_dir() else []),
                                  lambda: self._cancelled)
        finally:
            self.early = {"files": files, "bytes": n, "seconds": round(time.monotonic() - t0, 3)}
            self._early_done.set()
            self._open_gate()

    def _run(self, snapshot: Path, remap) -> None:
        t0 = time.monotonic()
        try:
            m = read_manifest(snapshot)
            weights = snapshot / m.weights["flat"] if m.weights.get("flat") else None
            if weights is not None and m.weights.get("kept_linears") and self._bulk == "profile":
                weights = None  # its profile ranges are all a restore reads of it
            gate = {"gate": self.gate} if self.gate else {}
            st = None
            if self._bulk == "profile" or weights is None:
                self.warmer = start_warming(warm_paths(snapshot, m), profile="auto", record="off",
                                            mapped=remap is not None, rest="never" if remap is not None else "now",
                                            remap=remap, **gate, **self._shape)
                st = self.warmer.wait()
            # the weights whole, after the profile's ranges (or alone, with bulk="weights")
            if weights is not None and not self._cancelled and (st is None or st.profile_used):
                self.warmer = start_warming([weights], profile="off", record="off", mapped=False, **gate, **self._shape)
                st2 = self.warmer.wait()
                st = st2 if st is None else WarmStats(
                    mode=st.mode, bytes=st.bytes + st2.bytes, planned=st.planned + st2.planned,
                    finished=st2.finished, profile_used=True, errors=st.errors + st2.errors)
            if st is not None:  # (None: cancelled before the weights-only warming started)
                st.seconds = time.monotonic() - t0
            self.stats = st
        except Exception as e:  # noqa: BLE001 - warming is an optimisation: the restore goes on
            self.error = f"{type(e).__name__}: {e}"

    def container_started(self) -> None:
        """Docker's start call returned: with ``after_start``, the bulk reads begin now (or once the
        early files are read)."""
        if self._started is not None:
            self._started.set()
        self._open_gate()

    def wait(self, timeout: float | None = None) -> WarmStats | None:
        self._t.join(timeout)
        for t in (self._early_t, self._head_t):
            if t is not None:
                t.join(timeout)
        return self.stats

    def cancel(self) -> None:
        self._cancelled = True
        if self.gate is not None:
            self.gate.set()
        if self.warmer is not None:
            self.warmer.cancel()


def early_files(snapshot: Path, remap=None) -> list[Path]:
    """What a container restore reads before CRIU runs, in the order it does, as host paths: the
    entrypoint's own files (the node's recorded profile, ranges of source "process", through
    ``remap``, in exec_order), the snapshot's manifest, the restore's helper programs and libraries (the image's
    helpers.RESTORE_FILES list, through ``remap``), then the snapshot's small files CRIU and the
    wrapper open: its metadata images (not the pages; with the hot layout, the parent's pagemaps
    too), the shm and link-remap copies, the run dir's
    files the server holds open (not the rest of run/: the checkpoint's compile cache, 150 MB for the
    bench model, is not read before the first token)."""
    out: list[Path] = []
    prof = _snapshot.node_profile(snapshot)
    if remap is not None and prof is not None and prof.exists():
        try:
            out += [remap(p) for p in exec_order([Path(r.file) for r in load_profile(prof).ranges
                                                  if r.source == "process"])]
        except ColdstartError:
            pass  # an unreadable profile: the bulk warmer's plan says so
    out.append(snapshot / "manifest.json")
    if remap is not None:
        try:
            out += [remap(Path(ln)) for ln in remap(Path(RESTORE_FILES)).read_text().split()]
        except OSError:
            pass  # an image built before the list existed
    out += [p for p in sorted((snapshot / "criu").glob("*.img")) if not p.name.startswith("pages-")]
    # the hot layout: CRIU reads the dumped pagemaps too, to find the pages the child leaves to them
    out += sorted((snapshot / "criu" / "parent").glob("pagemap-*.img"))
    for sub in ("shm", "link-remaps"):
        if (snapshot / sub).is_dir():
            out += sorted(p for p in (snapshot / sub).iterdir() if p.is_file())
    try:
        out += [snapshot / "run" / rel for rel in read_manifest(snapshot).run_files]
    except Exception:  # noqa: BLE001 - the restore names a bad manifest
        pass
    return list(dict.fromkeys(out))


def exec_order(files: list[Path]) -> list[Path]:
    """The entrypoint's own files in the order its cold start needs them: the shared libraries the
    interpreter maps at exec (libpython, libc, ...), then the extension modules (under lib-dynload or
    site-packages), then the rest (Python sources and bytecode) as recorded, in import order. The
    profile lists the mapped files last, in address order: read there, they come after the
    interpreter has faulted them in itself and delay criu and the helpers behind them (a cold restore
    with host warming: -0.08 s tiny, -0.06 s bench, paired medians of 22, results/spot-checks/early-elf-first)."""
    def rank(p: Path) -> int:
        if ".so" not in p.name:
            return 2
        return 1 if {"lib-dynload", "site-packages"} & set(p.parts) else 0
    return sorted(files, key=rank)  # stable: each group keeps the recorded order


def _read_criu_first(images: Path, remap, cancelled=lambda: False) -> int:
    """Read what CRIU's restore reads rather than maps (pipeline.restore.ReadAhead's list, read here
    one range after another instead of asked for at once): the heads of the ELF files it checks by
    build-id (through ``remap``), then its page runs. Returns the bytes read."""
    n = 0
    for name in _images.elf_files(images):
        if cancelled():
            return n
        try:
            with open(remap(Path(name)) if remap is not None else name, "rb", buffering=0) as f:
                n += len(f.read(_images.ELF_HEAD))
        except OSError:
            continue
    try:
        runs = _images.read_runs(images)
    except OSError:
        return n  # a hint: the restore reads them anyway
    return n + _read_ranges(runs, cancelled, exact=False)


def _read_ranges(ranges: list[tuple[Path, int, int]], cancelled=lambda: False, exact: bool = True) -> int:
    """Read (file, offset, length) ranges into the page cache in order; returns the bytes read.
    ``exact``: each range alone, no readahead past it (the pages between them are not wanted yet)."""
    n = 0
    fds: dict[Path, int] = {}
    pipe = None
    try:
        for path, off, length in ranges:
            if cancelled():
                break
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                if exact:
                    os.posix_fadvise(fds[path], 0, 0, os.POSIX_FADV_RANDOM)
            if exact:
                pipe = pipe or exact_pipe()
                n += read_into_cache(fds[path], off, length, cancelled, pipe)
            else:
                n += read_into_cache(fds[path], off, length)
    except OSError:
        pass  # a hint: the restore reads them anyway
    finally:
        for fd in [*fds.values(), *(pipe or ())]:
            os.close(fd)
    return n


def _read_data(path: Path, cancelled=lambda: False) -> int:
    """Read ``path``'s data into the page cache, skipping its holes (the shm copies are sparse: 400 MB
    long, 100 KB of data); returns the bytes read."""
    n = 0
    with open(path, "rb", buffering=0) as f:
        for pos, end in data_extents(f.fileno()):
            got = read_into_cache(f.fileno(), pos, end - pos, cancelled)
            n += got
            if got < end - pos:
                break  # cancelled, or the file shrank
    return n


def host_warm(snapshot: Path, layers: list[Path] | None = None, **shape) -> HostWarm:
    """Warm, on the host, what the restore will read, from the moment the container is created
    (HostWarm).
    With the node's recorded profile (a previous replica's) and ``layers`` (the image's layer dirs,
    docker_api.image_layers): the ranges the profile names, the image's files the entrypoint and the
    restored server read among them; the rest is the entrypoint's own warmer's, after its first
    token. Otherwise the snapshot's bulk files (pipeline.restore.warm_paths) whole."""
    return HostWarm(snapshot, layers, **shape)


def create_naive(c, image: str, model: Path, host_port: int, kv_cache_bytes: int = 256 << 20,
                 extra: list[str] | None = None, name: str | None = None, pod=None):
    """The naive start a user would write: vLLM's OpenAI server in the runtime image, docker's default
    security, the model mounted read-only, the same network and port publishing as a restore.
    ``extra``: more vLLM arguments (e.g. ``--enforce-eager``, the flag our servers run with); ``pod``:
    as for ``create_restore``."""
    model = hf_model_dir(model)
    return _create(c, image, ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                              "--host", "0.0.0.0", "--port", str(CONTAINER_PORT), "--seed", "0",
                              "--kv-cache-memory-bytes", str(kv_cache_bytes), *(extra or [])],
                   entrypoint=["python3"], name=name, shm_size=SHM_SIZE, **_network(c, host_port, pod),
                   volumes={str(model): {"bind": str(model), "mode": "ro"}},
                   runtime=docker_api.oci_runtime(c))
