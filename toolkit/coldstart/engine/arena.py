"""File-mapped weights on CPU: one page-aligned arena laid out exactly like the flat weights file.

Why: after sleep level 2 a copy-based reload (ours or vLLM's ``reload_weights``) first pays a
zero-fill page fault for every 4 KiB of weights (~330 k faults for 1.3 GiB) and then copies every
byte. If the weights live in one anonymous mapping whose layout *is* the flat file's (same order,
offsets and alignment as ``coldstart.weights.dump.dump_tensors`` writes for ``model_tensors``), a
reload is one ``mmap(MAP_PRIVATE|MAP_FIXED)`` of the file over the arena: the page cache's pages are
mapped, not copied, and ``MADV_POPULATE_READ`` (kernel >= 5.14) in a few threads maps them all
before the first forward pass would fault on them. Copy-on-write keeps the file unchanged if
anything ever writes a weight.

Sleep level 2 replaces the arena by a fresh anonymous mapping (``MAP_FIXED|MAP_ANONYMOUS|
MAP_NORESERVE``): the pages go, the addresses stay valid, CRIU dumps no weight pages and the image
holds no reference to the weights file. A restored process maps the snapshot's weights file again,
so that file must stay in place (and unchanged) while the server runs.

Tensors that cannot be re-pointed safely (non-contiguous, a view into a bigger storage, a storage
shared by two names) stay where vLLM put them; the arena still reserves their bytes (the file has
them) and a reload copies them out of the mapped arena.

CPU only. The GPU path keeps vLLM's CuMemAllocator and our loader's CUDA target.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coldstart.errors import ColdstartError
from coldstart.weights.format import DEFAULT_ALIGNMENT, FlatIndex, align_up, dtype_name, require_present

PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x10, 0x20, 0x4000
MADV_WILLNEED, MADV_DONTNEED, MADV_HUGEPAGE, MADV_POPULATE_READ = 3, 4, 14, 22
MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
_libc.mremap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
PAGE = os.sysconf("SC_PAGE_SIZE")
SETTLED_PARTLY = "settled already (the spans behind kept packed handles stay mapped)"


def _mmap(addr: int | None, size: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    r = _libc.mmap(addr, size, PROT_READ | PROT_WRITE, flags, fd, offset)
    if r is None or r == MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, f"mmap({size} bytes): {os.strerror(e)}")
    if addr is not None and r != addr:
        raise OSError(0, f"mmap(MAP_FIXED) returned {r:#x}, not {addr:#x}")
    return r


def _madvise(addr: int, size: int, advice: int) -> None:
    if _libc.madvise(addr, size, advice) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"madvise({advice}, {size} bytes): {os.strerror(e)}")


@dataclass
class Span:
    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    inplace: bool  # True: the tensor's data lives in the arena; False: left where vLLM put it


@dataclass
class WeightArena:
    """One anonymous mapping holding the model's tensors at the flat file's offsets."""

    addr: int
    size: int
    alignment: int
    spans: list[Span]
    tensors: dict[str, Any] = field(repr=False)  # name -> the model's own tensor object
    mapped: str | None = None  # the file currently mapped over the arena (None: anonymous)
    lazy: list[str] = field(default_factory=list)  # spans map_file left unpopulated, settle leaves mapped
    settled_partly: bool = False  # settled all but the lazy spans (the file stays mapped under them)
    # map_file's populating threads while they run: (threads, errors, path, when mapped)
    _populating: tuple | None = field(default=None, repr=False)

    # --- construction
    @classmethod
    def build(cls, named: dict[str, Any], alignment: int = DEFAULT_ALIGNMENT) -> "WeightArena":
        """Move every eligible tensor of ``named`` (name -> the module's own Parameter/buffer, in
        dump order) into a fresh arena and point it there (``t.data = view``)."""
        import torch

        storages: dict[int, int] = {}
        for t in named.values():
            p = t.untyped_storage().data_ptr()
            storages[p] = storages.get(p, 0) + 1
        spans: list[Span] = []
        for name, t in named.items():
            nbytes = t.numel() * t.element_size()
            st = t.untyped_storage()
            inplace = (t.device.type == "cpu" and t.is_contiguous() and t.storage_offset() == 0
                       and st.nbytes() == nbytes and storages[st.data_ptr()] == 1)
            spans.append(Span(name, dtype_name(t.dtype), [int(s) for s in t.shape], 0, nbytes, inplace))
        arena = cls._mapped(spans, alignment)
        arena.tensors = dict(named)
        with torch.no_grad():
            for s in spans:
                if s.inplace:
                    t = named[s.name]
                    view = arena.view(s)
                    view.copy_(t)
                    t.data = view  # the Parameter/buffer object keeps its identity, its data moves
        return arena

    @classmethod
    def empty(cls, sizes: dict[str, int], alignment: int = DEFAULT_ALIGNMENT) -> "WeightArena":
        """A fresh arena of uint8 spans (name -> bytes, in dump order) whose tensors are views over
        it: for buffers that are not torch's (vLLM's packed GEMM handles, coldstart.engine.packed),
        pointed here by their owner."""
        arena = cls._mapped([Span(name, "uint8", [nbytes], 0, nbytes, True) for name, nbytes in sizes.items()],
                            alignment)
        arena.tensors = {s.name: arena.view(s) for s in arena.spans}
        return arena

    @classmethod
    def _mapped(cls, spans: list[Span], alignment: int) -> "WeightArena":
        """A fresh anonymous mapping for ``spans`` (in order), each placed at the next ``alignment``
        boundary, as dump_tensors places them in the file (their offsets are set here)."""
        if alignment % PAGE:
            raise ColdstartError(f"arena alignment {alignment} is not a multiple of the page size")
        pos = 0
        for s in spans:
            s.offset = align_up(pos, alignment)
            pos = s.offset + s.nbytes
        size = max(align_up(pos, alignment), alignment)
        addr = _mmap(None, size, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
        return cls(addr=addr, size=size, alignment=alignment, spans=spans, tensors={})

    def view(self, s: Span):
        """A tensor over the arena bytes of ``s`` (shape and dtype of the tensor)."""
        import torch

        from coldstart.weights.format import torch_dtype

        if not s.nbytes:
            return torch.empty(s.shape, dtype=torch_dtype(s.dtype))
        buf = (ctypes.c_uint8 * s.nbytes).from_address(self.addr + s.offset)
        return torch.frombuffer(buf, dtype=torch_dtype(s.dtype)).view(s.shape)

    # --- facts
    @property
    def inplace_bytes(self) -> int:
        return sum(s.nbytes for s in self.spans if s.inplace)

    def left_in_place(self) -> list[str]:
        return [s.name for s in self.spans if not s.inplace]

    def intact(self) -> str | None:
        """None if every re-pointed tensor still lives at its arena address, else the first one
        that moved (something replaced its data: a map reload would not reach it)."""
        for s in self.spans:
            if s.inplace and self.tensors[s.name].data_ptr() != self.addr + s.offset:
                return s.name
        return None

    def check_index(self, index: FlatIndex) -> None:
        """Refuse (ColdstartError) unless ``index`` describes exactly this arena's layout."""
        if len(index.tensors) != len(self.spans):
            raise ColdstartError(f"flat index does not match the weight arena: {len(index.tensors)} tensors "
                                 f"in the file, {len(self.spans)} in the model")
        for e, s in zip(index.tensors, self.spans):
            if (e.name, e.dtype, list(e.shape), e.offset, e.nbytes) != (s.name, s.dtype, s.shape, s.offset, s.nbytes):
                raise ColdstartError(
                    f"flat index does not match the weight arena at {s.name!r}: file has "
                    f"{e.name} {e.dtype}{list(e.shape)} @{e.offset}+{e.nbytes}, arena {s.name} "
                    f"{s.dtype}{s.shape} @{s.offset}+{s.nbytes}")
        if index.data_size != self.size:
            raise ColdstartError(f"flat file size {index.data_size} does not match the weight arena ({self.size} bytes)")

    def _unsettleable(self) -> str | None:
        """Why ``settle`` has nothing to do, or None."""
        if not self.mapped:
            return "the arena is not mapped from a file"
        return SETTLED_PARTLY if self.settled_partly else None

    def settle_bytes(self) -> int:
        """What ``settle`` will copy: the arena less the lazy spans (0 when it has nothing to do)."""
        if self._unsettleable():
            return 0
        return sum(n for _, n in self.extents(set(self.lazy)))

    def extents(self, skip: frozenset[str] | set[str] = frozenset()) -> list[tuple[int, int]]:
        """Page-aligned (offset, length) runs of the arena covering every span not named in ``skip``
        (merged where they touch); the whole arena when nothing is skipped."""
        if not skip:
            return [(0, self.size)]
        runs: list[tuple[int, int]] = []
        for s in self.spans:
            if s.name in skip or not s.nbytes:
                continue
            start, end = s.offset - s.offset % PAGE, align_up(s.offset + s.nbytes, PAGE)
            if runs and start <= runs[-1][1]:
                runs[-1] = (runs[-1][0], max(runs[-1][1], end))
            else:
                runs.append((start, end))
        return [(a, b - a) for a, b in runs]

    # --- the two operations
    def map_file(self, index: FlatIndex, *, threads: int = 4, verify: bool = False,
                 piece: int = 64 << 20, willneed: bool = True, populate: str = "now",
                 skip: frozenset[str] | set[str] = frozenset(), huge: bool = True) -> dict:
        """Map the flat file over the arena (after ``check_index``), populate it, copy the tensors
        left in place out of it. Returns timings. Raises ColdstartError on any failure.
        ``populate`` "background": the populating threads are left running (``wait_populated``):
        the caller's own work on the weights (prepacking them) goes on meanwhile, faulting in with
        ``populate_tensor`` what it reaches first. On a cold page cache the populate waits on the
        disk with the CPUs idle, and the prepack then needs them both (AVX-512 host: 0.7 s, then
        1 s); side by side they take the longer of the two. (Not with ``verify``: it reads all.)
        ``skip``: spans the caller will not read (linear weights whose packed handles were kept
        through the checkpoint): mapped like the rest, neither read ahead nor populated.
        ``huge``: MADV_HUGEPAGE on the mapping, so that a cold read fills the page cache in 2 MiB
        folios (99% of the file against ~60% without): the device then writes into a few large
        pages instead of many small ones, which the Intel AMX VM's hypervisor charges for (1.04-1.07x
        faster paired in seven runs, for about half the CPU; results/spot-checks/huge-folios,
        results/reload-intel-28 to -32). Pages already cached are mapped as they are. The stats'
        ``huge_folios``: whether the kernel took the advice."""
        if populate not in ("now", "background"):
            raise ValueError(f"populate must be now or background, not {populate!r}")
        import torch

        self.check_index(index)
        require_present(index, (s.name for s in self.spans if s.name not in skip), "mapping it")
        moved = self.intact()
        if moved:
            raise ColdstartError(f"the weight arena is no longer intact ({moved!r} was moved out of it)")
        t0 = time.perf_counter()
        path = index.data_file
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ColdstartError(f"cannot open the weights file {path}: {e.strerror}") from None
        try:
            if os.fstat(fd).st_size != self.size:
                raise ColdstartError(f"{path}: size {os.fstat(fd).st_size} does not match the weight arena ({self.size})")
            _mmap(self.addr, self.size, MAP_PRIVATE | MAP_FIXED, fd, 0)
        except OSError as e:
            raise ColdstartError(f"mapping {path} over the weight arena failed: {e}") from None
        finally:
            os.close(fd)
        self.mapped = str(path)
        self.lazy = sorted(skip)
        advised = False
        if huge:
            try:
                _madvise(self.addr, self.size, MADV_HUGEPAGE)
                advised = True
            except OSError:  # a kernel without transparent huge pages: 4 KiB folios, as before
                pass
        t_map = time.perf_counter()
        extents = self.extents(skip)
        if willneed:  # asynchronous read-ahead of the file: the populate threads then find pages
            try:
                for o, n in extents:
                    _madvise(self.addr + o, n, MADV_WILLNEED)
            except OSError:
                pass
        errors: list[str] = []
        ranges = [(o + k, min(piece, n - k)) for o, n in extents for k in range(0, n, piece)]
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not ranges:
                        return
                    o, n = ranges.pop(0)
                try:
                    _madvise(self.addr + o, n, MADV_POPULATE_READ)
                except OSError as e:
                    errors.append(str(e))
                    return

        ths = [threading.Thread(target=work, name=f"cs-populate-{i}", daemon=True) for i in range(max(1, threads))]
        for th in ths:
            th.start()
        self._populating = (ths, errors, str(path), t_map)
        if populate == "now" or verify:
            self.wait_populated()
        t_pop = time.perf_counter()
        if verify:
            self._verify(index, threads, skip)
        t_ver = time.perf_counter()
        with torch.no_grad():
            for s in self.spans:
                if not s.inplace:
                    self.tensors[s.name].copy_(self.view(s))
        t1 = time.perf_counter()
        return {"mode": "map", "bytes": self.size, "populated_bytes": sum(n for _, n in extents), "tensors": len(self.spans),
                "copied_tensors": len(self.left_in_place()), "seconds": round(t1 - t0, 6),
                "map_s": round(t_map - t0, 6), "populate_s": round(t_pop - t_map, 6),
                "verify_s": round(t_ver - t_pop, 6), "verified": bool(verify), "threads": threads,
                "huge_folios": advised,
                "gib_s": round(self.size / 2**30 / (t1 - t0), 3) if t1 > t0 else 0.0}

    def wait_populated(self) -> float:
        """Join the populating threads map_file started; seconds from the mapping to now (0 when
        nothing was populating). Raises ColdstartError if populating failed."""
        ths, errors, path, t_map = self._populating or ((), [], "", time.perf_counter())
        self._populating = None
        for th in ths:
            th.join()
        if errors:
            raise ColdstartError(f"populating the mapped weights from {path} failed: {errors[0]}")
        return time.perf_counter() - t_map if ths else 0.0

    def _stop_populating(self) -> None:
        """Before the mapping changes under them: the populating threads end (their errors do not
        matter any more)."""
        try:
            self.wait_populated()
        except ColdstartError:
            pass

    def populate_tensor(self, t) -> None:
        """Fault in the mapped pages under tensor ``t`` now (no-op outside the arena; a failure is
        left to the populating threads to report: this is only an earlier start)."""
        a, n = t.data_ptr(), t.numel() * t.element_size()
        if not (self.addr <= a < self.addr + self.size) or not n:
            return
        start = a - a % PAGE
        end = min(self.addr + self.size, a + n + (-(a + n)) % PAGE)
        try:
            _madvise(start, end - start, MADV_POPULATE_READ)
        except OSError:
            pass

    def _verify(self, index: FlatIndex, threads: int, skip=frozenset()) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from coldstart.weights.format import hasher

        digest = hasher(index.digest_algo)
        jobs = []
        for e in index.tensors:
            if e.name in skip:  # neither populated nor read (map_file's ``skip``)
                continue
            for i, want in enumerate(e.chunk_digests):
                start = i * index.chunk_bytes
                n = min(index.chunk_bytes, e.nbytes - start)
                jobs.append((e.name, e.offset + start, n, want))

        def check(job):
            name, off, n, want = job
            got = digest((ctypes.c_uint8 * n).from_address(self.addr + off))
            return None if got == want else f"{name} @{off}"

        with ThreadPoolExecutor(max(1, threads)) as ex:
            bad = [b for b in ex.map(check, jobs) if b]
        if bad:
            raise ColdstartError(f"weights file {index.data_file}: digest mismatch in {len(bad)} chunk(s), "
                                 f"first {bad[0]}")

    def settle(self, *, piece: int = 32 << 20, stop: threading.Event | None = None) -> dict:
        """Turn a mapped arena into anonymous memory holding the same bytes at the same addresses:
        copy it into a new anonymous mapping, then ``mremap`` that mapping over the arena in one
        step (a reader never sees anything but the weights). Why: a restored server served 4-9 %
        slower from the page-cache mapping than from anonymous memory, where a stock server keeps
        its weights (docs/engine.md, "Settling"); and once settled the server no longer reads the
        weights file (on a lazy mount: no longer depends on the daemon for them).

        Safe while the server runs (nothing writes the weights between a reload and the next sleep);
        the caller must stop it (``stop``) before a sleep or a reload. Returns what it did;
        ``{"settled": False, "why": ...}`` if there was nothing to do or it was stopped.

        The spans map_file was told to skip (``lazy``) stay mapped and unread: copying them would
        read from the file what nothing reads. The rest moves run by run (one ``mremap`` each)."""
        if why := self._unsettleable():
            return {"settled": False, "why": why}
        self._stop_populating()
        t0 = time.perf_counter()
        extents = self.extents(set(self.lazy))
        new = _mmap(None, self.size, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
        left = [(0, self.size)]  # the parts of ``new`` still ours (a moved run's range may be reused)

        def drop_left() -> None:
            for o, n in left:
                if n:
                    _libc.munmap(new + o, n)

        moved = 0
        try:
            for o, n in extents:
                for k in range(0, n, piece):
                    if stop is not None and stop.is_set():
                        drop_left()
                        return {"settled": False, "why": "stopped (sleep or reload)", "copied": moved + k}
                    # releases the GIL
                    ctypes.memmove(new + o + k, self.addr + o + k, min(piece, n - k))
                r = _libc.mremap(new + o, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, self.addr + o)
                if r is None or r == MAP_FAILED or r != self.addr + o:
                    e = ctypes.get_errno()
                    raise OSError(e, f"mremap over the weight arena: {os.strerror(e)}")
                lo, ln = left.pop()  # runs go in order: the run came off the front of the last part
                left += [(lo, o - lo), (o + n, lo + ln - o - n)]
                moved += n
        except BaseException:
            drop_left()
            raise
        drop_left()  # the holes where the lazy spans were
        out = {"settled": True, "bytes": moved, "seconds": round(time.perf_counter() - t0, 6), "was": self.mapped}
        if self.lazy:
            self.settled_partly = True  # the file stays mapped under the lazy spans
            out["left_mapped"] = self.size - moved
        else:
            self.mapped = None
        return out

    def release(self) -> int:
        """Sleep level 2: a fresh anonymous mapping over the arena (pages gone, addresses valid)."""
        self._stop_populating()
        _mmap(self.addr, self.size, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE)
        self.mapped = None
        self.lazy, self.settled_partly = [], False
        return self.size

    def state(self) -> dict:
        return {"addr": self.addr, "bytes": self.size, "tensors": len(self.spans),
                "left_in_place": self.left_in_place(), "mapped": self.mapped, "lazy": len(self.lazy),
                "settled_partly": self.settled_partly}


def file_mapped(path: str | Path, pid: int | str = "self") -> bool:
    """True if ``path`` appears in /proc/<pid>/maps (a live mapping of the file)."""
    p = str(Path(path).resolve())
    with open(f"/proc/{pid}/maps") as f:
        return any(line.rstrip("\n").endswith(" " + p) or line.rstrip("\n").endswith("\t" + p) for line in f)
