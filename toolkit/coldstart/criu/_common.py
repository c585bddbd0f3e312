"""Bits shared by dump and restore: which criu binary, and the flags vLLM processes need."""
from __future__ import annotations

import os
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import fsync_dir, fsync_tree  # noqa: F401  (re-exported for the criu stage)


def resolve_criu(variant: str = "patched", criu_path: str | Path | None = None) -> Path:
    """The criu binary to run: an explicit path, else the project build of `variant`."""
    if criu_path:
        p = Path(criu_path)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ColdstartError(f"criu binary {p} does not exist or is not executable")
        return p
    from coldstart.criu.locate import find_criu  # honours $COLDSTART_CRIU

    return Path(find_criu(variant=variant))


def shared_flags(*, tcp_established: bool, shell_job: bool, ext_unix_sk: bool, file_locks: bool,
                 network_lock: str | None) -> list[str]:
    """Flags that dump and restore must agree on (CRIU refuses a restore that lacks them)."""
    a: list[str] = []
    if tcp_established:
        a.append("--tcp-established")
    if shell_job:
        a.append("--shell-job")
    if ext_unix_sk:
        a.append("--ext-unix-sk")
    if file_locks:
        a.append("--file-locks")
    if network_lock:
        a += ["--network-lock", network_lock]
    return a
