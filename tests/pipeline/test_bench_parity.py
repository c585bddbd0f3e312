"""Serving parity on the benchmark model (~1.3 GiB, bf16): the tiny model's parity test
(test_pipeline.py) does not exercise what only a model this size gets on an AVX-512 host, where the
checkpoint's defaults keep vLLM's packed GEMM handles in the image and leave the weights only they
read out of the weights file. One checkpoint with the defaults, one stock server, several prompts."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from coldstart.engine.client import EngineClient
from coldstart.pipeline.restore import RestoreOptions, restore

from .conftest import PROMPTS, free_port

pytestmark = pytest.mark.timeout(1800)

TOKENS = 64


def _answers(url: str) -> list[list[int]]:
    c = EngineClient(url, timeout=600)
    return [c.complete(p, max_tokens=TOKENS, seed=0).token_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def bench_snapshot(tmp_path_factory):
    """The bench model checkpointed with the defaults a user gets (no option named)."""
    from coldstart.models.tiny import cached_model
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    model = cached_model("bench")
    out = tmp_path_factory.mktemp("bench-snapshot") / "snap"
    m, _ = checkpoint(CheckpointOptions(model=model, out=out, port=free_port()), say=print)
    yield model, out, m
    shutil.rmtree(out, ignore_errors=True)


def test_restored_bench_model_answers_like_a_stock_server(bench_snapshot):
    """A stock vLLM server (vLLM's own CPU worker, cold boot) and the restored server give the same
    greedy tokens for several prompts, as restored and after one sleep(2) -> wake -> reload cycle.
    Where the defaults kept the packed handles (an AVX-512 host), the reload packs nothing, and the
    weights file leaves out the weights only the handles read."""
    from coldstart.engine.launcher import EngineSpec, start_engine
    from coldstart.pipeline.checkpoint import reload_weights

    model, snap, m = bench_snapshot
    run_dir = Path(tempfile.mkdtemp(prefix="cs-stock-"))  # short: vLLM's IPC socket paths live in it
    stock = start_engine(EngineSpec(model=model, run_dir=run_dir, port=free_port(), sleep_mode=False, worker_cls="", dev_mode=False))
    try:
        stock.wait_ready(1200)
        want = _answers(stock.spec.base_url)
    finally:
        stock.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    assert all(len(w) == TOKENS for w in want), want

    kept = bool(m.weights.get("kept_linears"))
    lines: list[str] = []
    res = restore(RestoreOptions(snapshot=snap, fallback=False), say=lines.append)
    try:
        assert res.restored and res.canary_ok, lines
        assert _answers(res.base_url) == want, (m.weights.get("kept_linears"), m.weights.get("omitted"))
        c = res.client(timeout=600)
        c.sleep(level=2)
        c.wake_up(["weights"])
        r = reload_weights(c, snap, m.weights)[0]
        c.wake_up(["kv_cache"])
        if kept:  # the handles are the only copy of the weights left out: kept through the sleep
            assert m.weights.get("omitted", 0) > 0, m.weights
            assert r.get("packed_kept", 0) > 0 and not r.get("prepacked_linears"), r
        assert _answers(res.base_url) == want, r
    finally:
        res.stop()
