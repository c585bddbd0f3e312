"""``coldstart restore [DIR]``: the container entrypoint. Restore the snapshot, prove it with the
canary, serve; on any failure before serving, say why on one line and cold-boot the same model.

Order (DESIGN.md): validate the manifest against this host → start page-cache warming → put back the
host state the image refers to (log sizes, /dev/shm buffers, CRIU link_remap files) → CRIU restore
(patched criu maps pages-*.img instead of copying) → wait for /health → wake weights → reload them
in place through our loader → wake the KV cache → the canary must give the recorded tokens → serve.

We become a child subreaper before the restore, so the restored tree (``--restore-detached``) is
re-parented to us: the entrypoint stays the server's parent, forwards SIGTERM/SIGINT and exits with it.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from coldstart.errors import ColdstartError
from coldstart.pipeline import _criu, hostfacts
from coldstart.pipeline.events import EventName, Timeline
from coldstart.pipeline.manifest import Manifest, read_manifest, sparse_copy, validate_against_host

SHM = Path("/dev/shm")
PR_SET_CHILD_SUBREAPER = 36


class RestoreFailed(ColdstartError):
    """A failure before serving: the caller falls back to a cold boot and prints this reason."""


@dataclass
class RestoreOptions:
    snapshot: Path
    verify: bool = False  # check every file's xxh3 digest too (costs a full read)
    timeout: float = 300.0  # for the restored server's /health and each dev-mode call
    warm: bool = True
    fallback: bool = True
    model: str | None = None  # cold-boot this if the manifest cannot even be read
    port: int | None = None  # host port to serve on (private net: the forwarder's; cold boot: vLLM's)
    cold_timeout: float = 900.0
    net: str = "auto"  # host | private | auto (private when the snapshot's port is busy here)
    reload_mode: str = "auto"  # map | copy | auto: how the worker refills its weights (sleep_worker.py)
    # page-cache warming (warm stage): None/"auto" = the entrypoint's COLDSTART_WARM_* env or defaults
    warm_mode: str | None = None  # native | vmtouch | none
    warm_method: str | None = None  # native: pread | populate | willneed
    warm_profile: str = "auto"  # auto (DIR/profile.json if recorded) | off | PATH
    warm_record: str = "auto"  # auto (when there is no profile) | off | force; saved at first token
    warm_rest: str = "after"  # with a profile, the ranges it does not name: after (first token) | now | never


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

    def stop(self) -> None:
        """Stop the server (and the forwarder); reap it."""
        try:
            self.engine.stop(timeout=10)
        finally:
            if self.forwarder is not None:
                self.forwarder.close()
            _reap(self.engine.root_pid)


def set_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def restore(opts: RestoreOptions, say: Callable[[str], None] = print) -> RestoreResult:
    """Restore (or, failing that, cold-boot) and return once the server answers correctly."""
    snap = Path(opts.snapshot).absolute()
    tl = Timeline.from_container_start("restore", snapshot=snap.name)
    m: Manifest | None = None
    try:
        m = read_manifest(snap)
        tl.labels["model"] = Path(m.model).name
        try:
            return _restore(snap, m, opts, tl, say)
        except RestoreFailed as e:
            # The dumped loopback TCP connections (gloo) come back with their exact 4-tuples; right
            # after another copy of this snapshot stopped on this host they can still be in TIME_WAIT.
            # A private network namespace has none of them: retry there once (auto mode only).
            if opts.net != "auto" or not any(k in str(e) for k in ("inet socket back", "Address already in use")):
                raise
            say(f"restore in the host network failed ({str(e)[:120]}...); retrying in a private one")
            tl.mark("RESTORE_RETRY", reason="host network busy: retrying with --net private")
            return _restore(snap, m, RestoreOptions(**{**opts.__dict__, "net": "private"}), tl, say)
    except Exception as e:  # the entrypoint's promise: whatever went wrong, still serve (cold)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not isinstance(e, (ColdstartError, OSError, subprocess.SubprocessError, TimeoutError)):
            reason = f"{type(e).__name__}: {reason}"  # unexpected: name the exception type too
        if not opts.fallback:
            raise RestoreFailed(reason) from e
        return fall_back(reason, m, opts, tl, say)


def fall_back(reason: str, m: Manifest | None, opts: RestoreOptions, tl: Timeline,
              say: Callable[[str], None]) -> RestoreResult:
    """Cold-boot the snapshot's model with the snapshot's engine args (FALLBACK event with the reason)."""
    from coldstart.pipeline.cold import cold_start

    say(f"fallback: {reason}")
    tl.mark(EventName.FALLBACK, reason=reason)
    tl.labels["outcome"] = "fallback"
    model = opts.model or (m.model if m else None)
    if not model:
        raise ColdstartError(f"restore failed ({reason}) and there is no model to cold-boot "
                             "(pass --model)")
    port = opts.port or (m.port if m else 8000)
    if not _port_free("127.0.0.1", port):
        port = _free_port()
        say(f"port busy: the cold boot listens on {port}")
    eng, comp = cold_start(model, port=port, engine_args=m.engine_args if m else [], timeline=tl,
                           timeout=opts.cold_timeout, served_model_name=m.served_model_name if m else None,
                           kv_cache_bytes=int(m.timings.get("kv_cache_bytes", 256 << 20)) if m else 256 << 20,
                           canary_prompt=m.canary.prompt if m else None,
                           canary_tokens=m.canary.max_tokens if m else 16)
    ok = bool(m and comp and comp.token_ids == m.canary.token_ids)
    return RestoreResult(engine=eng, base_url=eng.base_url, timeline=tl, restored=False,
                         fallback_reason=reason, canary_ok=ok, manifest=m, text=comp.text if comp else "")


def _truncate_logs(m: Manifest) -> None:
    """CRIU checks the size of the files the process had open: cut the logs back to dump time."""
    for logp, size in m.log_sizes.items():
        p = Path(logp)
        if p.exists() and p.stat().st_size > size:
            os.truncate(p, size)


def _prepare_host_state(snap: Path, m: Manifest) -> None:
    """Put back in the host's /dev/shm what the image refers to by path but does not contain."""
    for name in m.shm_files:
        src = snap / "shm" / name
        if src.exists():
            sparse_copy(src, SHM / name)  # mostly holes; CRIU checks the mode too
    remaps = snap / "link-remaps"
    if remaps.is_dir():
        for src in remaps.iterdir():
            shutil.copy2(src, SHM / src.name)


class _BackgroundWarm:
    """Imports and starts the warm stage's warmer on a thread, so that its start-up (imports, plan)
    never delays the restore itself; WARM_START is marked when it really starts."""

    def __init__(self, paths: list[Path], tl: Timeline, opts: "RestoreOptions | None" = None):
        import threading

        self.warmer = None
        self._tl = tl
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
        self._t = threading.Thread(target=self._run, args=(paths, kw), name="coldstart-warm", daemon=True)
        self._t.start()

    def _run(self, paths: list[Path], kw: dict) -> None:
        try:
            from coldstart.warm import start_warming  # type: ignore[attr-defined]

            self.warmer = start_warming(paths, **kw)
            plan = getattr(self.warmer, "plan", None)
            self._tl.mark(EventName.WARM_START, files=len(paths), mode=self.warmer.mode,
                          profile=bool(getattr(plan, "profile_used", False)),
                          mapped_files=len(getattr(plan, "mapped", ())))
        except Exception:  # warming is an optimisation: never a reason to fail the restore
            self.warmer = None

    def at_first_token(self):
        """Stop recording the access profile and save it; let the warm go on with the ranges the
        profile did not name (held back until now). Returns the saved profile's path or None."""
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
        if self.warmer is not None:
            self.warmer.cancel()


def _start_warming(snap: Path, m: Manifest, tl: Timeline, opts: "RestoreOptions | None" = None) -> _BackgroundWarm | None:
    """Background page-cache warming of the pages images, then the weights file (warm stage); with a
    recorded profile, its order, and the ranges of the libraries the restored server maps."""
    if importlib.util.find_spec("coldstart.warm") is None:
        return None
    paths = sorted((snap / "criu").glob("pages-*.img"))
    if m.weights.get("flat"):
        paths.append(snap / m.weights["flat"])
    return _BackgroundWarm(paths, tl, opts)


def _restore(snap: Path, m: Manifest, opts: RestoreOptions, tl: Timeline, say) -> RestoreResult:
    from coldstart.engine.client import EngineClient
    from coldstart.engine.launcher import EngineProcess, EngineSpec

    problems: list[str] = []
    try:
        criu = _criu.find(m.criu_variant)
    except ColdstartError as e:
        criu = None
        problems.append(f"criu: {e}")
    host = hostfacts.collect(criu)
    problems += [p for p in validate_against_host(m, snap, host=host, verify=opts.verify)
                 if not (criu is None and p.startswith("criu:"))]
    if problems:
        raise RestoreFailed("snapshot does not fit this host: " + "; ".join(problems))
    tl.mark(EventName.MANIFEST_OK)

    warmer = _start_warming(snap, m, tl, opts) if opts.warm and opts.warm_mode != "off" else None

    net = opts.net
    if net == "auto":
        net = "host" if _port_free(m.host_addr, m.port) else "private"
    if net == "host" and not _port_free(m.host_addr, m.port):
        raise RestoreFailed(f"port {m.port} is busy on {m.host_addr} (another server from this snapshot? "
                            "use --net private)")
    # (no subreaper needed: criu stays the tree's parent and our child)
    work = Path(tempfile.mkdtemp(prefix="coldstart-restore-"))
    pidfile = work / "restore.pid"
    mmap = _criu.supports_mmap_pages(criu)
    argv = _criu.restore_argv(criu, snap / "criu", work, pidfile, mmap_pages=mmap)
    _truncate_logs(m)
    _criu.ensure_kerndat(criu)  # criu in a PID namespace without its own /proc needs the cached facts
    from coldstart.pipeline.netns import wrap_argv

    if net == "private":
        shm = [snap / "shm" / n for n in m.shm_files if (snap / "shm" / n).exists()]
        if (snap / "link-remaps").is_dir():
            shm += sorted((snap / "link-remaps").iterdir())
        argv = wrap_argv(argv, shm, private_net=True)
    else:
        argv = wrap_argv(argv)
    lock = _criu.remap_lock() if net == "host" else contextlib.nullcontext()
    lock.__enter__()
    if net == "host":
        _prepare_host_state(snap, m)
    tl.mark(EventName.RESTORE_ISSUED, mmap_pages=mmap, net=net)
    restored_flag = work / "restored"
    env = dict(os.environ, COLDSTART_RESTORED_FILE=str(restored_flag))
    errf = open(work / "criu.stderr", "w+")
    popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                             cwd=m.run_dir or None)
    deadline = time.monotonic() + opts.timeout
    try:
        while not restored_flag.exists():
            if popen.poll() is not None:
                errf.seek(0)
                raise RestoreFailed(f"criu restore failed (log {work / 'restore.log'}): "
                                    f"{_criu._log_tail(work / 'restore.log') or errf.read().strip()[-300:]}")
            if time.monotonic() > deadline:
                popen.kill()
                popen.wait()
                raise RestoreFailed(f"criu restore did not finish within {opts.timeout:.0f} s")
            time.sleep(0.002)
    finally:
        if net == "host":
            _remove_placed_remaps(snap)
        lock.__exit__(None, None, None)
    root_pid = _host_root(popen.pid)
    if not root_pid:
        popen.kill()
        popen.wait()
        raise RestoreFailed("criu restored no process tree (nothing under criu in the new PID namespace)")
    tl.mark(EventName.RESTORE_DONE, pid=root_pid)

    spec = EngineSpec(model=Path(m.model), run_dir=Path(m.run_dir), port=m.port, host=m.host_addr,
                      sleep_mode=m.asleep or bool(m.weights), extra_args=list(m.engine_args), device=m.device,
                      served_model_name=m.served_model_name)
    eng = EngineProcess.attach(spec, root_pid, popen=popen, new_pidns=True)
    fwd = None
    base_url = spec.base_url
    if net == "private":
        from coldstart.pipeline.netns import Forwarder

        eng.shm_paths = lambda: set()  # its /dev/shm is a private tmpfs: never unlink the host's files
        try:
            fwd = Forwarder(root_pid, (m.host_addr, m.port), ("127.0.0.1", opts.port or 0)).start()
        except OSError as e:
            eng.stop(timeout=5)
            raise RestoreFailed(f"cannot forward to the restored server: {e}") from e
        base_url = f"http://127.0.0.1:{fwd.address[1]}"
    try:
        client = EngineClient(base_url, timeout=opts.timeout)
        deadline = time.monotonic() + opts.timeout
        while not client.health():
            if not eng.alive():
                raise RestoreFailed(f"the restored server exited (pid {root_pid}; log {spec.log_path})")
            if time.monotonic() > deadline:
                raise RestoreFailed(f"the restored server did not answer /health within {opts.timeout:.0f} s")
            time.sleep(0.02)
        tl.mark(EventName.SERVER_UP)
        if m.xcomp_perm:  # before any forward pass: a criu without our patch 0008 drops the AMX permission
            res = (client.collective_rpc("coldstart_xstate", kwargs={"restore": m.xcomp_perm}) or [{}])[0]
            if res.get("error"):
                raise RestoreFailed(f"the restored worker cannot get its AMX permission back: {res['error']}")
            asked = res.get("asked")
            if asked:
                say(f"xstate: asked again for features {asked} (AMX) that the CRIU restore dropped")
        if m.asleep or m.weights:
            from coldstart.pipeline.checkpoint import reload_weights

            client.wake_up(["weights"])
            tl.mark(EventName.WAKE_WEIGHTS)
            t = time.monotonic()
            # with a warm stage running (a warmer, or a profile recorder) the page cache is shared with
            # it: map (an O_DIRECT copy would read the weights a second time, past the warmer, and hide
            # them from the recorded profile); without one, auto copies a cold file in with O_DIRECT
            mode = "map" if opts.reload_mode == "auto" and warmer is not None else opts.reload_mode
            res = reload_weights(client, snap, m.weights, mode=mode)
            dt = time.monotonic() - t
            nbytes = int(m.weights.get("bytes", 0))
            r0 = res[0] if res and isinstance(res[0], dict) else {}
            tl.mark(EventName.WEIGHTS_LOADED, bytes=nbytes, gib_s=round(nbytes / 2**30 / dt, 3) if dt else 0,
                    mode=r0.get("mode", "stock"),
                    **{k: r0[k] for k in ("auto_choice", "map_refused", "o_direct") if r0.get(k)})
            client.wake_up(["kv_cache"])
            tl.mark(EventName.WAKE_KV)
        from coldstart.pipeline.canary import check as check_canary

        bad, text = check_canary(client, m.canary)
        if bad:
            raise RestoreFailed(bad)
        tl.mark(EventName.CANARY_OK, kind=m.canary.kind)
        tl.mark(EventName.FIRST_TOKEN)
        tl.mark(EventName.READY, url=base_url, pid=root_pid)
        if warmer is not None:
            _finish_warm(warmer, tl)
        tl.events.sort(key=lambda e: e.t)  # WARM_START is marked from the warming thread
        tl.labels["outcome"] = "restored"
        shutil.rmtree(work, ignore_errors=True)
        return RestoreResult(engine=eng, base_url=base_url, timeline=tl, restored=True, canary_ok=True,
                             manifest=m, text=text, forwarder=fwd)
    except BaseException:
        eng.stop(timeout=5)
        if fwd is not None:
            fwd.close()
        _reap(root_pid)
        if warmer is not None:
            try:
                warmer.cancel()
            except Exception:
                pass
        raise


def _remove_placed_remaps(snap: Path) -> None:
    """CRIU has used (or failed to use) the link_remap files we put in /dev/shm: remove them, so they
    cannot block the next dump (their names repeat across vLLM trees)."""
    remaps = snap / "link-remaps"
    if not remaps.is_dir():
        return
    for src in remaps.iterdir():
        (SHM / src.name).unlink(missing_ok=True)


def _host_root(launcher_pid: int, settle: float = 5.0) -> int:
    """Host PID of the restored root: unshare → criu (PID 1 of the new namespace) → root.

    Right after post-resume criu can still have exiting helper children (zombies, or helpers that
    have not exited yet): wait up to ``settle`` seconds for exactly one live child, instead of
    failing the restore on a momentary second child (seen under heavy load)."""
    import psutil

    deadline = time.monotonic() + settle
    while True:
        try:
            inits = psutil.Process(launcher_pid).children()
            roots = [c for c in (inits[0].children() if inits else [])
                     if c.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            return 0
        if len(roots) == 1:
            return roots[0].pid
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.02)


def _finish_warm(warmer, tl: Timeline) -> None:
    """First token: end the access-profile recording (what comes later is not the restore's
    demand) and report the warm if it is done (else it goes on in the background, unreported)."""
    try:
        saved = warmer.at_first_token()
        if warmer.done:
            st = warmer.wait(0)
            tl.mark(EventName.WARM_DONE, bytes=getattr(st, "bytes", 0), profile_saved=str(saved or ""))
    except Exception:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    from coldstart.pipeline.checkpoint import port_free

    return port_free(host, port)


def serve(res: RestoreResult) -> int:
    """Stay the server's parent: forward SIGTERM/SIGINT/SIGHUP to it, return its exit status."""
    eng = res.engine
    pid = eng.popen.pid if getattr(eng, "popen", None) is not None else eng.root_pid

    def forward(signum, _frame):
        try:
            os.kill(eng.root_pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # not our child (should not happen with the subreaper): poll
            while eng.alive():
                time.sleep(0.5)
            return 0
        except InterruptedError:
            continue
