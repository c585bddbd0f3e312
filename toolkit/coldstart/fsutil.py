"""File helpers shared by the stages: durable publishing of an artifact (staging dir → fsync → rename)
and the removal of what killed writers staged, the data extents of a sparse file and punching holes in one, read-ahead hints the kernel does not cut short, and a sampled page-cache residency (mincore; no numpy: the restore asks it before the warm stage loads)."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Iterator


def identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A file's identity for what is cached or recorded about it: the same inode of the same device,
    unchanged since (size, mtime and ctime; any write or chmod moves ctime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def fsync_dir(d: Path) -> None:
    """fsync a directory, so that a rename or a new entry in it survives a crash."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> None:
    """fsync one file's data, before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under ``root`` (symlinks, sockets and FIFOs are left
    alone: a live run dir holds vLLM's RPC sockets), before the caller renames it into place or
    writes the marker that publishes it."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(p).st_mode):
                fsync_file(p)
        fsync_dir(Path(dirpath))


def data_extents(fd: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of data in the open file ``fd``, skipping its holes (SEEK_DATA /
    SEEK_HOLE): vLLM's /dev/shm buffers are ~400 MB long and hold a few pages of data."""
    size = os.fstat(fd).st_size
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            return
        off = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, off


_WILLNEED_PIECE: dict[int, int] = {}


def _willneed_piece(fd: int) -> int:
    """The most one POSIX_FADV_WILLNEED call reads on ``fd``'s device: the kernel clamps each call to
    max(the device's largest request, its read_ahead_kb) and drops the rest of the range (one call
    for 1 GiB read 8 MiB here). From sysfs; 1 MiB where the device is not found there (an overlay or
    FUSE file reports an anonymous device)."""
    dev = os.fstat(fd).st_dev
    if dev not in _WILLNEED_PIECE:
        kb = []
        for f in (f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb",
                  f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/max_sectors_kb",
                  f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/../queue/max_sectors_kb"):
            try:
                kb.append(int(Path(f).read_text()))
            except (OSError, ValueError):
                pass
        _WILLNEED_PIECE[dev] = max(max(kb, default=1024), 128) << 10
    return _WILLNEED_PIECE[dev]


def will_need(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to read ``length`` bytes at ``offset`` into the page cache, all of them:
    POSIX_FADV_WILLNEED in pieces the kernel does not cut short (_willneed_piece). Returns once the
    reads are queued, not done."""
    piece = _willneed_piece(fd)
    end = offset + length
    while offset < end:
        n = min(piece, end - offset)
        os.posix_fadvise(fd, offset, n, os.POSIX_FADV_WILLNEED)
        offset += n


def publish_dir(stage: Path, target: Path) -> None:
    """Make a fully written staging dir appear at ``target`` all at once and durably: every file
    fsynced, one rename, the parent fsynced. The caller removes ``stage`` if this raises."""
    fsync_tree(stage)
    os.rename(stage, target)
    fsync_dir(Path(target).parent)


_STAGE_MARK = re.compile(r"\.(?:pull|partial)-(\d+)")


def remove_dead_stages(parent: Path, name: str) -> list[Path]:
    """Remove what killed writers of ``parent/name`` left beside it: the hidden staging entries of a
    pull or a pack (".NAME.pull-PID", ".NAME.partial-PID", and the pull staged inside a pack's,
    "..NAME.pull-PID.pull-PID") whose every writer is gone. A pod evicted mid-pull would otherwise
    leave a snapshot's size of disk behind at every retry. A live writer's stage is left alone."""
    removed: list[Path] = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for p in entries:
        rest = p.name.lstrip(".")
        if p.name == rest or not rest.startswith(name + "."):
            continue
        marks = rest[len(name):]
        pids = _STAGE_MARK.findall(marks)
        if not pids or _STAGE_MARK.sub("", marks) or any(pid_alive(int(x)) for x in pids):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def pid_alive(pid: int) -> bool:
    """A process with this PID exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` all at once: a temporary file beside it, fsynced, renamed over
    it, the directory fsynced. A killed writer leaves the old file (and at most a hidden temp file).
    The temporary name is unique, not the PID's: containers sharing a node dir are each PID 1."""
    import tempfile

    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    tmp = Path(name)
    try:
        with open(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is not what a plain write would give
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_results(out_dir: Path, rows: list[dict], table: str, command: str) -> None:
    """A benchmark's raw.jsonl, table.md and COMMAND, each replaced atomically (other files in
    ``out_dir``, e.g. earlier runs kept beside the current one, are left alone)."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "raw.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write_atomic(out_dir / "table.md", table)
    write_atomic(out_dir / "COMMAND", command.rstrip("\n") + "\n")


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, off: int, n: int) -> bool:
    """Free the blocks of [off, off+n) (the file reads zeros there, its size unchanged); False where
    the filesystem cannot (the bytes then stay: only space is lost)."""
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, n) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    raise OSError(e, f"fallocate(PUNCH_HOLE, {off}, {n}): {os.strerror(e)}")


def sampled_resident_fraction(path: Path | str, samples: int = 256) -> float:
    """Estimated fraction of ``path`` in the page cache: mincore of ``samples`` evenly spaced pages
    (a full scan of a GiB-sized file costs milliseconds, a sample tens of microseconds)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 1.0
        npages = (size + PAGE - 1) // PAGE
        addr = _libc.mmap(None, npages * PAGE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap for mincore: {os.strerror(err)}")
        try:
            picks = sorted({k * npages // max(1, samples) for k in range(min(samples, npages))})
            vec = (ctypes.c_ubyte * 1)()
            hits = 0
            for k in picks:
                if _libc.mincore(addr + k * PAGE, PAGE, vec) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mincore: {os.strerror(err)}")
                hits += vec[0] & 1
        finally:
            _libc.munmap(addr, npages * PAGE)
    finally:
        os.close(fd)
    return hits / len(picks)
