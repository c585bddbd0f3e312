"""engine/packed.py without a server: vLLM's own CPU GEMM dispatch on plain modules, their oneDNN
handles' buffers found, moved into a packed arena, released and mapped back from their dump."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported(),
    reason="vLLM gives every layer a oneDNN handle only on AVX-512 BF16 without AMX (with AMX, small "
           "layers go to its SGL kernels)")


def _layers() -> dict[str, torch.nn.Module]:
    from vllm.model_executor.layers import utils as layer_utils

    torch.manual_seed(0)
    out = {}
    for name, (n, k) in {"b.weight": (512, 256), "a.weight": (384, 512), "c.weight": (96, 512)}.items():
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch.bfloat16), requires_grad=False)
        layer_utils.dispatch_cpu_unquantized_gemm(m, False)  # vLLM's own handle, the weight kept
        out[name] = m
    return out


def _outputs(layers) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {n: m.cpu_linear(torch.randn(3, m.weight.shape[1], dtype=torch.bfloat16), m.weight, None)
            for n, m in layers.items()}


def test_handles_moved_released_and_mapped_back(tmp_path: Path):
    from coldstart.engine import packed
    from coldstart.weights.dump import dump_tensors
    from coldstart.weights.format import read_index

    layers = _layers()
    ref = _outputs(layers)
    views = packed.views(layers)
    assert all(views[n].numel() >= m.weight.numel() * m.weight.element_size() for n, m in layers.items())
    arena = packed.adopt(layers, copy=True)
    assert [s.name for s in arena.spans] == sorted(layers)
    for name, m in layers.items():
        assert packed.buffer_of(m)[0] == arena.tensors[name].data_ptr()  # the handle reads the arena now
    assert all(torch.equal(a, b) for a, b in zip(_outputs(layers).values(), ref.values()))
    idx = dump_tensors(sorted(packed.views(layers).items()), tmp_path / "packed")
    arena.check_index(idx)
    arena.release()
    assert not any(o.any() for o in _outputs(layers).values())  # the buffers read zeros
    arena.map_file(read_index(tmp_path / "packed"), threads=2, verify=True)
    assert all(torch.equal(a, b) for a, b in zip(_outputs(layers).values(), ref.values()))
    # moved again into the same arena (as a sleep does after a repack): reused, not remapped
    assert packed.adopt(layers, copy=True, into=arena) is arena
    sig = packed.signature("x", views)
    assert sig == packed.signature("x", packed.views(layers)) and sig != packed.signature("y", views)
    assert packed.dump_dir(tmp_path, sig) == tmp_path / f"packed-{sig}"


def test_a_layer_without_a_onednn_handle_is_unsupported():
    from coldstart.engine import packed

    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.zeros(8, 8, dtype=torch.bfloat16), requires_grad=False)
    m.cpu_linear = torch.nn.functional.linear
    with pytest.raises(packed.Unsupported, match="no oneDNN handle"):
        packed.buffer_of(m)
