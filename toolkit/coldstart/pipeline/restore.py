"""``coldstart restore [DIR]``: the container entrypoint. Restore the snapshot, prove it with the
canary, serve; on any failure before serving, say why on one line and cold-boot the same model.

The phases (``_restore``, DESIGN.md): validate the manifest against this host → place this
restore's writable state (its own directory, run-dir overlay, /dev/shm, network: netns.py) → start
CRIU (patched criu maps pages-*.img instead of copying) → check digests (integrity.py, on a thread,
joined before serving) and warm the page cache beside it → wait for CRIU, then /health → wake
weights → reload them in place through our loader → wake the KV cache → the canary must give the
recorded answer → serve. Nothing is written inside the snapshot: it may be read-only, moved, and
restored by several replicas at once.

CRIU stays the restored tree's parent and our child: the entrypoint forwards SIGTERM/SIGINT to the
server and exits with it.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from coldstart.criu import caps
from coldstart.criu import layout as _layout
from coldstart.criu import server as _criu
from coldstart.criu import logs as criu_logs
from coldstart.criu.restore import alive
from coldstart.errors import ColdstartError
from coldstart.fsutil import sampled_resident_fraction, will_need
from coldstart.netutil import client_host, free_port, is_loopback, port_free
from coldstart.pipeline import affinity, hostfacts, integrity
from coldstart.pipeline.events import EventName, Timeline
from coldstart.pipeline.manifest import Manifest, read_manifest, validate_against_host
from coldstart.pipeline.netns import Forwarder, wrap_argv
from coldstart.pipeline.snapshots import gc_restore_dirs, write_owner
from coldstart.registry.mount import damage_log_from_env
from coldstart.state import restores_dir, state_dir


class RestoreFailed(ColdstartError):
    """A failure before serving: the caller falls back to a cold boot and prints this reason."""


@dataclass
class RestoreOptions:
    snapshot: Path
    # digests (integrity.py): auto = what this node has not verified unchanged | full | off
    verify: str = "auto"
    timeout: float = 300.0  # for the restored server's /health and each dev-mode call
    warm: bool = True
    fallback: bool = True
    model: str | None = None  # cold-boot this if the manifest cannot even be read
    port: int | None = None  # host port to serve on (private net: the forwarder's; cold boot: vLLM's)
    listen: str = "127.0.0.1"  # address the forwarder or cold boot listens on (0.0.0.0 in a container)
    cold_timeout: float = 900.0
    net: str = "auto"  # host | private | auto (private when the snapshot's port is busy here)
    reload_mode: str = "auto"  # map | copy | auto: how the worker refills its weights (sleep_worker.py)
    # page-cache warming (warm stage): None/"auto" = the entrypoint's COLDSTART_WARM_* env or defaults
    warm_mode: str | None = None  # native | vmtouch | none
    warm_method: str | None = None  # native: sendfile | pread | populate | willneed
    warm_profile: str = "auto"  # auto (this node's profile, else DIR/profile.json) | off | PATH
    warm_record: str = "auto"  # auto (while this node has none) | off | force; saved at first token
    warm_rest: str = "after"  # with a profile, the ranges it does not name: after (first token) | now | never
    # a registry reference instead of a directory: mounted lazily (coldstart.registry.mount) at
    # ``snapshot``, then restored from the mount; the mount lives until ``RestoreResult.stop``
    ref: str | None = None
    # the server's runtime tree (its venv): a registry reference (`coldstart push --runtime-of`, mounted
    # lazily) or a directory, seen by the restored server at its checkpoint path (Runtime)
    runtime: str | None = None
    # after READY, weights reloaded by mapping the flat file are copied into anonymous memory in the
    # background (the worker's coldstart_settle): a restored server then serves as fast as a stock one
    settle: bool = True
    # a recording restore (pipeline/layout.py): CRIU without readahead on the images, every run mapped,
    # so the pages present at the first token are the pages the restore touched
    record_pages: bool = False
    # called with the restored engine after its wake and reload, right before the canary's forward
    # pass (a recording restore reads there which pages the restore needed before that pass)
    before_canary: Callable[[object], None] | None = None


@dataclass
class Runtime:
    """The server's runtime as this restore provides it: ``tree`` (a lazy mount or a directory) bound
    at ``at``, the path the server was checkpointed with, inside the restore's mount namespace only
    (CRIU reopens every library the server mapped by that path)."""
    tree: Path
    at: str
    mount: object | None = None  # registry.mount.Mount of a runtime reference

    def remap(self, p):
        """Where a path of the server's (under ``at``) is seen from outside the namespace."""
        s = str(p)
        if s == self.at or s.startswith(self.at + "/"):
            s = str(self.tree) + s[len(self.at):]
        return type(p)(s) if not isinstance(p, str) else s


@dataclass
class RestoreResult:
    engine: object  # coldstart.engine.launcher.EngineProcess
    base_url: str
    timeline: Timeline
    restored: bool  # False: a cold boot serves (see fallback_reason)
    fallback_reason: str | None = None
    canary_ok: bool = False
    manifest: Manifest | None = None
    text: str = ""
    forwarder: object | None = None  # netns.Forwarder in net="private" mode
    state: "RestoreState | None" = None  # this restore's writable directory (removed at stop)
    mount: object | None = None  # registry.mount.Mount when restored from a registry reference
    runtime: Runtime | None = None  # the runtime the server runs from, when the restore provided it
    lazy_log: object | None = None  # registry.mount.DamageLog of a lazy mount made outside (a container's host)

    def client(self, timeout: float = 120.0):
        """An EngineClient for the server at ``base_url``, with its control token (none for a cold boot,
        which runs without vLLM's dev mode)."""
        from coldstart.engine.client import EngineClient

        return EngineClient(self.base_url, timeout=timeout, token=self.engine.spec.control_token or None)

    def stop(self) -> None:
        """Stop the server (and the forwarder); reap it; remove this restore's writable state; then
        unmount a lazy mount (last: the server maps its files until it is gone)."""
        try:
            self.engine.stop(timeout=10)
        finally:
            self.close()

    def close(self, keep_runtime: bool = False) -> None:
        """What ``stop`` does once the server is gone: the forwarder closed, this restore's writable
        state (and a cold boot's scratch run dir) removed, its lazy mounts unmounted
        (``keep_runtime``: not the runtime's, which a cold boot in its place runs from)."""
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        _reap(self.engine.root_pid)
        self.engine.remove_scratch()
        if self.state is not None:
            self.state.release()
            self.state = None
        if self.mount is not None:
            self.mount.unmount()
            self.mount = None
        if not keep_runtime and self.runtime is not None and self.runtime.mount is not None:
            self.runtime.mount.unmount()
            self.runtime.mount = None

    def damaged(self) -> str | None:
        """Why this restored server cannot be trusted any more, or None: a chunk of its lazily mounted
        snapshot or runtime that the registry serves damaged (registry.mount.Mount.corrupt_chunks; the
        daemon finds the rest of the chunks after READY, in the background). The server maps the
        files holding it and will take SIGBUS, or hang inside a request, when it reads it."""
        why = damaged_chunk(self.mount, self.runtime.mount if self.runtime is not None else None, self.lazy_log)
        return f"{why}, and the restored server maps it" if why else None


def damaged_chunk(*sources) -> str | None:
    """The first chunk that the registry serves damaged, named with its file and reference, or None;
    per lazy mount (registry.mount.Mount) or daemon log (its DamageLog); None entries are skipped."""
    for src in sources:
        log = getattr(src, "damage", src)  # a Mount's DamageLog
        bad = log.corrupt_chunks() if log is not None else {}
        if bad:
            digest, paths = next(iter(bad.items()))
            where = f"{', '.join(paths) or 'a file'} of {log.name}"
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            return f"chunk {digest[:19]} of {where} failed its digest twice{more}: the registry serves it damaged"
    return None


def restore(opts: RestoreOptions, say: Callable[[str], None] = print) -> RestoreResult:
    """Restore (or, failing that, cold-boot) and return once the server answers correctly."""
    snap = Path(opts.snapshot).absolute()
    tl = Timeline.from_container_start("restore", snapshot=opts.ref or snap.name)
    m: Manifest | None = None
    mnt = rt = None
    outer = damage_log_from_env()  # a restore container's snapshot, mounted lazily by its host
    try:
        if opts.ref:
            mnt = _mount(opts.ref, snap, tl, say)
            if opts.verify == "auto":  # every byte read through the mount is checked against its chunk's
                # BLAKE3 digest, and `coldstart push` published only bytes matching the manifest's
                # digests: hashing the files here would fetch all of them before the first token
                opts = RestoreOptions(**{**opts.__dict__, "verify": "off"})
        m = read_manifest(snap, opts.ref)
        tl.labels["model"] = Path(m.model).name
        if opts.runtime:
            rt = _runtime(opts.runtime, m, tl, say)
        try:
            res = _restore(snap, m, opts, tl, say, rt, mnt)
            res.mount, res.runtime, res.lazy_log = mnt, rt, outer
            return res
        except RestoreFailed as e:
            # The dumped loopback TCP connections (gloo) come back with their exact 4-tuples; right
            # after another copy of this snapshot stopped on this host they can still be in TIME_WAIT.
            # A private network namespace has none of them: retry there once (auto mode only). auto
            # chose the host's network because the snapshot's port was free here, so the forwarder
            # takes that port (if it still is): clients find the server where a host-network restore
            # puts it.
            if opts.net != "auto" or not any(k in str(e) for k in ("inet socket back", "Address already in use")):
                raise
            say(f"restore in the host network failed ({str(e)[:120]}...); retrying in a private one")
            tl.mark("RESTORE_RETRY", reason="host network busy: retrying with --net private")
            port = opts.port or (m.port if port_free(opts.listen, m.port) else None)
            retry = RestoreOptions(**{**opts.__dict__, "net": "private", "port": port})
            res = _restore(snap, m, retry, tl, say, rt, mnt)
            res.mount, res.runtime, res.lazy_log = mnt, rt, outer
            return res
    except Exception as e:  # the entrypoint's promise: whatever went wrong, still serve (cold)
        reason = _first_line(e)
        if not isinstance(e, (ColdstartError, OSError, subprocess.SubprocessError, TimeoutError)):
            reason = f"{type(e).__name__}: {reason}"  # unexpected: name the exception type too
        # a chunk the registry serves damaged is the cause; what CRIU or the server said of its EIO, the symptom
        bad = damaged_chunk(mnt, rt.mount if rt is not None else None, outer)
        if bad:
            reason = f"{bad} ({reason[:200]})"
        if mnt is not None:
            mnt.unmount()
        if not opts.fallback:
            if rt is not None and rt.mount is not None:
                rt.mount.unmount()
            raise RestoreFailed(reason) from e
        # a node given --runtime may have no venv of its own: the cold boot runs from that runtime
        res = fall_back(reason, m, opts, tl, say, rt)
        res.runtime = rt
        return res


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _mount(ref: str, mountpoint: Path, tl: Timeline, say: Callable[[str], None]):
    """Mount ``ref`` lazily at ``mountpoint`` (index fetched and verified, prefetch started). The
    daemon prefetches only the chunks the access profile names (COLDSTART_LAZY_PREFETCH: profiled,
    all or none); the rest is fetched from READY on (``_restore``). Prefetching everything in profile
    order from the start sent the rest over the link before the first token too, beside the
    restore's own faults: results/lazy-prefetch."""
    from coldstart.registry.mount import mount

    try:
        mnt = mount(ref, mountpoint, prefetch=snapshot_prefetch())
    except ColdstartError as e:
        raise RestoreFailed(f"lazy mount of {ref}: {e}") from None
    tl.mark(EventName.LAZY_MOUNTED, ref=ref, manifest=mnt.manifest_digest)
    say(f"mounted {ref} at {mountpoint} (lazy, verified chunks)")
    return mnt


def _runtime(arg: str, m: Manifest, tl: Timeline, say: Callable[[str], None]) -> Runtime:
    """Provide the server's runtime from ``arg``: a registry reference mounted lazily (only the chunks
    the server maps are prefetched: a venv is gigabytes of which a restore reads a few percent), or a
    directory (a pulled copy)."""
    from coldstart.registry.artifact import RUNTIME_KIND
    from coldstart.registry.mount import as_reference, mount, mount_point_for

    at = m.host.get("sys_prefix") or ""
    if not at:
        raise RestoreFailed("the snapshot does not record the runtime path its server ran from (sys_prefix)")
    ref = as_reference(arg)
    if ref is None:
        if not Path(arg).is_dir():
            raise RestoreFailed(f"runtime {arg}: no such directory")
        tl.mark(EventName.RUNTIME_MOUNTED, dir=str(arg), seen_at=at)
        return Runtime(Path(arg).absolute(), at)
    try:
        mnt = mount(ref, mount_point_for(ref, "runtime-"),
                    prefetch="none" if os.environ.get("COLDSTART_LAZY_PREFETCH") == "none" else "profiled")
    except ColdstartError as e:
        raise RestoreFailed(f"lazy mount of the runtime {ref}: {e}") from None
    exe = m.host.get("python_executable") or ""
    if mnt.kind != RUNTIME_KIND or not (mnt.prefix in (at, os.path.realpath(at)) or exe.startswith(mnt.prefix + "/")):
        mnt.unmount()
        why = ("not a runtime (push it with `coldstart push VENV REF --runtime-of SNAPSHOT`)" if mnt.kind != RUNTIME_KIND
               else f"pushed from {mnt.prefix}, but the snapshot's server ran from {at}")
        raise RestoreFailed(f"runtime {ref}: {why}")
    tl.mark(EventName.RUNTIME_MOUNTED, ref=ref, manifest=mnt.manifest_digest, seen_at=mnt.prefix)
    say(f"mounted the runtime {ref} at {mnt.mountpoint} (lazy, verified chunks), seen by the server at {mnt.prefix}")
    return Runtime(mnt.mountpoint, mnt.prefix, mnt)


def fall_back(reason: str, m: Manifest | None, opts: RestoreOptions, tl: Timeline,
              say: Callable[[str], None], rt: Runtime | None = None) -> RestoreResult:
    """Cold-boot the snapshot's model with the snapshot's engine args (FALLBACK event with the reason);
    with ``rt``, from that runtime (bound where the snapshot's server ran from, its python)."""
    say(f"fallback: {reason}")
    tl.mark(EventName.FALLBACK, reason=reason)
    tl.labels["outcome"] = "fallback"
    model = opts.model or (m.model if m else None)
    if not model:
        raise ColdstartError(f"restore failed ({reason}) and there is no model to cold-boot "
                             "(pass --model)")
    port = opts.port or (m.port if m else 8000)
    if not port_free(opts.listen, port):
        port = free_port()
        say(f"port busy: the cold boot listens on {port}")
    run_from: dict = {}
    if rt is not None and m is not None:
        run_from = {"binds": {rt.tree: rt.at}, "python": m.host.get("python_executable") or None}
        say(f"the cold boot runs from the runtime {rt.tree} (seen at {rt.at})")
    try:
        eng, comp = _cold(model, port, m, opts, tl, run_from)
    except BaseException:
        if rt is not None and rt.mount is not None:
            rt.mount.unmount()
        raise
    ok = bool(m and comp and comp.token_ids == m.canary.token_ids)
    return RestoreResult(engine=eng, base_url=eng.base_url, timeline=tl, restored=False,
                         fallback_reason=reason, canary_ok=ok, manifest=m, text=comp.text if comp else "")


def _cold(model, port: int, m: Manifest | None, opts: RestoreOptions, tl: Timeline, run_from: dict):
    from coldstart.pipeline.cold import cold_start

    return cold_start(model, port=port, host=opts.listen, engine_args=m.engine_args if m else [], timeline=tl,
                      timeout=opts.cold_timeout, served_model_name=m.served_model_name if m else None,
                      kv_cache_bytes=int(m.timings.get("kv_cache_bytes", 256 << 20)) if m else 256 << 20,
                      canary_prompt=m.canary.prompt if m else None,
                      canary_tokens=m.canary.max_tokens if m else 16, **run_from)


# Set (to "1") by whoever starts this restore while warming its snapshot from outside, as
# `coldstart container restore` does from the host from the container's create call on: the
# entrypoint then leaves the profile's ranges to it and warms only after its first token. Reading
# the same ranges again from here gained nothing and took CPU from the restore (2 cores).
HOST_WARMS_ENV = "COLDSTART_HOST_WARMS"
# "fetch" (default): after the first token, the lazy mounts (the runtime's, and the snapshot's when it
# prefetched only the profiled chunks) fetch every chunk they have not; "leave": only what is read
# (a node that keeps the runtime in a node-wide cache anyway, or a test).
RUNTIME_REST_ENV = "COLDSTART_LAZY_RUNTIME_REST"


def snapshot_prefetch() -> str:
    """What a restore's lazy mount of a snapshot prefetches from the mount on (registry.mount's
    ``prefetch``): the profiled chunks, unless COLDSTART_LAZY_PREFETCH says otherwise (_mount)."""
    return os.environ.get("COLDSTART_LAZY_PREFETCH") or "profiled"


def fetch_snapshot_rest(mnt) -> bool | None:
    """Once the restored server serves: have the snapshot mount's daemon fetch every chunk it has
    not (Mount.fetch_all; False: the daemon is gone). None: nothing asked (no mount, one that
    prefetched everything from the start, or RUNTIME_REST_ENV=leave)."""
    if mnt is None or getattr(mnt, "prefetch", "all") == "all" or os.environ.get(RUNTIME_REST_ENV, "fetch") == "leave":
        return None
    return mnt.fetch_all()


# "0": no read-ahead of the restorer's reads; "all": the hot layout's child images even where the
# restore's own warmer reads them (both to compare)
READ_AHEAD_ENV = "COLDSTART_CRIU_READ_AHEAD"
# "0": a map reload prepacks after populating, "1": beside it; unset or "auto": beside it when the
# weights file is not all in the page cache (sleep_worker._overlap_prepack)
PREPACK_OVERLAP_ENV = "COLDSTART_PREPACK_OVERLAP"
HUGE_FOLIOS_ENV = "COLDSTART_HUGE_FOLIOS"  # "0": a map reload reads into small page-cache folios (to compare)
WARM_AFTER_CRIU_ENV = "COLDSTART_WARM_AFTER_CRIU"  # "1": the warmer's reads wait for CRIU's resume (to compare)
IMPORTS_ENV = "COLDSTART_IMPORTS_BESIDE_CRIU"  # "0": no import thread beside CRIU (to compare)


class ReadAhead:
    """Ask the kernel, on a thread, for what CRIU reads cold before the restored tree runs, all at
    once: the heads of the ELF files whose build-id it checks (criu.images.elf_files; its restore
    took 0.1-0.3 s longer with the check than without, cold: results/spot-checks/criu-read-ahead),
    then every page run its restorer reads rather than maps (criu.images.read_runs: thousands of
    small preadv calls that otherwise wait on the disk one after another). The host can start one
    at the container's create call too (containers.run.HostWarm's ``criu_runs``; ``remap``: a path
    in the container to the image layer's file that holds it).

    Each run is asked for in pieces (fsutil.will_need): one call reads at most the device's
    read-ahead and drops the rest (the hot child's three runs, 1.32 GB with the bench model's
    packed handles, would read 24 MiB here).

    ``child`` False: not the hot layout's child images (criu/layout.py), when the restore's own
    warmer reads them first, whole and in order (warm.base.make_plan): asking for them too gained
    nothing there (bench model in containers, cold: 3.00 s against 3.02, medians of 4,
    results/spot-checks/host-warm-shape/bench-aheadall.jsonl). Where the host warms instead, in its
    idle I/O class, they are asked for: 2.03 s against 2.36 without (bench-willneed-pieces.jsonl);
    only the ranges the restore touches before its canary where the checkpoint recorded them
    (``early``: the manifest's ``layout.early``), the rest of the child being mostly packed GEMM
    handles that only the canary reads (results/spot-checks/hot-first)."""

    def __init__(self, images_dir: Path, remap: Callable[[Path], Path] | None = None, child: bool = True,
                 early: dict | None = None):
        self.bytes = self.runs = self.heads = 0
        self._early = early
        self.error: str | None = None
        self._child = child or os.environ.get(READ_AHEAD_ENV) == "all"
        self._t = threading.Thread(target=self._run, args=(images_dir, remap), name="coldstart-read-ahead",
                                   daemon=True)
        self._t.start()

    def _run(self, images_dir: Path, remap: Callable[[Path], Path] | None) -> None:
        from coldstart.criu.images import ELF_HEAD, elf_files, read_runs
        from coldstart.criu.layout import early_ranges

        for name in elf_files(images_dir):
            path = remap(Path(name)) if remap is not None else Path(name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # CRIU names it when it matters
            try:
                os.posix_fadvise(fd, 0, ELF_HEAD, os.POSIX_FADV_WILLNEED)
                self.heads += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not self._child and (images_dir / "parent").is_dir():
            return  # the hot layout's child: the warmer reads it (above)
        # with the pages needed before the canary known, only those: the rest of the child (the packed
        # handles) asked for here would queue before the libraries and weights the wake needs sooner
        fds: dict[Path, int] = {}
        try:
            for path, off, n in early_ranges(images_dir, self._early) or read_runs(images_dir):
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                will_need(fds[path], off, n)
                self.runs += 1
                self.bytes += n
        except OSError as e:  # a hint: the restore reads them anyway
            self.error = f"{e.filename}: {e.strerror}"
        finally:
            for fd in fds.values():
                os.close(fd)

    def result(self) -> dict:
        self._t.join(0)
        out = {"read_ahead_runs": self.runs, "read_ahead_bytes": self.bytes, "read_ahead_elf_heads": self.heads}
        return {**out, "read_ahead_error": self.error} if self.error else out


class _BackgroundWarm:
    """Imports and starts the warm stage's warmer on a thread, so that its start-up (imports, plan)
    never delays the restore itself; WARM_START is marked when it really starts."""

    def __init__(self, paths: list[Path], tl: Timeline, opts: "RestoreOptions | None" = None, remap=None,
                 old_pids: set[int] | None = None, others: list[Path] | None = None):
        import threading

        self.paths = paths
        self.warmer = None
        self.recording = None  # a profile recorder without a warmer (_record_only)
        self._tl = tl
        self._lock = threading.Lock()
        self._cancelled = False
        self._first_token = threading.Event()
        self.started = threading.Event()  # WARM_START marked (or the warmer gave up): its reads have begun
        self._deferred = False
        kw: dict = {}
        if opts is not None:  # only what the options set: the rest follows COLDSTART_WARM_* / defaults
            if opts.warm_mode:
                kw["mode"] = opts.warm_mode
            if opts.warm_method and (opts.warm_mode or "native") == "native":
                kw["method"] = opts.warm_method
            if opts.warm_profile not in ("auto", ""):
                kw["profile"] = opts.warm_profile
            if opts.warm_record not in ("auto", ""):
                kw["record"] = opts.warm_record
            kw["rest"] = opts.warm_rest
        if remap is not None:
            kw["remap"] = remap
        if old_pids is not None:
            kw["old_pids"] = old_pids
        if others is not None:
            kw["others"] = others
        # WARM_AFTER_CRIU_ENV=1: the native warmer's reads wait for CRIU's restore (criu_done). Its
        # restorer reads small page runs one after another, each waiting behind the warmer's queue:
        # CRIU's restore takes 1.1-1.4 s instead of 2.5-2.9, but the restored server's own faults
        # then wait behind the warmer instead, and the first token came no sooner
        # (results/spot-checks/criu-read-ahead), so it is not the default
        self._criu_done = threading.Event()
        if (kw.get("mode") or os.environ.get("COLDSTART_WARM_MODE") or "native") == "native" \
                and os.environ.get(WARM_AFTER_CRIU_ENV, "0") == "1":
            kw["gate"] = self._criu_done
        else:
            self._criu_done.set()
        self._t = threading.Thread(target=self._run, args=(paths, kw), name="coldstart-warm", daemon=True)
        self._t.start()

    def _run(self, paths: list[Path], kw: dict) -> None:
        try:
            deferred = self._host_warms(paths, kw)
            if deferred:  # (marked now: the timeline is reported at the first token)
                self._deferred = True
                self._record_only(paths, kw, pagecache=False)
                self._tl.mark(EventName.WARM_START, files=len(paths), mode="deferred: warmed from outside",
                              recording=self.recording is not None)
                self.started.set()
                # the warmer (and numpy) are imported once the first token is out: beside CRIU they
                # took its CPU and held back _import_beside_criu (results/spot-checks/defer-warm-import)
                self._first_token.wait()
                kw = {**kw, "record": "off", "rest": "now"}
                from coldstart.warm.base import background_priority

                background_priority()  # (its readers, started from this thread, inherit it)
            from coldstart.warm import start_warming  # type: ignore[attr-defined]

            if (not deferred and "mode" not in kw and kw.get("record") != "force"  # (not asked for explicitly)
                    and all(sampled_resident_fraction(p) >= 0.99 for p in paths)):
                # all in the page cache already (another restore of this snapshot just ran, or it was
                # just pulled): reading it again would only take CPU from this restore and any beside it
                self._record_only(paths, kw, pagecache=True)
                self._tl.mark(EventName.WARM_START, files=len(paths), mode="skipped: already in the page cache",
                              recording=self.recording is not None)
                return
            w = start_warming(paths, **kw)
            with self._lock:
                self.warmer = w
                if self._cancelled:  # the restore failed while the warmer was being planned
                    w.cancel()
                    return
            if deferred:
                return
            plan = getattr(self.warmer, "plan", None)
            self._tl.mark(EventName.WARM_START, files=len(paths), mode=self.warmer.mode,
                          profile=bool(getattr(plan, "profile_used", False)),
                          mapped_files=len(getattr(plan, "mapped", ())))
        except Exception:  # warming is an optimisation: never a reason to fail the restore
            self.warmer = None
        finally:
            self.started.set()

    def _record_only(self, paths: list[Path], kw: dict, pagecache: bool) -> None:
        """Record the node's profile without warming (warm.start_recording), in a container only
        (or COLDSTART_WARM_RECORD=force): there the shipped profile names none of the entrypoint's
        own files, cold replicas following it served 0.3-0.9 s later, and a restore warmed from the
        host would never record one. On a host the node's own served a cold restore 0.03 s sooner
        than the shipped one, the first cold restore records one anyway, and recording cost a
        restore that found its snapshot cached 0.04 s (0.23 s with the digest check beside it;
        paired medians, results/spot-checks/record-only-cost)."""
        wanted = (os.environ.get("COLDSTART_IN_CONTAINER") == "1"
                  or os.environ.get("COLDSTART_WARM_RECORD") == "force")
        if kw.get("record") == "off" or not wanted:
            return
        from coldstart.warm import start_recording

        rec = start_recording(paths, old_pids=kw.get("old_pids"), others=kw.get("others"), pagecache=pagecache)
        with self._lock:
            self.recording = rec
            if rec is not None and self._cancelled:
                rec.cancel()

    def criu_done(self) -> None:
        """CRIU has resumed the tree: the reads may begin."""
        self._criu_done.set()

    @staticmethod
    def _host_warms(paths: list[Path], kw: dict) -> bool:
        """Whether the profile's ranges are warmed from outside (HOST_WARMS_ENV) and there is a
        profile to follow (without one this restore records it, and must warm to do so)."""
        if os.environ.get(HOST_WARMS_ENV) != "1" or kw.get("record") == "force" or kw.get("profile") == "off":
            return False
        from coldstart.warm import where

        root = where.snapshot_root(paths)
        return root is not None and where.resolve_profile(root) is not None

    def at_first_token(self):
        """Stop recording the access profile and save it; let the warm go on with the ranges the
        profile did not name (held back until now), or start it if it was left to the outside.
        Returns the saved profile's path or None."""
        self._first_token.set()
        with self._lock:
            rec = self.recording
        if rec is not None:  # recorded without warming (start_recording)
            return rec.end_recording()
        if self._deferred:  # it starts now, on its thread: nothing recorded, nothing to wait for
            return None
        self._t.join(5)
        getattr(self.warmer, "release", lambda: None)()
        end = getattr(self.warmer, "end_recording", None)
        return end() if end is not None else None

    @property
    def done(self) -> bool:
        return self.warmer is not None and bool(getattr(self.warmer, "done", False))

    def wait(self, timeout=None):
        return self.warmer.wait(timeout) if self.warmer is not None else None

    def cancel(self) -> None:
        """Cancel the warm, also one still being planned on the thread: a warmer started after the
        restore failed would wait for a first token that never comes, holding its files open (a
        profile with a thousand mapped files: a thousand descriptors per failed restore)."""
        with self._lock:
            self._cancelled = True
            if self.warmer is not None:
                self.warmer.cancel()
            if self.recording is not None:
                self.recording.cancel()
        self._first_token.set()
        self._criu_done.set()


def warm_paths(snap: Path, m: Manifest) -> list[Path]:
    """What a restore of ``snap`` reads in bulk, in warming order: the pages images, then the weights.
    In the hot layout (m.layout) those pages images hold what the restore touches; the parent's
    are mapped lazily and never warmed (most of them are never touched)."""
    paths = sorted((snap / "criu").glob("pages-*.img"))
    if m.weights.get("flat"):
        paths.append(snap / m.weights["flat"])
    return paths


def _start_warming(snap: Path, m: Manifest, tl: Timeline, opts: "RestoreOptions | None" = None,
                   remap=None, old_pids: set[int] | None = None,
                   others: list[Path] | None = None) -> _BackgroundWarm | None:
    """Background page-cache warming of the pages images, then the weights file (warm stage); with a
    recorded profile, its order, and the ranges of the libraries the restored server maps (``remap``:
    where those are seen from here, e.g. in a runtime mounted elsewhere). ``old_pids``: the
    processes alive before CRIU started (a recording watches the others: the restored tree).
    ``others``: the files the digest check has begun to read (_Checks.reading)."""
    if importlib.util.find_spec("coldstart.warm") is None:
        return None
    return _BackgroundWarm(warm_paths(snap, m), tl, opts, remap, old_pids, others)


def _restore(snap: Path, m: Manifest, opts: RestoreOptions, tl: Timeline, say, rt: Runtime | None = None,
             mnt=None) -> RestoreResult:
    """The phases, in order; each marks its timeline event and raises RestoreFailed naming the
    problem. ``undo`` unwinds what the phases started if a later one fails."""
    with contextlib.ExitStack() as undo:
        criu, mmap = _validate(snap, m, opts, tl, say, rt)
        st = _place_state(snap, m, opts, undo)
        # Every program this process runs is started before its threads: an exec from a vfork'd
        # child while other threads ran failed once in ~120 restores ("Bad address").
        old_pids = {int(d) for d in os.listdir("/proc") if d.isdigit()}  # before the restored tree
        popen = _criu_start(criu, mmap, snap, m, st, tl, undo, rt, record_pages=opts.record_pages)
        warms = opts.warm and opts.warm_mode != "off"
        # the hot layout's child is left to this restore's own warmer, unless the host warms for it
        # (HOST_WARMS_ENV: the profile's ranges are then the host's)
        own_child = warms and os.environ.get(HOST_WARMS_ENV) != "1"
        ahead = (ReadAhead(snap / "criu", child=not own_child, early=m.layout.get("early"))
                 if mmap and os.environ.get(READ_AHEAD_ENV, "1") != "0" and not opts.record_pages else None)
        checks = _start_verify(snap, m, opts, tl)
        try:
            warmer = (_start_warming(snap, m, tl, opts, rt.remap if rt is not None else None, old_pids,
                                     others=checks.reading)
                      if warms else None)
            if warmer is not None:
                undo.callback(warmer.cancel)
            _import_beside_criu(warmer.started if warmer is not None else None,
                                warmer.paths[0] if warmer is not None and warmer.paths else None)
            eng = _criu_wait(popen, snap, m, st, tl, undo, opts.timeout)
            server_log = _failed_log_path(st.dir.name, "server")  # where a failure from here on keeps it
            checks.watch(eng.pids(), server_log)
            if warmer is not None:
                warmer.criu_done()
            if ahead is not None:
                tl.get(EventName.RESTORE_DONE).attrs.update(ahead.result())
            check_url, base_url, fwd, check_fwd = _connect(eng, m, st, opts, undo)
            client = _wait_server(eng, check_url, opts, tl, m, say, checks, server_log)
            checks.guard(_wake_and_reload, client, snap, m, opts, tl, warmer is not None)
            if opts.before_canary is not None:
                opts.before_canary(eng)
            text = _canary(client, m, tl, checks)
            gate = {}
            if m.gated:  # checked: clients may come in now (in a private network through the checks'
                client.open_gate()  # forwarder, closed next; the public one relays from loopback)
                gate = {"gate": "opened"}
            if fwd is not None:
                check_fwd.close()
                fwd.start()
        except Exception as e:  # noqa: BLE001 - re-raised unless a damaged file or a dead process explains it
            bad = checks.failure(timeout=60)  # a damaged file: name it, not the symptom it caused
            if bad:
                raise RestoreFailed(bad) from e
            gone = checks.exited()  # e.g. a call refused because the API server is gone
            if gone and gone not in str(e):
                raise RestoreFailed(f"{gone}; then {_first_line(e)}") from e
            raise
        ft = tl.mark(EventName.FIRST_TOKEN)
        ft.attrs.update(image_pages_in_use(eng.root_pid) or {"pages_mapped_bytes": None})  # (after the mark)
        ready = tl.mark(EventName.READY, url=base_url, pid=eng.root_pid, **gate)
        # the rest of a lazily mounted runtime and snapshot, in the background: the server then needs
        # neither the registry nor the link (a daemon gone with chunks unfetched is a SIGBUS on the
        # next fault)
        if os.environ.get(RUNTIME_REST_ENV, "fetch") != "leave" and rt is not None and rt.mount is not None:
            ready.attrs["runtime_fetch_all"] = rt.mount.fetch_all()
        if (fetched := fetch_snapshot_rest(mnt)) is not None:
            ready.attrs["snapshot_fetch_all"] = fetched
        if mnt is not None or (rt is not None and rt.mount is not None):  # a later restore's gc_restore_dirs
            # unmounts them once this server is gone (one left by --no-serve has no entrypoint to do it)
            write_owner(st.dir, snap, server_pid=eng.root_pid,
                        mounts=[x.mountpoint for x in (mnt, rt.mount if rt is not None else None) if x is not None])
        undo.pop_all()  # from here on the result owns the server
    if opts.settle:
        if fwd is not None:  # a private network's checks forwarder is closed by now: ask through the public one
            from coldstart.engine.client import EngineClient

            client = EngineClient(base_url, timeout=opts.timeout, token=m.control_token or None)
        _settle(client, tl)
    if warmer is not None:
        _finish_warm(warmer, tl)
    tl.events.sort(key=lambda e: e.t)  # WARM_START is marked from the warming thread
    tl.labels["outcome"] = "restored"
    return RestoreResult(engine=eng, base_url=base_url, timeline=tl, restored=True, canary_ok=True,
                         manifest=m, text=text, forwarder=fwd, state=st)


def _validate(snap: Path, m: Manifest, opts: RestoreOptions, tl: Timeline, say,
              rt: Runtime | None = None) -> tuple[str, bool]:
    """The manifest against this host: every problem named at once; warnings go to the timeline.
    Returns the criu binary and whether it maps pages (our patch)."""
    problems: list[str] = []
    try:
        criu = _criu.find(m.criu_variant)
    except ColdstartError as e:
        criu = None
        problems.append(f"criu: {e}")
    host = hostfacts.collect(criu, runtime=(rt.at, rt.tree) if rt is not None else None)
    warnings: list[str] = []
    problems += [p for p in validate_against_host(m, snap, host=host, verify=False, warnings=warnings,
                                                  remap=rt.remap if rt is not None else None)
                 if not (criu is None and p.startswith("criu:"))]
    if criu is not None and any(w.startswith("kernel:") for w in warnings):
        bad = _criu.kernel_check(criu)  # another kernel build: it must still have what CRIU needs
        if bad:
            problems.append(f"kernel: `criu check` on {host.kernel} fails: {bad}")
    if problems:
        raise RestoreFailed("snapshot does not fit this host: " + "; ".join(problems))
    missing = caps.missing_for_restore(m.server_caps)
    if missing:  # CRIU would fail obscurely (or, missing the server's own, never finish)
        raise RestoreFailed(caps.explain(missing))
    for w in warnings:
        say(f"warning: {w}")
    mmap = _criu.supports_mmap_pages(criu)
    kdat = _criu.ensure_kerndat(criu)  # criu in a PID namespace without its own /proc needs the cached facts
    tl.mark(EventName.MANIFEST_OK, kdat=kdat, **({"warnings": "; ".join(warnings)} if warnings else {}))
    return criu, mmap


class _Checks:
    """Digest checks of the snapshot (integrity.py) on a thread beside the restore, joined before
    serving: CRIU's metadata images first (a few MB: a damaged one is found before CRIU is far), then
    what the restore reads in bulk, then the rest. A failed phase asks ``failure()`` first, so the
    reason names the damaged file rather than the symptom it caused. (The thread only reads: a
    failed restore leaves it to end.)
    Once the tree is restored it is also watched (``watch``): a guarded call ends when one of its
    processes exits."""

    def __init__(self, snap: Path, m: Manifest, mode: str, tl: Timeline):
        self.snap, self.mode, self.tl = snap, mode, tl
        used = {rel: fe for rel, fe in m.files.items() if not rel.startswith("checkpoint-logs/")}
        meta = {rel for rel in used if rel.startswith("criu/") and not Path(rel).name.startswith("pages-")}
        # then what the restore reads in bulk (the hot layout's child images, the weights file:
        # warm_paths), then the rest (the parent's pages, mapped lazily, most never touched); each
        # group smallest file first (integrity.verify)
        bulk = {os.path.relpath(p, snap) for p in warm_paths(snap, m)} & set(used)
        rest = [r for r in used if r not in meta and r not in bulk]
        self._groups = [{r: used[r] for r in meta}, {r: used[r] for r in bulk}, {r: used[r] for r in rest}]
        self.t0 = time.monotonic()
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._stats = {"checked": 0, "skipped": 0, "bytes": 0}
        self.reading: list[Path] = []  # the files it has begun to read (a profile recording heeds them)
        self._tree: list = []  # (psutil.Process, its name) of each restored process (watch)
        self._log = ""
        self._t = threading.Thread(target=self._run, name="coldstart-verify", daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            for files in self._groups:
                st = integrity.verify(self.snap, files, self.mode, on_file=self.reading.append)
                for k in self._stats:
                    self._stats[k] += st.get(k, 0)
        except BaseException as e:  # noqa: BLE001 - reported by join()
            self._error = e
        finally:
            self.seconds = time.monotonic() - self.t0

    def failure(self, timeout: float | None = 0) -> str | None:
        """The integrity failure if one is known (after ``timeout`` s of waiting), else None."""
        self._t.join(timeout)
        return str(self._error) if self._error is not None else None

    def watch(self, pids: list[int], log: Path | str = "") -> None:
        """Watch the restored tree from now on: an engine process that dies under a live API server
        (a corrupt page with the digests off, an out-of-memory kill) leaves the server's requests
        unanswered until their timeouts (a collective_rpc: 600 s), so its exit ends the wait."""
        import psutil

        self._log = str(log)
        for pid in pids:
            try:
                p = psutil.Process(pid)
                self._tree.append((p, p.name()))  # (the name cannot be read once it is gone)
            except psutil.Error:
                pass

    def exited(self) -> str | None:
        """Which watched process has exited, if one has (a zombie counts: its parent has not
        reaped it yet)."""
        import psutil

        for p, name in self._tree:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                pass
            return (f"a process of the restored server exited: pid {p.pid} ({name})"
                    + (f" (log {self._log})" if self._log else ""))
        return None

    def guard(self, fn: Callable, *args):
        """``fn(*args)`` (a call to the restored server), ended early by a digest failure or by the
        exit of a watched process: a damaged image can hang the server inside a request (a corrupt
        hot page held the canary until the client's 300 s timeout). The call runs in a thread; on a
        failure RestoreFailed names the file (or the process) at once, and the caller's cleanup
        stops the server, which ends the call."""
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                box["error"] = e

        t = threading.Thread(target=run, name="coldstart-restore-call", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            bad = (self.failure() or self.exited()) if t.is_alive() else None
            if bad:
                raise RestoreFailed(bad)
        if "error" in box:  # the call failed first (an API server answers 500 for its dead engine):
            bad = self.failure() or self.exited()  # the cause, where the watch sees one, over its echo
            if bad:
                raise RestoreFailed(bad) from box["error"]
            raise box["error"]
        return box.get("value")

    def join(self) -> None:
        """Wait for every check; raise RestoreFailed naming the bad file and chunk."""
        self._t.join()
        if self._error is not None:
            raise RestoreFailed(str(self._error)) from self._error
        self.tl.mark("VERIFIED", mode=self.mode, seconds=round(self.seconds, 3), **self._stats)


def _start_verify(snap: Path, m: Manifest, opts: RestoreOptions, tl: Timeline) -> _Checks:
    mode = opts.verify if isinstance(opts.verify, str) else ("full" if opts.verify else "auto")
    if mode not in integrity.VERIFY_MODES:
        raise RestoreFailed(f"unknown verify mode {mode!r} (expected one of {', '.join(integrity.VERIFY_MODES)})")
    return _Checks(snap, m, mode, tl)


@dataclass
class RestoreState:
    """This restore's writable directory and what it holds on the host (nothing in the snapshot)."""
    dir: Path  # state_dir()/restores/<snapshot>-<pid>-<n>: run-upper/, run-work/, criu/
    net: str  # host | private
    port_lock: object | None = None  # the host port's lock file, held while the server lives

    @property
    def criu_dir(self) -> Path:
        return self.dir / "criu"

    def release(self) -> None:
        if self.port_lock is not None:
            self.port_lock.close()
            self.port_lock = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _place_state(snap: Path, m: Manifest, opts: RestoreOptions, undo: contextlib.ExitStack) -> RestoreState:
    """Make this restore's writable directory and choose its network: the host's (or the container's)
    when this restore can hold the snapshot's port (a lock per host port: concurrent restores must not
    race for it) and the server there is where clients are to come (``_serves_listen``), else a
    private namespace and a forwarder."""
    restores_dir().mkdir(parents=True, exist_ok=True)
    gc_restore_dirs()
    d = Path(tempfile.mkdtemp(prefix=f"{snap.name}-{os.getpid()}-", dir=restores_dir()))
    for sub in ("run-upper", "run-work", "criu"):
        (d / sub).mkdir()
    write_owner(d, snap)  # `coldstart snapshot rm` refuses while this restore's entrypoint lives
    net, lock = opts.net, None
    if net == "auto" and not _serves_listen(m, opts):
        net = "private"
    if net in ("auto", "host"):
        lock = _claim_port(m.host_addr, m.port)
        if lock is None and net == "host":
            shutil.rmtree(d, ignore_errors=True)
            raise RestoreFailed(f"port {m.port} is busy on {m.host_addr} (another server from this snapshot? "
                                "use --net private)")
        net = "host" if lock is not None else "private"
    st = RestoreState(dir=d, net=net, port_lock=lock)
    undo.callback(st.release)
    return st


def _serves_listen(m: Manifest, opts: RestoreOptions) -> bool:
    """Whether the restored server, on this network, is reached by ``opts.listen``'s clients: a server
    checkpointed on loopback does not serve a container's published port (that takes the private
    net's forwarder)."""
    return is_loopback(opts.listen) or not is_loopback(m.host_addr)


def _claim_port(addr: str, port: int):
    """A lock on (addr, port) held while our server uses it, or None when another restore holds it
    or the port is taken. Host-wide because the host's port is: see docs/pipeline.md."""
    import fcntl

    locks = state_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    f = open(locks / f"port-{addr}-{port}.lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    if not port_free(addr, port):
        f.close()
        return None
    return f


def _criu_start(criu: str, mmap: bool, snap: Path, m: Manifest, st: RestoreState, tl: Timeline,
                undo: contextlib.ExitStack, rt: Runtime | None = None, record_pages: bool = False) -> subprocess.Popen:
    """Start CRIU restoring the tree in its namespaces (netns.wrap_argv)."""
    argv = _criu.restore_argv(criu, snap / "criu", st.criu_dir, mmap_pages=mmap)
    shm = {snap / "shm" / n: m.shm_modes.get(n, 0o600) for n in m.shm_files if (snap / "shm" / n).exists()}
    if (snap / "link-remaps").is_dir():
        shm.update({p: m.shm_modes.get(p.name, 0o600) for p in sorted((snap / "link-remaps").iterdir())})
    argv = wrap_argv(argv, run_lower=snap / "run", run_upper=st.dir / "run-upper", run_work=st.dir / "run-work",
                     run_at=m.run_dir, shm=shm, private_net=st.net == "private",
                     run_modes={rel: m.files[f"run/{rel}"].mode for rel in m.run_files if f"run/{rel}" in m.files},
                     binds={rt.tree: rt.at} if rt is not None else None)
    tl.mark(EventName.RESTORE_ISSUED, mmap_pages=mmap, net=st.net)
    env = dict(os.environ, COLDSTART_RESTORED_FILE=str(st.dir / "restored"))
    if record_pages:
        env[_layout.RECORD_ENV] = "1"
    with open(st.dir / "criu.stderr", "w") as errf:  # the child keeps its own copy of the fd
        popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf, cwd=st.dir)
    undo.callback(lambda: popen.poll() is None and (popen.kill(), popen.wait()))
    return popen


FAILED_LOGS_KEPT = 20


def _keep_failed_log(log: Path, name: str, kind: str = "restore") -> Path:
    """A copy of a failed restore's log (``kind``: "restore", CRIU's; "server", the restored
    server's) that outlives the restore's directory (state.failed_dir, the latest FAILED_LOGS_KEPT
    of each kind); ``log`` itself where it cannot be copied."""
    try:
        kept = _failed_log_path(name, kind)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, kept)
        for old in sorted(kept.parent.glob(f"*-{kind}.log"), key=lambda f: f.stat().st_mtime)[:-FAILED_LOGS_KEPT]:
            old.unlink(missing_ok=True)
        return kept
    except OSError:
        return log


def _failed_log_path(name: str, kind: str) -> Path:
    from coldstart.state import failed_dir

    return failed_dir() / f"{name}-{kind}.log"


def _criu_failure(log: Path, stderr: str, name: str) -> str:
    """A failed CRIU restore in one line: the log's first errors, the cause (e.g. a dumped
    connection's address still taken, which restore() retries in a private network), not its last
    (the tasks that failed after it), and where the log is kept."""
    said = criu_logs.summarize(log) if log.is_file() else stderr[-300:]
    return f"criu restore failed (log {_keep_failed_log(log, name)}): {said}"


def _import_beside_criu(warm_started: threading.Event | None, first: Path | None = None) -> None:
    """Import what the phases after CRIU's resume use, on a thread while CRIU restores: before CRIU
    starts these imports would delay it, after its resume they would lengthen the start (requests,
    the engine client's HTTP, alone takes ~0.05-0.09 s: results/spot-checks/restore-imports). On a
    cold node, once the warmer's reads have begun, whose own start (numpy, its plan) they would
    otherwise delay; on a warm one (``first``, the first file the warmer reads, in the page cache:
    8 pages sampled with mincore) at once: there the warmer has nothing to hurry for, and its plan had held them past CRIU's resume
    (results/spot-checks/imports-wait). A phase that gets there first imports what it needs itself
    (Python's import lock)."""
    if os.environ.get(IMPORTS_ENV, "1") == "0":
        return

    def cached() -> bool:
        try:
            return first is not None and sampled_resident_fraction(first, samples=8) >= 1.0
        except OSError:
            return False

    def run() -> None:
        if warm_started is not None and not cached():
            warm_started.wait(1.0)
        try:
            import psutil  # noqa: F401
            import requests  # noqa: F401

            import coldstart.engine.client  # noqa: F401
            import coldstart.engine.gate  # noqa: F401  (the client's token header; it brings asyncio)
            import coldstart.pipeline.canary  # noqa: F401
            import coldstart.pipeline.checkpoint  # noqa: F401
        except Exception:  # noqa: BLE001 - the phase that needs the module meets the error itself
            pass

    threading.Thread(target=run, name="coldstart-imports", daemon=True).start()


def _criu_wait(popen: subprocess.Popen, snap: Path, m: Manifest, st: RestoreState, tl: Timeline,
               undo: contextlib.ExitStack, timeout: float):
    """Wait until CRIU has resumed the tree; returns the attached engine."""
    from coldstart.engine.launcher import EngineProcess, EngineSpec

    restored_flag = st.dir / "restored"
    deadline = time.monotonic() + timeout
    log = st.criu_dir / "restore.log"
    while not restored_flag.exists():
        if popen.poll() is not None:
            stderr = (st.dir / "criu.stderr").read_text(errors="replace").strip()
            _criu.forget_node_kerndat()  # the facts copied from the node may be why: the next restore probes
            raise RestoreFailed(_criu_failure(log, stderr, st.dir.name))
        if time.monotonic() > deadline:
            popen.kill()
            popen.wait()
            raise RestoreFailed(f"criu restore did not finish within {timeout:.0f} s")
        time.sleep(0.002)
    root_pid = _host_root(popen.pid)
    if not root_pid:
        popen.kill()
        popen.wait()
        raise RestoreFailed("criu restored no process tree (nothing under criu in the new PID namespace)")
    spec = EngineSpec(model=Path(m.model), run_dir=st.dir / "run-upper", port=m.port, host=m.host_addr,
                      sleep_mode=m.asleep or bool(m.weights), extra_args=list(m.engine_args), device=m.device,
                      served_model_name=m.served_model_name, control_token=m.control_token)
    eng = EngineProcess.attach(spec, root_pid, popen=popen, new_pidns=True)
    # CRIU does not carry CPU masks: bind vLLM's worker threads again before any forward pass
    bound, unbound_why = affinity.apply(eng.pids(), m.affinity)
    tl.mark(EventName.RESTORE_DONE, pid=root_pid, threads_bound=bound, **({"unbound": unbound_why} if unbound_why else {}))
    write_owner(st.dir, snap, server_pid=root_pid)
    eng.shm_paths = lambda: set()  # its /dev/shm is a private tmpfs: never unlink the host's files
    # a later phase's failure names the server's log where it outlives this restore's directory:
    # copied there once the server has stopped (the callbacks run last-in, first-out)
    undo.callback(_keep_failed_log, spec.log_path, st.dir.name, "server")
    undo.callback(lambda: (eng.stop(timeout=5), _reap(root_pid)))
    return eng


def _connect(eng, m: Manifest, st: RestoreState, opts: RestoreOptions, undo: contextlib.ExitStack):
    """(URL the restore's own checks use, URL clients use, public forwarder, the checks' forwarder).
    On the host network both are the server's own. In a private network the public forwarder is
    bound now and opened after the canary (``_open``); the checks go through a loopback forwarder
    of their own, closed then."""
    if st.net != "private":
        return eng.base_url, eng.base_url, None, None
    try:
        fwd = Forwarder(eng.root_pid, (m.host_addr, m.port), (opts.listen, opts.port or 0))
        undo.callback(fwd.close)
        checks = Forwarder(eng.root_pid, (m.host_addr, m.port), ("127.0.0.1", 0)).start()
        undo.callback(checks.close)
    except OSError as e:
        raise RestoreFailed(f"cannot forward to the restored server: {e}") from e
    return (f"http://127.0.0.1:{checks.address[1]}", f"http://{client_host(opts.listen)}:{fwd.address[1]}", fwd,
            checks)


def _wait_server(eng, base_url: str, opts: RestoreOptions, tl: Timeline, m: Manifest, say,
                 checks: "_Checks | None" = None, log: Path | None = None):
    """Wait for the restored server's /health; ``log``: where a failure says its log is (kept)."""
    from coldstart.engine.client import EngineClient

    client = EngineClient(base_url, timeout=opts.timeout, token=m.control_token or None)
    deadline = time.monotonic() + opts.timeout
    while not client.health():
        # a damaged image can hang the restored server instead of killing it: the digest check's
        # verdict ends the wait
        bad = checks.failure() if checks is not None else None
        if bad:
            raise RestoreFailed(bad)
        if not eng.alive():
            raise RestoreFailed(f"the restored server exited (pid {eng.root_pid}; log {log or eng.spec.log_path})")
        gone = checks.exited() if checks is not None else None
        if gone:
            raise RestoreFailed(gone)
        if time.monotonic() > deadline:
            raise RestoreFailed(f"the restored server did not answer /health within {opts.timeout:.0f} s")
        time.sleep(0.02)
    tl.mark(EventName.SERVER_UP)
    if m.xcomp_perm:  # before any forward pass: a criu without our patch 0008 drops the AMX permission
        # guarded too: a corrupt page that kills the engine leaves the API server up, this call unanswered
        def xstate():
            return client.collective_rpc("coldstart_xstate", kwargs={"restore": m.xcomp_perm})

        res = ((checks.guard(xstate) if checks is not None else xstate()) or [{}])[0]
        if res.get("error"):
            raise RestoreFailed(f"the restored worker cannot get its AMX permission back: {res['error']}")
        if res.get("asked"):
            say(f"xstate: asked again for features {res['asked']} (AMX) that the CRIU restore dropped")
    return client


def _wake_and_reload(client, snap: Path, m: Manifest, opts: RestoreOptions, tl: Timeline, warming: bool) -> None:
    if not (m.asleep or m.weights):
        return
    client.wake_up(["weights"])
    tl.mark(EventName.WAKE_WEIGHTS)
    t = time.monotonic()
    # with a warm stage running (a warmer, or a profile recorder) the page cache is shared with it:
    # map, also where auto would copy (a refused map), since an O_DIRECT copy would read the weights
    # a second time, past the warmer, and hide them from the recorded profile
    mode = "map" if opts.reload_mode == "auto" and warming else opts.reload_mode
    # (from this process's environment: the restored worker's is the checkpoint's)
    overlap = {"0": False, "1": True}.get(os.environ.get(PREPACK_OVERLAP_ENV, ""), "auto")
    huge = os.environ.get(HUGE_FOLIOS_ENV, "1") != "0"
    from coldstart.pipeline.checkpoint import reload_weights

    res = reload_weights(client, snap, m.weights, mode=mode, overlap=overlap, huge=huge)
    dt = time.monotonic() - t
    nbytes = int(m.weights.get("bytes", 0))
    r0 = res[0] if res and isinstance(res[0], dict) else {}
    tl.mark(EventName.WEIGHTS_LOADED, bytes=nbytes, gib_s=round(nbytes / 2**30 / dt, 3) if dt else 0,
            mode=r0.get("mode", "stock"),
            **{k: r0[k] for k in ("auto_choice", "map_refused", "o_direct", "prepack_s", "prepacked_linears",
                                  "populate_s", "prepack_overlapped", "prepack_waited_s", "resident_at_start",
                                  "packed_kept", "handles_only", "populated_bytes", "packed_refilled",
                                  "packed_bytes", "packed_populate_s", "packed_refused", "huge_folios")
               if r0.get(k) or (k == "resident_at_start" and r0.get(k) is not None)})
    client.wake_up(["kv_cache"])
    tl.mark(EventName.WAKE_KV)


def _settle(client, tl: Timeline) -> None:
    """Served from a mapped weights file: ask the worker to move the weights into anonymous memory in
    the background (it answers at once). A refusal or an error costs nothing but the speed-up: the
    mapped weights stay valid, so it is recorded, never a reason to fall back."""
    loaded = tl.get(EventName.WEIGHTS_LOADED)
    if loaded is None or loaded.attrs.get("mode") not in ("map", "map+packed"):
        return
    try:
        res = client.collective_rpc("coldstart_settle")
        r0 = res[0] if res and isinstance(res[0], dict) else {}
        tl.mark(EventName.SETTLE_ASKED, started=bool(r0.get("started")),
                **{k: r0[k] for k in ("bytes", "why") if r0.get(k)})
    except Exception as e:  # noqa: BLE001
        tl.mark(EventName.SETTLE_ASKED, started=False, why=f"{type(e).__name__}: {e}"[:200])


def _canary(client, m: Manifest, tl: Timeline, checks: _Checks) -> str:
    """The recorded answer must come back, and every digest must match, before anything is served
    (a digest failure is named in preference to the canary's symptom of it)."""
    from coldstart.pipeline.canary import check as check_canary

    bad, text = checks.guard(check_canary, client, m.canary)
    checks.join()
    if bad:
        raise RestoreFailed(bad)
    tl.mark(EventName.CANARY_OK, kind=m.canary.kind)
    return text


def _host_root(launcher_pid: int, settle: float = 5.0) -> int:
    """Host PID of the restored root: unshare → criu (PID 1 of the new namespace) → root.

    Right after post-resume criu can still have exiting helper children (zombies, or helpers that
    have not exited yet): wait up to ``settle`` seconds for exactly one live child, instead of
    failing the restore on a momentary second child (seen under heavy load). A helper reaped between
    the listing and the look at it is one fewer child, not the end of the tree (a cold container
    restore fell back once on that)."""
    import psutil

    deadline = time.monotonic() + settle
    while True:
        try:
            inits = psutil.Process(launcher_pid).children()
        except psutil.NoSuchProcess:
            return 0
        roots = []
        try:
            kids = inits[0].children() if inits else []
        except psutil.NoSuchProcess:
            kids = []  # CRIU's init gone: nothing to find (until the deadline says so)
        for c in kids:
            try:
                if c.status() != psutil.STATUS_ZOMBIE:
                    roots.append(c)
            except psutil.NoSuchProcess:
                continue
        if len(roots) == 1:
            return roots[0].pid
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.02)


_PRESENT = bytes(b >> 7 for b in range(256))  # a pagemap entry's top byte: bit 63, the page is present
_COPIED = bytes(int(b & 0xA0 == 0x80) for b in range(256))  # present and not a file page (bit 61)


def image_pages_in_use(root_pid: int) -> dict | None:
    """The snapshot's CRIU pages the restored tree has mapped in (present in its page tables):
    ``pages_mapped_bytes``, what the restore needed of its memory image so far, whether the page
    cache held it or the disk (or a lazy mount) had to give it; of them ``pages_written_bytes``, the
    pages written since (copied on write: certainly touched, where a page mapped from the file may
    only have come with a fault's 64 KiB fault-around block, results/spot-checks/diet-executor "The
    floors"). None when the tree cannot be read. From /proc/PID/pagemap over the images' mappings in
    /proc/PID/maps (the same counts as smaps' Rss and Anonymous, in a third of the time: it runs
    between the first token and READY, over the hot layout's thousands of mappings)."""
    import re

    import psutil

    pat = re.compile(r"/pages-\d+\.img( \(deleted\))?$")
    page = os.sysconf("SC_PAGE_SIZE")
    mapped = written = 0
    try:
        procs = [psutil.Process(root_pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return None
    for p in procs:
        try:
            runs: list[list[int]] = []
            with open(f"/proc/{p.pid}/maps") as f:
                for line in f:
                    if ".img" in line and pat.search(line.rstrip("\n")):
                        a, b = line.split(" ", 1)[0].split("-")
                        lo, hi = int(a, 16), int(b, 16)
                        if runs and runs[-1][1] == lo:
                            runs[-1][1] = hi
                        else:
                            runs.append([lo, hi])
            fd = os.open(f"/proc/{p.pid}/pagemap", os.O_RDONLY)
            try:
                for lo, hi in runs:
                    top = os.pread(fd, (hi - lo) // page * 8, lo // page * 8)[7::8]  # little-endian entries
                    mapped += top.translate(_PRESENT).count(1)
                    written += top.translate(_COPIED).count(1)
            finally:
                os.close(fd)
        except OSError:
            continue
    return {"pages_mapped_bytes": mapped * page, "pages_written_bytes": written * page}


def _finish_warm(warmer, tl: Timeline) -> None:
    """First token: end the access-profile recording (what comes later is not the restore's
    demand) and report the warm if it is done (else it goes on in the background, unreported)."""
    try:
        saved = warmer.at_first_token()
        if warmer.done:
            st = warmer.wait(0)
            tl.mark(EventName.WARM_DONE, bytes=getattr(st, "bytes", 0), profile_saved=str(saved or ""))
        elif saved and tl.get(EventName.WARM_START) is not None:  # recorded without warming
            tl.get(EventName.WARM_START).attrs["profile_saved"] = str(saved)
    except Exception as e:  # noqa: BLE001 - the server is up: a lost profile is only a slower next start
        ws = tl.get(EventName.WARM_START)
        if ws is not None:  # said in the timeline, not hidden
            ws.attrs["profile_error"] = f"{type(e).__name__}: {e}"[:200]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class LateDamage(RestoreFailed):
    """Found after READY (serve's ``watch``): the restored server must be replaced."""


def serve_and_release(res: RestoreResult, opts: RestoreOptions, say: Callable[[str], None] = print) -> int:
    """The entrypoint's serving: ``serve`` the server, then release what the restore holds (its lazy
    mounts, its writable state) once the server is gone. A restored server found damaged after READY
    (``RestoreResult.damaged``: its lazy snapshot or runtime holds a chunk the registry serves
    damaged) is stopped and a cold boot takes its place (``fall_back``), saying why: the promise of
    the restore before READY (any failure: a cold boot) kept after it, before the server reads the
    bad bytes."""
    try:
        code = serve(res, watch=res.damaged if res.restored else None)
    except LateDamage as e:
        asked: list[int] = []  # a stop asked for during the cold boot: honoured once it is up
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, lambda signum, _frame: asked.append(signum))
        res.engine.stop(timeout=10)
        res.close(keep_runtime=opts.fallback)
        if not opts.fallback:
            raise RestoreFailed(f"after READY: {e}") from None
        try:
            cold = fall_back(f"after READY: {e}", res.manifest, opts, res.timeline, say, res.runtime)
        except BaseException:
            res.close()  # the runtime's mount too: nothing runs from it now
            raise
        cold.runtime = res.runtime
        if asked:
            cold.stop()
            return 128 + asked[0]
        say(f"ready: {cold.base_url} (cold boot)")
        try:
            return serve(cold)
        finally:
            cold.close()
    res.close()
    return code


def serve(res: RestoreResult, watch: Callable[[], str | None] | None = None) -> int:
    """Stay the server's parent: forward SIGTERM/SIGINT/SIGHUP to it, return its exit status.
    ``watch``, asked about once a second: a reason to stop serving this server (LateDamage is raised
    with it, the server left running for the caller to stop).

    If the server's root process dies abruptly, vLLM's EngineCore and worker live on in the
    namespace (CRIU, its init, keeps them): after a grace period the namespace is ended."""
    eng = res.engine
    popen = getattr(eng, "popen", None)
    pid = popen.pid if popen is not None else eng.root_pid

    def forward(signum, _frame):
        try:
            os.kill(eng.root_pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    root_gone_at = None
    next_watch = time.monotonic() + 1.0
    while True:
        if watch is not None and time.monotonic() >= next_watch:
            next_watch = time.monotonic() + 1.0
            why = watch()
            if why:
                raise LateDamage(why)
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: poll the root
            while eng.alive():
                time.sleep(0.5)
            return 0
        if done:
            return os.waitstatus_to_exitcode(status)
        if popen is not None and not alive(eng.root_pid):
            root_gone_at = root_gone_at or time.monotonic()
            if time.monotonic() - root_gone_at > 10:
                popen.kill()  # unshare --kill-child takes CRIU, the namespace's init, and all in it
        time.sleep(0.2)

