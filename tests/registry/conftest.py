"""Registry fixtures: a real OCI registry (Debian's docker-registry) on 127.0.0.1 with its own
storage, and a small tree with every kind of entry an artifact must carry."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from coldstart.engine.launcher import free_port
from coldstart.registry import server


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    srv = server.start(tmp_path_factory.mktemp("registry"), free_port())
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Files larger than a chunk and a pack, random (stored as is), text (stored compressed), bf16
    weights in a weights file and in a CRIU pages image (both stored byte-grouped and compressed), an
    empty file, a file with repeated chunks (stored once), a private file, nested and empty
    directories, a relative symlink, a FIFO and a unix socket."""
    root = tmp_path_factory.mktemp("tree") / "t"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "emptydir").mkdir()
    (root / "big.bin").write_bytes(os.urandom(3_500_000))
    w = np.random.default_rng(0).normal(0, 0.02, 400_000).astype(np.float32)  # bf16: a float32's high half
    (root / "weights.flat").write_bytes((w.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    w = np.random.default_rng(1).normal(0, 0.02, 400_000).astype(np.float32)
    (root / "pages-1.img").write_bytes((w.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    (root / "text.txt").write_text("".join(f"line {i}: {os.urandom(4).hex()} the quick brown fox\n"
                                           for i in range(20_000)))
    block = os.urandom(64 << 10)
    (root / "dup.bin").write_bytes(block * 6 + b"tail")
    (root / "empty").write_bytes(b"")
    (root / "sub" / "deeper" / "small.txt").write_text("hello\n")
    os.chmod(root / "sub" / "deeper" / "small.txt", 0o600)
    os.symlink("sub/deeper/small.txt", root / "link")
    (root / "manifest.json").write_text("{}\n")
    os.mkfifo(root / "sub" / "fifo")
    with socket.socket(socket.AF_UNIX) as s:  # a bound socket leaves its file (a snapshot's run dir has some)
        s.bind(str(root / "sub" / "sock"))
    return root
