"""Durability helpers shared by every stage that publishes an artifact (staging dir → fsync → rename)."""
from __future__ import annotations

import os
import stat
from pathlib import Path


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
