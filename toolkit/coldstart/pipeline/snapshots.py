"""Snapshots on this host: list them with size and state, remove one that nothing uses, verify one.

A snapshot is in use while a live restore maps its files (the patched CRIU maps pages-*.img into the
restored processes, the weights may be mapped too) or while a restore started from it still runs
(its state dir names the snapshot and the entrypoint's PID). Removing one in use would take the
pages from under a running server (SIGBUS), so ``remove`` refuses.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.criu.restore import alive
from coldstart.errors import ColdstartError
from coldstart.pipeline import integrity
from coldstart.pipeline.manifest import MANIFEST_NAME, read_manifest
from coldstart.state import restores_dir

OWNER = "owner.json"  # in each restore's state dir: {"snapshot": path, "pid": entrypoint pid, "server_pid", "mounts"}


@dataclass
class SnapshotInfo:
    path: Path
    state: str  # ready | in use | partial (an unfinished or killed checkpoint's staging dir)
    bytes: int = 0
    model: str = ""
    created_at: str = ""
    users: list[int] = field(default_factory=list)  # PIDs mapping its files or restoring from it


def write_owner(restore_dir: Path, snapshot: Path, server_pid: int = 0, mounts: list[Path] = ()) -> None:
    """``mounts``: the restore's lazy mounts (its snapshot's, its runtime's), to be unmounted with its
    dir once its entrypoint and server are gone."""
    (restore_dir / OWNER).write_text(json.dumps({"snapshot": str(snapshot.resolve()), "pid": os.getpid(),
                                                 "server_pid": server_pid, "mounts": [str(p) for p in mounts]}))


def gc_restore_dirs() -> list[Path]:
    """Remove the state dirs of restores whose entrypoint and server are both gone (a restore with
    --no-serve leaves its server running on its dir, so the entrypoint's exit alone is no reason),
    and unmount the lazy mounts they recorded (such a restore has no entrypoint left to do it), and
    any mount of the node's whose daemon is gone (registry.mount.sweep_dead)."""
    from coldstart.registry.mount import sweep_dead, unmount_left
    from coldstart.state import state_dir

    removed = []
    for owner in (restores_dir().glob("*/" + OWNER) if restores_dir().is_dir() else []):
        try:
            o = json.loads(owner.read_text())
        except (OSError, ValueError):
            continue
        if not any(alive(int(o.get(k) or 0)) for k in ("pid", "server_pid") if int(o.get(k) or 0) > 0):
            for mp in o.get("mounts") or []:
                unmount_left(Path(mp))
            shutil.rmtree(owner.parent, ignore_errors=True)
            removed.append(owner.parent)
    sweep_dead(state_dir() / "mounts")
    return removed


def users(snap: Path) -> list[int]:
    """PIDs that map or hold open a file of ``snap``, or whose restore of it still runs."""
    root = str(Path(snap).resolve()) + "/"
    found: set[int] = set()
    for d in (restores_dir().glob("*/" + OWNER) if restores_dir().is_dir() else []):
        try:
            o = json.loads(d.read_text())
        except (OSError, ValueError):
            continue
        if str(o.get("snapshot", "")) + "/" == root and alive(int(o.get("pid", 0))):
            found.add(int(o["pid"]))
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/maps") as f:
                if any(root in line for line in f):
                    found.add(int(name))
                    continue
            for fd in os.listdir(f"/proc/{name}/fd"):
                if os.readlink(f"/proc/{name}/fd/{fd}").startswith(root):
                    found.add(int(name))
                    break
        except OSError:
            continue
    return sorted(found)


def _size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def info(path: Path) -> SnapshotInfo:
    path = Path(path)
    if path.name.startswith(".") and ".partial-" in path.name:
        return SnapshotInfo(path=path, state="partial", bytes=_size(path))
    m = read_manifest(path)
    u = users(path)
    return SnapshotInfo(path=path, state="in use" if u else "ready", model=Path(m.model).name,
                        bytes=sum(f.size for f in m.files.values()), created_at=m.created_at, users=u)


def find(roots: list[Path]) -> list[SnapshotInfo]:
    """Snapshots given directly or found one level below each root (partial ones too)."""
    out = []
    for r in map(Path, roots):
        if (r / MANIFEST_NAME).is_file():
            out.append(info(r))
            continue
        if not r.is_dir():
            raise ColdstartError(f"{r}: no such directory")
        for d in sorted(r.iterdir()):
            if d.is_dir() and ((d / MANIFEST_NAME).is_file() or ".partial-" in d.name):
                out.append(info(d))
    return out


def remove(path: Path, force: bool = False) -> None:
    """Delete a snapshot nothing uses (``force``: even then). Read-only copies are made writable first."""
    path = Path(path)
    if not (path / MANIFEST_NAME).is_file() and ".partial-" not in path.name:
        raise ColdstartError(f"{path} is not a snapshot (no {MANIFEST_NAME})")
    u = users(path)
    if u and not force:
        raise ColdstartError(f"{path} is in use by PIDs {', '.join(map(str, u))} (a live restore maps its "
                             "files); stop them first")
    for d, _dirs, _files in os.walk(path):
        os.chmod(d, os.stat(d).st_mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(path)


def verify(path: Path, mode: str = "full") -> dict:
    """Check every file's digests now (``mode`` full) and remember them on this node, so that the
    restores after it skip the check: the first restore on a node then pays nothing for integrity."""
    m = read_manifest(path)
    return integrity.verify(Path(path), m.files, mode=mode)
