"""`criu dump` of a process tree into an image directory that appears only when complete.

CRIU writes straight into its -D directory, so a failed or killed dump would leave a
half-written image that a later restore might trust. We dump into a hidden staging directory
next to the target, fsync it, and rename it into place; on failure the staging directory is
removed and the error names CRIU's failing log line.
"""
from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.criu import logs
from coldstart.criu._common import resolve_criu, shared_flags
from coldstart.fsutil import publish_dir
from coldstart.criu.images import image_facts
from coldstart.errors import ColdstartError


@dataclass
class DumpOptions:
    """Defaults are the flag set a vLLM server tree needs (ENVIRONMENT.md)."""

    variant: str = "patched"  # which project build of criu ("patched" dumps like stock)
    criu_path: Path | None = None  # explicit binary, overrides `variant`
    leave_running: bool = False  # keep the tree running after the dump (else CRIU kills it)
    tcp_established: bool = True  # vLLM's API server and engine talk over loopback TCP
    shell_job: bool = True  # the tree may share a session/terminal with its launcher
    ext_unix_sk: bool = True  # unix sockets to peers outside the tree (e.g. journald)
    skip_in_flight: bool = True  # half-open TCP connections would fail the dump
    link_remap: bool = True  # deleted-but-open files (/dev/shm/sem.*) are saved as link-remaps
    ghost_limit: str | None = "100M"  # deleted files up to this size are copied into the image
    file_locks: bool = True  # flock/posix locks (vLLM caches, pid files)
    network_lock: str | None = "nftables"  # this host has no iptables binary; libnftables is built in
    log_level: int = 4  # dumps are rare: keep the full log for diagnosis
    timeout: float = 600.0
    extra_args: list[str] = field(default_factory=list)


@dataclass
class DumpResult:
    images_dir: Path
    pid: int  # root of the dumped tree
    seconds: float  # wall time of `criu dump`
    pages_bytes: int  # total size of pages-*.img
    total_bytes: int  # whole image directory
    n_processes: int
    log_path: Path
    criu: Path
    leave_running: bool


def dump_argv(criu: Path, pid: int, images_dir: Path, opts: DumpOptions) -> list[str]:
    a = [str(criu), "dump", "-t", str(pid), "-D", str(images_dir), "-o", "dump.log", f"-v{opts.log_level}"]
    a += shared_flags(tcp_established=opts.tcp_established, shell_job=opts.shell_job,
                      ext_unix_sk=opts.ext_unix_sk, file_locks=opts.file_locks,
                      network_lock=opts.network_lock)
    if opts.skip_in_flight:
        a.append("--skip-in-flight")
    if opts.link_remap:
        a.append("--link-remap")
    if opts.ghost_limit:
        a += ["--ghost-limit", opts.ghost_limit]
    if opts.leave_running:
        a.append("--leave-running")
    return a + list(opts.extra_args)


def dump(pid: int, images_dir: str | Path, opts: DumpOptions | None = None) -> DumpResult:
    """Checkpoint the tree rooted at `pid` into `images_dir` (which must not exist yet)."""
    opts = opts or DumpOptions()
    target = Path(images_dir).absolute()
    if target.exists():
        raise ColdstartError(f"{target} already exists: CRIU images are immutable, dump into a new directory")
    if not Path(f"/proc/{pid}").exists():
        raise ColdstartError(f"no process with pid {pid} to dump")
    criu = resolve_criu(opts.variant, opts.criu_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        argv = dump_argv(criu, pid, staging, opts)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            raise ColdstartError(f"criu dump of pid {pid} timed out after {opts.timeout:.0f} s") from None
        seconds = time.monotonic() - t0
        log = staging / "dump.log"
        if proc.returncode != 0:
            why = logs.summarize(log) if log.exists() else (proc.stderr.strip().splitlines() or ["?"])[-1]
            kept = _keep_log(log, target, "dump")
            raise ColdstartError(f"criu dump of pid {pid} failed: {why}" + (f" (full log: {kept})" if kept else ""))
        publish_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    facts = image_facts(target)
    return DumpResult(images_dir=target, pid=pid, seconds=seconds, pages_bytes=facts.pages_bytes,
                      total_bytes=facts.total_bytes, n_processes=facts.n_processes,
                      log_path=target / "dump.log", criu=criu, leave_running=opts.leave_running)


def _keep_log(log: Path, target: Path, what: str) -> Path | None:
    """Keep the failing log next to (not inside) the would-be image dir, for a human to read."""
    if not log.exists():
        return None
    dst = target.parent / f"{target.name}.{what}-failed.log"
    try:
        shutil.copyfile(log, dst)
    except OSError:
        return None
    return dst
