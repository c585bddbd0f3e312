"""Checkpoint and restore containers (docker-py through docker_api's client).

Security, as measured so far (results/containers-caps, docs/containers.md): the checkpoint needs no
seccomp filter (CRIU suspends the tasks' filters to dump them); the restore runs under docker's
default seccomp profile. Both still get every capability but SYS_RESOURCE (absent from this machine's
bounding set): dropping NET_ADMIN or SYS_TIME made the restore fail, and SYS_ADMIN + SYS_PTRACE +
NET_ADMIN + SYS_TIME over docker's defaults did not finish in 240 s. The least set is still open.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BROAD_SECURITY: dict[str, Any] = {"cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"],
                                  "security_opt": ["seccomp=unconfined"]}
CHECKPOINT_SECURITY = BROAD_SECURITY
RESTORE_SECURITY: dict[str, Any] = {"cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"]}  # docker's default seccomp
STATE_TMPFS = {"/run/coldstart": "rw,exec,size=4g"}  # per-replica state: overlay upper dirs need a non-overlay fs
SHM_SIZE = "1g"  # vLLM's shared-memory buffers need more than docker's 64 MiB default


@dataclass
class CheckpointRun:
    exit_code: int
    logs: str
    seconds: float
    snapshot: Path


def checkpoint(c, image: str, model: Path, out: Path, *, port: int, extra: list[str] | None = None) -> CheckpointRun:
    """``coldstart checkpoint`` inside a container: the model mounted read-only at its own path,
    ``out``'s parent mounted read-write at /out (the snapshot is published there by a rename)."""
    model, out = Path(model).resolve(), Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["checkpoint", str(model), "--out", f"/out/{out.name}", "--port", str(port), *(extra or [])]
    t0 = time.monotonic()
    ctr = c.containers.run(image, cmd, entrypoint=["coldstart"], detach=True, shm_size=SHM_SIZE, network_mode="host",
                           volumes={str(model): {"bind": str(model), "mode": "ro"},
                                    str(out.parent): {"bind": "/out", "mode": "rw"}},
                           environment={"TMPDIR": "/out"}, **CHECKPOINT_SECURITY)
    try:
        res = ctr.wait(timeout=900)
        logs = ctr.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        ctr.remove(force=True)
    return CheckpointRun(int(res.get("StatusCode", -1)), logs, time.monotonic() - t0, out)


def start_restore(c, image: str, snapshot: Path, model: Path, *, name: str | None = None,
                  extra: list[str] | None = None):
    """A container whose entrypoint restores ``snapshot`` (mounted read-only at /snapshot), with a
    tmpfs for its per-replica state; returns the running container (the caller removes it)."""
    snapshot, model = Path(snapshot).resolve(), Path(model).resolve()
    return c.containers.run(image, ["/snapshot", *(extra or [])], detach=True, name=name, shm_size=SHM_SIZE,
                            network_mode="host", tmpfs=STATE_TMPFS,
                            volumes={str(snapshot): {"bind": "/snapshot", "mode": "ro"},
                                     str(model): {"bind": str(model), "mode": "ro"}},
                            **RESTORE_SECURITY)
