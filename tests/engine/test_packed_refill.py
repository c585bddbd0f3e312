"""A reload after sleep(2) that maps the packed GEMM handles' buffers back from a packed dump instead
of packing the weights again (coldstart.engine.packed), on the shared tiny-model server."""
from __future__ import annotations

import shutil

import psutil

from coldstart.engine.launcher import find_worker_pid


def _complete(client, prompt: str):
    return client.complete(prompt, max_tokens=16, seed=0, ignore_eos=True)


def _onednn_host(client) -> bool:
    """AVX-512 BF16 without AMX: vLLM packs every linear layer of the tiny model into a oneDNN handle
    (with AMX, layers this small go to its SGL kernels instead)."""
    import torch

    return client.collective_rpc("coldstart_state")[0]["handles_hold_copies"] and not torch.cpu._is_amx_tile_supported()


def _cycle(client, path, **kw) -> dict:
    client.sleep(2)
    client.wake_up(["weights"])
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(path), "mode": "auto", **kw})[0]
    client.wake_up(["kv_cache"])
    return res


def test_packed_refill_serves_identically_without_packing(engine_server, canary, canary_prompt, flat_dump, tmp_path):
    """Handles packed from a flat dump, their buffers dumped beside it: each sleep(2) releases the
    buffers (RSS falls by them too) and a reload maps them back, packing nothing; the greedy answer
    is the reference's. A copy of the dump without the packed buffers, or packed=False, packs anew."""
    from coldstart.warm.residency import evict

    eng, client = engine_server
    flat = tmp_path / "flat"
    shutil.copytree(flat_dump, flat)
    first = _cycle(client, flat, packed=False)  # handles packed from this dump
    assert first["prepacked_linears"] > 0 or not client.collective_rpc("coldstart_state")[0]["handles_hold_copies"]
    dumped = client.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat)})[0]
    if _onednn_host(client):  # every layer serves through a oneDNN handle there: it must work
        assert "error" not in dumped, dumped
    if "error" in dumped:  # a host where vLLM's handles are not oneDNN's (SGL kernels on AMX): the old path
        assert "no packed" in dumped["error"] or "oneDNN" in dumped["error"], dumped
        res = _cycle(client, flat)
        assert res["prepacked_linears"] > 0 and "packed_refilled" not in res, res
        assert _complete(client, canary_prompt) == canary
        return
    pdirs = list(flat.glob("packed-*"))
    assert [str(p) for p in pdirs] == [dumped["dir"]] and (pdirs[0] / "weights.flat").stat().st_size >= dumped["bytes"]

    worker = psutil.Process(find_worker_pid(eng))
    rss_awake = worker.memory_info().rss
    client.sleep(2)
    state = client.collective_rpc("coldstart_state")[0]
    assert state["packed_released"] and state["last"]["packed_released"] > 0, state["last"]
    assert state["last"]["unpacked_linears"] == 0, state["last"]
    assert rss_awake - worker.memory_info().rss >= state["weights_bytes"] + dumped["bytes"] // 2
    client.wake_up(["weights"])
    evict(flat / "weights.flat")
    evict(pdirs[0] / "weights.flat")
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat), "mode": "auto"})[0]
    client.wake_up(["kv_cache"])
    assert res["mode"] == "map+packed" and res["packed_refilled"] == dumped["tensors"], res
    assert res["prepacked_linears"] == 0 and res["prepack_s"] == 0.0, res
    assert _complete(client, canary_prompt) == canary
    # settling copies both arenas into anonymous memory; the answer stays the same
    assert client.collective_rpc("coldstart_settle")[0]["started"]
    settle = {}
    for _ in range(200):
        settle = client.collective_rpc("coldstart_state")[0]["settle"]
        if settle.get("state") != "running":
            break
    assert settle.get("state") == "done" and settle["packed"]["settled"], settle
    assert _complete(client, canary_prompt) == canary
    # again (the handles are already in their packed arena), and verified against the digests
    res = _cycle(client, flat, verify=True)
    assert res["mode"] == "map+packed" and res["prepacked_linears"] == 0, res
    assert _complete(client, canary_prompt) == canary

    # the shared dump has no packed buffers: packing anew, and right
    res = _cycle(client, flat_dump)
    assert res["prepacked_linears"] > 0 and "packed_refilled" not in res, res
    assert res["packed_refused"].startswith("no packed dump for these handles"), res
    assert _complete(client, canary_prompt) == canary
    # nor does packed=False refill
    res = _cycle(client, flat, packed=False)
    assert res["prepacked_linears"] > 0 and "packed_refilled" not in res, res
    assert _complete(client, canary_prompt) == canary


def test_a_corrupt_packed_dump_is_refused_and_the_layers_packed_anew(engine_server, canary, canary_prompt,
                                                                    flat_dump, tmp_path):
    """A packed dump truncated on disk: the refill is refused with the file's problem named, the
    layers are packed again from the plain weights, and the answer is right."""
    _, client = engine_server
    flat = tmp_path / "flat"
    shutil.copytree(flat_dump, flat)
    _cycle(client, flat, packed=False)
    dumped = client.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat)})[0]
    if "error" in dumped:
        return  # (no oneDNN handles here: the test above covers the old path)
    data = next(flat.glob("packed-*")) / "weights.flat"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    res = _cycle(client, flat)
    assert res["prepacked_linears"] > 0 and "packed_refilled" not in res, res
    assert res["packed_refused"].startswith("packed dump refused: ") and "weights.flat" in res["packed_refused"], res
    assert _complete(client, canary_prompt) == canary


def test_dump_packed_answers_what_it_cannot_do_and_the_engine_lives_on(engine_server, canary, canary_prompt,
                                                                       flat_dump, tmp_path):
    """No flat dump there, handles packed from vLLM's own reload (no flat dump's identity), weights
    asleep: each an answer naming the problem (an exception would take the engine down)."""
    _, client = engine_server
    res = client.collective_rpc("coldstart_dump_packed", kwargs={"path": str(tmp_path / "missing")})[0]
    assert res.get("error"), res
    client.sleep(2)
    client.wake_up(["weights"])
    client.collective_rpc("reload_weights")  # vLLM's own, from the model's safetensors
    client.wake_up(["kv_cache"])
    res = client.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat_dump)})[0]
    assert "were not built from" in res.get("error", "") or "no packed" in res.get("error", ""), res
    client.sleep(2)
    res = client.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat_dump)})[0]
    assert "sleep level 2" in res.get("error", ""), res
    client.wake_up(["weights"])
    client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump)})
    client.wake_up(["kv_cache"])
    assert _complete(client, canary_prompt) == canary
