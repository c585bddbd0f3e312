"""One tiny-model snapshot per test session, shared by every pipeline test (a checkpoint costs a
vLLM start plus a CRIU dump: minutes on this machine). Fallback tests damage hard-linked copies."""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

# the prompts whose greedy answers a restored server must give exactly as a stock server does
PROMPTS = ("The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def snapshot(tiny_snapshot):
    """(snapshot dir, manifest) of the tiny model: the session's one checkpoint (tests/conftest.py)."""
    return tiny_snapshot.out, tiny_snapshot.manifest


@pytest.fixture
def snapshot_copy(snapshot, tmp_path):
    """A copy of the snapshot to damage: every file hard-linked (free), manifest.json copied.
    Replace a file (unlink + write) before changing its bytes, never write through the link."""
    src, _ = snapshot

    def make(name: str = "copy") -> Path:
        dst = tmp_path / name
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src)
            t = dst / rel
            if p.is_dir():
                t.mkdir(parents=True, exist_ok=True)
            elif not p.is_file():
                continue  # run/rpc's sockets: CRIU binds them anew
            elif p.name == "manifest.json":
                t.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, t)
            else:
                t.parent.mkdir(parents=True, exist_ok=True)
                os.link(p, t)
        return dst

    return make


def unlink_copy(path: Path) -> None:
    """Break the hard link so that writing ``path`` does not change the shared snapshot."""
    tmp = path.with_name(path.name + ".unlinked")
    shutil.copyfile(path, tmp)
    os.replace(tmp, path)
