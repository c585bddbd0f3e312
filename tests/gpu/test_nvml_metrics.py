"""The exporter's GPU gauges from the real NVML: the device's name, its memory, and memory that a process
takes showing up in them (elsewhere these series are tested with a mocked NVML)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu
GiB = 1 << 30


def test_gpu_gauges_follow_real_device_memory():
    import torch
    from prometheus_client import generate_latest

    from coldstart.metrics import names as N
    from coldstart.metrics.export import build_registry, gpu_memory
    from coldstart.pipeline.events import Timeline

    before = gpu_memory()
    assert before and before[0].total_bytes > 8 * GiB and before[0].name.startswith("NVIDIA"), before
    block = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    after = gpu_memory()
    assert after[0].used_bytes - before[0].used_bytes >= 2 * GiB * 0.95
    tl = Timeline.from_container_start("restore", model="m", variant="v")
    tl.mark("READY")
    text = generate_latest(build_registry(tl)).decode()
    name = re.escape(after[0].name)
    for series in N.GPU_ONLY:
        m = re.search(rf'^{series}\{{[^}}]*gpu="0"[^}}]*gpu_name="{name}"[^}}]*\}} (\S+)$', text, re.M)
        assert m and float(m.group(1)) > 0, series
    del block
