"""`criu restore` of an image directory, optionally into a fresh PID namespace.

Three ways to run it, because callers need different lifetimes:
- detached (default): ``criu restore -d``; CRIU exits once the tree runs, the tree is re-parented
  to init. Fastest; needs the dumped PIDs to be free on this host.
- pidns: ``unshare --pid --fork --kill-child setsid criu restore`` (not detached: CRIU stays as
  the namespace's init, since PID 1 exiting would kill the namespace). Works while the original
  PIDs are still taken. No --mount-proc (it broke vLLM restores here); the inner setsid is needed.
- child (detach=False): CRIU stays as the tree's parent, e.g. for a supervisor that waits on it.
In the non-detached modes "restored" is signalled by CRIU's post-resume action script.

On any failure the half-restored tree is killed and the error names CRIU's failing log line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.criu import logs
from coldstart.criu._common import resolve_criu, shared_flags
from coldstart.criu.images import check_pages, image_facts
from coldstart.errors import ColdstartError

NOTIFY_SCRIPT = """#!/bin/sh
# written by coldstart: tells the caller that CRIU resumed the restored tree
[ "$CRTOOLS_SCRIPT_ACTION" = post-resume ] && : > "$COLDSTART_RESTORED_FILE"
exit 0
"""


@dataclass
class RestoreOptions:
    variant: str = "patched"
    criu_path: Path | None = None
    # None: stock restore (pages copied into fresh memory); 0: map pages-*.img privately with the
    # patch's default minimum run; N > 0: map runs of at least N KiB (smaller runs are copied).
    mmap_pages: int | None = None
    pidns: bool = False  # restore into a fresh PID namespace (original PIDs may still be alive)
    # pidns only. CRIU's start-up probes read /proc/<pid> of forked helpers, which needs a /proc
    # of the new namespace unless CRIU's kerndat cache is valid (only a build with a tmpfs RUNDIR
    # keeps one, and every rebuild invalidates it), so --mount-proc by default. False is for
    # callers that know the cache is there (vLLM restores were seen to break with --mount-proc).
    mount_proc: bool = True
    detach: bool = True  # without pidns: let CRIU exit once the tree runs (else CRIU stays its parent)
    tcp_established: bool = True
    shell_job: bool = True
    ext_unix_sk: bool = True
    file_locks: bool = True
    network_lock: str | None = "nftables"
    log_level: int = 2  # errors + warnings: enough for the failing line, cheap on the hot path
    work_dir: Path | None = None  # logs, pidfile, stats (never the image dir: it stays read-only)
    timeout: float = 300.0
    extra_args: list[str] = field(default_factory=list)


@dataclass
class RestoreResult:
    pid: int  # root of the restored tree, as seen from the host
    ns_pid: int  # the same process as seen inside its PID namespace (== pid without pidns)
    seconds: float  # from launching criu to "tree resumed"
    images_dir: Path
    log_path: Path
    criu: Path
    mmap_pages: int | None
    pidns: bool
    # the criu (or unshare) process that stays alive in pidns/child mode; None when detached
    process: subprocess.Popen | None = None

    def host_pid(self, ns_pid: int) -> int:
        """Host pid of the restored process that has `ns_pid` inside the tree's namespace."""
        if not self.pidns:
            return ns_pid
        for p in [self.pid] + descendants(self.pid):
            if inner_pid(p) == ns_pid:
                return p
        raise ColdstartError(f"no restored process has pid {ns_pid} in its namespace")

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the restored tree (and its namespace) and wait until it is gone."""
        pids = [self.pid] + descendants(self.pid)
        for p in pids:
            _kill(p)
        if self.process is not None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _reap(pids)
        wait_gone(pids, timeout)


def set_child_subreaper() -> None:
    """Make detached restored trees our children (CRIU -d re-parents them to the nearest
    subreaper), so we can reap them: an unreaped zombie keeps its PID taken for the next restore."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap(pids: list[int], timeout: float = 10.0) -> None:
    """waitpid() those of `pids` that are our children (no-op for the others)."""
    end = time.monotonic() + timeout
    for p in pids:
        while True:
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > end:
                break
            time.sleep(0.002)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def inner_pid(pid: int) -> int | None:
    """`pid` as seen from its own (innermost) PID namespace (last NSpid field)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def restore_argv(criu: Path, images_dir: Path, work: Path, opts: RestoreOptions) -> list[str]:
    a = [str(criu), "restore", "-D", str(images_dir), "-W", str(work), "-o", "restore.log",
         f"-v{opts.log_level}", "--pidfile", str(work / "restored.pid")]
    a += shared_flags(tcp_established=opts.tcp_established, shell_job=opts.shell_job,
                      ext_unix_sk=opts.ext_unix_sk, file_locks=opts.file_locks,
                      network_lock=opts.network_lock)
    if opts.mmap_pages is not None:
        a.append("--mmap-pages" if opts.mmap_pages == 0 else f"--mmap-pages={int(opts.mmap_pages)}")
    if opts.pidns or not opts.detach:
        a += ["--action-script", str(work / "notify.sh")]
    else:
        a.append("-d")
    a += list(opts.extra_args)
    if opts.pidns:
        # --kill-child: if the launcher dies, the namespace (and the restored tree) dies with it
        a = ["unshare", "--pid", "--fork", "--kill-child"] + (["--mount-proc"] if opts.mount_proc else []) + ["setsid"] + a
    return a


def restore(images_dir: str | Path, opts: RestoreOptions | None = None) -> RestoreResult:
    """Restore the tree in `images_dir`; returns once it runs (or raises, leaving nothing behind)."""
    opts = opts or RestoreOptions()
    images = Path(images_dir).absolute()
    try:
        facts = image_facts(images)
        check_pages(images)
    except ColdstartError as e:
        raise ColdstartError(f"criu restore of {images} refused: {e}") from None
    criu = resolve_criu(opts.variant, opts.criu_path)
    if opts.mmap_pages is not None:
        _require_mmap(criu)
    if not opts.pidns and facts.root_pid is not None and alive(facts.root_pid):
        raise ColdstartError(
            f"pid {facts.root_pid} (the dumped root) is in use on this host: stop it or restore with --pidns")
    work = Path(opts.work_dir) if opts.work_dir else Path(tempfile.mkdtemp(prefix="coldstart-restore-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "restore.log"
    for stale in (log, work / "restored.pid", work / "restored"):
        stale.unlink(missing_ok=True)
    env = dict(os.environ)
    if opts.pidns or not opts.detach:
        (work / "notify.sh").write_text(NOTIFY_SCRIPT)
        os.chmod(work / "notify.sh", 0o755)
        env["COLDSTART_RESTORED_FILE"] = str(work / "restored")
    argv = restore_argv(criu, images, work, opts)

    t0 = time.monotonic()
    if not (opts.pidns or not opts.detach):
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            _, err = proc.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            _cleanup_after_failure(work, facts.pids, proc)
            raise ColdstartError(f"criu restore of {images} timed out after {opts.timeout:.0f} s") from None
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            _cleanup_after_failure(work, facts.pids, None)
            raise ColdstartError(_failure(images, log, err))
        pid = _read_pid(work)
        return RestoreResult(pid=pid, ns_pid=pid, seconds=seconds, images_dir=images, log_path=log, criu=criu,
                             mmap_pages=opts.mmap_pages, pidns=False, process=None)

    # pidns / child mode: CRIU stays alive; wait for its post-resume notification
    # stderr to a file, not a pipe: CRIU lives on as the namespace's init and must never block
    with open(work / "criu.stderr", "w") as errf:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=errf, env=env, start_new_session=True)
    ready = work / "restored"
    deadline = t0 + opts.timeout
    while not ready.exists():
        if popen.poll() is not None:
            err = (work / "criu.stderr").read_text(errors="replace")
            _cleanup_after_failure(work, facts.pids, popen)
            raise ColdstartError(_failure(images, log, err))
        if time.monotonic() > deadline:
            _cleanup_after_failure(work, facts.pids, popen)
            raise ColdstartError(f"criu restore of {images} timed out after {opts.timeout:.0f} s")
        time.sleep(0.001)
    seconds = time.monotonic() - t0
    ns_pid = _read_pid(work)
    if opts.pidns:
        # unshare -> criu (PID 1 inside) -> restored root
        inits = children(popen.pid)
        # criu's children: the restored root, and maybe the action-script shell still exiting
        roots = [c for c in (children(inits[0]) if inits else []) if inner_pid(c) == ns_pid]
        if len(roots) != 1:
            _cleanup_after_failure(work, facts.pids, popen)
            raise ColdstartError(f"restored tree of {images} not found under criu (children: {roots})")
        pid = roots[0]
    else:
        pid = ns_pid
    return RestoreResult(pid=pid, ns_pid=ns_pid, seconds=seconds, images_dir=images, log_path=log, criu=criu,
                         mmap_pages=opts.mmap_pages, pidns=opts.pidns, process=popen)


def _require_mmap(criu: Path) -> None:
    try:
        from coldstart.criu.locate import criu_supports_mmap
    except ImportError:
        return  # cannot tell: let criu itself refuse an unknown option
    if not criu_supports_mmap(criu):
        raise ColdstartError(f"{criu} has no --mmap-pages option: use the patched build (scripts/build-criu)")


def _read_pid(work: Path) -> int:
    try:
        return int((work / "restored.pid").read_text().strip())
    except (OSError, ValueError):
        raise ColdstartError(f"criu restore wrote no pidfile in {work}") from None


def _failure(images: Path, log: Path, stderr: str | None) -> str:
    if log.exists() and log.stat().st_size:
        why = logs.summarize(log)
    else:
        lines = [x for x in (stderr or "").strip().splitlines() if x.strip()]
        why = lines[-1] if lines else "criu exited without a log"
    return f"criu restore of {images} failed: {why} (full log: {log})"


def _cleanup_after_failure(work: Path, dumped_pids: list[int], popen: subprocess.Popen | None) -> None:
    """Kill whatever CRIU left behind: its own children, then the restored pid if it runs."""
    victims: list[int] = []
    if popen is not None:
        victims = [popen.pid] + descendants(popen.pid)
    for v in reversed(victims):
        _kill(v)
    if popen is not None:
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
    # detached mode: a tree CRIU already resumed before failing late (pidfile written)
    try:
        pid = int((work / "restored.pid").read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and pid in dumped_pids and alive(pid) and not victims:
        tree = [pid] + descendants(pid)
        for p in tree:
            _kill(p)
        wait_gone(tree)
    wait_gone(victims)
