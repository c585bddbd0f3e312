"""The parallel weight loader: flat file -> preallocated tensors, in place.

Two ways to move the bytes, picked per destination:

* ``direct`` (CPU destinations, the default there): N reader threads ``os.preadv`` each piece of
  the file straight into the destination tensors' memory (a piece = a slice of a big tensor, or a run
  of small neighbouring tensors read with one preadv whose iovecs point at each tensor, the
  alignment padding going to a scratch buffer). No intermediate buffer, no extra memcpy: the
  kernel's copy from the page cache (or the disk DMA, with O_DIRECT) is the only one.
* ``staged`` (CUDA destinations; selectable on CPU to measure it): N reader threads fill K reusable
  host buffers (pinned on CUDA); each filled buffer is copied into the destination tensors by the
  reader that filled it (CUDA's default) or by one coordinating thread (on CUDA: async copies on a
  side stream; a buffer goes back to the readers only once the event recorded after its copies has
  completed). The CUDA path is
  verified on an H100 by the GPU kit (tests/gpu, results/gpu/, docs/gpu.md); its scheduling is also
  unit-tested without a device.

Both release the GIL where the time goes (preadv, torch copy_), and both can verify the per-chunk
digests of the index while loading (an error names the tensor).

Page cache or not: by default the loader looks at the data file's residency first (mincore). A
cached file, or unaligned destinations, read through the page cache; a cold file into page-aligned
destinations (the engine's weight arena, CUDA's staging buffers) the way its device was probed to
read faster (weights.readshape), O_DIRECT in 1 MiB reads where it was not probed.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from coldstart.cpulist import format_cpus, widen_thread
from coldstart.errors import ColdstartError
from coldstart.fsutil import will_need
from coldstart.weights.format import (FlatIndex, TensorEntry, align_up, hasher, read_index, require_present,
                                     torch_dtype)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
DIRECT_IO_ALIGN = 4096
MAX_SEGMENTS = 400  # tensors per coalesced read: with their padding iovecs, well under IOV_MAX (1024)
BOUNCE_BYTES = 8 << 20  # O_DIRECT into unaligned tensors: per-thread bounce buffer, at most this size
COLD_DIRECT_MAX = 0.10  # direct=None: O_DIRECT when less than this fraction of the data file is cached
ALIGNED_DIRECT_MIN = 0.90  # ... and at least this share of the bytes land in page-aligned destinations


@dataclass
class LoadStats:
    """What a load did and how fast (phases are wall seconds; *_s sums are thread-seconds)."""

    bytes: int
    seconds: float
    gib_per_s: float
    tensors: int
    mode: str  # direct | staged
    device: str
    threads: int
    chunk_bytes: int
    buffers: int
    verify: bool
    o_direct: bool
    phases: dict[str, float] = field(default_factory=dict)  # plan, io, finalize (wall)
    read_s: float = 0.0  # summed over reader threads: time inside preadv
    copy_s: float = 0.0  # time issuing/doing buffer -> tensor copies (staged)
    verify_s: float = 0.0  # time hashing
    wait_s: float = 0.0  # staged: coordinator waiting for a filled buffer (or, copies by readers, for the end)
    alloc_s: float = 0.0  # staged: allocating (on CUDA: pinning) the host buffers
    notes: list[str] = field(default_factory=list)
    layout: str = "ranges"  # ranges (one contiguous run per reader) | shared (one queue of pieces)
    read_bytes: int = 0  # largest blocking read of data not yet cached (0: whole pieces)
    fadvise: str = ""  # the hint given on each reader's fd ("" = none)
    direct_choice: str = ""  # "auto: N% cached -> O_DIRECT|buffered", or "" when the caller chose
    reader_cpus: str = ""  # "0 -> 0-1": the readers ran on more CPUs than the calling thread's mask
    copies: str = ""  # staged: who queued the copies out of the host buffers (readers | coordinator)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# --------------------------------------------------------------------------------------------
# planning


@dataclass
class Segment:
    """``length`` bytes of tensor ``tensor`` starting at byte ``toff``, found at ``boff`` in the piece."""

    tensor: int
    toff: int
    boff: int
    length: int


@dataclass
class Piece:
    """One read: ``length`` bytes of the file at ``offset`` (padding between segments included)."""

    offset: int
    length: int
    segments: list[Segment]


def plan_pieces(entries: list[TensorEntry], max_piece: int, *, digest_chunk: int, verify: bool) -> list[Piece]:
    """Cut the file into reads of at most ``max_piece`` bytes, in file order.

    Big tensors are split into ``max_piece`` slices (multiples of the digest chunk when verifying,
    so every piece holds whole digest chunks); small neighbours are coalesced into one read.
    """
    if verify:
        max_piece = max(digest_chunk, max_piece - max_piece % digest_chunk)
    order = sorted(range(len(entries)), key=lambda i: entries[i].offset)
    pieces: list[Piece] = []
    cur: Piece | None = None
    for i in order:
        e = entries[i]
        if e.nbytes == 0:
            continue
        if e.nbytes > max_piece:
            cur = None
            for start in range(0, e.nbytes, max_piece):
                n = min(max_piece, e.nbytes - start)
                pieces.append(Piece(e.offset + start, n, [Segment(i, start, 0, n)]))
            continue
        if cur is not None and e.offset + e.nbytes - cur.offset <= max_piece and len(cur.segments) < MAX_SEGMENTS:
            boff = e.offset - cur.offset
            cur.segments.append(Segment(i, 0, boff, e.nbytes))
            cur.length = boff + e.nbytes
        else:
            cur = Piece(e.offset, e.nbytes, [Segment(i, 0, 0, e.nbytes)])
            pieces.append(cur)
    return pieces


def check_dest(index: FlatIndex, dest: Mapping[str, Any], strict: bool) -> list[tuple[TensorEntry, Any]]:
    """Pair index entries with destination tensors; names, dtypes and shapes must match."""
    pairs = []
    names = index.by_name()
    if strict:
        missing = [n for n in names if n not in dest]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ColdstartError(f"tensor {missing[0]!r} is in the dump but not in the destination{more}")
        extra = [n for n in dest if n not in names]
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise ColdstartError(f"tensor {extra[0]!r} is in the destination but not in the dump{more}")
    for e in index.tensors:
        t = dest.get(e.name)
        if t is None:
            continue
        want_dt = torch_dtype(e.dtype)
        if t.dtype != want_dt:
            raise ColdstartError(f"tensor {e.name!r}: dtype {str(t.dtype).removeprefix('torch.')} in the destination, {e.dtype} in the dump")
        if list(t.shape) != list(e.shape):
            raise ColdstartError(f"tensor {e.name!r}: shape {list(t.shape)} in the destination, {e.shape} in the dump")
        pairs.append((e, t))
    if not pairs and index.tensors:
        raise ColdstartError("no tensor of the dump is in the destination")
    require_present(index, (e.name for e, _ in pairs), "loading it")
    return pairs


# --------------------------------------------------------------------------------------------
# host buffers and the buffer pool (the scheduling shared by the CPU and CUDA staged paths)


class BufferPool:
    """K reusable host buffers. A buffer released with a ``fence`` (anything with ``query()`` and
    ``synchronize()``, e.g. a torch.cuda.Event recorded after the copies that read it) is handed out
    again only once the fence has completed: readers never overwrite a buffer a copy still reads."""

    def __init__(self, buffers: list[Any]):
        self._free: deque[Any] = deque(buffers)
        self._pending: deque[tuple[Any, Any]] = deque()  # (buffer, fence), oldest first
        self._cond = threading.Condition()
        self._closed = False
        self.size = len(buffers)

    def acquire(self) -> Any:
        with self._cond:
            while True:
                if self._closed:
                    raise _Stopped()
                if self._free:
                    return self._free.popleft()
                if self._pending and self._pending[0][1].query():  # oldest copy already done
                    return self._pending.popleft()[0]
                if self._pending:
                    buf, fence = self._pending.popleft()  # claim the oldest; wait for it unlocked
                    break
                self._cond.wait()
        fence.synchronize()
        return buf

    def release(self, buf: Any, fence: Any = None) -> None:
        with self._cond:
            if fence is None:
                self._free.append(buf)
            else:
                self._pending.append((buf, fence))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Stopped(Exception):
    pass


def _aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory (O_DIRECT needs aligned buffers)."""
    return mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))


def _bytes_view(t):
    """A flat uint8 torch view of a contiguous tensor."""
    import torch

    t = t.detach()  # parameters require grad; the in-place load must not be recorded by autograd
    if t.dim() == 0:
        t = t.reshape(1)
    return t.reshape(-1).view(torch.uint8)


def _preadv_full(fd: int, views: list, offset: int, what: Callable[[], str], need: int | None = None) -> int:
    """preadv until every view is full (or, at end of file, at least ``need`` bytes were read: an
    O_DIRECT read rounded up past the end); a short file is a truncated dump."""
    total = sum(len(v) for v in views)
    need = total if need is None else need
    done = 0
    while done < total:
        try:
            n = os.preadv(fd, views, offset + done)
        except OSError as e:
            raise ColdstartError(f"reading {what()} from the weights file failed: {e.strerror or e}") from None
        if n <= 0:
            if done >= need:
                return done
            raise ColdstartError(f"weights file ended early while reading {what()} (truncated dump?)")
        done += n
        if done < total:  # short read: advance the iovecs
            skip, rest = n, []
            for v in views:
                if skip >= len(v):
                    skip -= len(v)
                    continue
                rest.append(v[skip:])
                skip = 0
            views = rest
    return total


def _steps(views: list, start: int, step: int):
    """``views`` from byte ``start`` on, cut into lists of views of at most ``step`` bytes each."""
    out, cur, room, skip = [], [], step, start
    for v in views:
        if skip >= len(v):
            skip -= len(v)
            continue
        v, skip = v[skip:], 0
        while len(v):
            take = min(room, len(v))
            cur.append(v[:take])
            v, room = v[take:], room - take
            if room == 0:
                out.append(cur)
                cur, room = [], step
    if cur:
        out.append(cur)
    return out


def _read_cold_aware(fd: int, views: list, offset: int, what: Callable[[], str], step: int) -> int:
    """Fill ``views`` from ``offset``: whatever the page cache already holds in one RWF_NOWAIT call
    (a warm file costs one syscall per piece), the rest in blocking reads of at most ``step`` bytes.

    Why small blocking reads: on a cold file the kernel's readahead keeps the device busy ahead of a
    stream of ~1 MiB reads; fio (the measured limit) reads this way, and fio's own 16 MiB reads were
    slower than its 1 MiB ones here (results/bench-load)."""
    total = sum(len(v) for v in views)
    done = 0
    if step <= 0 or step >= total:
        return _preadv_full(fd, views, offset, what)
    try:
        done = max(0, os.preadv(fd, views, offset, os.RWF_NOWAIT))
    except BlockingIOError:  # nothing of it cached yet (its readahead has been started)
        done = 0
    except OSError as e:  # EOPNOTSUPP on filesystems without non-blocking buffered reads
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise ColdstartError(f"reading {what()} from the weights file failed: {e.strerror or e}") from None
        done = 0
    if done >= total:
        return total
    pos = offset + done
    for part in _steps(views, done, step):
        pos += _preadv_full(fd, part, pos, what)
    return total


def _read_direct_steps(fd: int, views: list, offset: int, what: Callable[[], str], need: int, step: int) -> int:
    """O_DIRECT ``views`` (block-aligned) from ``offset`` in reads of ``step`` bytes (0: one read);
    the file may end inside the last block, after ``need`` bytes.

    Why steps: fio's 1 MiB O_DIRECT reads beat its 16 MiB ones on this disk (results/bench-load)."""
    total = sum(len(v) for v in views)
    parts = _steps(views, 0, step) if 0 < step < total else [views]
    pos = 0
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        pos += _preadv_full(fd, part, offset + pos, what, need=max(0, need - pos) if last else None)
    return pos


# --------------------------------------------------------------------------------------------
# the loader


class _Loader:
    def __init__(self, index: FlatIndex, pairs, *, threads: int, chunk_bytes: int, buffers: int | None, verify: bool,
                 direct: bool, progress: Progress | None, mode: str, layout: str = "ranges",
                 read_bytes: int = 0, fadvise: str | None = None, prefetch_bytes: int = 0, spread: bool = True,
                 copies: str | None = None, on_landed: Callable[[str], None] | None = None):
        import torch

        self.torch = torch
        self.index = index
        self.entries = [e for e, _ in pairs]
        self.notes: list[str] = []
        self.threads = max(1, threads)
        self.verify = verify
        self.o_direct = direct
        if direct and index.alignment < DIRECT_IO_ALIGN:
            self.notes.append(f"dump alignment {index.alignment} < {DIRECT_IO_ALIGN}: buffered reads used")
            self.o_direct = False
        self.progress = progress
        self.digest = hasher(index.digest_algo) if verify else None
        # non-contiguous destinations are loaded into a contiguous shadow, copied back at the end
        self.targets, self.post = [], []
        for _, t in pairs:
            if t.is_contiguous():
                self.targets.append(t)
            else:
                shadow = torch.empty(t.shape, dtype=t.dtype, device=t.device)
                self.targets.append(shadow)
                self.post.append((t, shadow))
        devices = {str(t.device) for t in self.targets}
        if len(devices) > 1:  # load_into splits by device before building loaders
            raise ColdstartError(f"destination tensors are on several devices ({', '.join(sorted(devices))})")
        self.device = self.targets[0].device.type if self.targets else "cpu"
        if mode == "auto":
            mode = "direct" if self.device == "cpu" else "staged"
        if mode not in ("direct", "staged"):
            raise ColdstartError(f"unknown load mode {mode!r} (auto, direct or staged)")
        if mode == "direct" and self.device != "cpu":
            raise ColdstartError("direct mode reads into host memory: use staged for device destinations")
        self.mode = mode
        if copies is None:
            copies = default_copies(self.device)
        if copies not in ("readers", "coordinator"):
            raise ColdstartError(f"unknown copy issuer {copies!r} (readers or coordinator)")
        self.copies = copies
        self.chunk_bytes = max(DIRECT_IO_ALIGN, chunk_bytes - chunk_bytes % DIRECT_IO_ALIGN)
        self.pieces = plan_pieces(self.entries, self.chunk_bytes, digest_chunk=index.chunk_bytes, verify=verify)
        self.max_piece = max((p.length for p in self.pieces), default=0)
        # staged: one buffer per reader plus two being copied out, unless the caller chose (4 buffers
        # for 8 readers left half of them idle on the H100 machine: results/gpu)
        self.nbuffers = max(1, buffers) if buffers else max(1, threads) + 2
        self.total = sum(e.nbytes for e in self.entries)
        self.done = 0
        self.lock = threading.Lock()
        self.read_s = self.copy_s = self.verify_s = self.wait_s = self.alloc_s = 0.0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.next_piece = 0
        if layout not in ("shared", "ranges"):
            raise ColdstartError(f"unknown read layout {layout!r} (shared or ranges)")
        self.layout = layout
        self.read_bytes = max(0, read_bytes)
        self.direct_step = align_up(self.read_bytes, DIRECT_IO_ALIGN)  # O_DIRECT reads stay block-aligned
        if fadvise not in (None, "sequential"):
            raise ColdstartError(f"unknown fadvise {fadvise!r} (sequential or none)")
        self.fadvise = fadvise
        self.prefetch_bytes = max(0, prefetch_bytes)
        self.spread = spread
        self.reader_cpus = ""
        self.tls = threading.local()
        self.views = [_bytes_view(t) for t in self.targets]  # torch uint8 views
        # direct mode: each tensor reported to ``on_landed`` once its last byte is in place (a shadowed
        # one, and every tensor in staged mode, only when the whole load is: _load_group)
        self.on_landed = on_landed
        self.left = [e.nbytes for e in self.entries]
        self.reported = [False] * len(self.entries)
        self.shadowed = {i for i, t in enumerate(self.targets) if t is not pairs[i][1]}
        self.np_views = [v.numpy() if self.device == "cpu" else None for v in self.views]

    # -- shared helpers
    def _spread(self) -> None:
        """Let this reader thread run on every CPU the process may use: a buffered read is a memcpy
        on the reader's CPU, and eight readers started in vLLM's one-core worker shared that core
        (docs/weights.md, "Reader CPUs")."""
        if not self.spread:
            return
        widened = widen_thread()
        if widened is not None and widened[0] != widened[1] and not self.reader_cpus:
            with self.lock:
                self.reader_cpus = f"{format_cpus(widened[0])} -> {format_cpus(widened[1])}"

    def _open(self) -> int:
        self._spread()
        flags = os.O_RDONLY
        if self.o_direct:
            try:
                return os.open(self.index.data_file, flags | os.O_DIRECT)
            except OSError as e:
                self.notes.append(f"O_DIRECT refused ({e.strerror}); buffered reads used")
                self.o_direct = False
        try:
            fd = os.open(self.index.data_file, flags)
        except OSError as e:
            raise ColdstartError(f"{self.index.data_file}: cannot open ({e.strerror})") from None
        if self.fadvise == "sequential" and not self.o_direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def _take(self) -> Piece | None:
        with self.lock:
            if self.stop.is_set() or self.next_piece >= len(self.pieces):
                return None
            p = self.pieces[self.next_piece]
            self.next_piece += 1
            return p

    def _what(self, piece: Piece) -> Callable[[], str]:
        return lambda: ", ".join(repr(self.entries[s.tensor].name) for s in piece.segments[:3])

    def _verify_segment(self, seg: Segment, data) -> None:
        """Check the digest chunks of ``seg`` (whole chunks by construction of the plan)."""
        e = self.entries[seg.tensor]
        cb = self.index.chunk_bytes
        t0 = time.perf_counter()
        for k in range(seg.toff // cb, -(-(seg.toff + seg.length) // cb)):
            a = k * cb - seg.toff
            b = min((k + 1) * cb, e.nbytes) - seg.toff
            if self.digest(data[a:b]) != e.chunk_digests[k]:
                raise ColdstartError(f"tensor {e.name!r}: chunk {k} (bytes {k * cb}..{min((k + 1) * cb, e.nbytes)}) "
                                     f"does not match its digest: corrupt weights file")
        dt = time.perf_counter() - t0
        with self.lock:
            self.verify_s += dt

    def _bounce(self, n: int):
        b = getattr(self.tls, "bounce", None)
        if b is None or len(b) < n:
            b = self.tls.bounce = _aligned_buffer(align_up(n, DIRECT_IO_ALIGN))
        return b

    def _advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.progress:
            self.progress(done, self.total)

    # -- direct mode: preadv into the destination memory
    def _direct_piece(self, fd: int, piece: Piece, scratch: memoryview) -> None:
        import numpy as np

        aligned_ok = True
        if self.o_direct:  # O_DIRECT: every iovec must be block-aligned in address and length
            aligned_ok = len(piece.segments) == 1 and piece.length % DIRECT_IO_ALIGN == 0 and \
                self.np_views[piece.segments[0].tensor][piece.segments[0].toff:].ctypes.data % DIRECT_IO_ALIGN == 0
        t0 = time.perf_counter()
        if aligned_ok:
            views, pos = [], 0
            for s in piece.segments:
                if s.boff > pos:
                    views.append(scratch[:s.boff - pos])
                views.append(memoryview(self.np_views[s.tensor][s.toff:s.toff + s.length]))
                pos = s.boff + s.length
            if self.o_direct:
                _read_direct_steps(fd, views, piece.offset, self._what(piece), piece.length, self.direct_step)
            else:
                _read_cold_aware(fd, views, piece.offset, self._what(piece), self.read_bytes)
            self.read_s_add(time.perf_counter() - t0)
            if self.verify:
                for s in piece.segments:
                    self._verify_segment(s, self.np_views[s.tensor][s.toff:s.toff + s.length])
        else:  # through a small page-aligned bounce buffer, in sub-reads (bounded memory, few faults)
            n = align_up(piece.length, DIRECT_IO_ALIGN)
            step = min(BOUNCE_BYTES, self.direct_step) if self.direct_step else BOUNCE_BYTES
            buf = self._bounce(min(n, step))
            arr = np.frombuffer(buf, dtype=np.uint8)
            pos = 0
            while pos < n:
                m = min(step, n - pos)
                t0 = time.perf_counter()
                _preadv_full(fd, [memoryview(buf)[:m]], piece.offset + pos, self._what(piece),
                             need=min(m, piece.length - pos))
                self.read_s_add(time.perf_counter() - t0)
                for s in piece.segments:
                    a, b = max(s.boff, pos), min(s.boff + s.length, pos + m)
                    if a < b:
                        dst = s.toff + a - s.boff
                        self.np_views[s.tensor][dst:dst + b - a] = arr[a - pos:b - pos]
                pos += m
            if self.verify:
                for s in piece.segments:
                    self._verify_segment(s, self.np_views[s.tensor][s.toff:s.toff + s.length])
        self._advance(sum(s.length for s in piece.segments))
        if self.on_landed is not None:
            self._landed(piece)

    def _landed(self, piece: Piece) -> None:
        done = []
        with self.lock:
            for s in piece.segments:
                self.left[s.tensor] -= s.length
                if self.left[s.tensor] <= 0 and s.tensor not in self.shadowed and not self.reported[s.tensor]:
                    self.reported[s.tensor] = True
                    done.append(self.entries[s.tensor].name)
        for name in done:
            self.on_landed(name)

    def report_rest(self) -> None:
        """The load is through: report every tensor not reported yet (shadowed, empty, staged)."""
        if self.on_landed is None:
            return
        for i, e in enumerate(self.entries):
            if not self.reported[i]:
                self.reported[i] = True
                self.on_landed(e.name)

    def read_s_add(self, dt: float) -> None:
        with self.lock:
            self.read_s += dt

    def _direct_worker(self) -> None:
        fd = -1
        try:
            fd = self._open()
            scratch = memoryview(_aligned_buffer(self.index.alignment * 2))
            while (p := self._take()) is not None:
                self._direct_piece(fd, p, scratch)
        except BaseException as e:  # noqa: BLE001 - handed to the coordinator
            with self.lock:
                self.errors.append(e)
            self.stop.set()
        finally:
            if fd >= 0:
                os.close(fd)

    def _split_ranges(self, n: int) -> list[list[int]]:
        """The pieces cut into ``n`` contiguous runs of about equal bytes: ``[next, end)`` piece
        indices, one run per reader (each reader is then one sequential stream, like fio's jobs)."""
        total = sum(p.length for p in self.pieces) or 1
        bounds = [0] * (n + 1)
        acc, k = 0, 1
        for i, p in enumerate(self.pieces):
            while k < n and acc >= total * k // n:
                bounds[k] = i
                k += 1
            acc += p.length
        for j in range(k, n + 1):
            bounds[j] = len(self.pieces)
        return [[bounds[j], bounds[j + 1]] for j in range(n)]

    def _take_range(self, ranges: list[list[int]], me: int) -> Piece | None:
        """The next piece of reader ``me``'s run; when it is done, take over the upper half of the
        biggest run left (so a slow stream's tail is shared, and both halves stay sequential)."""
        with self.lock:
            if self.stop.is_set():
                return None
            r = ranges[me]
            if r[0] >= r[1]:
                victim = max(range(len(ranges)), key=lambda j: ranges[j][1] - ranges[j][0])
                v = ranges[victim]
                left = v[1] - v[0]
                if left <= 0:
                    return None
                mid = v[0] + (left + 1) // 2 if left > 1 else v[0]
                r[0], r[1] = mid, v[1]
                v[1] = mid
            p = self.pieces[r[0]]
            r[0] += 1
            return p

    def _range_worker(self, ranges: list[list[int]], me: int) -> None:
        fd = -1
        try:
            fd = self._open()
            scratch = memoryview(_aligned_buffer(self.index.alignment * 2))
            hinted = last_end = 0
            while (p := self._take_range(ranges, me)) is not None:
                if self.prefetch_bytes and not self.o_direct:  # start the next bytes' reads early
                    if p.offset != last_end:  # a new run (taken over from another reader)
                        hinted = 0
                    last_end = p.offset + p.length
                    lo = max(hinted, p.offset + p.length)
                    hi = p.offset + p.length + self.prefetch_bytes
                    if hi > lo:
                        will_need(fd, lo, hi - lo)
                        hinted = hi
                self._direct_piece(fd, p, scratch)
        except BaseException as e:  # noqa: BLE001 - handed to the coordinator
            with self.lock:
                self.errors.append(e)
            self.stop.set()
        finally:
            if fd >= 0:
                os.close(fd)

    def run_direct(self) -> None:
        n = min(self.threads, max(1, len(self.pieces)))
        if self.layout == "ranges":
            ranges = self._split_ranges(n)
            ths = [threading.Thread(target=self._range_worker, args=(ranges, i), name=f"coldstart-load-{i}",
                                    daemon=True) for i in range(n)]
        else:
            ths = [threading.Thread(target=self._direct_worker, name=f"coldstart-load-{i}", daemon=True)
                   for i in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()

    # -- staged mode: readers fill K host buffers; they, or one coordinator, copy them out
    def run_staged(self) -> None:
        import queue

        copier = make_copier(self.device, self.targets)
        bufsize = align_up(self.max_piece, DIRECT_IO_ALIGN)
        t0 = time.perf_counter()
        bufs = [copier.host_buffer(bufsize) for _ in range(min(self.nbuffers, max(1, len(self.pieces))))]
        self.alloc_s = time.perf_counter() - t0
        pool = BufferPool(bufs)
        ready: "queue.Queue[tuple[Piece, Any] | BaseException | None]" = queue.Queue()
        nreaders = min(self.threads, max(1, len(self.pieces)))

        ranges = self._split_ranges(nreaders) if self.layout == "ranges" else None
        views = self.np_views if copier.numpy_views else self.views
        by_readers = self.copies == "readers"

        def copy_out(piece: Piece, buf) -> None:
            """Queue the piece's copies and hand the buffer back behind their fence. Readers call it
            themselves by default: a coordinator that issued every copy was the warm bound on the H100
            (copy_s 0.1 s of a 0.15 s load, results/gpu)."""
            t0 = time.perf_counter()
            fence = copier.copy(piece, buf, views)
            dt = time.perf_counter() - t0
            with self.lock:
                self.copy_s += dt
            pool.release(buf, fence)
            self._advance(sum(s.length for s in piece.segments))

        def reader(me: int) -> None:
            fd = -1
            try:
                fd = self._open()
                while (p := (self._take_range(ranges, me) if ranges is not None else self._take())) is not None:
                    buf = pool.acquire()
                    n = align_up(p.length, DIRECT_IO_ALIGN) if self.o_direct else p.length
                    t0 = time.perf_counter()
                    if self.o_direct:
                        _read_direct_steps(fd, [copier.host_view(buf)[:n]], p.offset, self._what(p), p.length,
                                           self.direct_step)
                    else:
                        _read_cold_aware(fd, [copier.host_view(buf)[:n]], p.offset, self._what(p), self.read_bytes)
                    self.read_s_add(time.perf_counter() - t0)
                    if self.verify:  # here, in parallel: one coordinator hashing everything was the bottleneck on GPU
                        hv = copier.host_view(buf)
                        for s in p.segments:
                            self._verify_segment(s, hv[s.boff:s.boff + s.length])
                    if by_readers:
                        copy_out(p, buf)
                    else:
                        ready.put((p, buf))
            except _Stopped:
                pass
            except BaseException as e:  # noqa: BLE001
                ready.put(e)
            finally:
                if fd >= 0:
                    os.close(fd)
                ready.put(None)

        ths = [threading.Thread(target=reader, args=(i,), name=f"coldstart-read-{i}", daemon=True)
               for i in range(nreaders)]
        for t in ths:
            t.start()
        finished = 0
        try:
            while finished < nreaders:
                t0 = time.perf_counter()
                item = ready.get()
                self.wait_s += time.perf_counter() - t0
                if item is None:
                    finished += 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                copy_out(*item)
            t0 = time.perf_counter()
            copier.finish()
            self.copy_s += time.perf_counter() - t0
        except BaseException:
            self.stop.set()
            pool.close()
            for t in ths:
                t.join()
            try:
                copier.finish()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        for t in ths:
            t.join()


class CpuCopier:
    """Staged copies on CPU: numpy memcpy (releases the GIL; torch's copy_ would wake its OpenMP
    pool, whose spinning threads steal the CPU from the readers); buffers are free at once."""

    numpy_views = True  # copy() gets numpy views of the destinations

    def host_buffer(self, n: int):
        return _aligned_buffer(n)

    def host_view(self, buf) -> memoryview:
        return memoryview(buf)

    def copy(self, piece: Piece, buf, views) -> None:
        import numpy as np

        src = np.frombuffer(buf, dtype=np.uint8)
        for s in piece.segments:
            np.copyto(views[s.tensor][s.toff:s.toff + s.length], src[s.boff:s.boff + s.length])
        return None

    def finish(self) -> None:
        pass


class CudaCopier:
    """Staged copies to a CUDA device (verified on an H100 and an H200: tests/gpu): pinned host buffers, async H2D copies on
    a side stream, one event per buffer recorded after its copies; the BufferPool hands the buffer
    back to the readers only after that event completed.

    ``copy`` may be called from several reader threads at once: torch's current stream is per thread,
    and every copy goes to the one side stream, so a buffer's event also covers the copies queued
    before it. ``cuda`` is the ``torch.cuda`` module; tests pass a stand-in to run this code without a
    device.
    """

    numpy_views = False  # copy() gets torch uint8 views of the destinations

    def __init__(self, device, cuda=None) -> None:
        import torch

        self.torch = torch
        self.cuda = cuda if cuda is not None else torch.cuda
        self.device = device
        self.stream = self.cuda.Stream(device=device)
        # the destinations may have just been (re)allocated or zeroed on the current stream
        self.stream.wait_stream(self.cuda.current_stream(device))
        self.registered: list[int] = []

    def _pinned(self, n: int):
        return self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)

    def host_buffer(self, n: int):
        buf = self._pinned(n)
        if buf.data_ptr() % DIRECT_IO_ALIGN:  # O_DIRECT needs page alignment: pin our own mmap instead
            m = _aligned_buffer(n)
            buf = self.torch.frombuffer(m, dtype=self.torch.uint8)
            rc = self.cuda.cudart().cudaHostRegister(buf.data_ptr(), n, 0)
            if int(rc) != 0:
                raise ColdstartError(f"cudaHostRegister failed ({rc})")
            self.registered.append(buf.data_ptr())
            buf._coldstart_mmap = m  # keep the mapping alive as long as the tensor
        return buf

    def host_view(self, buf) -> memoryview:
        return memoryview(buf.numpy())

    def copy(self, piece: Piece, buf, views):
        with self.cuda.stream(self.stream):
            for s in piece.segments:
                views[s.tensor][s.toff:s.toff + s.length].copy_(buf[s.boff:s.boff + s.length], non_blocking=True)
            ev = self.cuda.Event()
            ev.record(self.stream)
        return ev

    def finish(self) -> None:
        """Wait for every copy (also on errors: no DMA may outlive its host buffer)."""
        self.stream.synchronize()
        for ptr in self.registered:
            self.cuda.cudart().cudaHostUnregister(ptr)
        self.registered.clear()


def make_copier(device_type: str, targets):
    if device_type == "cpu":
        return CpuCopier()
    if device_type == "cuda":
        return CudaCopier(targets[0].device)
    raise ColdstartError(f"loading into {device_type} tensors is not supported (cpu, cuda)")


def load_into(
    flat: Path | str,
    dest: Mapping[str, Any],
    *,
    threads: int | None = None,
    chunk_bytes: int = 16 << 20,
    buffers: int | None = None,
    verify: bool = False,
    direct: bool | None = None,
    progress: Progress | None = None,
    strict: bool = True,
    mode: str = "auto",
    layout: str = "ranges",
    read_bytes: int | None = None,
    fadvise: str | None = "sequential",
    prefetch_bytes: int = 0,
    spread: bool = True,
    copies: str | None = None,
    on_landed: Callable[[str], None] | None = None,
) -> LoadStats:
    """Load a flat dump (its directory or weights.flat) into ``dest`` in place.

    ``dest`` maps tensor names to preallocated tensors whose dtypes and shapes match the index
    (``strict``: the two name sets must also be equal). ``mode``: auto (direct on CPU, staged on
    CUDA), direct or staged. ``direct=True`` opens the file with O_DIRECT (bypasses the page cache),
    ``False`` reads through the page cache, ``None`` (default) chooses by the file's residency and the
    destinations: O_DIRECT when less than ``COLD_DIRECT_MAX`` of it is cached, the destinations are
    page-aligned (the engine's weight arena, CUDA's staging buffers: the disk fills them in place, and
    the page cache gets no second copy of the weights) and the device reads that way no slower
    (weights.readshape; an unprobed device is probed first when the file is big), buffered otherwise
    (a cached part is one memcpy away; unaligned destinations would need a bounce buffer, slower than
    the page cache on both hosts measured: see ``choose_direct``).

    How the file is read (defaults measured best here, see docs/weights.md): ``threads`` readers
    (None: ``default_threads`` of the destination's device and O_DIRECT or not; 0: one per usable
    CPU, at most 16), each walking its own contiguous run of the file (``layout="ranges"``;
    ``"shared"``: all take the next piece of one queue) in pieces of at most ``chunk_bytes``; a
    piece the page cache holds is read with one call, the rest in blocking reads of ``read_bytes``
    (0: the whole piece at once; None: ``default_read_bytes``); ``fadvise="sequential"`` on each
    reader's file descriptor (None: no hint); ``prefetch_bytes`` > 0 also asks for that many bytes
    ahead of each reader with POSIX_FADV_WILLNEED. ``spread``: reader threads may run on every CPU the
    process's cpuset allows, whatever mask the calling thread has (vLLM binds its worker to one core).
    ``copies`` (staged mode): who queues a piece's copies to the destination, "readers" or
    "coordinator" (None: ``default_copies`` of the device). ``on_landed(name)``: called once per
    tensor, from a reader thread, as soon as its bytes are all in place (direct mode; in staged mode
    and for a non-contiguous destination, when the whole load is), so a caller can start on the
    tensors that have arrived while the rest is still read (a load that fails has reported only
    some).
    """
    t_start = time.perf_counter()
    if threads is not None and threads <= 0:
        threads = auto_threads()
    index = flat if isinstance(flat, FlatIndex) else read_index(flat)
    pairs = check_dest(index, dest, strict)
    choice = ""
    if direct is None:
        direct, choice = choose_direct(Path(index.data_file), 1.0 if mode == "staged" else aligned_fraction(pairs),
                                       index=index)
    if direct:
        refused = direct_refused(Path(index.data_file))
        if refused:  # (decided before the shape: a buffered load takes the buffered defaults)
            direct, choice = False, f"{choice + '; ' if choice else ''}O_DIRECT refused ({refused}) -> buffered"
    groups: dict[str, list] = {}
    for e, t in pairs:  # one loader per device (CPU: direct; each GPU: staged through its own stream)
        groups.setdefault(str(t.device), []).append((e, t))
    total = sum(e.nbytes for e, _ in pairs)
    parts: list[LoadStats] = []
    base = 0
    for g in groups.values() or [[]]:
        prog = progress
        if progress is not None and len(groups) > 1:
            prog = (lambda b: lambda done, _t: progress(b + done, total))(base)
        dev = g[0][1].device.type if g else "cpu"
        parts.append(_load_group(index, g, threads=threads or default_threads(dev, bool(direct)),
                                 chunk_bytes=chunk_bytes, buffers=buffers, verify=verify, direct=direct, progress=prog,
                                 mode=mode, layout=layout,
                                 read_bytes=default_read_bytes(dev, bool(direct)) if read_bytes is None else read_bytes,
                                 fadvise=fadvise, prefetch_bytes=prefetch_bytes, spread=spread, copies=copies,
                                 on_landed=on_landed))
        base += parts[-1].bytes
    st = parts[0]
    if len(parts) > 1:
        for p in parts[1:]:
            st.bytes += p.bytes
            st.tensors += p.tensors
            st.read_s += p.read_s
            st.copy_s += p.copy_s
            st.verify_s += p.verify_s
            st.wait_s += p.wait_s
            st.alloc_s += p.alloc_s
            st.notes += p.notes
            st.phases = {k: round(st.phases.get(k, 0) + v, 6) for k, v in p.phases.items()}
        st.mode = "+".join(p.mode for p in parts)
        st.device = "+".join(p.device for p in parts)
    st.direct_choice = choice
    st.seconds = time.perf_counter() - t_start
    st.gib_per_s = st.bytes / st.seconds / 2**30 if st.seconds > 0 else 0.0
    return st


def aligned_fraction(pairs) -> float:
    """The share of the bytes to load whose destination O_DIRECT can fill in place: page-aligned
    contiguous CPU tensors (the engine's weight arena), and every CUDA destination (staged through
    page-aligned host buffers). The rest would go through a bounce buffer and a memcpy."""
    total = aligned = 0
    for e, t in pairs:
        total += e.nbytes
        if t.device.type != "cpu" or (t.is_contiguous() and t.data_ptr() % DIRECT_IO_ALIGN == 0):
            aligned += e.nbytes
    return aligned / total if total else 1.0


def choose_direct(data_file: Path, aligned: float = 1.0, index: FlatIndex | None = None) -> tuple[bool, str]:
    """O_DIRECT or the page cache for this load; (choice, why). A cached file (``COLD_DIRECT_MAX``),
    or destinations mostly not page-aligned (``aligned``: their share of the bytes; through a bounce
    buffer O_DIRECT lost to buffered reads on both hosts measured: AMD 0.39x vs 0.96x the device
    limit, Intel 0.81x vs 0.84x; docs/weights.md), read through the page cache. A cold file into
    aligned destinations reads the way its device read faster when probed (weights.readshape): the
    two ways differ by 2x, in opposite directions, on the Intel and the AMD Zen 3 hosts. An unprobed
    device is probed first when ``index`` is given and the file is big enough for the probe's cost
    (about 0.5 s, once per device and boot) to matter less than a wrong choice
    (``readshape.AUTO_PROBE_MIN``; ``COLDSTART_READ_PROBE=0`` turns it off); otherwise, and when the
    probe cannot run, O_DIRECT. The residency is sampled (256 pages: tens of microseconds; a full
    mincore scan took 7-10 ms for 1.25 GiB, 6-8 % of a warm load); if it cannot be read, buffered."""
    from coldstart.warm.residency import sampled_resident_fraction

    try:
        frac = sampled_resident_fraction(data_file)
    except OSError as e:
        return False, f"auto: residency unknown ({e.strerror or e}) -> buffered"
    if frac >= COLD_DIRECT_MAX:
        return False, f"auto: {frac:.0%} cached -> buffered"
    if aligned < ALIGNED_DIRECT_MIN:
        return False, f"auto: {frac:.0%} cached, {aligned:.0%} of the bytes page-aligned -> buffered"
    return cold_direct(data_file, index, f"auto: {frac:.0%} cached")


def cold_direct(data_file: Path, index: FlatIndex | None = None, said: str = "cold") -> tuple[bool, str]:
    """``choose_direct`` for a file known to be cold, into page-aligned destinations: the way its
    device was probed to read faster (an unprobed device probed first, see there), else O_DIRECT;
    (choice, why), ``said`` heading the why."""
    from coldstart.weights import readshape

    rec, note = readshape.cached(data_file), ""
    if (rec is None and index is not None and os.environ.get("COLDSTART_READ_PROBE", "1") != "0"
            and os.stat(data_file).st_size >= readshape.AUTO_PROBE_MIN):
        try:
            rec, note = readshape.probe_and_save(index), " (probed now)"
        except (ColdstartError, OSError) as e:
            note = f"; probe failed: {e}"
    if rec is None:
        return True, f"{said} -> O_DIRECT{note}"
    return rec.direct, f"{said}, {rec.why()}{note} -> {rec.way}"


def direct_refused(data_file: Path) -> str | None:
    """Why this file cannot be opened with O_DIRECT (some FUSE mounts and older tmpfs refuse it),
    or None when it can."""
    try:
        os.close(os.open(data_file, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC))
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return e.strerror or str(e)
    return None  # (any other error is the buffered open's to report)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def default_threads(device_type: str, o_direct: bool = False) -> int:
    """Readers when the caller does not say. CPU destinations read through the page cache: one per
    usable CPU (the kernel's readahead keeps the disk busy ahead of them; more readers only share
    the 2 cores: on the AMD host 8 readers read at 0.83x the limit cold and 0.76x warm where 2 read
    whole pieces at 0.96x and 0.90x, results/bench-load-avx512; in results/bench-load-avx512-2 0.93x
    and 1.04x against 8 readers' 0.92x and 0.97x, cold within the disk's spread); with O_DIRECT 8 (no readahead: the readers are the queue). CUDA:
    one per CPU between 8 and 16 (on the 16-CPU H100 machine 16 readers beat 8 warm in 3 of 3 runs
    and cold in 2 of 3: results/gpu/, docs/gpu.md)."""
    if device_type == "cuda":
        return max(8, min(16, usable_cpus()))
    return 8 if o_direct else auto_threads()


def default_read_bytes(device_type: str, o_direct: bool = False) -> int:
    """The largest blocking read of data not yet cached when the caller does not say: whole pieces
    (0) for CPU destinations through the page cache (the readahead runs ahead of one read as well
    as of sixteen: 0.96x against 0.81x the limit with 1 MiB reads, results/bench-load-avx512), 1 MiB
    with O_DIRECT (fio's 1 MiB O_DIRECT reads beat its 16 MiB ones, results/bench-load) and for
    CUDA (measured so on the H100 and H200, docs/gpu.md)."""
    return 0 if device_type == "cpu" and not o_direct else 1 << 20


def default_copies(device_type: str) -> str:
    """Who issues a staged piece's copies: its reader, as soon as it has read it ("readers"), or one
    coordinating thread fed by a queue ("coordinator"). Readers for CUDA: the coordinator bounded
    the warm load on the H100, and readers beat it warm on the H200 (docs/gpu.md). On CPU the staged
    path is a test and fallback path and keeps the coordinator, whose numpy copies do not compete
    with the readers for a core."""
    return "readers" if device_type == "cuda" else "coordinator"


def auto_threads() -> int:
    """One reader per CPU this process may use, at most 16. Warm, the load is a copy out of the page
    cache that scales with the CPUs: on the 16-CPU H100 machine 16 readers copied 32.5-36.4 GiB/s
    where 8 copied 22.1-23.8 (results/gpu/h100-80gb-hbm3-2026-11-27/run1); cold, the readahead keeps
    the disk busy with either (fio's best job count on the 2-CPU hosts was the CPU count)."""
    return max(1, min(16, usable_cpus()))


def _load_group(index: FlatIndex, pairs, **kw) -> LoadStats:
    t_start = time.perf_counter()
    ld = _Loader(index, pairs, **kw)
    t_plan = time.perf_counter()
    if ld.mode == "direct":
        ld.run_direct()
        if ld.errors:
            err = next((e for e in ld.errors if isinstance(e, ColdstartError)), ld.errors[0])
            raise err
    else:
        ld.run_staged()
    t_io = time.perf_counter()
    for t, shadow in ld.post:
        t.copy_(shadow)
    if ld.post and ld.device == "cuda":
        ld.torch.cuda.synchronize()
    ld.report_rest()
    t_end = time.perf_counter()
    secs = t_end - t_start
    return LoadStats(
        bytes=ld.total, seconds=secs, gib_per_s=(ld.total / secs / 2**30) if secs > 0 else 0.0, tensors=len(pairs),
        mode=ld.mode, device=ld.device, threads=ld.threads, chunk_bytes=ld.chunk_bytes,
        buffers=ld.nbuffers if ld.mode == "staged" else 0, verify=kw["verify"], o_direct=ld.o_direct,
        phases={"plan": round(t_plan - t_start, 6), "io": round(t_io - t_plan, 6), "finalize": round(t_end - t_io, 6)},
        read_s=ld.read_s, copy_s=ld.copy_s, verify_s=ld.verify_s, wait_s=ld.wait_s, alloc_s=ld.alloc_s, notes=ld.notes,
        layout=ld.layout, read_bytes=ld.read_bytes, fadvise=ld.fadvise or "", reader_cpus=ld.reader_cpus,
        copies=ld.copies if ld.mode == "staged" else "",
    )


def alloc_like_index(index: FlatIndex | Path | str, device: str = "cpu") -> dict[str, Any]:
    """Preallocated destination tensors for every tensor of a dump, zero-filled (so every page is
    already touched, as a live model's parameters are)."""
    import torch

    if not isinstance(index, FlatIndex):
        index = read_index(index)
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ColdstartError(f"device {device}: no CUDA device available")
    return {e.name: torch.zeros(e.shape, dtype=torch_dtype(e.dtype), device=device) for e in index.tensors}


def verify_flat(flat: Path | str, *, threads: int = 4, progress: Progress | None = None) -> tuple[FlatIndex, list[str]]:
    """Check every chunk digest of a dump; returns (index, problems) — one line per bad tensor. The
    tensors it leaves out (``index.absent``) have no bytes to check."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    index = read_index(flat)
    digest = hasher(index.digest_algo)
    cb = index.chunk_bytes
    work = [(e, k) for e in index.tensors if e.name not in index.absent for k in range(len(e.chunk_digests))]
    total = sum(e.nbytes for e in index.tensors if e.name not in index.absent)
    done = [0]
    lock = threading.Lock()
    fd = os.open(index.data_file, os.O_RDONLY)
    bad: dict[str, str] = {}

    tls = threading.local()

    def check(item):
        e, k = item
        n = min(cb, e.nbytes - k * cb)
        if getattr(tls, "buf", None) is None:
            tls.buf = np.empty(cb, dtype=np.uint8)  # one per thread, reused: no page faults per chunk
        buf = tls.buf[:n]
        got = _preadv_full(fd, [memoryview(buf)], e.offset + k * cb, lambda: repr(e.name))
        ok = got == n and digest(buf) == e.chunk_digests[k]
        with lock:
            if not ok and e.name not in bad:
                bad[e.name] = f"tensor {e.name!r}: chunk {k} does not match its digest"
            done[0] += n
            d = done[0]
        if progress:
            progress(d, total)

    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as ex:
            list(ex.map(check, work))
    finally:
        os.close(fd)
    order = [e.name for e in index.tensors if e.name in bad]
    return index, [bad[n] for n in order]
