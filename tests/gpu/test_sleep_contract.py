"""The GPU sleep contract our reload relies on (vLLM's CuMemAllocator, here with torch and the driver's
virtual memory API since vLLM-CUDA is absent): sleep gives the device memory back, wake maps new memory
at the same addresses, the loader refills the tensors there bit-exactly. Also the driver's process
checkpoint API on a small process, and NVML telemetry."""
from __future__ import annotations

import pytest

from coldstart.weights.dump import dump_tensors
from coldstart.weights.format import DTYPE_SIZES
from coldstart.weights.loader import load_into

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def _views(region_tensor, specs):
    """Named tensors packed into one uint8 region tensor, 256-byte aligned (like an allocator's blocks)."""
    out, off = {}, 0
    for name, shape, dtype in specs:
        n = 1
        for s in shape:
            n *= s
        nb = n * DTYPE_SIZES[str(dtype).removeprefix("torch.")]
        out[name] = region_tensor[off:off + nb].view(dtype).view(shape)
        off = -(-(off + nb) // 256) * 256
    return out, off


def test_sleep_releases_and_wake_remaps_for_an_in_place_reload(tmp_path):
    import torch

    from coldstart.gpu.vmm import SleepableRegion

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # a context current on this thread
    specs = [("w1", (4096, 4096), torch.bfloat16), ("w2", (2048, 8192), torch.float16),
             ("norm", (4096,), torch.float32), ("emb", (1000, 512), torch.float32)]
    g = torch.Generator().manual_seed(3)
    src = {n: torch.randn(s, generator=g).to(dt) for n, s, dt in specs}
    flat = tmp_path / "dump"
    dump_tensors(src.items(), flat)

    region = SleepableRegion(256 * MiB)
    try:
        dest, used = _views(region.as_tensor(), specs)
        assert used <= region.size
        ptrs = {n: t.data_ptr() for n, t in dest.items()}
        load_into(flat, dest, verify=True, threads=4, direct=False)
        torch.cuda.synchronize()
        assert all(torch.equal(dest[n].cpu(), src[n]) for n in src)

        free_awake = torch.cuda.mem_get_info()[0]
        region.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        assert free_asleep - free_awake >= region.size * 0.9, "sleep did not give the memory back"

        region.wake()
        assert torch.cuda.mem_get_info()[0] <= free_asleep - region.size * 0.9
        for t in dest.values():  # what vLLM's wake-up leaves is undefined: make it visibly wrong
            t.view(torch.uint8).fill_(0x5A)
        assert {n: t.data_ptr() for n, t in dest.items()} == ptrs
        load_into(flat, dest, verify=True, threads=4, direct=False)
        torch.cuda.synchronize()
        assert all(torch.equal(dest[n].cpu(), src[n]) for n in src)
    finally:
        torch.cuda.synchronize()
        region.free()


def test_driver_checkpoint_api_round_trip(tmp_path):
    """A process holding 64 MiB: lock + checkpoint frees its device memory, restore + unlock gives
    it back with the same contents (the holder checks its own digests)."""
    from coldstart.engine import cuda_checkpoint as driver
    from coldstart.bench.gpu import Holder

    h = Holder(64 * MiB, tmp_path / "holder")
    try:
        h.wait_ready()
        assert driver.get_state(h.pid) == "running"
        driver.suspend(h.pid)
        assert driver.get_state(h.pid) == "checkpointed"
        driver.resume(h.pid)
        assert driver.get_state(h.pid) == "running"
        v = h.verify()
        assert v["ok"], v
    finally:
        h.stop()


def test_cuda_checkpoint_command_line(tmp_path):
    """Our ``cuda-checkpoint`` (for CRIU's CUDA plugin) speaks the utility's flags."""
    import subprocess
    import sys

    from coldstart.bench.gpu import Holder, _env

    h = Holder(16 * MiB, tmp_path / "holder")
    try:
        h.wait_ready()

        def cc(*args):
            return subprocess.run([sys.executable, "-m", "coldstart.engine.cuda_checkpoint", *args], env=_env(),
                                  capture_output=True, text=True, timeout=60)

        assert "--action" in cc("-h").stdout
        assert cc("--get-state", "--pid", str(h.pid)).stdout.strip() == "running"
        assert int(cc("--get-restore-tid", "--pid", str(h.pid)).stdout.strip()) > 0
        assert cc("--toggle", "--pid", str(h.pid)).returncode == 0
        assert cc("--get-state", "--pid", str(h.pid)).stdout.strip() == "checkpointed"
        assert cc("--toggle", "--pid", str(h.pid)).returncode == 0
        assert h.verify()["ok"]
        bad = cc("--action", "lock", "--pid", "999999")
        assert bad.returncode != 0 and "cuCheckpointProcessLock" in bad.stderr
    finally:
        h.stop()


def test_nvml_facts_name_the_gpu():
    from coldstart.engine.gpu import gpu_facts

    f = gpu_facts()
    assert f.get("gpus") and f.get("driver"), f


def test_gpu_tools_fall_back_to_our_cuda_checkpoint(tmp_path, monkeypatch):
    """Where NVIDIA's cuda-checkpoint is absent, GpuCheckpointTools gives ours, and it works."""
    import subprocess

    from coldstart.engine.gpu import GpuCheckpointTools
    from coldstart.bench.gpu import Holder

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "cuda_plugin.so").write_bytes(b"")
    tools = GpuCheckpointTools.find(plugin_dir=tmp_path / "plugins", state_dir=tmp_path / "state")
    assert tools.ok, tools.problems
    assert tools.cuda_checkpoint == tmp_path / "state" / "bin" / "cuda-checkpoint"
    h = Holder(16 * MiB, tmp_path / "holder")
    try:
        h.wait_ready()
        env = tools.criu_env({"PATH": "/usr/bin:/bin"})
        out = subprocess.run(["cuda-checkpoint", "--get-state", "--pid", str(h.pid)], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "running", out.stderr
    finally:
        h.stop()
