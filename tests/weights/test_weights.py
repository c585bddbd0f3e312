"""Flat format + loader: round trips, clear errors, crash safety, the staged pipeline's scheduling."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from itertools import chain
from pathlib import Path

import numpy as np
import pytest
import torch

from coldstart.errors import ColdstartError
from coldstart.weights import loader as loader_mod
from coldstart.weights.dump import dump_safetensors, dump_tensors
from coldstart.weights.format import DATA_NAME, INDEX_NAME, read_index
from coldstart.weights.loader import BufferPool, alloc_like_index, load_into, plan_pieces, verify_flat

KIB = 1024
DIGEST_CHUNK = 16 * KIB  # small digest chunks and reads so that a few MB exercise every split path


@pytest.fixture(autouse=True)
def _own_node_dir(tmp_path, monkeypatch):
    """No device probe recorded on this machine (weights.readshape, in the default node dir) decides
    how a test's cold loads read."""
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))


def _raw(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    shapes = [(3,), (1000, 37), (257, 129), (64, 1024), ()]  # odd sizes, one > several read pieces, a scalar
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for i, s in enumerate(shapes):
            out[f"{dt}.{i}"] = torch.randn(s, generator=g).to(dt)
    for i, s in enumerate(shapes):
        out[f"int8.{i}"] = torch.randint(-128, 128, s, generator=g, dtype=torch.int8)
    out["int64.buf"] = torch.arange(17, dtype=torch.int64)
    out["bool.mask"] = torch.rand(33, generator=g) > 0.5
    out["empty"] = torch.empty(0, 5, dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def src() -> dict[str, torch.Tensor]:
    return _tensors()


@pytest.fixture(scope="module")
def flat(tmp_path_factory, src) -> Path:
    out = tmp_path_factory.mktemp("flat") / "dump"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    return out


def _fresh(src):
    return {k: torch.full_like(v, 0) if v.dtype != torch.bool else torch.zeros_like(v) for k, v in src.items()}


def test_layout(flat, src):
    idx = read_index(flat)
    assert (flat / DATA_NAME).exists() and (flat / INDEX_NAME).exists()
    assert [t.name for t in idx.tensors] == list(src)
    assert all(t.offset % 4096 == 0 for t in idx.tensors)
    assert idx.data_size % 4096 == 0 and idx.data_size == (flat / DATA_NAME).stat().st_size
    big = idx.by_name()["torch.float32.3"]
    assert big.nbytes == 64 * 1024 * 4 and len(big.chunk_digests) == 16
    with open(flat / DATA_NAME, "rb") as f:
        f.seek(big.offset)
        assert f.read(big.nbytes) == _raw(src["torch.float32.3"])


@pytest.mark.parametrize("mode", ["direct", "staged"])
@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("o_direct", [False, True])
@pytest.mark.parametrize("layout", ["ranges", "shared"])
def test_roundtrip_bit_exact(flat, src, mode, verify, o_direct, layout, monkeypatch):
    # O_DIRECT into unaligned tensors goes through a bounce buffer: make it small and not a divisor
    # of the pieces, so sub-reads straddle tensor and piece boundaries
    monkeypatch.setattr(loader_mod, "BOUNCE_BYTES", 12 * KIB)
    dest = _fresh(src)
    seen: list[tuple[int, int]] = []
    stats = load_into(flat, dest, threads=3, chunk_bytes=64 * KIB, buffers=2, verify=verify, direct=o_direct, mode=mode,
                      layout=layout, prefetch_bytes=128 * KIB if layout == "ranges" else 0, read_bytes=20 * KIB,
                      progress=lambda done, total: seen.append((done, total)))
    assert max(seen) == (stats.bytes, stats.bytes)
    for k, v in src.items():
        assert dest[k].dtype == v.dtype and _raw(dest[k]) == _raw(v), k
    assert stats.bytes == sum(v.numel() * v.element_size() for v in src.values())
    assert stats.mode == mode and stats.tensors == len(src) and stats.gib_per_s > 0


def _page_aligned_like(src):
    """Destinations at page-aligned addresses (like the engine's weight arena), so O_DIRECT reads
    go straight into them instead of through the bounce buffer."""
    import mmap

    sizes = [max(v.numel() * v.element_size(), 1) for v in src.values()]
    arena = mmap.mmap(-1, sum(-(-n // 4096) * 4096 for n in sizes))
    out, pos = {}, 0
    for (k, v), n in zip(src.items(), sizes):
        t = torch.frombuffer(arena, dtype=torch.uint8, count=n, offset=pos) if v.numel() else torch.empty(0)
        out[k] = t[: v.numel() * v.element_size()].view(v.dtype).view(v.shape)
        assert not v.numel() or out[k].data_ptr() % 4096 == 0
        pos += -(-n // 4096) * 4096
    return out, arena


@pytest.mark.parametrize("read_kb", [0, 3, 16])
def test_o_direct_into_aligned_tensors_in_steps(flat, src, read_kb):
    """O_DIRECT straight into page-aligned tensors, in reads of ``read_bytes`` (rounded up to a block)."""
    dest, _arena = _page_aligned_like(src)
    stats = load_into(flat, dest, threads=2, chunk_bytes=64 * KIB, direct=True, verify=True, read_bytes=read_kb * KIB)
    assert stats.o_direct
    for k, v in src.items():
        assert _raw(dest[k]) == _raw(v), k


def _page_aligned(src) -> dict[str, torch.Tensor]:
    """Zeroed destinations, each starting on its own page (as in the engine's weight arena)."""
    out = {}
    for k, v in src.items():
        n = v.numel() * v.element_size()
        buf = loader_mod._aligned_buffer(max(n, 1))
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=max(n, 1))[:n]
        out[k] = flat.view(v.dtype).reshape(v.shape) if n else torch.empty(v.shape, dtype=v.dtype)
    return out


def test_auto_o_direct_follows_the_page_cache(tmp_path, src):
    """direct=None: a cold data file is read with O_DIRECT into page-aligned destinations (its device
    not probed), through the page cache into unaligned ones (a bounce buffer lost to it on both
    hosts); a cached file through the page cache."""
    from coldstart.warm.residency import evict

    out = tmp_path / "auto"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    data = out / DATA_NAME
    evict(data)
    dest = _page_aligned(src)
    cold = load_into(out, dest, chunk_bytes=64 * KIB, verify=True)
    assert cold.o_direct and cold.direct_choice == "auto: 0% cached -> O_DIRECT", cold.direct_choice
    assert (cold.threads, cold.read_bytes) == (8, 1 << 20)  # no readahead under O_DIRECT: 8 readers, 1 MiB reads
    assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())
    evict(data)
    dest = _fresh(src)  # torch's allocations: not page-aligned
    cold = load_into(out, dest, chunk_bytes=64 * KIB)
    assert not cold.o_direct and "page-aligned -> buffered" in cold.direct_choice, cold.direct_choice
    # through the page cache: one reader per usable CPU, whole pieces (the readahead runs ahead)
    assert (cold.threads, cold.read_bytes) == (loader_mod.auto_threads(), 0)
    assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())
    data.read_bytes()
    dest = _fresh(src)
    warm = load_into(out, dest, chunk_bytes=64 * KIB)
    assert not warm.o_direct and warm.direct_choice == "auto: 100% cached -> buffered", warm.direct_choice
    assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())
    forced = load_into(out, _fresh(src), chunk_bytes=64 * KIB, direct=False)
    assert not forced.o_direct and forced.direct_choice == ""


def test_a_cold_load_reads_the_way_its_device_was_probed_faster(tmp_path, src):
    """The probe loads the dump's head cold both ways and records the device's rates in the node dir;
    a cold load into page-aligned memory then reads the way the record says (buffered where the page
    cache read faster), and says why; a record from another boot counts for nothing."""
    import dataclasses

    from coldstart.warm.residency import evict
    from coldstart.weights import readshape

    out = tmp_path / "dump"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    data = out / DATA_NAME
    assert readshape.cached(data) is None
    rec = readshape.probe_and_save(out, span=256 * KIB, rounds=2)
    assert len(rec.direct_gib_s) == len(rec.buffered_gib_s) == 2 and min(rec.direct_gib_s + rec.buffered_gib_s) > 0
    assert rec.probed_file == str(data) and rec.span_bytes <= 256 * KIB + 4 * KIB
    assert readshape.cached(data) == rec and readshape.record_path(data).parent == tmp_path / "node" / "read-shape"
    for direct in (False, True):
        readshape.save(dataclasses.replace(rec, direct=direct, direct_gib_s=(1.0,) if direct else (0.5,),
                                           buffered_gib_s=(0.5,) if direct else (1.0,)), data)
        evict(data)
        dest = _page_aligned(src)
        st = load_into(out, dest, chunk_bytes=64 * KIB, verify=True)
        want = "O_DIRECT" if direct else "buffered"
        assert st.o_direct == direct and st.direct_choice.endswith(f"probed: O_DIRECT {1.0 if direct else 0.5:.2f}, "
                                                                    f"buffered {0.5 if direct else 1.0:.2f} GiB/s -> {want}"), st.direct_choice
        assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())
    readshape.save(dataclasses.replace(rec, boot_id="another-boot", direct=False), data)
    assert readshape.cached(data) is None


def test_a_big_cold_load_probes_an_unprobed_device_first(tmp_path, src, monkeypatch):
    """With no record, a cold load of a file past AUTO_PROBE_MIN probes the device before it reads,
    records it, and says so; COLDSTART_READ_PROBE=0 keeps the unprobed rule (O_DIRECT)."""
    from coldstart.warm.residency import evict
    from coldstart.weights import readshape

    monkeypatch.setattr(readshape, "AUTO_PROBE_MIN", 1)
    monkeypatch.setattr(readshape, "SPAN_BYTES", 256 * KIB)
    out = tmp_path / "dump"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    evict(out / DATA_NAME)
    monkeypatch.setenv("COLDSTART_READ_PROBE", "0")
    st = load_into(out, _page_aligned(src), chunk_bytes=64 * KIB)
    assert st.o_direct and st.direct_choice == "auto: 0% cached -> O_DIRECT" and readshape.cached(out / DATA_NAME) is None
    monkeypatch.delenv("COLDSTART_READ_PROBE")
    evict(out / DATA_NAME)
    dest = _page_aligned(src)
    st = load_into(out, dest, chunk_bytes=64 * KIB, verify=True)
    rec = readshape.cached(out / DATA_NAME)
    assert rec is not None and st.o_direct == rec.direct and "(probed now)" in st.direct_choice, st.direct_choice
    assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())


def test_probe_command_records_the_device(tmp_path, src):
    """`coldstart weights probe DUMP` prints both rates and the choice and writes the record."""
    out = tmp_path / "dump"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    r = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "weights", "probe", str(out),
                        "--span-mb", "1", "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "probed: O_DIRECT" in r.stdout and "recorded in" in r.stdout, r.stdout
    assert len(list((tmp_path / "node" / "read-shape").glob("*.json"))) == 1  # (_own_node_dir)
    r = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "weights", "probe", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_small_alignment_falls_back_to_buffered(tmp_path, src):
    out = tmp_path / "a512"
    dump_tensors(src.items(), out, alignment=512, chunk_bytes=DIGEST_CHUNK)
    assert any(t.offset % 4096 for t in read_index(out).tensors)
    dest = _fresh(src)
    stats = load_into(out, dest, direct=True, verify=True, chunk_bytes=64 * KIB)
    assert not stats.o_direct and stats.notes
    for k, v in src.items():
        assert _raw(dest[k]) == _raw(v), k


def test_many_small_tensors(tmp_path):
    """More small neighbours than one preadv may take (IOV_MAX): reads are cut by tensor count too."""
    src = {f"n{i}": torch.full((3 + i % 5,), i, dtype=torch.float16) for i in range(1500)}
    dump_tensors(src.items(), tmp_path / "many")
    for mode in ("direct", "staged"):
        dest = _fresh(src)
        load_into(tmp_path / "many", dest, mode=mode, verify=True)
        assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())


@pytest.mark.parametrize("threads", [1, 2, 5, 64])
def test_ranges_cover_every_piece_once(threads):
    """Each reader starts on its own contiguous run; a reader that is done takes over the upper half
    of the biggest run left. Whatever the interleaving, every piece is read exactly once."""
    import random

    entries = [type("E", (), {"offset": i * 8 * KIB, "nbytes": (1 + i % 3) * 2 * KIB})() for i in range(37)]
    pieces = plan_pieces(entries, 8 * KIB, digest_chunk=4 * KIB, verify=False)
    for seed in range(5):
        ld = loader_mod._Loader.__new__(loader_mod._Loader)
        ld.pieces, ld.lock, ld.stop = pieces, threading.Lock(), threading.Event()
        ranges = ld._split_ranges(threads)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(pieces)
        assert all(ranges[j][1] == ranges[j + 1][0] for j in range(threads - 1))  # contiguous, in file order
        rng, active, got = random.Random(seed), list(range(threads)), []
        while active:
            me = rng.choice(active)
            p = ld._take_range(ranges, me)
            if p is None:
                active.remove(me)
            else:
                got.append(p.offset)
        assert sorted(got) == [p.offset for p in pieces]


def test_a_refused_o_direct_takes_the_buffered_shape(tmp_path, src, monkeypatch):
    """A filesystem that refuses O_DIRECT (EINVAL at open: some FUSE mounts, older tmpfs; ext4 and
    tmpfs here accept it, so the refusal is simulated at os.open): a cold load falls back to the page
    cache with the buffered defaults (one reader per CPU, whole pieces), not O_DIRECT's 8 x 1 MiB,
    and says why."""
    import errno
    import os

    from coldstart.warm.residency import evict

    out = tmp_path / "nodirect"
    dump_tensors(src.items(), out, chunk_bytes=DIGEST_CHUNK)
    evict(out / DATA_NAME)
    real_open = os.open

    def no_direct(path, flags, *args, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", no_direct)
    dest = _page_aligned(src)
    st = load_into(out, dest, chunk_bytes=64 * KIB, verify=True)
    assert not st.o_direct and st.direct_choice.endswith("O_DIRECT refused (Invalid argument) -> buffered"), st.direct_choice
    assert (st.threads, st.read_bytes) == (loader_mod.auto_threads(), 0)
    assert all(_raw(dest[k]) == _raw(v) for k, v in src.items())


def test_unknown_layout_is_refused(flat, src):
    with pytest.raises(ColdstartError, match="layout"):
        load_into(flat, _fresh(src), layout="zigzag")


def test_non_contiguous_destination(flat, src):
    dest = _fresh(src)
    base = torch.zeros(1024, 64, dtype=torch.float32)
    dest["torch.float32.3"] = base.t()  # a (64, 1024) transposed view: loaded through a shadow, copied back
    load_into(flat, dest, chunk_bytes=64 * KIB)
    assert torch.equal(base.t(), src["torch.float32.3"])


@pytest.mark.parametrize("layout", ["shared", "ranges"])
def test_each_tensor_is_reported_once_when_its_bytes_are_in_place(flat, src, layout):
    """on_landed: every tensor once, each already equal to the source when reported (a caller
    starts on it while the rest is read); a non-contiguous destination only once it is copied back."""
    dest = _fresh(src)
    base = torch.zeros(1024, 64, dtype=torch.float32)
    dest["torch.float32.3"] = base.t()
    seen: list[str] = []
    wrong: list[str] = []
    lock = threading.Lock()

    def landed(name: str) -> None:
        with lock:
            seen.append(name)
            if not torch.equal(dest[name], src[name]):
                wrong.append(name)

    load_into(flat, dest, chunk_bytes=64 * KIB, threads=4, layout=layout, on_landed=landed)
    assert sorted(seen) == sorted(src) and not wrong, (seen, wrong)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow a thread to one")
def test_readers_spread_past_a_one_core_caller(flat, src):
    """A caller bound to one core (vLLM's worker) still gets readers on every CPU it may use; with
    spread=False the readers keep the caller's mask."""
    got: dict = {}

    def bound_caller(spread: bool) -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        dest = _fresh(src)
        st = load_into(flat, dest, chunk_bytes=64 * KIB, threads=4, spread=spread)
        got[spread] = (st.reader_cpus, all(torch.equal(dest[k], v) for k, v in src.items()))

    for spread in (True, False):
        t = threading.Thread(target=bound_caller, args=(spread,))
        t.start()
        t.join()
    from coldstart.cpulist import format_cpus

    mine = format_cpus(os.sched_getaffinity(0))
    assert got[True] == (f"{min(os.sched_getaffinity(0))} -> {mine}", True)
    assert got[False] == ("", True)


def test_plan_respects_digest_chunks():
    idx_entries = [type("E", (), {"offset": 0, "nbytes": 100 * KIB})(), type("E", (), {"offset": 104 * KIB, "nbytes": 10})()]
    pieces = plan_pieces(idx_entries, 40 * KIB, digest_chunk=16 * KIB, verify=True)
    # 40 KiB rounds down to 32 KiB (two whole digest chunks); the small tensor gets its own read
    assert [p.length for p in pieces] == [32 * KIB, 32 * KIB, 32 * KIB, 4 * KIB, 10]
    pieces = plan_pieces(idx_entries, 200 * KIB, digest_chunk=16 * KIB, verify=False)
    assert len(pieces) == 1 and [s.boff for s in pieces[0].segments] == [0, 104 * KIB]


def test_roundtrip_from_safetensors(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "tiny.flat"
    idx = dump_safetensors(tiny_model_dir, out)
    ref = load_file(str(tiny_model_dir / "model.safetensors"))
    assert {t.name for t in idx.tensors} == set(ref)
    dest = alloc_like_index(out)
    load_into(out / DATA_NAME, dest, verify=True)  # the weights.flat path works too
    for k, v in ref.items():
        assert _raw(dest[k]) == _raw(v), k


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(96, 80).to(torch.bfloat16)
        self.norm = torch.nn.BatchNorm1d(80)  # buffers: running stats + an int64 counter
        self.head = torch.nn.Linear(80, 7, bias=False).to(torch.float16)


def _named(m: torch.nn.Module):
    return chain(m.named_parameters(), m.named_buffers())


def test_roundtrip_from_live_module(tmp_path):
    torch.manual_seed(1)
    a = _Net()
    a.norm.running_mean.normal_()
    a.norm.num_batches_tracked.fill_(42)
    dump_tensors(_named(a), tmp_path / "live")
    torch.manual_seed(2)
    b = _Net()
    dest = dict(_named(b))  # parameters require grad: the loader writes them in place anyway
    ptrs = {k: v.data_ptr() for k, v in dest.items()}
    load_into(tmp_path / "live", dest)
    for (k, va), (_, vb) in zip(_named(a), _named(b)):
        assert _raw(va) == _raw(vb), k
        assert vb.data_ptr() == ptrs[k]  # in place: same memory
    assert b.lin.weight.requires_grad


def test_mismatches_name_the_tensor(flat, src):
    dest = _fresh(src)
    del dest["int8.1"]
    with pytest.raises(ColdstartError, match=r"'int8\.1'.*not in the destination"):
        load_into(flat, dest)
    load_into(flat, dest, strict=False)  # a subset loads when not strict
    dest = _fresh(src)
    dest["extra.weight"] = torch.zeros(3)
    with pytest.raises(ColdstartError, match=r"'extra\.weight'.*not in the dump"):
        load_into(flat, dest)
    dest = _fresh(src)
    dest["torch.float16.1"] = torch.zeros(1000, 38, dtype=torch.float16)
    with pytest.raises(ColdstartError, match=r"'torch\.float16\.1': shape \[1000, 38\].*\[1000, 37\]"):
        load_into(flat, dest)
    dest = _fresh(src)
    dest["torch.bfloat16.2"] = torch.zeros(257, 129, dtype=torch.float16)
    with pytest.raises(ColdstartError, match=r"'torch\.bfloat16\.2': dtype float16 .* bfloat16"):
        load_into(flat, dest)


def _copy_dump(flat: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (DATA_NAME, INDEX_NAME):
        (dst / name).write_bytes((flat / name).read_bytes())
    return dst


def test_truncated_data_file(flat, src, tmp_path):
    d = _copy_dump(flat, tmp_path / "t")
    size = (d / DATA_NAME).stat().st_size
    os.truncate(d / DATA_NAME, size - 8192)
    with pytest.raises(ColdstartError, match="truncated"):
        read_index(d)
    with pytest.raises(ColdstartError, match="truncated"):
        load_into(d, _fresh(src))


def test_bad_index(flat, tmp_path):
    d = _copy_dump(flat, tmp_path / "b")
    (d / INDEX_NAME).write_text("{not json")
    with pytest.raises(ColdstartError, match="corrupt index"):
        read_index(d)
    raw = json.loads((flat / INDEX_NAME).read_text())
    raw["version"] = 99
    (d / INDEX_NAME).write_text(json.dumps(raw))
    with pytest.raises(ColdstartError, match="version 99"):
        read_index(d)
    (d / INDEX_NAME).unlink()
    with pytest.raises(ColdstartError, match="missing index"):
        read_index(d)
    with pytest.raises(ColdstartError, match="no such"):
        read_index(tmp_path / "nowhere")


@pytest.mark.parametrize("mode", ["direct", "staged"])
def test_corrupt_chunk_names_the_tensor(flat, src, tmp_path, mode):
    d = _copy_dump(flat, tmp_path / "c")
    e = read_index(d).by_name()["torch.bfloat16.3"]
    with open(d / DATA_NAME, "r+b") as f:  # flip one byte in the tensor's third digest chunk
        f.seek(e.offset + 2 * DIGEST_CHUNK + 5)
        b = f.read(1)
        f.seek(e.offset + 2 * DIGEST_CHUNK + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ColdstartError, match=r"tensor 'torch\.bfloat16\.3': chunk 2 .*digest"):
        load_into(d, _fresh(src), verify=True, mode=mode, chunk_bytes=64 * KIB)
    load_into(d, _fresh(src), verify=False, mode=mode)  # without verification the bytes just load
    _, bad = verify_flat(d)
    assert len(bad) == 1 and "torch.bfloat16.3" in bad[0]


_DUMP_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    from pathlib import Path
    import coldstart.weights.dump as dump
    out, ready, where = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    tensors = ((f"t{i}", torch.full((1 << 20,), i, dtype=torch.float32)) for i in range(64))  # 256 MiB
    def hang(*a, **k):
        ready.write_text("x")
        time.sleep(600)
    if where == "data":
        state = {"n": 0}
        def progress(done, total):
            state["n"] += 1
            if state["n"] == 20:
                hang()
        dump.dump_tensors(tensors, out, chunk_bytes=1 << 20, progress=progress)
    else:  # everything written and fsynced, killed just before the publishing rename
        dump.fsync_dir = hang
        dump.dump_tensors(tensors, out, chunk_bytes=1 << 20)
""")


@pytest.mark.parametrize("where", ["data", "publish"])
def test_sigkill_during_dump_leaves_no_dump(tmp_path, where):
    out, ready = tmp_path / "dump", tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", _DUMP_SCRIPT, str(out), str(ready), where])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert p.poll() is None, "dump subprocess died early"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    assert not out.exists()
    with pytest.raises(ColdstartError):
        read_index(out)
    leftovers = [x for x in tmp_path.iterdir() if x.name.startswith(".dump.staging-")]
    assert leftovers  # the killed writer's staging dir is there, never named like a dump
    # the next dump into the same place succeeds and sweeps the dead writer's staging dir
    dump_tensors([("a", torch.ones(4))], out)
    assert read_index(out).tensors[0].name == "a"
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".dump.staging-")]


def test_dump_refuses_existing_output(flat):
    with pytest.raises(ColdstartError, match="already exists"):
        dump_tensors([("a", torch.ones(1))], flat)


# ---- the staged pipeline's buffer scheduling (what the CUDA path relies on), without a device


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when its owner says so, or when synchronized."""

    def __init__(self, on_complete=None) -> None:
        self.done = threading.Event()
        self.on_complete = on_complete
        self.synced = False
        self._lock = threading.Lock()

    def complete(self) -> None:
        with self._lock:
            if not self.done.is_set():
                if self.on_complete:
                    self.on_complete()
                self.done.set()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.synced = True
        self.complete()


def test_buffer_pool_waits_for_the_fence():
    pool = BufferPool(["A", "B"])
    a, b = pool.acquire(), pool.acquire()
    ev_a, ev_b = FakeEvent(), FakeEvent()
    pool.release(a, ev_a)
    pool.release(b, ev_b)
    ev_b.complete()  # B's copy is done, but A is older: FIFO claims A and synchronizes on it
    got = pool.acquire()
    assert got == "A" and ev_a.synced
    assert pool.acquire() == "B" and not ev_b.synced  # already complete: no synchronize needed

    pool2 = BufferPool(["X"])
    x = pool2.acquire()
    out = []
    t = threading.Thread(target=lambda: out.append(pool2.acquire()))
    t.start()
    time.sleep(0.2)
    assert not out  # nothing free, nothing pending: the reader waits
    pool2.release(x, None)
    t.join(5)
    assert out == ["X"]

    pool3 = BufferPool(["Y"])
    pool3.acquire()
    errs = []

    def blocked():
        try:
            pool3.acquire()
        except Exception as e:  # noqa: BLE001
            errs.append(type(e).__name__)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    pool3.close()  # an error elsewhere: blocked readers are released
    t.join(5)
    assert errs == ["_Stopped"]


class DeferredCopier:
    """Behaves like the CUDA copier: copies are queued and only happen when their event completes
    (later, in another thread, or when synchronized). If the pool handed a buffer back to the readers
    before its event completed, a reader would overwrite it first and the loaded bytes would differ."""

    numpy_views = True

    def __init__(self) -> None:
        self.pending: list[FakeEvent] = []
        self.max_in_flight = 0
        self.stop = threading.Event()
        self.completer = threading.Thread(target=self._complete_slowly, daemon=True)
        self.completer.start()

    def _complete_slowly(self) -> None:
        while not self.stop.is_set():
            time.sleep(0.002)
            if self.pending:
                self.pending.pop(0).complete()

    def host_buffer(self, n: int):
        return bytearray(n)

    def host_view(self, buf) -> memoryview:
        return memoryview(buf)

    def copy(self, piece, buf, views):
        snap = [(s, ) for s in piece.segments]

        def do_copy() -> None:
            src = np.frombuffer(buf, dtype=np.uint8)
            for (s,) in snap:
                views[s.tensor][s.toff:s.toff + s.length] = src[s.boff:s.boff + s.length]

        ev = FakeEvent(on_complete=do_copy)
        self.pending.append(ev)
        self.max_in_flight = max(self.max_in_flight, len(self.pending))
        return ev

    def finish(self) -> None:
        for ev in list(self.pending):
            ev.synchronize()
        self.stop.set()


@pytest.mark.parametrize("copies", ["readers", "coordinator"])
def test_staged_pipeline_never_reuses_a_busy_buffer(flat, src, monkeypatch, copies):
    """Whoever issues the copies (each reader, CUDA's default, or one coordinator), a buffer goes
    back to the readers only after its deferred copy has happened."""
    copier = DeferredCopier()
    monkeypatch.setattr(loader_mod, "make_copier", lambda device, targets: copier)
    dest = _fresh(src)
    st = load_into(flat, dest, mode="staged", threads=4, buffers=3, chunk_bytes=16 * KIB, verify=True, copies=copies)
    for k, v in src.items():
        assert _raw(dest[k]) == _raw(v), k
    assert copier.max_in_flight >= 1
    assert st.copies == copies


def test_copy_issuer_defaults_and_refusal(flat, src):
    assert loader_mod.default_copies("cuda") == "readers" and loader_mod.default_copies("cpu") == "coordinator"
    st = load_into(flat, _fresh(src), mode="staged", threads=2)
    assert st.copies == "coordinator"
    assert load_into(flat, _fresh(src), mode="direct").copies == ""
    with pytest.raises(ColdstartError, match="unknown copy issuer 'gpu'"):
        load_into(flat, _fresh(src), mode="staged", copies="gpu")


class FakeCuda:
    """Stands in for the torch.cuda module: records stream/event/registration calls, so the CUDA
    copier's own code runs here (its copies are real torch copies between CPU tensors)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.registered: set[int] = set()
        self.n_registered = 0
        fake = self

        class Stream:
            def __init__(self, device=None) -> None:
                self.device = device

            def wait_stream(self, other) -> None:
                fake.log.append(("wait_stream", other))

            def synchronize(self) -> None:
                fake.log.append(("stream_sync",))

        class Event:
            def record(self, stream) -> None:
                fake.log.append(("record", stream))

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:
                pass

        self.Stream, self.Event = Stream, Event

    def current_stream(self, device=None):
        return "current"

    def stream(self, st):
        fake = self

        class Ctx:
            def __enter__(self):
                fake.log.append(("enter", st))

            def __exit__(self, *exc):
                fake.log.append(("exit", st))

        return Ctx()

    def cudart(self):
        return self

    def cudaHostRegister(self, ptr, n, flags):
        assert ptr % 4096 == 0
        self.registered.add(ptr)
        self.n_registered += 1
        return 0

    def cudaHostUnregister(self, ptr):
        self.registered.remove(ptr)
        return 0


def test_cuda_copier_code_path_without_a_device(flat, src, monkeypatch):
    """UNVERIFIED ON GPU: runs CudaCopier's code with a stand-in torch.cuda; checks the ordering it
    promises (side stream waits for the current one; each buffer's copies are issued on the side stream
    and followed by an event on it; host registrations undone; everything synchronized at the end)."""
    fake = FakeCuda()
    copier = loader_mod.CudaCopier("cuda:0", cuda=fake)
    # a pinned allocation that is not page-aligned: exercises the mmap + cudaHostRegister fallback
    def misaligned(n: int) -> torch.Tensor:
        t = torch.empty(n + 128, dtype=torch.uint8)
        k = 64 if (t.data_ptr() + 64) % 4096 else 128
        return t[k:k + n]

    copier._pinned = misaligned
    monkeypatch.setattr(loader_mod, "make_copier", lambda device, targets: copier)
    dest = _fresh(src)
    load_into(flat, dest, mode="staged", threads=2, buffers=2, chunk_bytes=64 * KIB, direct=True)
    for k, v in src.items():
        assert _raw(dest[k]) == _raw(v), k
    log = fake.log
    assert log[0] == ("wait_stream", "current")
    side = copier.stream
    body = log[1:-1]
    assert body and len(body) % 3 == 0
    for i in range(0, len(body), 3):
        assert body[i:i + 3] == [("enter", side), ("record", side), ("exit", side)]
    assert log[-1] == ("stream_sync",)
    assert fake.n_registered == 2 and not fake.registered  # both buffers registered, then unregistered


# ---- CLI (in-process through coldstart.cli.main, which prints `error: ...` and exits 1; one real
# subprocess checks the installed entry point)


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    from coldstart import cli

    monkeypatch.setattr(sys, "argv", ["coldstart", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_errors_are_one_line(tmp_path, flat, capsys, monkeypatch):
    r = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "weights", "load", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    d = _copy_dump(flat, tmp_path / "c")
    with open(d / DATA_NAME, "r+b") as f:
        f.seek(read_index(d).by_name()["int8.3"].offset)
        f.write(b"\x7f\x7f\x7f")
    code, _, err = _main(capsys, monkeypatch, "weights", "verify", str(d))
    assert code == 1 and "int8.3" in err and len(err.strip().splitlines()) == 1
    code, _, err = _main(capsys, monkeypatch, "weights", "load", str(d), "--verify")
    assert code == 1 and "int8.3" in err and err.strip().startswith("error:")
    code, _, err = _main(capsys, monkeypatch, "weights", "dump", str(tmp_path / "nope"), str(tmp_path / "o"))
    assert code == 1 and "not a directory" in err


def test_cli_dump_load_verify(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cli.flat"
    code, _, err = _main(capsys, monkeypatch, "weights", "dump", str(tiny_model_dir), str(out))
    assert code == 0, err
    code, stdout, err = _main(capsys, monkeypatch, "weights", "load", str(out), "--json", "--verify", "--threads", "2")
    assert code == 0, err
    stats = json.loads(stdout.strip().splitlines()[-1])
    assert stats["tensors"] == len(read_index(out).tensors) and stats["verify"] is True
    code, stdout, _ = _main(capsys, monkeypatch, "weights", "load", str(out))
    assert code == 0 and "throughput" in stdout
    code, stdout, _ = _main(capsys, monkeypatch, "weights", "verify", str(out))
    assert code == 0 and stdout.startswith("ok:")


def test_tune_queue_measures_each_request_size_and_sets_only_when_asked(tmp_path):
    """On a real block device (an ext4 image on a loop device): the probe populates a file cold under
    each max_sectors_kb, puts the queue back as it found it, and chooses one it measured; --apply
    sets the choice and names a udev rule for it; bad input is one line."""
    from coldstart.weights import queue

    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "160M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        f = mnt / "weights.flat"
        f.write_bytes(os.urandom(80 << 20))
        q = queue.queue_dir(f)
        assert q.parent.name.startswith("loop"), q
        before = queue.current_kb(q)
        rec = queue.probe(f, span=64 << 20, rounds=2)
        assert queue.current_kb(q) == before and rec.current_kb == before
        assert set(rec.gib_s) >= {before} and all(len(v) == 2 and min(v) > 0 for v in rec.gib_s.values())
        assert rec.choice_kb in rec.gib_s and rec.span_bytes == 64 << 20
        cli = [sys.executable, "-m", "coldstart", "weights", "tune-queue", str(f), "--rounds", "1", "--span-mb", "64"]
        out = subprocess.run([*cli, "--apply"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert f"{q.parent.name} (" in out.stdout and "max_sectors_kb" in out.stdout, out.stdout
        if out.stdout.splitlines()[-1].startswith("set "):
            chosen = int(out.stdout.split(" -> ")[1].split()[0])
            assert queue.current_kb(q) == chosen and f'ATTR{{queue/max_sectors_kb}}="{chosen}"' in out.stdout
        else:
            assert queue.current_kb(q) == before and out.stdout.splitlines()[-1].startswith("keep ")
        queue.apply(q, before)
        with pytest.raises(ColdstartError, match="out of range"):
            queue.apply(q, 1 << 30)
        small = mnt / "small"
        small.write_bytes(b"x" * 4096)
        out = subprocess.run([*cli[:5], str(small)], capture_output=True, text=True)
        assert out.returncode != 0 and "too small to probe" in out.stderr and "Traceback" not in out.stderr, out.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    shm = Path("/dev/shm") / f"cs-tune-{os.getpid()}"
    shm.write_bytes(b"x")
    try:
        with pytest.raises(ColdstartError, match="on no block device"):
            queue.queue_dir(shm)
        with pytest.raises(ColdstartError, match="No such file"):
            queue.queue_dir(shm.with_name(shm.name + "-missing"))
    finally:
        shm.unlink()
