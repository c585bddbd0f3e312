"""`coldstart checkpoint --packed-dump` (CheckpointOptions.packed_dump): the packed GEMM handles'
buffers beside the weights file instead of in the CRIU image; the restore maps them back, packing
nothing, and the restored server's sleep(2) releases them (a kept set would stay resident)."""
from __future__ import annotations

import shutil
import time

import pytest
import torch

from coldstart.engine.client import EngineClient
from coldstart.pipeline.restore import RestoreOptions, restore

from .conftest import PROMPTS, free_port

pytestmark = [pytest.mark.timeout(1500), pytest.mark.skipif(
    not torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported(),
    reason="the tiny model's layers get oneDNN handles only on AVX-512 BF16 without AMX")]


@pytest.fixture(scope="module")
def pd_snapshot(tiny_model_dir, tmp_path_factory):
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    out = tmp_path_factory.mktemp("pd-snapshot") / "snap"
    m, _ = checkpoint(CheckpointOptions(model=tiny_model_dir, out=out, port=free_port(), packed_dump=True), say=print)
    yield out, m
    shutil.rmtree(out, ignore_errors=True)


def test_packed_dump_restores_without_packing_and_sleeps_lean(pd_snapshot):
    snap, m = pd_snapshot
    pdir = m.weights["packed_dir"]
    assert not m.weights.get("kept_linears") and not m.weights.get("omitted"), m.weights
    assert f"{pdir}/weights.flat" in m.files and m.files[f"{pdir}/weights.flat"].xxh3  # verified like the rest
    res = restore(RestoreOptions(snapshot=snap, fallback=False), say=print)
    try:
        assert res.restored and res.canary_ok
        loaded = next(e for e in res.timeline.events if e.name == "WEIGHTS_LOADED").attrs
        assert loaded["mode"] == "map+packed" and loaded["packed_refilled"] > 0, loaded
        assert not loaded.get("prepacked_linears") and loaded["packed_bytes"] > 0, loaded
        c = EngineClient(res.base_url, timeout=300)
        want = [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS]
        deadline = time.monotonic() + 120  # the settle (asked after READY) moves both arenas
        while (st := c.collective_rpc("coldstart_state")[0])["settle"].get("state") == "running":
            assert time.monotonic() < deadline, st["settle"]
            time.sleep(0.2)
        assert st["settle"]["state"] == "done" and st["settle"]["packed"]["settled"], st["settle"]
        assert [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS] == want
        # a sleep releases the handles' buffers too; the next reload maps them back
        c.sleep(level=2)
        last = c.collective_rpc("coldstart_state")[0]["last"]
        assert last["packed_released"] > 0 and not last["kept_linears"], last
        c.wake_up(["weights"])
        again = c.collective_rpc("coldstart_reload", kwargs={"path": str(snap / m.weights["dir"])})[0]
        c.wake_up(["kv_cache"])
        assert again["mode"] == "map+packed" and again["prepacked_linears"] == 0, again
        assert [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS] == want
    finally:
        res.stop()
