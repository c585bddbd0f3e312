"""``coldstart bench container``: container restore vs a naive container start of the same model, both
timed from the docker-py create call to the first completion answered through the host's port.

Naive: the runtime image running vLLM's OpenAI server as a user would (docker's default security,
1 GiB /dev/shm). Restore: the image's entrypoint restoring a snapshot that was checkpointed in a
container, mounted read-only, least privilege (run.RESTORE_SECURITY). Restore + host warming: the
same, with the host warming the snapshot from the create call on, overlapped with container create
and start. Each container is on our bridge network with its port published, or (``--network pod``)
joins a pod's network namespace made before the clock. Page-cache states (run_bench): warm (after
one unmeasured start), cold (the whole page cache dropped: the snapshot, the image's files, the
model) and cold-snapshot (only the snapshot evicted, after one unmeasured restore). Also: the entry
probe (the entrypoint's start alone) and restore+load (the warming's load on a warm restore). The
methods' order turns every repetition.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from coldstart.warm.residency import evict_all

Say = Callable[[str], None]

# The entrypoint's work before ENTRY_READY (pipeline.entry.prepare, after the import the console
# script does), run in place of the restore by the "entry" probe; prints the wall time of its first
# line and of its end.
ENTRY_PROBE = ("import time; t = time.time(); import coldstart.main; from coldstart.pipeline import entry; "
               "entry.prepare(['/snapshot']); print(repr(t), repr(time.time()))")


def wait_port_closed(port: int, timeout: float = 60.0) -> None:
    """Until nothing listens on 127.0.0.1:``port`` (the previous server must be gone: else a restore
    finds its port busy and takes a private network)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} still in use after {timeout:.0f} s")


def one_start(c, image: str, method: str, model: Path, snap: Path, layers: list[Path] | None = None,
              host_warm: dict | None = None, env: dict[str, str] | None = None, decoy: Path | None = None,
              pod=None) -> dict:
    """One container start, timed from the docker-py create call (COLDSTART_T0, passed in) to the first
    completion through the published port. ``method``: naive | restore | restore+hostwarm |
    restore+load | entry | entry+hostwarm (``layers``: the image's layer dirs,
    docker_api.image_layers, looked up before the clock starts; ``host_warm``: run.HostWarm's shape,
    its defaults when None; ``env``: more of the restore container's environment). restore+load: the
    plain restore, while the host warmer warms ``decoy``, a cold copy of the snapshot, from the create
    call: the warming's load on the CPUs and the disk without what it is for (make_decoy). entry: the
    restore's container, same image, mounts, network and security, running only what the entrypoint
    does before ENTRY_READY (ENTRY_PROBE), to its end ("entry_s") and its first line of Python
    ("exec_s"), from the create call; entry+hostwarm: the same while the host warms the snapshot as
    for restore+hostwarm (cancelled when it ends). ``pod``: a running run.create_pod container whose network
    namespace (and published port) the container joins, made by the caller before the clock, as
    kubelet makes a pod's sandbox before its containers; None: the container's own, on our bridge."""
    from coldstart.containers import run
    from coldstart.engine.launcher import free_port
    from coldstart.bench.warm import block_device, device_read_bytes, host_cpu_busy_s

    dev = block_device(snap)
    port = free_port() if pod is None else run.pod_port(pod)
    read0 = device_read_bytes(dev)
    busy0 = host_cpu_busy_s()
    t0, wall0 = time.monotonic(), time.time()
    warmer = None
    if method in ("restore+hostwarm", "entry+hostwarm"):
        warmer = run.host_warm(snap, layers, **(host_warm or {}))
    elif method == "restore+load":
        if decoy is None:
            raise ValueError("restore+load needs a decoy (make_decoy)")
        warmer = run.host_warm(decoy, layers, **(host_warm or {}))
    # named before the create call: a benchmark stopped during that call (^C, SIGTERM) still removes it
    name = f"coldstart-bench-{os.getpid()}-{next(_SEQ)}"
    try:
        if method == "naive":
            ctr = run.create_naive(c, image, model, port, name=name, pod=pod)
        elif method.startswith("entry"):
            ctr = run.create_restore(c, image, snap, model, port, name=name, entrypoint=["python", "-c", ENTRY_PROBE],
                                     env=env, host_warms=method == "entry+hostwarm", pod=pod)
        else:
            ctr = run.create_restore(c, image, snap, model, port, name=name,
                                     env={**(env or {}), "COLDSTART_T0": repr(wall0)},
                                     host_warms=method == "restore+hostwarm", pod=pod)
    except BaseException:
        _remove_named(c, name)
        if warmer is not None:
            warmer.cancel()
        raise
    row: dict = {} if pod is None else {"network": "pod"}
    row["created_s"] = round(time.monotonic() - t0, 3)
    try:
        ctr.start()
        row["started_s"] = round(time.monotonic() - t0, 3)
        if warmer is not None:
            warmer.container_started()
        if method.startswith("entry"):
            row.update(_entry_times(ctr, wall0))
            return row  # (finally below still adds the warmer's record to it)
        t1 = run.first_completion(port, str(model), t0 + 900, ctr)
        row["first_token_s"] = round(t1 - t0, 3)
        row["disk_read_bytes"] = device_read_bytes(dev) - read0
        row["cpu_busy_s"] = round(host_cpu_busy_s() - busy0, 3)  # the whole host's, create to first token
        if method != "naive":  # its summary line follows the first token
            summ = run.with_host_events(run.summary(ctr, time.monotonic() + 60), row["created_s"], row["started_s"])
            row["restored"] = summ.get("restored")
            row["fallback_reason"] = summ.get("fallback_reason")
            row["events"] = summ.get("events")
            if summ.get("attrs"):
                row["event_attrs"] = summ["attrs"]  # e.g. WEIGHTS_LOADED: the reload's populate and prepack
    except Exception as e:  # noqa: BLE001 - recorded; the next cell still runs
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if warmer is not None:
            warmer.container_started()  # (a failed start call never opened its gate)
            if method.startswith("entry"):
                warmer.cancel()  # the probe is over: what is left of the warming is the restore's
            st = warmer.wait()
            row["host_warm"] = {"bytes": getattr(st, "bytes", None), "seconds": getattr(st, "seconds", None),
                                "error": warmer.error, "early": warmer.early, "head": warmer.head,
                                **(warmer.ahead.result() if warmer.ahead is not None else {})}
        ctr.remove(force=True)
    return row


_SEQ = itertools.count()


def _remove_named(c, name: str) -> None:
    """Remove the container ``name`` if docker made it (a create call interrupted midway); best
    effort, on the way out of an error that is the one to report."""
    try:
        c.containers.get(name).remove(force=True)
    except Exception:  # noqa: BLE001 - NotFound (never made), or the daemon gone too
        pass


def _entry_times(ctr, wall0: float) -> dict:
    """The entry probe's two wall times (ENTRY_PROBE's line), from the create call."""
    res = ctr.wait(timeout=120)
    logs = ctr.logs().decode(errors="replace")
    try:
        ts, te = (float(x) for x in logs.split()[-2:])
    except ValueError:
        raise RuntimeError(f"entry probe exited {res.get('StatusCode')}: {logs[-300:]}") from None
    return {"exec_s": round(ts - wall0, 3), "entry_s": round(te - wall0, 3)}


def new_to_node(snap: Path) -> None:
    """Make the next restore of ``snap`` the first on this node: the node forgets that it verified
    its files and the access profile it recorded (both kept in the node dir for later replicas),
    and the page cache is dropped, as on a node that has just received it (a restore that finds it
    all cached, the checkpoint having just written it, does not warm, so records no profile)."""
    from coldstart.warm.residency import drop_caches
    from coldstart.pipeline.integrity import NodeRecord
    from coldstart.pipeline.manifest import read_manifest
    from coldstart.warm.snapshot import node_profile

    NodeRecord().forget(snap, read_manifest(snap).files)
    prof = node_profile(snap)
    if prof is not None:
        prof.unlink(missing_ok=True)
    drop_caches()


def case_label(size: str, layout: str) -> str:
    """A case's name in rows and tables: the model, and the snapshot's layout unless it is as dumped."""
    return size if layout == "dumped" else f"{size}-{layout}"


def snapshot_in_container(c, image: str, size: str, work: Path, say: Say = print,
                          layout: str = "hot") -> tuple[Path, Path]:
    """(model dir, snapshot dir) of the ``size`` model checkpointed in a container of ``image`` with
    ``layout`` (``coldstart checkpoint --layout``), under ``work``/<image tag>/<case_label>: made once
    per image (a snapshot restores only in the image that made it). One clear error when the
    checkpoint fails or did not make the layout asked for (a failed recording keeps the dumped one)."""
    from coldstart.containers import run
    from coldstart.errors import ColdstartError
    from coldstart.models.tiny import cached_model

    model = cached_model(size)
    snap = Path(work) / image.replace(":", "-") / case_label(size, layout)
    if not (snap / "manifest.json").exists():
        say(f"checkpointing {size} ({layout} layout) in a container -> {snap}")
        res = run.checkpoint(c, image, model, snap, extra=["--layout", layout])
        if res.exit_code != 0:
            raise ColdstartError(f"checkpoint of {size} in a container failed: "
                                 f"{(res.logs.strip().splitlines() or ['its log is empty'])[-1]}")
    require_layout(snap, layout)
    return model, snap


class BenchCase(NamedTuple):
    """What every container experiment starts from (bench_case)."""
    client: Any  # docker-py client of our dockerd
    image: str  # the app image's tag, built from this tree
    layers: list[Path]  # its layer dirs (host warming reads the image's files through them)
    model: Path
    snap: Path


def bench_case(size: str, work: Path, say: Say = print, layout: str = "hot") -> BenchCase:
    """The docker client, the app image built from this checkout (cached by its inputs), the image's
    layer dirs and the ``size`` model's snapshot checkpointed in it (snapshot_in_container)."""
    from coldstart.containers import docker_api, image

    c = docker_api.client(None)
    tag = image.app_image(c, Path(__file__).resolve().parents[3], say=say).tag
    layers = docker_api.image_layers(c, tag)
    model, snap = snapshot_in_container(c, tag, size, work, say=say, layout=layout)
    return BenchCase(c, tag, layers, model, snap)


def require_layout(snap: Path, layout: str) -> None:
    """A benchmark's snapshot, reused or just made, has ``layout``: else one clear error (a failed
    recording keeps the images as dumped, and an old work dir may hold either)."""
    from coldstart.errors import ColdstartError
    from coldstart.pipeline.manifest import read_manifest

    got = "hot" if read_manifest(snap).layout else "dumped"
    if got != layout:
        raise ColdstartError(f"{snap} has the {got} layout, not {layout}: remove it to checkpoint again")


def make_decoy(snap: Path) -> Path:
    """A copy of ``snap`` beside it (``<name>.decoy``, made once): for restore+load, whose host warmer
    reads it cold while the restore runs from a warm page cache. A copy, so that the warmer finds the
    same files, the same node profile (it is keyed by the snapshot's id) and the same sizes."""
    import shutil
    import stat

    def special(d: str, names: list[str]) -> list[str]:  # sockets and FIFOs of run/: nothing reads them
        return [n for n in names if not stat.S_ISREG(m := os.lstat(os.path.join(d, n)).st_mode)
                and not stat.S_ISDIR(m) and not stat.S_ISLNK(m)]

    decoy = snap.with_name(snap.name + ".decoy")
    if not decoy.exists():
        staged = snap.with_name(snap.name + ".decoy.tmp")
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(snap, staged, symlinks=True, ignore=special)
        staged.rename(decoy)
    return decoy


def disk_bandwidth(snap: Path) -> dict:
    """The disk's sequential read bandwidth, on the snapshot's largest dense file (evicted before each
    read; bench.warm.probe_file)."""
    from coldstart.bench.warm import best_bandwidth, probe_file

    big = probe_file([p for p in snap.rglob("*") if p.is_file()])
    return {"file": big.name, **best_bandwidth(big)}


def disk_probe(snap: Path) -> float:
    """The disk's sequential read bandwidth now (bytes/s), as disk_bandwidth measures it (the better
    of O_DIRECT and buffered reads of the snapshot's largest dense file, evicted before and after),
    to run right before and after a cold start. On this VM the disk's speed moves from one minute to
    the next (the same file read at 1.0, 2.0, 1.9 and 1.2 GiB/s in passes 15 s apart), so each
    cold start is held against the disk of its moment too (results/spot-checks/disk-variance)."""
    return float(disk_bandwidth(snap)["bw_bytes_s"])


def run_bench(c, image: str, cases: list[tuple[str, Path, Path]], *, reps: int, caches: tuple[str, ...],
              say: Say = print, methods: tuple[str, ...] = ("naive", "restore", "restore+hostwarm"),
              naive_reps: int | None = None, network: str = "bridge") -> list[dict]:
    """``cases``: (case label, model dir, snapshot dir); two cases of one model (two layouts) share its
    naive starts, run with the first. One record per (case, method, cache, rep). ``caches``: warm;
    cold (the whole page cache dropped before each start); cold-snapshot (a node that runs containers:
    one unmeasured restore of the snapshot leaves docker, the image and the node dir as it leaves them,
    then only the snapshot's files are evicted; restores only: the naive start and the entry probe
    read nothing of the snapshot). restore+hostwarm runs in cold cells only (with a warm cache it is
    the plain restore), restore+load in warm cells only (its decoy evicted before each start). The order of
    the methods turns around every repetition. entry+hostwarm, like restore+hostwarm, runs in cold
    cells only; a warm entry follows one unmeasured entry. Before them, per snapshot, one restore that is the
    first on this node (row "first-on-node"). A warm restore cell follows one unmeasured restore of
    the same snapshot (row "prewarm"): else whatever ran before it (a naive start, a dropped cache)
    decides what "warm" holds. ``naive_reps``: repetitions of the naive start (minutes each for the
    bench model), the first ones; default ``reps``. ``network``: bridge (each container its own
    network namespace on our bridge, its port published: ``docker run -p``) or pod (each start joins a
    pod's, run.create_pod, made before the cell's page cache is dropped and removed after it: what
    kubelet runs)."""
    from coldstart.containers.docker_api import image_layers

    layers = image_layers(c, image)
    decoys = {snap: make_decoy(snap) for _, _, snap in cases} if "restore+load" in methods else {}
    naive_case = {}
    for size, model, _ in cases:
        naive_case.setdefault(model, size)
    rows: list[dict] = []
    for size, model, snap in cases:
        bw = disk_bandwidth(snap)
        rows.append({"size": size, "method": "disk", **bw})
        say(json.dumps(rows[-1]))
        # the first restore of a snapshot on a node verifies every file and records the access
        # profile (both kept in the node dir for later replicas): not the steady state, kept apart
        new_to_node(snap)
        with pod_if(c, image, network == "pod") as pod:
            rows.append({"size": size, "method": "first-on-node",
                         **one_start(c, image, "restore", model, snap, layers, pod=pod)})
        say(json.dumps(rows[-1]))
    for rep in range(reps):
        for size, model, snap in cases:
            for cache in caches:
                ms = [m for m in methods if not (m in ("restore+hostwarm", "entry+hostwarm") and cache == "warm")
                      and not (m == "restore+load" and cache != "warm")
                      and not (cache == "cold-snapshot" and m not in ("restore", "restore+hostwarm"))
                      and not (m == "naive" and (rep >= (reps if naive_reps is None else naive_reps)
                                                 or naive_case[model] != size))]
                for method in (ms if rep % 2 == 0 else ms[::-1]):
                    with pod_if(c, image, network == "pod") as pod:
                        rows.extend(_cell(c, image, size, model, snap, layers, method, cache, rep, decoys.get(snap),
                                          pod, say))
    return rows


@contextlib.contextmanager
def pod_if(c, image: str, wanted: bool):
    """A pod's sandbox (run.create_pod) for one cell's starts when ``wanted``, removed after; else None."""
    from coldstart.containers import run
    from coldstart.engine.launcher import free_port

    pod = run.create_pod(c, image, free_port()) if wanted else None
    try:
        yield pod
    finally:
        if pod is not None:
            pod.remove(force=True)


def _cell(c, image: str, size: str, model: Path, snap: Path, layers, method: str, cache: str, rep: int,
          decoy: Path | None, pod, say: Say) -> list[dict]:
    """One measured start of run_bench (and what prepares its page cache): its rows."""
    from coldstart.warm.residency import drop_caches

    rows: list[dict] = []
    probe0 = None
    probed = method in ("restore", "restore+hostwarm")  # the rows the warming bound reads (disk_probe_bytes_s)
    if cache == "cold":
        probe0 = disk_probe(snap) if probed else None
        drop_caches()
    elif cache == "cold-snapshot" or method in ("restore", "restore+load"):
        # one unmeasured restore first: the cache a warm restore finds, or (cold-snapshot)
        # docker, the image and the node dir as a restore leaves them, the snapshot evicted
        rows.append({"size": size, "method": "prewarm", "cache": cache, "rep": rep,
                     **one_start(c, image, "restore", model, snap, layers, pod=pod)})
        say(json.dumps(rows[-1]))
        if cache == "cold-snapshot":
            probe0 = disk_probe(snap)
            evict_all([snap])
    elif method == "entry":  # warm: the image's files as a restore just left them
        rows.append({"size": size, "method": "prewarm", "cache": cache, "rep": rep, "of": "entry",
                     **one_start(c, image, "entry", model, snap, layers, pod=pod)})
        say(json.dumps(rows[-1]))
    if method == "restore+load":
        evict_all([decoy])
    row = {"size": size, "method": method, "cache": cache, "rep": rep, "model": model.name,
           **one_start(c, image, method, model, snap, layers, decoy=decoy, pod=pod)}
    if probe0 is not None:  # the disk's speed around this start (disk_probe)
        row["disk_probe_bytes_s"] = [probe0, disk_probe(snap)]
    rows.append(row)
    say(json.dumps(row))
    return rows


LAYOUTS = ("hot", "dumped")  # `coldstart checkpoint --layout`: what snapshot_in_container can make
CACHES = ("warm", "cold", "cold-snapshot")  # run_bench's page-cache states
COLD_CACHES = CACHES[1:]  # those that start with something to read
METHODS = ("naive", "restore", "restore+hostwarm", "restore+load", "entry", "entry+hostwarm")


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _med(rows: list[dict], key: str = "first_token_s") -> float | None:
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def _per_start_bounds(rows: list[dict], sizes: list[str]) -> list[str]:
    """The overlapped-warming check per cold start, against the disk as probed right before and
    after that start (disk_probe): bound = max(warm restore, the start's bytes read / the mean of
    its two probes). Also the whole host's CPU-seconds from the create call to the first token."""
    out = ["", "The same check per cold start, against the disk probed right before and after it (as above, "
           "the mean of the two): medians, with each start's ratio. CPU: the whole host's "
           "busy CPU-seconds from the create call to the first token (median; the host line names its cores).", "",
           "| model | method | disk around the start (GiB/s) | read (GiB) | bound (s) | first token (s) "
           "| ratio to bound | each start's ratio | CPU-s (warm restore: CPU-s) |", "|---|---|---|---|---|---|---|---|---|"]
    n = 0
    for size, cache, method in ((s, c, m) for s in sizes for c in COLD_CACHES for m in ("restore", "restore+hostwarm")):
        warm_rows = [r for r in rows if r["size"] == size and r["method"] == "restore" and r.get("cache") == "warm"]
        warm = _med(warm_rows)
        if warm is None:
            continue
        sel = [r for r in rows if r["size"] == size and r["method"] == method and r.get("cache") == cache
               and r.get("disk_probe_bytes_s") and r.get("first_token_s") and r.get("disk_read_bytes")]
        if not sel:
            continue
        per = []
        for r in sel:
            bw = statistics.mean(r["disk_probe_bytes_s"])
            bound = max(warm, r["disk_read_bytes"] / bw)
            per.append((bw, r["disk_read_bytes"], bound, r["first_token_s"], r["first_token_s"] / bound))
        med = lambda i: statistics.median(x[i] for x in per)  # noqa: E731
        n += 1
        out.append(f"| {size} | {method}{'' if cache == 'cold' else f' ({cache})'} | {med(0) / 2**30:.2f} ({min(x[0] for x in per) / 2**30:.2f}-"
                   f"{max(x[0] for x in per) / 2**30:.2f}) | {med(1) / 2**30:.2f} | {med(2):.2f} | {med(3):.2f} "
                   f"| **{med(4):.2f}x** | {', '.join(f'{x[4]:.2f}' for x in per)} "
                   f"| {_fmt(_med(sel, 'cpu_busy_s'))} ({_fmt(_med(warm_rows, 'cpu_busy_s'))}) |")
    return out if n else []


def _run_bound(rows: list[dict], size: str, cache: str = "cold") -> dict:
    """The run-level overlapped-warming figures of one case (medians): warm restore, restore with
    host warming ("hw") and alone ("cold") from ``cache``, the bytes such a restore alone read, the
    disk's bandwidth ("bw", bytes/s) and the time those bytes take at it ("read_s"; None without a
    probe or the bytes). The bandwidth is the median of the probes around this case's cold starts
    ("around": disk_probe), else the run's one probe ("run"): one probe can fall in one of the VM's
    slow minutes and flatter every ratio of the run (results/container-intel-pod-10: 0.92x on the
    run's probe against 1.61x on the probes around each start)."""
    sel = lambda m, c: [r for r in rows if r["size"] == size and r["method"] == m and r.get("cache") == c]  # noqa: E731
    disk = next((r for r in rows if r["size"] == size and r["method"] == "disk"), None)
    around = [statistics.mean(r["disk_probe_bytes_s"]) for m in ("restore", "restore+hostwarm")
              for r in sel(m, cache) if r.get("disk_probe_bytes_s")]
    bw, probe = (statistics.median(around), "around") if around else \
        ((disk["bw_bytes_s"], "run") if disk else (None, None))
    nbytes = _med(sel("restore", cache), "disk_read_bytes")
    return {"disk": disk, "bw": bw, "probe": probe, "nbytes": nbytes, "warm": _med(sel("restore", "warm")),
            "hw": _med(sel("restore+hostwarm", cache)), "cold": _med(sel("restore", cache)),
            "read_s": nbytes / bw if bw and nbytes is not None else None}


def _entry_floor(rows: list[dict], sizes: list[str]) -> list[str]:
    """What a dropped page cache costs before any of the restore's code runs, probed in the same run
    (method entry): the entry's cold time, the smaller of without and with the host warming, less its
    warm time. The overlapped-warming check again, with that cost added to the warm restore in the
    bound: max(warm restore + the entry's cold cost, bytes read / the disk's bandwidth)."""
    out = ["", "Before the restore's code runs: the entrypoint's own start (docker's create and start, the "
           "interpreter, the imports and arguments before ENTRY_READY), probed in the same run by a container "
           "like the restore's (image, mounts, network, security) that runs only that part (method entry), "
           "from the create call to its end. Its files are read from the first milliseconds on, so warming "
           "started at the create call cannot take its cold cost off (entry + host warming: the same probe "
           "with the host warming the snapshot). Cold cost: the smaller of the two cold probes less the warm "
           "one. The same check as above, with that cost added to the warm restore in the bound.", "",
           "| model | entry, warm (s) | entry, cold (s) | entry + host warming, cold (s) | cold cost (s) "
           "| bound (s) | bound with the entry's cold cost (s) | restore + host warming (s) | ratio |",
           "|---|---|---|---|---|---|---|---|---|"]
    n = 0
    for size in sizes:
        sel = lambda m, c: [r for r in rows if r["size"] == size and r["method"] == m and r.get("cache") == c]  # noqa: E731
        ew, ec, eh = (_med(sel(m, c), "entry_s") for m, c in (("entry", "warm"), ("entry", "cold"),
                                                               ("entry+hostwarm", "cold")))
        b = _run_bound(rows, size)
        warm, hw, read_s = b["warm"], b["hw"], b["read_s"]
        if ew is None or ec is None or warm is None or hw is None or read_s is None:
            continue  # (no bound without the disk probe and the bytes: as in the table above)
        cost = max(min(x for x in (ec, eh) if x is not None) - ew, 0.0)
        bound, floor = max(warm, read_s), max(warm + cost, read_s)
        n += 1
        out.append(f"| {size} | {ew:.3f} | {ec:.3f} | {'-' if eh is None else f'{eh:.3f}'} | {cost:.3f} | {bound:.2f} "
                   f"| {floor:.2f} | {hw:.2f} | **{hw / floor:.2f}x** |")
    return out if n else []


LOSS_EVENTS = ("CONTAINER_STARTED", "ENTRY_PYTHON", "ENTRY_READY", "RESTORE_DONE", "WEIGHTS_LOADED", "FIRST_TOKEN")


def _where_lost(rows: list[dict], sizes: list[str]) -> list[str]:
    """Where a cold restore with host warming falls behind a warm one: the median time of each
    milestone of their timelines, from the create call, and the difference. Before ENTRY_PYTHON
    nothing of ours has run (docker's create and start, the interpreter's exec)."""
    out = ["", "Where the cold restore with host warming falls behind the warm one: medians of each milestone "
           "from the create call (s). Before ENTRY_PYTHON (the entrypoint's first line of Python) only docker's "
           "create and start and the interpreter's exec have run.", "",
           "| model | case | " + " | ".join(LOSS_EVENTS) + " |", "|---|---|" + "---|" * len(LOSS_EVENTS)]
    n = 0
    for size in sizes:
        cells = {case: [r for r in rows if r["size"] == size and r["method"] == m and r.get("cache") == c
                        and r.get("events")]
                 for case, m, c in (("warm", "restore", "warm"), ("cold + host warming", "restore+hostwarm", "cold"),
                                    ("cold-snapshot + host warming", "restore+hostwarm", "cold-snapshot"))}
        cells = {case: rs for case, rs in cells.items() if rs}
        med = {case: {e: _med([{"t": r["events"][e]} for r in rs if e in r["events"]], "t") for e in LOSS_EVENTS}
               for case, rs in cells.items()}
        if "warm" not in cells or len(cells) < 2:
            continue
        n += 1
        for case in cells:
            out.append(f"| {size} | {case} | " + " | ".join(_fmt(med[case][e], 3) for e in LOSS_EVENTS) + " |")
        a = med["warm"]
        for case in list(cells)[1:]:
            b = med[case]
            label = "**lost**" if case == "cold + host warming" else f"**lost** ({case.split(' ')[0]})"
            out.append(f"| {size} | {label} | " + " | ".join(
                "-" if a[e] is None or b[e] is None else f"{b[e] - a[e]:+.3f}" for e in LOSS_EVENTS) + " |")
    return out if n else []


def render(rows: list[dict], host: str, command: str) -> str:
    """Medians per (model, cache, method); the speed-up of the restore over the naive start; and the
    overlapped-warming check: cold restore+hostwarm against max(warm restore, bytes a cold restore
    reads from the disk / the disk's bandwidth measured in this run)."""
    L = ["# Container restore vs naive container start (first token, from the docker-py create call)", "",
         f"`{command}`", "", host, "",
         "| model | cache | naive (s) | restore (s) | restore + host warming (s) | restored | speed-up |",
         "|---|---|---|---|---|---|---|"]
    sizes = list(dict.fromkeys(r["size"] for r in rows if r.get("cache")))
    model_of = {r["size"]: r.get("model") for r in rows if r.get("cache")}
    for size in sizes:
        for cache in dict.fromkeys(r["cache"] for r in rows if r.get("cache")):
            cell = {m: [r for r in rows if r["size"] == size and r.get("cache") == cache and r["method"] == m]
                    for m in ("restore", "restore+hostwarm")}
            # a model's naive starts ran with its first case (its other layouts share them)
            cell["naive"] = [r for r in rows if r["method"] == "naive" and r.get("cache") == cache
                             and (r["size"] == size or (r.get("model") and r.get("model") == model_of.get(size)))]
            n, r, h = (_med(cell[m]) for m in ("naive", "restore", "restore+hostwarm"))
            rs = cell["restore"] + cell["restore+hostwarm"]
            ok = sum(1 for x in rs if x.get("restored"))
            cnt = lambda m: f" ({len([x for x in cell[m] if 'first_token_s' in x])})"  # noqa: E731
            L.append(f"| {size} | {cache} | {_fmt(n)}{cnt('naive')} | {_fmt(r)}{cnt('restore')} | "
                     f"{_fmt(h)}{cnt('restore+hostwarm') if cell['restore+hostwarm'] else ''} | {ok}/{len(rs)} | "
                     + (f"**{n / r:.1f}x**" if n and r else "-") + " |")
    first = [r for r in rows if r["method"] == "first-on-node" and r.get("first_token_s") is not None]
    if first:
        L += ["", "First restore of each snapshot on this node (not in the medians above: it verifies every "
              "file and records the access profile, which later replicas find in the node dir): "
              + ", ".join(f"{r['size']} {r['first_token_s']:.2f} s" for r in first) + "."]
    L += ["", "Overlapped warming (cold cache): restore + host warming against the bound "
          "max(warm restore, bytes a cold restore reads from the disk / the disk's bandwidth: the median of the "
          "probes right before and after each cold start of the case, or * the run's one probe where there are "
          "none). cold: the whole "
          "page cache dropped before each start; cold-snapshot (when run): a node that runs containers, where "
          "only the snapshot's files were evicted (docker, the image and the node dir as the restore before "
          "left them).", "",
          "| model | cache | disk bandwidth (GiB/s) | cold restore reads (GiB) | read time (s) | warm restore (s) "
          "| bound (s) | restore + host warming (s) | ratio to bound | restore alone, same cache (s) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for size, cache in ((s, c) for s in sizes for c in COLD_CACHES):
        b = _run_bound(rows, size, cache)
        if b["read_s"] is None or b["warm"] is None or b["hw"] is None:
            continue
        bound = max(b["warm"], b["read_s"])
        L.append(f"| {size} | {cache} | {b['bw'] / 2**30:.2f}{'*' if b['probe'] == 'run' else ''} "
                 f"| {b['nbytes'] / 2**30:.2f} | {b['read_s']:.2f} "
                 f"| {b['warm']:.2f} | {bound:.2f} | {b['hw']:.2f} | **{b['hw'] / bound:.2f}x** | {_fmt(b['cold'])} |")
    L += _per_start_bounds(rows, sizes)
    L += _entry_floor(rows, sizes)
    L += _where_lost(rows, sizes)
    loaded = [size for size in sizes if any(r["size"] == size and r["method"] == "restore+load" for r in rows)]
    if loaded:
        L += ["", "The warming's own cost: a warm restore while the same host warmer, started at the create "
              "call, reads a cold copy of the snapshot (restore+load). It waits for no byte: what it loses to "
              "the warm restore is what reading those bytes on this host costs the restore (CPU, the disk's "
              "queue), which no order of the same reads removes. The copy's image-layer files are the real "
              "ones, already cached, so it carries a little less load than the real warming.", "",
              "| model | warm restore (s) | warm restore under the warmer's load (s) | the warmer read (GiB) "
              "| restore + host warming, cold (s) | ratio to the loaded warm restore |", "|---|---|---|---|---|---|"]
        for size in loaded:
            sel = lambda m, c: [r for r in rows if r["size"] == size and r["method"] == m and r.get("cache") == c]  # noqa: E731
            warm, load, hw = _med(sel("restore", "warm")), _med(sel("restore+load", "warm")), _med(sel("restore+hostwarm", "cold"))
            hb = [r["host_warm"]["bytes"] for r in sel("restore+load", "warm") if (r.get("host_warm") or {}).get("bytes")]
            gib = f"{statistics.median(hb) / 2**30:.2f}" if hb else "-"
            ratio = f"**{hw / load:.2f}x**" if hw and load else "-"
            L.append(f"| {size} | {_fmt(warm)} | {_fmt(load)} | {gib} | {_fmt(hw)} | {ratio} |")
    warm_reads = {size: _med([r for r in rows if r["size"] == size and r["method"] == "restore"
                              and r.get("cache") == "warm"], "disk_read_bytes") for size in sizes}
    if any(v is not None for v in warm_reads.values()):
        L += ["", "Each warm restore followed one unmeasured restore of the same snapshot (rows \"prewarm\"); "
              "it read from the disk (median): " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in warm_reads.items()
                                                         if v is not None) + "."]
    errs = [r for r in rows if r.get("error")]
    if errs:
        L += ["", "Errors:"] + [f"- {r['size']} {r['method']} {r.get('cache', '')} rep {r.get('rep', '')}: "
                               f"{r['error'][:200]}" for r in errs]
    fb = [r for r in rows if r.get("fallback_reason")]
    if fb:
        L += ["", "Fallbacks:"] + [f"- {r['size']} {r['method']} {r.get('cache', '')} rep {r.get('rep', '')}: "
                                   f"{r['fallback_reason'][:200]}" for r in fb]
    return "\n".join(L) + "\n"
