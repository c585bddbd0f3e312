"""Session-wide fixtures shared by every stage's tests (expensive things are made once)."""
from __future__ import annotations

import os
from pathlib import Path

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
