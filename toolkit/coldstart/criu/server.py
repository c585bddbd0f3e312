"""CRIU for a vLLM server tree: the dump and restore command lines the pipeline runs.

Built from the stage's own argv builders (``dump.dump_argv``, ``restore.restore_argv``) with the
options a vLLM server needs (ENVIRONMENT.md): ``--tcp-established`` (the HTTP listener and gloo's
loopback connections), ``--ext-unix-sk``, ``--link-remap`` (deleted /dev/shm/sem.* files),
``--ghost-limit`` (deleted temp files), ``--shell-job``. The dump runs inside the server's mount
namespace (``nsenter``), where its run dir sits at the canonical path, so the image names that path
and no host path. ``COLDSTART_CRIU`` overrides the binary (tests point it at a missing path to force
the fallback).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from coldstart.criu import logs
from coldstart.criu.dump import DumpOptions, dump_argv
from coldstart.criu.restore import NOTIFY_SCRIPT, RestoreOptions, restore_argv as stage_restore_argv
from coldstart.errors import ColdstartError
from coldstart.procutil import die_with_parent

GHOST_LIMIT = "512M"  # deleted temp files of a vLLM tree are copied into the image up to this size


def plugin_args() -> list[str]:
    """``-L DIR`` for CRIU plugins (the CUDA plugin, which drives cuda-checkpoint, on a GPU host:
    unverified on GPU). COLDSTART_CRIU_PLUGINS names the directory; none on CPU hosts."""
    d = os.environ.get("COLDSTART_CRIU_PLUGINS")
    return ["-L", d] if d else []


def find(variant: str = "patched") -> str:
    """Absolute path of the criu binary to use (raises ColdstartError naming what is missing)."""
    env = os.environ.get("COLDSTART_CRIU")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise ColdstartError(f"criu binary {env} (COLDSTART_CRIU) does not exist or is not executable")
        return env
    from coldstart.criu.locate import find_criu  # one place knows where our builds live

    try:
        return str(find_criu(variant))
    except ColdstartError:
        if variant != "stock":
            return find("stock")  # restore still works without the patch, only slower
        raise


def supports_mmap_pages(criu: str) -> bool:
    """Whether this criu is our patched one (restore maps pages-*.img instead of copying)."""
    from coldstart.criu.locate import criu_supports_mmap  # cached per binary

    try:
        return criu_supports_mmap(Path(criu))
    except (ColdstartError, subprocess.SubprocessError):
        return False


@contextlib.contextmanager
def remap_lock():
    """Host-wide lock around CRIU's use of /dev/shm/link_remap.<id> files.

    Why: CRIU names a link remap after the file's id in the image, and two vLLM trees have the same
    ids, so two dumps at once collide in the host's /dev/shm ("Can't link remap ...: File exists").
    Held from before the dump until its remaps are saved and removed. (Restores put theirs back in
    a private /dev/shm and need no lock.)"""
    import fcntl

    d = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
    with open(d / "coldstart-link-remap.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


KDAT_FILES = ("/run/criu.kdat", "/dev/shm/criu.kdat")  # where criu keeps its kernel facts (tmpfs: per boot)
_node_copy: Path | None = None  # the node's copy this process's facts came from (ensure_kerndat)


def ensure_kerndat(criu: str) -> str:
    """CRIU caches kernel facts in a tmpfs file on its first run; made outside the restore's PID
    namespace (where /proc is the host's), once per boot. A new container's /dev/shm starts empty,
    and probing them (``criu check``) took 30-50 ms of every container restore, so the facts are
    also kept in the node dir, which replicas share (``kdat_key``: only where they hold for this
    process; the file's digest in its name). Returns where they came from: "cached", "node" or
    "probed"."""
    from coldstart.fsutil import write_atomic

    global _node_copy
    if any(Path(p).exists() for p in KDAT_FILES):
        return "cached"
    shared = _node_kdat(criu)
    for target in KDAT_FILES:
        found = _node_facts(shared, target) if shared is not None else None
        if found is not None and Path(target).parent.is_dir():
            try:
                write_atomic(Path(target), found[1])
                _node_copy = found[0]
                return "node"
            except OSError:
                break
    subprocess.run([criu, "check"], capture_output=True, timeout=60)
    made = next((Path(p) for p in KDAT_FILES if Path(p).exists()), None)
    if shared is not None and made is not None:
        import xxhash

        try:
            data = made.read_bytes()
            shared.mkdir(parents=True, exist_ok=True)
            write_atomic(shared / f"{_kdat_name(str(made))}.{xxhash.xxh3_64(data).hexdigest()}", data)
        except OSError:
            pass  # a read-only node dir: the next restore probes again
    return "probed"


def forget_node_kerndat() -> bool:
    """After CRIU failed with facts copied from the node: remove that copy, so that the next restore
    probes them itself (a copy that does not hold here, e.g. under a seccomp profile the key cannot
    tell apart, then fails one restore, not every one). Whether there was one to remove."""
    global _node_copy
    copy, _node_copy = _node_copy, None
    if copy is None:
        return False
    copy.unlink(missing_ok=True)
    return True


def _node_facts(shared: Path, target: str) -> tuple[Path, bytes] | None:
    """The node's copy of the facts for ``target`` whose content matches the digest in its name (a
    damaged one is removed, so that the restore probes and writes it again)."""
    import xxhash

    for f in shared.glob(_kdat_name(target) + ".*"):
        try:
            data = f.read_bytes()
            if xxhash.xxh3_64(data).hexdigest() == f.suffix[1:]:
                return f, data
            f.unlink()
        except OSError:
            continue
    return None


def kdat_key(criu: str) -> str:
    """What CRIU's kernel facts depend on beyond the kernel: this boot, the criu build (and the libc
    it probes rseq through), the process's capabilities, seccomp and LSM label (a filter answering
    clone3 with ENOSYS, a dropped capability), its user namespace and its network namespace's IPv6.
    CRIU itself checks only a magic number that every build of ours shares."""
    import xxhash

    def read(path: str) -> str:
        try:
            return Path(path).read_text(errors="replace").strip()
        except OSError:
            return "-"

    st = os.stat(criu)
    status = [ln for ln in read("/proc/self/status").splitlines()
              if ln.startswith(("Cap", "Seccomp", "NoNewPrivs"))]
    parts = [read("/proc/sys/kernel/random/boot_id"), os.path.realpath(criu), str(st.st_size), str(st.st_mtime_ns),
             os.confstr("CS_GNU_LIBC_VERSION") or "-", *status, read("/proc/self/attr/current"),
             read("/proc/self/uid_map"), read("/proc/sys/net/ipv6/conf/all/disable_ipv6"),
             str(os.path.exists("/proc/net/if_inet6"))]
    return xxhash.xxh3_64("|".join(parts).encode()).hexdigest()


def _node_kdat(criu: str) -> Path | None:
    from coldstart.state import node_dir

    try:
        return node_dir() / "criu-kdat" / kdat_key(criu)
    except OSError:
        return None


def _kdat_name(target: str) -> str:
    return target.strip("/").replace("/", "_")


def kernel_check(criu: str) -> str:
    """"" when ``criu check`` finds every kernel feature it needs on this kernel, else its complaint.
    Cached per (kernel build, criu binary) in the node's state dir: it runs once per boot image."""
    import platform

    import xxhash

    from coldstart.state import state_dir

    st = os.stat(criu)
    key = xxhash.xxh3_64(f"{platform.release()}|{criu}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    cache = state_dir() / "criu-check" / key
    if cache.is_file():
        return cache.read_text()
    try:
        r = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        verdict = "" if r.returncode == 0 and "Looks good" in out else (
            " | ".join(ln for ln in out.splitlines() if "rror" in ln)[-300:] or out[-300:] or f"exit {r.returncode}")
    except (OSError, subprocess.SubprocessError) as e:
        verdict = f"criu check could not run: {e}"
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(verdict)
    except OSError:
        pass
    return verdict


def _log_tail(log: Path, n: int = 4) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln or "error" in ln]
    except OSError:
        return ""
    return " | ".join(ln.strip()[-200:] for ln in lines[-n:])


def dump(criu: str, pid: int, images: Path, log_dir: Path, timeout: float = 600,
         in_mount_ns: bool = True) -> None:
    """Dump the tree rooted at ``pid``; with ``in_mount_ns`` criu runs in that tree's mount namespace."""
    images.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "dump.log"
    opts = DumpOptions(log_level=4, ghost_limit=GHOST_LIMIT, extra_args=["-W", str(log_dir), *plugin_args()])
    argv = dump_argv(Path(criu), pid, images, opts)
    if in_mount_ns:
        argv = [shutil.which("nsenter") or "nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", *argv]
    for attempt in range(4):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=die_with_parent)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ColdstartError(f"criu dump of pid {pid} could not run: {e}") from e
        # a link_remap.<id> left by someone else's dump or restore: a failed dump leaves the tree
        # running, so wait for them to finish and try again
        if r.returncode == 0 or "Can't link remap" not in _log_tail(log, 10) or attempt == 3:
            break
        time.sleep(5)
    if r.returncode != 0:
        why = logs.summarize(log) if log.is_file() else r.stderr.strip()[-300:]  # the first errors: the cause
        raise ColdstartError(f"criu dump of pid {pid} failed (log {log}): {why}")


def restore_argv(criu: str, images: Path, work_dir: Path, mmap_pages: bool) -> list[str]:
    """``criu restore`` that stays the restored tree's parent (not ``-d``).

    Why not detached: the server was started under ``unshare --kill-child``, which set its parent-death
    signal to SIGKILL; CRIU restores that, so a detached restore (CRIU exits) kills the server at
    once. CRIU staying alive as the parent also keeps the chain entrypoint → criu → server, and CRIU
    exits with the server. The post-resume action script tells us when the tree runs."""
    notify = work_dir / "notify.sh"
    notify.write_text(NOTIFY_SCRIPT)
    notify.chmod(0o755)
    extra = ["--link-remap", *plugin_args()]
    if os.environ.get("COLDSTART_CRIU_FILE_VALIDATION"):
        extra += ["--file-validation", os.environ["COLDSTART_CRIU_FILE_VALIDATION"]]
    log_level = int(os.environ.get("COLDSTART_CRIU_LOG_LEVEL", "2"))
    opts = RestoreOptions(mmap_pages=0 if mmap_pages else None, detach=False, log_level=log_level, extra_args=extra)
    return stage_restore_argv(Path(criu), images, work_dir, opts)
