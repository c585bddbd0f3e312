"""The GPU worker: vLLM's own CUDA worker and sleep mode (CuMemAllocator), plus the coldstart RPCs.

UNVERIFIED ON GPU: the project has no GPU. Sleep and wake are vLLM's (level 2 unmaps the weights'
and KV cache's device memory; wake_up maps fresh memory at the same virtual addresses), so the
in-place refill by ``coldstart_reload`` goes through our loader's CUDA target (pinned host buffers,
copies on a side stream). The class adds methods only; it changes nothing in how vLLM runs.

Used as ``--worker-cls coldstart.engine.gpu_worker.ColdstartGPUWorker`` (EngineSpec(device="cuda")).
"""
from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_worker import Worker

from coldstart.engine.plugin import decode_arg
from coldstart.engine.sleep_worker import ColdstartRPCMixin


class ColdstartGPUWorker(ColdstartRPCMixin, Worker):
    """vLLM's GPU worker + coldstart_reload / coldstart_dump_weights / coldstart_state."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cs_init()

    def sleep(self, level: int = 1) -> None:
        level = int(decode_arg(level))
        super().sleep(level)
        self._cs_sleeping |= {"kv_cache", "weights"} if level >= 2 else {"kv_cache"}
        self._cs_last = {"op": "sleep", "level": level}

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = decode_arg(tags)
        if isinstance(tags, str):
            tags = [tags]
        super().wake_up(tags)
        self._cs_sleeping -= set(tags) if tags else {"weights", "kv_cache"}

    def coldstart_state(self) -> dict[str, Any]:
        out = super().coldstart_state()
        try:
            import torch

            free, total = torch.cuda.mem_get_info()
            out["cuda_free"], out["cuda_total"] = int(free), int(total)
        except Exception:  # no device, or not initialised
            pass
        return out
