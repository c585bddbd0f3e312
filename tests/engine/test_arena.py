"""The weight arena without a server: layout = the flat file's, map reload, release, refusals."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coldstart.engine.arena import WeightArena, file_mapped
from coldstart.engine.plugin import model_tensor_objects, model_tensors
from coldstart.errors import ColdstartError
from coldstart.weights.dump import dump_tensors
from coldstart.weights.format import read_index


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(100, 24, dtype=torch.bfloat16)
        self.lin = torch.nn.Linear(24, 100, bias=True, dtype=torch.bfloat16)
        self.lin.weight = self.emb.weight  # tied: one tensor, listed once
        self.odd = torch.nn.Linear(24, 24, dtype=torch.float32)
        self.register_buffer("cache", torch.randn(7, 3))
        base = torch.randn(40, 8)
        self.qk = torch.nn.Parameter(base[:20], requires_grad=False)  # views of one storage:
        self.register_buffer("v", base[20:])                           # must stay in place


def _snapshot(m):
    return {n: t.detach().clone() for n, t in model_tensors(m).items()}


def test_arena_map_release_roundtrip(tmp_path: Path):
    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    assert set(arena.left_in_place()) == {"qk", "v"}
    spans = {s.name: s for s in arena.spans}
    assert m.emb.weight.data_ptr() == arena.addr + spans["emb.weight"].offset
    assert m.lin.weight is m.emb.weight
    idx = dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    arena.check_index(idx)  # the dump's layout is the arena's
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n

    arena.release()
    assert not torch.equal(m.emb.weight.data, before["emb.weight"])  # zeros now
    m.qk.data.zero_()
    st = arena.map_file(read_index(tmp_path / "flat"), threads=2, verify=True)
    assert st["mode"] == "map" and st["copied_tensors"] == 2 and st["verified"]
    assert file_mapped(tmp_path / "flat" / "weights.flat")
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n
    # a write goes to a private copy: the file keeps its bytes
    m.cache.add_(1)
    assert torch.equal(arena.view(next(s for s in arena.spans if s.name == "cache")), before["cache"] + 1)
    raw = (tmp_path / "flat" / "weights.flat").read_bytes()
    s = next(s for s in arena.spans if s.name == "cache")
    assert torch.equal(torch.frombuffer(bytearray(raw[s.offset:s.offset + s.nbytes]), dtype=torch.float32).view(7, 3),
                       before["cache"])
    arena.release()
    assert not file_mapped(tmp_path / "flat" / "weights.flat")


def test_map_with_populate_in_the_background(tmp_path: Path):
    """populate="background": map_file returns with its threads still faulting the file in; a
    tensor asked for first (populate_tensor) is there at once, and the weights are the file's."""
    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    arena.release()
    st = arena.map_file(read_index(tmp_path / "flat"), threads=2, populate="background")
    arena.populate_tensor(m.odd.weight)
    arena.populate_tensor(torch.zeros(3))  # outside the arena: nothing to do
    assert arena.wait_populated() > 0 and arena.wait_populated() == 0  # joined once
    assert st["copied_tensors"] == 2
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n
    with pytest.raises(ValueError, match="populate"):
        arena.map_file(read_index(tmp_path / "flat"), populate="later")
    arena.release()


def test_arena_refuses_other_layout(tmp_path: Path):
    m = Tiny()
    arena = WeightArena.build(model_tensor_objects(m))
    tensors = model_tensors(m)
    dump_tensors(tensors.items(), tmp_path / "a8k", alignment=8192)
    with pytest.raises(ColdstartError, match="does not match the weight arena"):
        arena.map_file(read_index(tmp_path / "a8k"))
    dump_tensors(reversed(list(tensors.items())), tmp_path / "rev")
    with pytest.raises(ColdstartError, match="does not match the weight arena at"):
        arena.map_file(read_index(tmp_path / "rev"))
    assert arena.mapped is None


def test_arena_refuses_moved_tensor(tmp_path: Path):
    m = Tiny()
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    m.odd.weight.data = m.odd.weight.data.clone()  # something re-allocated a weight
    with pytest.raises(ColdstartError, match="no longer intact.*odd.weight"):
        arena.map_file(read_index(tmp_path / "flat"))


def _smaps_entry(addr: int) -> list[str]:
    """The /proc/self/smaps lines of the mapping that covers ``addr`` (its header first)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    heads = [i for i, line in enumerate(lines)
             if "-" in line.split()[0] and all(c in "0123456789abcdef-" for c in line.split()[0])]
    for i, j in zip(heads, [*heads[1:], len(lines)]):
        lo, hi = (int(x, 16) for x in lines[i].split()[0].split("-"))
        if lo <= addr < hi:
            return lines[i:j]
    raise AssertionError(f"nothing mapped at {addr:#x}")


def _anon_kib(addr: int, size: int) -> int:
    """Anonymous KiB of the mapping that covers [addr, addr+size)."""
    return int(next(x for x in _smaps_entry(addr) if x.startswith("Anonymous:")).split()[1])


def test_settle_moves_mapped_weights_into_anonymous_memory_in_place(tmp_path: Path):
    """After a map reload the weights are the file's page-cache pages; settle copies them into
    anonymous memory at the same addresses (the tensors keep their pointers and bytes) and the file
    is no longer mapped. A stop before it finishes leaves the mapping as it was."""
    import threading

    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    flat = tmp_path / "flat" / "weights.flat"
    assert arena.settle() == {"settled": False, "why": "the arena is not mapped from a file"}
    arena.release()
    arena.map_file(read_index(tmp_path / "flat"), threads=1)
    ptrs = {n: t.data_ptr() for n, t in model_tensors(m).items()}

    stop = threading.Event()
    stop.set()
    out = arena.settle(stop=stop)
    assert not out["settled"] and "stopped" in out["why"] and file_mapped(flat) and arena.mapped

    assert _anon_kib(arena.addr, arena.size) == 0  # only the file's pages (nothing written yet)
    out = arena.settle(piece=4096)
    assert out["settled"] and out["bytes"] == arena.size and out["was"] == str(flat)
    assert not file_mapped(flat) and arena.mapped is None
    assert _anon_kib(arena.addr, arena.size) * 1024 >= arena.inplace_bytes
    for n, t in model_tensors(m).items():
        assert t.data_ptr() == ptrs[n], n
        assert torch.equal(t, before[n]), n
    assert arena.intact() is None
    # the settled arena sleeps and maps again like a fresh one
    arena.release()
    arena.map_file(read_index(tmp_path / "flat"), threads=1)
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n


def _vm_flags(addr: int) -> set[str]:
    """VmFlags of the mapping that covers ``addr``."""
    return set(next(x for x in _smaps_entry(addr) if x.startswith("VmFlags:")).split()[1:])


def test_a_map_asks_for_huge_page_cache_folios_unless_told_not_to(tmp_path: Path):
    """map_file advises its mapping MADV_HUGEPAGE (the kernel then reads the file into 2 MiB
    folios); ``huge=False`` leaves the mapping plain, and a release gives back a plain arena."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    arena.release()
    assert arena.map_file(read_index(tmp_path / "flat"), threads=1)["huge_folios"]
    assert "hg" in _vm_flags(arena.addr)
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n
    arena.release()
    assert "hg" not in _vm_flags(arena.addr)
    assert not arena.map_file(read_index(tmp_path / "flat"), threads=1, huge=False)["huge_folios"]
    assert "hg" not in _vm_flags(arena.addr)
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n


def _backing(addr: int) -> str:
    """The path of the mapping covering ``addr`` in /proc/self/maps ("" for anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5] if len(parts) > 5 else ""
    raise AssertionError(f"nothing mapped at {addr:#x}")


def test_lazy_spans_are_neither_populated_nor_settled(tmp_path: Path):
    """Spans skipped by map_file (weights behind packed handles kept through a checkpoint) are mapped
    like the rest but not populated; settle moves every other span into anonymous memory run by run
    and leaves the skipped one mapped from the file; every tensor keeps its address and bytes."""
    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    flat = tmp_path / "flat" / "weights.flat"
    spans = {s.name: s for s in arena.spans}
    lazy = spans["odd.weight"]
    assert arena.extents() == [(0, arena.size)]
    ext = arena.extents({"odd.weight"})
    assert sum(n for _, n in ext) < arena.size
    assert not any(o <= lazy.offset < o + n for o, n in ext)

    arena.release()
    ptrs = {n: t.data_ptr() for n, t in model_tensors(m).items()}
    st = arena.map_file(read_index(tmp_path / "flat"), threads=2, skip={"odd.weight"})
    assert st["populated_bytes"] == sum(n for _, n in ext) and arena.lazy == ["odd.weight"]
    for n, t in model_tensors(m).items():
        assert torch.equal(t, before[n]), n  # the lazy span reads from the file on demand

    out = arena.settle(piece=4096)
    assert out["settled"] and out["bytes"] == sum(n for _, n in ext)
    assert out["left_mapped"] == arena.size - out["bytes"]
    assert arena.settled_partly and arena.mapped == str(flat) and file_mapped(flat)
    assert _backing(arena.addr + lazy.offset) == str(flat)
    assert _backing(arena.addr + spans["emb.weight"].offset) == ""
    assert arena.settle()["settled"] is False
    for n, t in model_tensors(m).items():
        assert t.data_ptr() == ptrs[n], n
        assert torch.equal(t, before[n]), n
    arena.release()
    assert not file_mapped(flat) and not arena.settled_partly and arena.lazy == []


def test_a_weights_file_that_leaves_tensors_out(tmp_path: Path):
    """omit_tensors: the left-out tensor's bytes become a hole, the index keeps its digests, and every
    reader refuses it by name (the loader, a map that would populate it, verify) instead of reading
    zeros; a map that skips it works and serves the rest; `weights verify` checks what is there."""
    from coldstart.weights.format import ABSENT_NAME, omit_tensors
    from coldstart.weights.loader import load_into, verify_flat

    m = Tiny()
    before = _snapshot(m)
    arena = WeightArena.build(model_tensor_objects(m))
    dump_tensors(model_tensors(m).items(), tmp_path / "flat")
    flat = tmp_path / "flat" / "weights.flat"
    index_text = (tmp_path / "flat" / "weights.index.json").read_text()
    size, blocks = flat.stat().st_size, flat.stat().st_blocks
    nbytes = omit_tensors(tmp_path / "flat", ["odd.weight"], "held elsewhere (test)")
    assert nbytes == 24 * 24 * 4 and (tmp_path / "flat" / ABSENT_NAME).is_file()
    assert flat.stat().st_size == size and flat.stat().st_blocks <= blocks
    assert (tmp_path / "flat" / "weights.index.json").read_text() == index_text  # its identity unchanged
    idx = read_index(tmp_path / "flat")
    assert idx.absent == {"odd.weight"} and "held elsewhere" in idx.absent_why
    e = idx.by_name()["odd.weight"]
    with open(flat, "rb") as f:
        f.seek(e.offset)
        assert f.read(e.nbytes) == bytes(e.nbytes)

    with pytest.raises(ColdstartError, match=r"loading it needs 1 tensors this dump left out \(odd.weight\): held elsewhere"):
        load_into(tmp_path / "flat", model_tensors(Tiny()))
    arena.release()
    with pytest.raises(ColdstartError, match="mapping it needs 1 tensors"):
        arena.map_file(idx, threads=2)
    arena.release()
    arena.map_file(idx, threads=2, verify=True, skip={"odd.weight"})
    for n, t in model_tensors(m).items():
        if n != "odd.weight":
            assert torch.equal(t, before[n]), n
    arena.release()
    index, bad = verify_flat(tmp_path / "flat")
    assert not bad and index.absent == {"odd.weight"}


def test_unpack_weight_rebuilds_the_plain_weight_through_the_layer_gemm():
    """unpack_weight runs the layer's own GEMM against the identity: bit for bit the weight (here
    through F.linear; a packed handle is checked by the restore tests)."""
    from coldstart.engine.sleep_worker import unpack_weight

    torch.manual_seed(1)
    lin = torch.nn.Linear(1100, 70, bias=False, dtype=torch.bfloat16)
    lin.cpu_linear = lambda x, w, b: torch.nn.functional.linear(x, w, b)
    assert torch.equal(unpack_weight(lin, block=512), lin.weight.detach())


def test_an_empty_arena_is_laid_out_like_the_dump_of_its_views(tmp_path: Path):
    """WeightArena.empty (the packed handles' buffers, engine/packed.py): uint8 spans at the offsets
    dump_tensors gives the same tensors in the same order, so the dump of its views maps back over
    it; release and map round-trip the bytes."""
    arena = WeightArena.empty({"a.weight": 5000, "b.weight": 1, "c.weight": 12288})
    assert [s.offset % 4096 for s in arena.spans] == [0, 0, 0]
    for i, t in enumerate(arena.tensors.values()):
        assert t.dtype == torch.uint8 and t.data_ptr() == arena.addr + arena.spans[i].offset
        t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8))
    before = {n: t.clone() for n, t in arena.tensors.items()}
    idx = dump_tensors(sorted(arena.tensors.items()), tmp_path / "packed")
    arena.check_index(idx)
    arena.release()
    assert not any(t.any() for t in arena.tensors.values())
    arena.map_file(read_index(tmp_path / "packed"), threads=2, verify=True)
    for n, t in arena.tensors.items():
        assert torch.equal(t, before[n]), n
