"""Session-wide fixtures shared by every stage's tests (expensive things are made once)."""
from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CACHE = Path(os.environ.get("COLDSTART_CACHE", "/var/cache/coldstart"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The default tiny Llama model (random weights, local tokenizer), made once per machine."""
    from coldstart.models.tiny import make_tiny

    out = CACHE / "models" / "tiny-seed0"
    if not (out / "config.json").exists():
        make_tiny(out, size="tiny", seed=0)
    return out


@dataclass
class TinySnapshot:
    out: Path  # the published snapshot directory
    manifest: Any  # coldstart.pipeline.manifest.Manifest
    timeline: Any  # the checkpoint's coldstart.pipeline.events.Timeline


@pytest.fixture(scope="session")
def tiny_snapshot(tiny_model_dir, tmp_path_factory) -> TinySnapshot:
    """ONE checkpoint of the tiny model per test session (a vLLM start plus a CRIU dump: minutes
    here), shared by the pipeline and metrics tests. Tests that damage it work on copies."""
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path_factory.mktemp("snapshot") / "snap"
    # the packed handles kept by name: the tiny model packs too fast for the default to keep them, and
    # the tests cover the path a bigger model takes on an AVX-512 host (manifest weights.pack_s)
    manifest, timeline = checkpoint(CheckpointOptions(model=tiny_model_dir, out=out, port=port, keep_packed=True),
                                    say=print)
    yield TinySnapshot(out, manifest, timeline)
    shutil.rmtree(out, ignore_errors=True)
