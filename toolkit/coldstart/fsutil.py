"""Durability helpers shared by every stage that publishes an artifact (staging dir → fsync → rename)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator


def fsync_dir(d: Path) -> None:
    """fsync a directory, so that a rename or a new entry in it survives a crash."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under ``root`` (symlinks, sockets and FIFOs are left
    alone: a live run dir holds vLLM's RPC sockets), before the caller renames it into place or
    writes the marker that publishes it."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if not stat.S_ISREG(os.lstat(p).st_mode):
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def data_extents(fd: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of data in the open file ``fd``, skipping its holes (SEEK_DATA /
    SEEK_HOLE): vLLM's /dev/shm buffers are ~400 MB long and hold a few pages of data."""
    size = os.fstat(fd).st_size
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            return
        off = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, off


def publish_dir(stage: Path, target: Path) -> None:
    """Make a fully written staging dir appear at ``target`` all at once and durably: every file
    fsynced, one rename, the parent fsynced. The caller removes ``stage`` if this raises."""
    fsync_tree(stage)
    os.rename(stage, target)
    fsync_dir(Path(target).parent)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: a temporary file beside it, fsynced, renamed over
    it, the directory fsynced. A killed writer leaves the old file (and at most a hidden temp file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_results(out_dir: Path, rows: list[dict], table: str, command: str) -> None:
    """A benchmark's raw.jsonl, table.md and COMMAND, each replaced atomically (other files in
    ``out_dir``, e.g. earlier runs kept beside the current one, are left alone)."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "raw.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write_atomic(out_dir / "table.md", table)
    write_atomic(out_dir / "COMMAND", command.rstrip("\n") + "\n")
