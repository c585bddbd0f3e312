"""``coldstart checkpoint MODEL``: start vLLM, record a canary, dump its weights, put it to sleep,
CRIU-dump the whole server tree and publish the snapshot directory.

The snapshot is built in a hidden staging directory beside the output (``.NAME.partial-PID``) and
appears only at publish, by one rename, complete with its manifest. The server runs in a private
mount namespace where the staging ``run/`` is bind-mounted at ENGINE_RUN_DIR, and CRIU dumps from
inside that namespace, so the images name that canonical path and never where the snapshot is built
or later kept. The server dies with the checkpoint (parent-death signal): a checkpoint killed at any
point leaves no server and no output directory; the next checkpoint to the same output removes the
dead one's staging directory.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from coldstart.criu import caps
from coldstart.criu import server as _criu
from coldstart.errors import ColdstartError
from coldstart.fsutil import fsync_dir, fsync_tree
from coldstart.netutil import bind_error, port_free  # noqa: F401  (port_free: the benchmarks' import)
from coldstart.pipeline import canary as canary_mod
from coldstart.pipeline import affinity, hostfacts
from coldstart.pipeline.events import EventName, Timeline
from coldstart.pipeline.integrity import NodeRecord
from coldstart.pipeline.manifest import (ENGINE_RUN_DIR, MANIFEST_NAME, Manifest, code_digest, inventory,
                                         sparse_copy, tree_digest, write_manifest)

DEFAULT_CANARY = "The capital of France is"
SHM = Path("/dev/shm")


@dataclass
class CheckpointOptions:
    model: Path
    out: Path
    port: int = 8000
    # where the server listens: loopback, or a wildcard in a container (clients then reach the restored
    # server directly). On either, coldstart.engine.gate holds clients without the control token until
    # the restore has checked the server: on loopback too, where a host-network restore's server
    # listens from CRIU's restore on, before its wake, reload and canary
    listen: str = "127.0.0.1"
    engine_args: list[str] = field(default_factory=list)
    canary_prompt: str = DEFAULT_CANARY
    canary_tokens: int = 16  # canary_kind "tokens" only
    canary_kind: str = "logprobs"  # logprobs: one forward pass (pipeline/canary.py) | tokens: N greedy tokens
    reload_mode: str = "auto"  # the rehearsal's reload: map | copy | auto (engine/sleep_worker.py)
    kv_cache_bytes: int = 256 << 20
    criu_variant: str = "patched"
    ready_timeout: float = 900.0
    sleep: bool | None = None  # None: sleep level 2 when our CPU sleep worker is installed
    served_model_name: str | None = None
    server_caps: str = "keep"  # keep (the checkpoint's own) | none (launcher.EngineSpec.drop_caps)
    # hot: a recording restore, then the pages it touched stored apart from the rest (pipeline/layout.py;
    # patched criu, CPU only; a lazily mounted restore fetches a third to half the bytes and reaches its
    # first token 1.25-2.5x sooner, results/lazy-hot) | dumped: the images as CRIU wrote them |
    # None: hot where it can be made (patched criu, CPU host), else dumped
    layout: str | None = None
    # CPU sleep worker: the linear layers' packed GEMM handles stay through the sleep and go into the
    # image, so a restore neither reads the linear weights from the flat file nor packs them again
    # (engine/sleep_worker.py, coldstart_keep_packed); the image grows by the packed copy (about
    # the weights' size). None: on where the CPU sleep worker's rehearsal reload took KEEP_PACKED_MIN_S
    # or more to pack them (a real reorder on AVX-512 hosts; almost nothing on AVX2 ones)
    keep_packed: bool | None = None  # True: fail the checkpoint when none could be kept
    # with kept handles: the weights file leaves out the weights only they read (holes; the index
    # keeps their digests; weights.format.omit_tensors), so the snapshot holds those once, packed.
    # The restored server keeps its handles through every sleep(2) and rebuilds them for a dump.
    slim_weights: bool = True
    # CPU: one more restore, the snapshot's files evicted, records its access profile, shipped in it as
    # profile.json (pipeline/layout.record_profile): a node's first restore warms in first-access order
    profile: bool = True


# Packing the linear layers after a reload costs a restore at least this much: then (by default) the
# handles are kept. The bench model took 0.03 s on the AVX2 host and 1.0-1.5 s on the AVX-512 BF16 one.
KEEP_PACKED_MIN_S = 0.25


def default_layout(criu_variant: str, device: str) -> str:
    """The layout a checkpoint makes unless told: hot needs our patched CRIU (its recording restore
    and parent-image mapping). GPU hosts keep dumped: the layout restores a CUDA process correctly
    (H200, docs/gpu.md) but no GPU vLLM server has shown it a gain."""
    return "hot" if criu_variant == "patched" and device == "cpu" else "dumped"


def sleep_worker_available() -> bool:
    return importlib.util.find_spec("coldstart.engine.sleep_worker") is not None


def check_listen(addr: str, port: int) -> None:
    """The server can listen on (addr, port) here: else one line saying why."""
    import errno

    e = bind_error(addr, port)
    if e is None:
        return
    if e.errno == errno.EADDRINUSE:
        raise ColdstartError(f"port {port} on {addr} is busy (choose another with --port)") from e
    raise ColdstartError(f"cannot listen on {addr}:{port}: {e.strerror} (--listen takes 127.0.0.1, 0.0.0.0 "
                         "or an address of this host)") from e


def hf_model_dir(model: Path) -> Path:
    """``model`` resolved, checked to be a Hugging Face model dir (its config.json): else one line."""
    model = Path(model).resolve()
    if not (model / "config.json").is_file():
        raise ColdstartError(f"model {model} not found (expected a Hugging Face model dir with config.json)")
    return model


def link_remap_names() -> set[str]:
    return {p.name for p in SHM.glob("link_remap.*")}


def remove_stale_link_remaps(max_age: float = 120.0) -> list[str]:
    """Remove /dev/shm/link_remap.* older than ``max_age`` s (by ctime: when the link was made).

    CRIU names them after image file ids, which are the same for every vLLM tree, so a leftover of a
    crashed dump or restore makes every later dump fail ("File exists"). A live dump or restore uses
    its remaps for seconds; call with the remap lock held."""
    removed = []
    now = time.time()
    for p in SHM.glob("link_remap.*"):
        try:
            if now - p.stat().st_ctime > max_age:
                p.unlink()
                removed.append(p.name)
        except OSError:
            pass
    return removed


def _prepare_out(out: Path):
    """Claim ``out`` (exclusive lock beside it) and make its staging directory; remove the staging
    directories of dead checkpoints to the same output. Returns (lock file, staging dir)."""
    if (out / MANIFEST_NAME).exists():
        raise ColdstartError(f"{out} already holds a published snapshot (remove it or choose another --out)")
    if out.exists():
        raise ColdstartError(f"{out} exists and is not a snapshot (choose another --out)")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = open(out.parent / f".{out.name}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ColdstartError(f"another checkpoint is writing {out} right now") from None
    for old in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(old, ignore_errors=True)  # we hold the lock: its writer is dead
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    staging.mkdir(mode=0o755)
    return lock, staging


def _publish(staging: Path, out: Path) -> None:
    """fsync the staging tree, rename it to ``out``, fsync the parent: ``out`` appears complete."""
    fsync_tree(staging)
    try:
        os.rename(staging, out)
    except OSError as e:
        raise ColdstartError(f"cannot publish {out}: {e}") from e
    fsync_dir(out.parent)


def _check_gate_hold() -> None:
    """The server reads its gate's hold (engine.gate.HOLD_ENV) from this environment when it starts;
    a value it cannot read would stop it there, named only in its log."""
    from coldstart.engine.gate import HOLD_ENV, parse_hold

    value = os.environ.get(HOLD_ENV)
    if parse_hold(value) is None:
        raise ColdstartError(f"{HOLD_ENV}={value!r} is not a number of seconds ≥ 0 (how long the restored server's "
                             "gate holds a request before its canary passed; 0: not at all)")


def checkpoint(opts: CheckpointOptions, say: Callable[[str], None] = lambda s: None) -> tuple[Manifest, Timeline]:
    """Make a snapshot of ``opts.model`` in ``opts.out``; returns its manifest and timeline."""
    from coldstart.engine.launcher import EngineSpec, start_engine

    model = hf_model_dir(opts.model)
    out = Path(opts.out).absolute()
    if opts.server_caps not in ("keep", "none"):
        raise ColdstartError(f"--server-caps must be keep or none, not {opts.server_caps!r}")
    if opts.layout not in ("hot", "dumped", None):
        raise ColdstartError(f"--layout must be hot or dumped, not {opts.layout!r}")
    if opts.layout == "hot" and opts.criu_variant != "patched":
        raise ColdstartError("--layout hot needs the patched criu (its recording restore and parent-image mapping); "
                             "use --layout dumped with --criu-variant stock")
    _check_gate_hold()
    criu = _criu.find(opts.criu_variant)  # fail before spending a minute on the engine
    host = hostfacts.collect(criu)
    check_listen(opts.listen, opts.port)
    # GPU host: vLLM's own sleep mode (CuMemAllocator) and the CRIU CUDA plugin (unverified on GPU).
    device = "cuda" if host.gpu else "cpu"
    layout = opts.layout or default_layout(opts.criu_variant, device)
    can_sleep = device == "cuda" or sleep_worker_available()
    sleep = can_sleep if opts.sleep is None else opts.sleep
    if sleep and not can_sleep:
        raise ColdstartError("sleep requested but coldstart.engine.sleep_worker is not installed")

    tl = Timeline.from_container_start("checkpoint", model=model.name)
    lock, staging = _prepare_out(out)
    eng = None
    shm_taken: list[Path] = []
    published = False
    try:
        spec = EngineSpec(model=model, run_dir=staging / "run", port=opts.port, host=opts.listen,
                          gate=True, kv_cache_bytes=opts.kv_cache_bytes,
                          sleep_mode=sleep, extra_args=list(opts.engine_args), device=device,
                          served_model_name=opts.served_model_name, run_dir_seen_at=Path(ENGINE_RUN_DIR),
                          die_with_parent=True, drop_caps=opts.server_caps == "none")
        say(f"starting vLLM on {spec.base_url} (run dir {spec.run_dir}, seen by the server at {ENGINE_RUN_DIR})")
        # Host PID namespace on purpose: vLLM's CPU worker reads /proc/<its pid>/status, and in a PID
        # namespace without its own /proc (a private /proc breaks CRIU here) that path is another
        # host process or missing. Every restore runs in a fresh PID namespace instead (restore.py).
        eng = start_engine(spec, new_pidns=False)
        eng.wait_ready(opts.ready_timeout)
        tl.mark(EventName.ENGINE_UP)
        client = spec.client(timeout=300)
        canary = canary_mod.record(client, opts.canary_prompt, kind=opts.canary_kind,
                                   max_tokens=opts.canary_tokens, seed=0)
        tl.mark(EventName.CANARY_RECORDED, tokens=len(canary.token_ids), kind=canary.kind,
                prompt_tokens=len(canary.prompt_token_ids), tolerance=canary.tolerance)
        say(f"canary: {canary.text!r}")

        weights: dict = {}
        if sleep:
            if device == "cpu":
                wdir = staging / "weights"  # dump_tensors publishes it by rename: must not exist yet
                res = client.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(wdir)})
                weights = _weights_entry(staging, wdir, res)
                tl.mark(EventName.WEIGHTS_DUMPED, bytes=weights["bytes"])
                say(f"weights dumped: {weights['flat']} ({weights['bytes'] / 2**20:.1f} MiB)")
            # Rehearsal (as vLLM's snapshot does): the exact wake + reload the restore will run must
            # give the canary back before the snapshot is published. The first cycle packs the linear
            # layers again and times it; when the handles are to be kept, a second cycle rehearses that.
            pack_s = _rehearse(client, staging, weights, canary, opts.reload_mode, False)
            if pack_s is not None:  # (vLLM's own reload, on GPU, says nothing)
                weights["pack_s"] = round(pack_s, 3)  # what each restore without kept handles spends
            keep = device == "cpu" and (opts.keep_packed if opts.keep_packed is not None
                                        else pack_s is not None and pack_s >= KEEP_PACKED_MIN_S)
            if device == "cpu" and opts.keep_packed is None:
                say(f"packing the linear layers took {pack_s or 0:.2f} s: " + (
                    "their packed handles are kept in the image" if keep else
                    f"under {KEEP_PACKED_MIN_S} s, so not kept (--keep-packed keeps them)"))
            if keep:
                _rehearse(client, staging, weights, canary, opts.reload_mode, True)
            _keep_packed(client, keep)
            client.sleep(level=2)
            if not client.is_sleeping():
                raise ColdstartError("the engine did not go to sleep (level 2)")
            last = _last_sleep(client) if keep else {}
            kept = int(last.get("kept_linears") or 0)
            if opts.keep_packed and not kept:  # asked for by name; the default just goes without
                raise ColdstartError("--keep-packed: the worker kept no packed handles through its sleep "
                                     "(its log says why)")
            if kept:  # the manifest says so: a host warmer then leaves the linear weights alone
                weights["kept_linears"] = kept
                if opts.slim_weights and last.get("kept_weights"):
                    weights.update(_slim_weights(last["kept_weights"], staging, weights))
                    say(f"weights file: {weights['omitted']} weights left out "
                        f"({weights['omitted_bytes'] / 2**20:.1f} MiB), held only by the packed handles in the image")
            tl.mark(EventName.ASLEEP, level=2, **({"kept_linears": kept} if keep else {}),
                    **({"pack_s": weights["pack_s"]} if "pack_s" in weights else {}))
        # the worker's AMX permission: stock CRIU does not restore it, so the restore can ask again
        xcomp_perm = (client.collective_rpc("coldstart_xstate") or [{}])[0].get("perm")
        client._s.close()  # no established connection to us may end up in the image
        time.sleep(0.3)

        shm_files = sorted(eng.shm_paths())
        pids = eng.pids()
        # The log's size as CRIU will record it: the server is idle now, and after the dump the
        # launcher (unshare) may still append a line, which the restore cuts off again.
        log_sizes = {spec.log_path.name: spec.log_path.stat().st_size}
        shm_modes = {p.name: p.stat().st_mode & 0o7777 for p in shm_files if p.exists()}
        run_files = _open_under(pids, ENGINE_RUN_DIR)
        server_caps = caps.held_by_tree(pids)
        cpu_masks = affinity.record(pids)  # CRIU does not keep them (pipeline/affinity.py)
        if opts.server_caps == "none" and server_caps:  # setpriv cannot drop the bounding set without SETPCAP
            raise ColdstartError("--server-caps none: the server still holds " + ", ".join(f"CAP_{n}" for n in server_caps)
                                 + " (dropping them needs CAP_SETPCAP in the checkpoint's container)")
        say(f"criu dump of {len(pids)} processes")
        criu = _criu.find(opts.criu_variant)  # again: a rebuild may have replaced the binary meanwhile
        (staging / "shm").mkdir()
        with _criu.remap_lock():
            for stale in remove_stale_link_remaps():
                say(f"removed a stale {stale} (left by a crashed dump/restore: it would block this dump)")
            remaps_before = link_remap_names()
            _criu.dump(criu, eng.root_pid, staging / "criu", staging / "checkpoint-logs")
            if eng.popen is not None:
                eng.popen.wait(timeout=30)
            eng.release_watchdog()  # the dumped tree is gone; its namespace's inode may be reused
            tl.mark(EventName.CRIU_DUMPED)
            # What the restore must put back: vLLM's /dev/shm buffers (mapped, not in the image) and
            # CRIU's link_remap files (stand-ins for deleted files such as sem.*).
            for p in shm_files:
                if p.exists():
                    sparse_copy(p, staging / "shm" / p.name)  # ~400 MB of mostly zeros: keep the holes
                    shm_taken.append(p)
            remaps = sorted(link_remap_names() - remaps_before)
            if remaps:
                (staging / "link-remaps").mkdir()
                for name in remaps:
                    shm_modes[name] = (SHM / name).stat().st_mode & 0o7777
                    shutil.copy2(SHM / name, staging / "link-remaps" / name)
                    shm_taken.append(SHM / name)
            for p in shm_taken:
                p.unlink(missing_ok=True)

        # run/ becomes the read-only template every restore mounts at ENGINE_RUN_DIR: the log back to
        # its size at dump (the launcher may have appended), CRIU's logs kept outside it
        for name, size in log_sizes.items():
            if (spec.run_dir / name).stat().st_size > size:
                os.truncate(spec.run_dir / name, size)
        leftovers = spec.compile_leftovers(run_files)
        if leftovers:
            freed = sum(p.stat().st_size for p in leftovers)
            for p in leftovers:
                p.unlink()
            say(f"left out torch's precompiled header{'s' if len(leftovers) > 1 else ''} "
                f"({freed / 2**20:.0f} MiB): a compile cache the restored server does not read")
        files = inventory(staging, digests=True)
        m = Manifest(
            model=str(model), model_digest=tree_digest(model),
            served_model_name=opts.served_model_name or str(model),
            engine_args=list(opts.engine_args), host=host.to_dict(), canary=canary, files=files,
            port=opts.port, host_addr=spec.host, gated=spec.gate, control_token=spec.control_token or "",
            run_dir=ENGINE_RUN_DIR, criu_variant=opts.criu_variant,
            device=device, asleep=sleep, pids=pids, weights=weights, shm_files=[p.name for p in shm_files],
            shm_modes=shm_modes, log_sizes=log_sizes, run_files=run_files, server_caps=server_caps,
            xcomp_perm=xcomp_perm, affinity=cpu_masks, coldstart_code=code_digest(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        m.timings = {e.name: e.t for e in tl.events}
        m.timings["kv_cache_bytes"] = opts.kv_cache_bytes
        write_manifest(staging, m)
        if layout == "hot" and m.asleep:
            # here, not at the top: the restore imports this module, and the layout brings numpy
            # (warm.residency), which the restore's entrypoint then loaded before CRIU started
            from coldstart.pipeline.layout import RecordingFailed, make_hot

            say("hot layout: a recording restore, then the pages it touched stored together")
            try:
                files, m.layout = make_hot(staging, files, say=say)
            except RecordingFailed as e:  # an optimisation: the snapshot restores as dumped
                say(f"hot layout skipped, the images stay as dumped: {e}")
            else:
                m.files = files
                tl.mark(EventName.HOT_LAYOUT, **m.layout)
        shipped: dict = {}
        if opts.profile and device == "cpu":
            from coldstart.pipeline.layout import RecordingFailed, record_profile

            write_manifest(staging, m)  # the restore reads the snapshot as it is now (its layout)
            say("access profile: one more restore, the snapshot's files evicted from the page cache")
            try:
                files = {**files, "profile.json": record_profile(staging, say=say)}
            except RecordingFailed as e:  # an optimisation: each node then records its own
                say(f"access profile skipped: {e}")
                shipped = {"profile_skipped": str(e)[:300]}
            else:
                m.files = files
        tl.mark(EventName.PUBLISHED, bytes=sum(f.size for f in files.values()), **shipped)
        m.timings = {e.name: e.t for e in tl.events}
        m.timings["kv_cache_bytes"] = opts.kv_cache_bytes
        write_manifest(staging, m)
        _publish(staging, out)
        published = True
        record = NodeRecord()  # we just hashed these bytes: this node need not check them again
        for rel, fe in files.items():
            record.add(out / rel, fe.xxh3, fe.chunks)
        say(f"published {out}")
        return m, tl
    except ColdstartError as e:
        kept = _keep_log(staging)
        if kept:
            raise ColdstartError(f"{e} [server log kept at {kept}]") from e
        raise
    finally:
        if not published:
            if eng is not None and eng.alive():
                eng.stop(timeout=10)
            # (link remaps of a failed dump are CRIU's to remove: others' may be in /dev/shm now)
            for p in shm_taken:
                p.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        lock.close()
        try:
            (out.parent / f".{out.name}.lock").unlink()
        except OSError:
            pass


def _open_under(pids: list[int], root: str) -> list[str]:
    """Regular files under ``root`` (as the processes see it) that they hold open or map, relative."""
    found: set[str] = set()
    pre = root.rstrip("/") + "/"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                found.update(ln.split(None, 5)[5].strip() for ln in f if len(ln.split(None, 5)) == 6)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
        except OSError:
            continue
    return sorted(p[len(pre):] for p in found if p.startswith(pre) and not p.endswith("(deleted)"))


def _keep_log(out: Path) -> Path | None:
    """Copy the server and CRIU logs out of a failed checkpoint's directory (which is removed)."""
    import tempfile

    srcs = [p for p in (out / "run" / "server.log", out / "checkpoint-logs" / "dump.log") if p.is_file()]
    if not srcs:
        return None
    dst = Path(tempfile.mkdtemp(prefix=f"coldstart-checkpoint-{out.name}-"))
    for p in srcs:
        shutil.copyfile(p, dst / p.name)
    return dst


def _rehearse(client, staging: Path, weights: dict, canary, reload_mode: str | None, keep: bool) -> float | None:
    """One sleep(2) / wake / reload / canary cycle, the packed handles kept through it or not; the
    seconds the reload spent packing the linear layers (None: no reload reported it)."""
    _keep_packed(client, keep)
    client.sleep(level=2)
    client.wake_up(["weights"])
    res = reload_weights(client, staging, weights, mode=reload_mode)
    client.wake_up(["kv_cache"])
    bad, _ = canary_mod.check(client, canary)
    if bad:
        kept = " (packed handles kept)" if keep else ""
        raise ColdstartError(f"rehearsal failed: after sleep + reload from the flat weights file{kept} the "
                             f"canary differs (the dump or the reload is wrong): {bad}")
    secs = [r["prepack_s"] for r in res or () if isinstance(r, dict) and "prepack_s" in r]
    return max(secs) if secs else None


def _keep_packed(client, keep: bool) -> None:
    """Tell the CPU worker whether its next sleep(2) keeps the packed handles (a worker without the
    RPC, e.g. the GPU one, is only asked when ``keep``)."""
    if keep:
        client.collective_rpc("coldstart_keep_packed", kwargs={"keep": True})


def _slim_weights(names: list[str], staging: Path, weights: dict) -> dict:
    """Leave ``names`` (what only the kept packed handles read: the worker's sleep record,
    ``kept_weights``) out of the dumped weights file; the manifest's record of it."""
    from coldstart.weights.format import ABSENT_NAME, omit_tensors

    n = omit_tensors(staging / weights["dir"], names,
                     "held only by the packed GEMM handles in the snapshot's CRIU image (checkpoint --slim-weights)")
    return {"omitted": len(names), "omitted_bytes": n,
            "index": weights["index"] + [str(Path(weights["dir"]) / ABSENT_NAME)]}


def _last_sleep(client) -> dict:
    """The CPU worker's record of its last sleep (``kept_linears``, ``kept_weights``...)."""
    st = (client.collective_rpc("coldstart_state") or [{}])[0]
    return st.get("last") or {}


def reload_weights(client, snap: Path, weights: dict, mode: str | None = None, overlap: bool | str | None = None,
                   huge: bool | None = None):
    """Refill the woken weights: the snapshot's flat file mapped over the weight arena or copied
    through our loader (CPU sleep worker; ``mode`` map | copy | auto, default the worker's;
    ``overlap``: a map reload prepacks while the file is still arriving: True, False, "auto" (when
    it is not all cached), None the worker's default; ``huge``: a map reads into 2 MiB page-cache
    folios, None the worker's default),
    else vLLM's own ``reload_weights`` from the model (GPU path: unverified on GPU)."""
    if weights.get("dir"):
        kw: dict = {"path": str(snap / weights["dir"])}
        if mode:
            kw["mode"] = mode
        if overlap is not None:
            kw["overlap"] = overlap
        if huge is not None:
            kw["huge"] = huge
        res = client.collective_rpc("coldstart_reload", kwargs=kw)
        for r in res:
            if isinstance(r, dict) and r.get("error"):
                raise ColdstartError(f"weight reload: {r['error']}")
        return res
    return client.collective_rpc("reload_weights")


def _weights_entry(out: Path, wdir: Path, rpc_result) -> dict:
    """Locate the flat file the worker wrote (one per worker; TP > 1 is not supported yet)."""
    flats = sorted(wdir.rglob("*.flat"))
    if len(flats) != 1:
        raise ColdstartError(f"expected one flat weights file in {wdir} after coldstart_dump_weights, "
                             f"found {len(flats)} (worker answered {str(rpc_result)[:200]})")
    flat = flats[0]
    index = [p for p in wdir.rglob("*.json")]
    return {"dir": str(flat.parent.relative_to(out)), "flat": str(flat.relative_to(out)), "index": [str(p.relative_to(out)) for p in index],
            "bytes": flat.stat().st_size}
