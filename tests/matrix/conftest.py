"""Matrix fixtures: a flat weights dump of the tiny model (the probe cells load it for real)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_flat(tiny_model_dir: Path, tmp_path_factory) -> Path:
    from coldstart.weights.dump import dump_safetensors

    out = tmp_path_factory.mktemp("matrix") / "tiny-flat"
    dump_safetensors(tiny_model_dir, out)
    return out
