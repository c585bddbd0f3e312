"""The loader's CUDA target on a real device: bit-exact for every dtype with digests verified, an error
that names a corrupted tensor, and host buffers reused only after the copies that read them finished."""
from __future__ import annotations

import os

import pytest

from coldstart.errors import ColdstartError
from coldstart.weights import loader as loader_mod
from coldstart.weights.dump import dump_tensors
from coldstart.weights.format import DTYPE_SIZES, read_index
from coldstart.weights.loader import alloc_like_index, load_into

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def _bytes(t):
    import torch

    return t.detach().reshape(-1).view(torch.uint8)


def _random(shape, dtype, gen):
    """Random bit patterns of any dtype (NaNs and all): bytes viewed as ``dtype``."""
    import torch

    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * DTYPE_SIZES[str(dtype).removeprefix("torch.")],), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def _every_dtype():
    import torch

    return [getattr(torch, n) for n in DTYPE_SIZES if isinstance(getattr(torch, n, None), torch.dtype)]


@pytest.fixture(scope="module")
def src_and_flat(tmp_path_factory):
    import torch

    g = torch.Generator().manual_seed(1)
    src = {}
    for i, dt in enumerate(_every_dtype()):
        name = str(dt).removeprefix("torch.")
        src[f"{name}.matrix"] = _random((257, 129), dt, g)  # odd shape: not a multiple of any chunk
        src[f"{name}.scalar"] = _random((), dt, g)
        src[f"{name}.empty"] = _random((0, 3), dt, g)
    src["big.bf16"] = _random((6 * MiB // 2 + 7,), torch.bfloat16, g)  # spans several pieces
    out = tmp_path_factory.mktemp("flat") / "dump"
    dump_tensors(src.items(), out, chunk_bytes=1 * MiB)
    return src, out


def _o_direct_ok(path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


CONFIGS = [
    dict(threads=1, chunk_bytes=1 * MiB, buffers=2, direct=False),
    dict(threads=4, chunk_bytes=2 * MiB, buffers=4, direct=False),
    dict(threads=4, chunk_bytes=2 * MiB, buffers=4, direct=False, copies="coordinator"),
    dict(threads=4, chunk_bytes=16 * MiB, buffers=3, direct=None),
    dict(threads=8, chunk_bytes=1 * MiB, buffers=2, direct=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_every_dtype_bit_exact_with_digests(src_and_flat, cfg):
    import torch

    src, flat = src_and_flat
    if cfg["direct"] is True and not _o_direct_ok(flat / "weights.flat"):
        pytest.skip("O_DIRECT is not supported on this filesystem")
    dest = alloc_like_index(flat, device="cuda")
    for t in dest.values():
        t.fill_(0) if t.dtype != torch.bool else t.fill_(False)
    st = load_into(flat, dest, verify=True, **cfg)
    torch.cuda.synchronize()
    assert st.mode == "staged" and st.device == "cuda" and st.verify
    assert st.copies == cfg.get("copies", "readers")
    for name, s in src.items():
        d = dest[name]
        assert d.device.type == "cuda" and d.dtype == s.dtype and list(d.shape) == list(s.shape)
        assert torch.equal(_bytes(d).cpu(), _bytes(s)), name


def test_corrupted_chunk_is_named(src_and_flat, tmp_path):
    import shutil

    src, flat = src_and_flat
    bad = tmp_path / "bad"
    shutil.copytree(flat, bad)
    e = read_index(bad).by_name()["big.bf16"]
    with open(bad / "weights.flat", "r+b") as f:
        f.seek(e.offset + 3 * MiB + 5)
        b = f.read(1)
        f.seek(e.offset + 3 * MiB + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    dest = alloc_like_index(bad, device="cuda")
    with pytest.raises(ColdstartError, match="big.bf16"):
        load_into(bad, dest, verify=True, threads=2, chunk_bytes=1 * MiB, direct=False)


class _SlowCopier(loader_mod.CudaCopier):
    """Delays every batch of copies on the side stream behind a sleep kernel, so a host buffer that
    were handed back before its copy ran would be overwritten while the copy still waits to read it."""

    fence = True

    def copy(self, piece, buf, views):
        import torch

        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(20_000_000)  # ~10 ms at H100 clocks
        ev = super().copy(piece, buf, views)
        return ev if self.fence else None  # fence=False: the missing wait this test must catch


class _PoisonPool(loader_mod.BufferPool):
    """Fills every buffer it hands out with 0xA5 before the reader gets it."""

    def acquire(self):
        buf = super().acquire()
        buf.fill_(0xA5)
        return buf


def _load_with(monkeypatch, flat, fence: bool, copies: str):
    import torch

    def make(device_type, targets):
        c = _SlowCopier(targets[0].device)
        c.fence = fence
        return c

    monkeypatch.setattr(loader_mod, "make_copier", make)
    monkeypatch.setattr(loader_mod, "BufferPool", _PoisonPool)
    dest = alloc_like_index(flat, device="cuda")
    load_into(flat, dest, verify=False, threads=2, chunk_bytes=1 * MiB, buffers=2, direct=False, copies=copies)
    torch.cuda.synchronize()
    return dest


@pytest.mark.parametrize("copies", ["readers", "coordinator"])
def test_buffers_are_reused_only_after_their_copies(src_and_flat, monkeypatch, copies):
    """With the event wait, poisoning every reused buffer changes nothing; without it (the negative
    control) the delayed copies read poison or the next piece, so the test can see a missing wait.
    Both copy issuers: each reader (CUDA's default) and one coordinator."""
    import torch

    src, flat = src_and_flat
    dest = _load_with(monkeypatch, flat, fence=True, copies=copies)
    assert all(torch.equal(_bytes(dest[n]).cpu(), _bytes(s)) for n, s in src.items())
    broken = _load_with(monkeypatch, flat, fence=False, copies=copies)
    assert not torch.equal(_bytes(broken["big.bf16"]).cpu(), _bytes(src["big.bf16"])), \
        "negative control: without the wait the data should have been corrupted"
