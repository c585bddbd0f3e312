"""`coldstart mount REF MOUNTPOINT`: an artifact served read-only and lazily by our FUSE daemon
(lazyfs/, Rust: coldstart-lazyfs). The one owner of that daemon's command line.

Here, in Python, the part that must be right before anything is served: the manifest and the index
are fetched and verified (sha256) and the index written to the node cache. The daemon then fetches
chunks on first read (range GETs on the packs), checks each against its BLAKE3 digest before any
byte of it is returned, keeps them in the node's content-addressed chunk cache (shared by every
mount on the node) and prefetches the rest in the index's first-access order. The cache may be
bounded (COLDSTART_LAZY_CACHE_MAX_BYTES): least recently used chunks are evicted, never one that a
live mount uses.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import write_atomic
from coldstart.state import cache_root

DAEMON = "coldstart-lazyfs"
# the daemon's log line for a chunk whose bytes failed their digest on the first fetch and on the
# retry (lazyfs/src/store.rs, Store::verified): the registry serves it damaged, every read of it is EIO
_CORRUPT_LINE = re.compile(r"chunk (blake3:[0-9a-f]+) from pack \S+ failed verification twice")


def cache_dir() -> Path:
    """The node's chunk cache: on disk (a tmpfs would hold every chunk twice in memory, once more in
    the page cache). COLDSTART_LAZY_CACHE overrides."""
    return Path(os.environ.get("COLDSTART_LAZY_CACHE")
                or cache_root() / "lazy-cache")


def daemon_binary() -> str:
    exe = os.environ.get("COLDSTART_LAZYFS") or str(
        cache_root() / "lazyfs" / "current" / DAEMON)
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        found = shutil.which(DAEMON)
        if not found:
            raise ColdstartError(f"{DAEMON} not found at {exe} (scripts/setup builds it from lazyfs/)")
        exe = found
    return exe


# a restore container's view of the host's lazy mount of its snapshot (containers.run.create_restore):
# the daemon's log and the index, bound read-only, so that its entrypoint sees damage the daemon finds
LOG_ENV, INDEX_ENV, REF_ENV = "COLDSTART_LAZY_LOG", "COLDSTART_LAZY_INDEX", "COLDSTART_LAZY_REF"


@dataclass
class DamageLog:
    """The chunks a daemon found damaged in the registry, read from its log: each failed its BLAKE3
    digest twice, so every read of it is EIO and a restored process mapping it takes SIGBUS."""
    log: Path
    index: Path  # the mount's index (the node cache's copy): which files hold a chunk
    name: str  # the reference (or the mount point) the messages name
    _seen: int = field(default=0, repr=False)  # bytes of the log read so far
    _corrupt: list = field(default_factory=list, repr=False)  # damaged chunk digests, in the order logged

    def corrupt_chunks(self) -> dict[str, list[str]]:
        """Chunk digest -> the paths in the tree that hold it, for every damaged chunk logged so far.
        Reads only what the daemon logged since the last call."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self._seen)
                new = f.read()
        except OSError:
            return self._files(self._corrupt)
        new = new[:new.rfind(b"\n") + 1]  # a line still being written: next time
        self._seen += len(new)
        for m in _CORRUPT_LINE.finditer(new.decode(errors="replace")):
            if m.group(1) not in self._corrupt:
                self._corrupt.append(m.group(1))
        return self._files(self._corrupt)

    def _files(self, digests) -> dict[str, list[str]]:
        if not digests:
            return {}
        try:
            idx = json.loads(Path(self.index).read_text())
            by_chunk = {i: c.get("digest") for i, c in enumerate(idx.get("chunks", []))}
            paths: dict[str, list[str]] = {d: [] for d in digests}
            for e in idx.get("entries", []):
                for ci in e.get("chunks") or []:
                    if by_chunk.get(ci) in paths and e["path"] not in paths[by_chunk[ci]]:
                        paths[by_chunk[ci]].append(e["path"])
            return paths
        except (OSError, ValueError, KeyError, TypeError):
            return {d: [] for d in digests}


def damage_log_from_env() -> DamageLog | None:
    """Inside a restore container whose snapshot is the host's lazy mount: that daemon's DamageLog."""
    log, index = os.environ.get(LOG_ENV), os.environ.get(INDEX_ENV)
    if not (log and index):
        return None
    return DamageLog(Path(log), Path(index), os.environ.get(REF_ENV) or "the snapshot")


def index_path(manifest_digest: str) -> Path:
    """The node cache's copy of the index of the artifact with this manifest digest."""
    return cache_dir() / "indexes" / f"{manifest_digest.split(':', 1)[1]}.json"


@dataclass
class Mount:
    mountpoint: Path
    pid: int
    manifest_digest: str
    log: Path
    proc: subprocess.Popen | None = None
    made_dir: bool = False  # the mount point was created for this mount (removed at unmount)
    kind: str = ""  # the index's kind: a tree (a snapshot) or a runtime (artifact.RUNTIME_KIND)
    prefix: str = ""  # a runtime: the path its server was checkpointed with it at
    prefetch: str = "all"  # what the daemon prefetches by itself (PREFETCH)
    ref: str = ""
    _damage: DamageLog | None = field(default=None, repr=False)

    @property
    def damage(self) -> DamageLog:
        """The daemon's log, read for chunks the registry serves damaged."""
        if self._damage is None:
            self._damage = DamageLog(self.log, index_path(self.manifest_digest), self.ref or str(self.mountpoint))
        return self._damage

    def corrupt_chunks(self) -> dict[str, list[str]]:
        """The chunks the daemon found damaged in the registry so far (DamageLog.corrupt_chunks)."""
        return self.damage.corrupt_chunks()

    def fetch_all(self) -> bool:
        """Have the daemon prefetch every chunk it has not fetched (SIGUSR1), in the background: once
        done the workload no longer depends on the registry or the link. False: the daemon is gone."""
        try:
            os.kill(self.pid, signal.SIGUSR1)
            return True
        except ProcessLookupError:
            return False

    def unmount(self, timeout: float = 10.0) -> None:
        """Unmount and wait for the daemon to exit (it keeps serving until then: a restored process
        mapping files of the mount must be gone first, or it takes SIGBUS on its next fault)."""
        try:
            unmount_point(self.mountpoint, lazy=True)
        except ColdstartError:
            pass  # not mounted any more (the daemon still gets its SIGTERM)
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end = time.monotonic() + timeout
        while time.monotonic() < end and _alive(self.pid, self.proc):
            time.sleep(0.05)
        if self.made_dir:
            try:
                self.mountpoint.rmdir()
            except OSError:
                pass


def unmount_point(mountpoint: Path | str, lazy: bool = False) -> None:
    """Unmount a mount of the daemon (which then exits by itself). ``lazy``: detach it even while
    files are open (a process still mapping them takes SIGBUS on its next miss)."""
    p = subprocess.run(["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise ColdstartError(f"cannot unmount {mountpoint}: {p.stderr.strip() or p.returncode}")


DEAD_MOUNT = (errno.ENOTCONN, errno.ECONNABORTED)  # what a FUSE mount answers once its daemon is gone


def _dead(mountpoint: Path | str) -> bool:
    """A FUSE mount whose daemon is gone (statvfs is answered by the daemon; a stat may come from the
    kernel's attribute cache for a while)."""
    try:
        os.statvfs(mountpoint)
    except OSError as e:
        return e.errno in DEAD_MOUNT
    return False


def unmount_left(mountpoint: Path) -> bool:
    """Unmount a mount its users left behind (lazily: nothing should map it now) and remove its mount
    point; False where the unmount was refused (left for `coldstart umount`). A mount whose daemon is
    gone counts as mounted (os.path.ismount says False there: its stat fails)."""
    if _dead(mountpoint) or os.path.ismount(mountpoint):
        try:
            unmount_point(mountpoint, lazy=True)
        except ColdstartError:
            return False
    try:
        Path(mountpoint).rmdir()
    except OSError:
        pass
    return True


def sweep_dead(root: Path) -> list[Path]:
    """Unmount the mounts under ``root`` whose daemon is gone (its owner was SIGKILLed before it could
    unmount: every access then fails, ENOTCONN or ECONNABORTED, and the mount point stays) and remove
    their mount points; returns them. A live mount is left alone, whoever made it."""
    return [mp for mp in (sorted(root.iterdir()) if root.is_dir() else []) if _dead(mp) and unmount_left(mp)]


def _alive(pid: int, proc: subprocess.Popen | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


PREFETCH = ("all", "profiled", "none")


def mount(ref: str, mountpoint: Path, *, prefetch: bool | str | None = None, threads: int = 8,
          timeout_s: float = 30.0, ready_timeout: float = 15.0, cache_max_bytes: int | None = None) -> Mount:
    """Mount ``ref`` at ``mountpoint`` (created if missing) and return once it serves. The daemon runs
    in its own session: it outlives the caller until ``unmount``. ``prefetch``: "all" (every chunk, in
    first-access order), "profiled" (only the chunks the access profile names: a runtime tree, of
    which a restore reads a few percent), "none"; True/False = all/none; None = COLDSTART_LAZY_PREFETCH
    or all (the restore entrypoint has no flag for it). ``cache_max_bytes``: the node cache's bound,
    kept by this daemon (None: COLDSTART_LAZY_CACHE_MAX_BYTES, unset or 0 = none)."""
    from coldstart.registry.artifact import fetch_index_blob  # (requests: not on the entrypoint's path)
    from coldstart.registry.distribution import Ref, Registry

    if prefetch is None:
        prefetch = os.environ.get("COLDSTART_LAZY_PREFETCH") or "all"
    prefetch = {True: "all", False: "none"}.get(prefetch, prefetch) if isinstance(prefetch, bool) else prefetch
    if prefetch not in PREFETCH:
        raise ColdstartError(f"prefetch {prefetch!r}: expected one of {', '.join(PREFETCH)}")
    if cache_max_bytes is None:
        raw_max = os.environ.get("COLDSTART_LAZY_CACHE_MAX_BYTES") or "0"
        if not raw_max.isdigit():
            raise ColdstartError(f"COLDSTART_LAZY_CACHE_MAX_BYTES={raw_max!r}: a number of bytes (0: no bound)")
        cache_max_bytes = int(raw_max)
    r = Ref.parse(ref)
    reg = Registry(r)
    raw, head, mdigest, _ = fetch_index_blob(reg)
    kind, prefix = str(head.get("kind", "")), str(head.get("prefix", ""))
    cache = cache_dir()
    (cache / "indexes").mkdir(parents=True, exist_ok=True)
    idx = index_path(mdigest)
    if not idx.exists():
        write_atomic(idx, raw)
    mountpoint = Path(mountpoint)
    made = not mountpoint.exists()
    mountpoint.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(mountpoint):
        raise ColdstartError(f"{mountpoint} is already a mount point")
    logs = cache / "logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"{mdigest.split(':', 1)[1][:16]}-{os.getpid()}-{time.time_ns()}.log"  # one per mount, even two in a second
    ready = logs / f".ready-{os.getpid()}-{time.monotonic_ns()}"
    argv = [daemon_binary(), "--index", str(idx), "--registry", f"{r.scheme}://{r.host}", "--repo", r.repo,
            "--cache", str(cache), "--cache-max-bytes", str(cache_max_bytes), "--mountpoint", str(mountpoint),
            "--prefetch", prefetch,
            "--threads", str(threads), "--timeout-s", str(int(timeout_s)), "--ready-file", str(ready),
            "--log-file", str(log)]
    if os.environ.get("COLDSTART_LAZY_READ_AHEAD_KB"):  # sparse faults (a restore) fetch less with less
        argv += ["--read-ahead-kb", os.environ["COLDSTART_LAZY_READ_AHEAD_KB"]]
    # credentials by the environment (argv shows in ps): the header that worked for the index, and
    # what the daemon renews it with when the registry answers 401 (an expired token)
    env = {**os.environ, "COLDSTART_LAZYFS_AUTH": reg._auth or ""}
    if reg.username:
        env.update(COLDSTART_REGISTRY_USER=reg.username, COLDSTART_REGISTRY_PASSWORD=reg.password or "")
    if isinstance(reg.verify, str):
        argv += ["--ca-file", reg.verify]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    end = time.monotonic() + ready_timeout
    while time.monotonic() < end:
        if ready.exists():
            ready.unlink(missing_ok=True)
            return Mount(mountpoint, proc.pid, mdigest, log, proc, made, kind, prefix, prefetch, ref)
        if proc.poll() is not None:
            err = (proc.stderr.read() or b"").decode(errors="replace").strip().splitlines()
            raise ColdstartError(f"{DAEMON} exited with {proc.returncode}: {err[-1] if err else 'no message'}")
        time.sleep(0.02)
    proc.kill()
    raise ColdstartError(f"{DAEMON} did not mount {mountpoint} within {ready_timeout:.0f} s (log: {log})")


def as_reference(arg: str) -> str | None:
    """``arg`` if it names a registry reference rather than a directory (host[:port]/repo..., not an
    existing path nor one starting with / or .), else None: how `restore` and `container restore`
    tell a snapshot directory from a reference."""
    if Path(arg).exists() or arg.startswith(("/", ".")) or "/" not in arg:
        return None
    return arg


def mount_point_for(ref: str, tag: str = "") -> Path:
    """A mount point of its own for one restore of ``ref`` (replicas share the node's chunk cache,
    not a mount), under the node's state dir."""
    import re

    from coldstart.state import state_dir

    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", ref)[-60:]
    return state_dir() / "mounts" / f"{tag}{name}-{os.getpid()}"
