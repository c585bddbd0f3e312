"""GPU tests: marked ``gpu``; skipped, each with the reason, where no CUDA device can be used.

Run them on a GPU machine with ``scripts/gpu-check OUTDIR`` (docs/gpu.md), or ``pytest -m gpu tests/gpu``.
"""
from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_unavailable() -> str:
    """'' when torch can use a CUDA device, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    return ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is not None and cuda_unavailable():
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {cuda_unavailable()}"))
