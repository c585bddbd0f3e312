"""Page-cache residency of files: mincore(2) on a read-only shared mapping, eviction, sampling.

Why mincore and not fincore(1)/vmtouch: we need it in-process, per page (to record access
profiles) and many times a second (progress bars, time series); mapping a file costs no I/O and
mincore answers from the page cache without faulting anything in.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.fsutil import sampled_resident_fraction  # noqa: F401 (numpy-free, so it lives there)
from coldstart.warm._numpy import np

PAGE = mmap.PAGESIZE
_WINDOW = 1 << 30  # map at most 1 GiB at a time: bounds the vector and the address-space use

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
MADV_POPULATE_READ = 22  # Linux 5.14+: fault the range in (read), no copy to user space


_SINK: int | None = None  # /dev/null, opened once, shared by every thread
_SINK_LOCK = threading.Lock()
_SPLICE = True  # False once the kernel refused to splice a file to /dev/null
_F_SETPIPE_SZ = 1031
EXACT_PIPE = 1 << 20  # the default pipe-max-size: what an unprivileged process may ask for


def exact_pipe() -> tuple[int, int]:
    """A pipe for ``read_into_cache(..., pipe=)``, as large as allowed (1 MiB, else the default
    64 KiB): the kernel's read request is as large as the room left in the pipe."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, _F_SETPIPE_SZ, EXACT_PIPE)
    except OSError:
        pass
    return r, w


def read_into_cache(fd: int, offset: int, length: int, cancelled=lambda: False,
                    pipe: tuple[int, int] | None = None) -> int:
    """Bring ``length`` bytes at ``offset`` of an open file into the page cache and return the bytes
    read (fewer at the end of the file), once they are there. Nothing is copied to user space (on
    2 cores that CPU is the restore's): sendfile(2) to /dev/null, which drops the pages it is handed.
    Its reads go through the kernel's readahead, which runs ahead past the range (up to read_ahead_kb)
    when the calls look sequential: right for whole files, extra bytes for a profile's short ranges.
    For those, ``pipe`` (``exact_pipe()``) with ``fd`` opened with POSIX_FADV_RANDOM: splice(2)
    through the pipe, whose size sets the request size, and the random advice keeps readahead off.
    Where the kernel refuses to splice (EINVAL, ENOSYS), pread into a scratch buffer.
    ``cancelled`` is asked between pieces of at most 8 MiB."""
    global _SINK, _SPLICE
    if _SINK is None:
        with _SINK_LOCK:  # the first readers arrive together: one descriptor, not one each
            if _SINK is None:
                _SINK = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    got = 0
    while got < length and not cancelled():
        want = min(length - got, 8 << 20)
        if _SPLICE:
            try:
                if pipe is None:
                    n = os.sendfile(_SINK, fd, offset + got, want)
                else:
                    n = os.splice(fd, pipe[1], want, offset_src=offset + got)
                    left = n
                    while left > 0:
                        left -= os.splice(pipe[0], _SINK, left)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                _SPLICE = False
                continue
        else:
            n = len(os.pread(fd, want, offset + got))
        if n <= 0:
            break  # end of file
        got += n
    return got


def populate_fd(fd: int, offset: int, length: int, *, huge: bool = False) -> None:
    """Bring ``length`` bytes at page-aligned ``offset`` of an open file into the page cache and
    return when they are there: MADV_POPULATE_READ on a transient read-only shared mapping. Like a
    pread it waits for the data (so in-flight bytes stay bounded), unlike one it copies nothing.
    ctypes releases the GIL for the call, so several threads populate in parallel. ``huge``: the
    mapping is madvised MADV_HUGEPAGE first, so that a cold read fills 2 MiB page-cache folios, as
    the engine's map reload does (a kernel without THP refuses the advice: 4 KiB folios then)."""
    if length <= 0:
        return
    addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap for populate: {os.strerror(err)}")
    try:
        if huge:
            _libc.madvise(addr, length, mmap.MADV_HUGEPAGE)  # advice only: EINVAL without THP is fine
        if _libc.madvise(addr, length, MADV_POPULATE_READ) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_POPULATE_READ): {os.strerror(err)}")
    finally:
        _libc.munmap(addr, length)


class _PageRegion(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


class _PmScanArg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("size", "flags", "start", "end", "walk_end", "vec", "vec_len",
                                                "max_pages", "category_inverted", "category_mask",
                                                "category_anyof_mask", "return_mask")]


_PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_PmScanArg) << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, ...)
_PAGE_IS_PRESENT, _PAGE_IS_SWAPPED = 1 << 3, 1 << 4
_libc.ioctl.restype = ctypes.c_int
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


class PresentScan:
    """The runs of pages present in (or swapped out of) a process's page tables, by the PAGEMAP_SCAN
    ioctl on its /proc/PID/pagemap (Linux 6.7+). Reading pagemap itself costs 8 bytes and a numpy
    pass per page of every mapping, present or not: a restored vLLM tree maps gigabytes in thousands
    of mappings, and a profile recorder reading it 20 times a second took a core. The ioctl walks
    the page tables in the kernel and answers only the runs. ``regions`` raises OSError (ENOTTY,
    EINVAL) where the kernel lacks it: the caller falls back to reading pagemap."""

    def __init__(self, capacity: int = 16384):
        self._vec = (_PageRegion * capacity)()
        self._arr = np.frombuffer(self._vec, dtype=np.uint64).reshape(capacity, 3)

    def regions(self, fd: int, start: int, end: int) -> np.ndarray:
        """[start, end) address runs (an n x 2 uint64 array) of present pages in [start, end)."""
        out: list[np.ndarray] = []
        while start < end:
            arg = _PmScanArg(size=ctypes.sizeof(_PmScanArg), start=start, end=end, vec=ctypes.addressof(self._vec),
                             vec_len=len(self._vec), category_anyof_mask=_PAGE_IS_PRESENT | _PAGE_IS_SWAPPED,
                             return_mask=_PAGE_IS_PRESENT | _PAGE_IS_SWAPPED)
            n = _libc.ioctl(fd, _PAGEMAP_SCAN, ctypes.byref(arg))
            if n < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"PAGEMAP_SCAN: {os.strerror(err)}")
            out.append(self._arr[:n, :2].copy())
            if n < len(self._vec) or arg.walk_end <= start:
                break
            start = arg.walk_end
        return np.concatenate(out) if len(out) > 1 else out[0] if out else np.zeros((0, 2), np.uint64)


def _mincore_fd(fd: int, offset: int, length: int) -> np.ndarray:
    """Residency (bool per page) of ``length`` bytes at page-aligned ``offset`` of an open file."""
    npages = (length + PAGE - 1) // PAGE
    out = np.zeros(npages, dtype=bool)
    done = 0
    while done < npages:
        n = min(npages - done, _WINDOW // PAGE)
        off = offset + done * PAGE
        addr = _libc.mmap(None, n * PAGE, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap for mincore: {os.strerror(err)}")
        try:
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, n * PAGE, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore: {os.strerror(err)}")
            out[done:done + n] = np.frombuffer(vec, dtype=np.uint8) & 1
        finally:
            _libc.munmap(addr, n * PAGE)
        done += n
    return out


def residency_vector(path: Path | str, offset: int = 0, length: int | None = None) -> np.ndarray:
    """Per-page residency of a file (or of a page-aligned range of it), as a numpy bool array."""
    if offset % PAGE:
        raise ValueError("offset must be page-aligned")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if length is None:
            length = size - offset
        length = max(0, min(length, size - offset))
        if length == 0:
            return np.zeros(0, dtype=bool)
        return _mincore_fd(fd, offset, length)
    finally:
        os.close(fd)


def resident_bytes(path: Path | str) -> tuple[int, int]:
    """(bytes of ``path`` in the page cache, file size). The last partial page counts its real size.
    (O_NONBLOCK: a FIFO given by mistake must not block the open; it has no pages.)"""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        vec = _mincore_fd(fd, 0, size)
    finally:
        os.close(fd)
    resident = int(vec.sum()) * PAGE
    if vec[-1] and size % PAGE:
        resident -= PAGE - size % PAGE
    return resident, size


def range_resident(fd: int, offset: int, length: int) -> bool:
    """True when every page of [offset, offset+length) of an open file is in the page cache."""
    start = offset - offset % PAGE
    return bool(_mincore_fd(fd, start, offset + length - start).all()) if length > 0 else True


def evict(path: Path | str) -> None:
    """Drop a file's pages from the page cache (fsync first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (as in resident_bytes)
    try:
        try:
            os.fsync(fd)
        except OSError:
            pass  # read-only filesystems refuse fsync; their pages are clean anyway
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict_all(paths: list[Path] | list[str]) -> None:
    """``evict`` each file named and each regular file under each directory named."""
    for f in expand_paths(paths):
        evict(f)


def will_need_all(paths: list[Path] | list[str]) -> None:
    """Queue reads of each file named and each regular file under each directory named into the page
    cache (fsutil.will_need; returns once queued). Unreadable files are skipped: a hint, not a read."""
    from coldstart.fsutil import will_need

    for f in expand_paths(paths):
        try:
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            will_need(fd, 0, os.fstat(fd).st_size)
        except OSError:
            pass
        finally:
            os.close(fd)


def drop_caches() -> None:
    """sync, then drop the clean page cache, dentries and inodes: the state of every cold case (root
    only). On a VM with free page reporting the memory this frees goes back to the hypervisor
    (bench.host's ``memory_kept`` keeps it)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        from coldstart.errors import ColdstartError

        raise ColdstartError(f"cannot drop the page cache (/proc/sys/vm/drop_caches: {e.strerror}): "
                             "cold runs need root") from None


def expand_paths(paths: list[Path] | list[str]) -> list[Path]:
    """Files named, plus the regular files under each directory named (sorted, recursive).

    Missing paths are kept as they are: the warmers report them as errors."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            items = sorted(q for q in p.rglob("*") if q.is_file() and not q.is_symlink())
        else:
            items = [p]
        for q in items:
            q = q.absolute()
            if q not in seen:
                seen.add(q)
                out.append(q)
    return out


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    resident: int  # bytes resident, all files
    per_file: dict[str, int] = field(default_factory=dict)


class ResidencySampler:
    """Background thread sampling the residency of a set of files every ``interval`` seconds.

    Gives the "bytes resident over time" curve of a warm or a restore; unreadable files count 0."""

    def __init__(self, paths: list[Path] | list[str], interval: float = 0.05, per_file: bool = False):
        self.paths = expand_paths(list(paths))
        self.interval = interval
        self.per_file = per_file
        self.samples: list[Sample] = []
        self.total = 0
        for p in self.paths:
            try:
                self.total += p.stat().st_size
            except OSError:
                pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def sample(self) -> Sample:
        per: dict[str, int] = {}
        total = 0
        for p in self.paths:
            try:
                r, _ = resident_bytes(p)
            except OSError:
                r = 0
            total += r
            if self.per_file:
                per[str(p)] = r
        s = Sample(t=round(time.monotonic() - self._t0, 4), resident=total, per_file=per)
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                break

    def start(self) -> "ResidencySampler":
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="coldstart-residency", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # the final state
        return self.samples

    def __enter__(self) -> "ResidencySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
