"""Integrity of a snapshot's files: per-chunk digests, checked before a restored server serves.

Every file of a snapshot gets, at checkpoint, one xxh3_64 digest per CHUNK bytes (and the whole
file's xxh3_128). A restore checks them before it serves (default), in threads beside the CRIU
restore and the weight reload, so that a mismatch names the file and the chunk and falls back
before any answer leaves the server.

Hashing every byte at every start would cost a full read of the images (gigabytes, of which a restore
needs a fraction), so a node remembers what it has checked: a record keyed by the file's identity
(device, inode, size, mtime, ctime) and its expected digests. A snapshot's files never change after
publish; any write or replacement changes mtime/ctime (which userspace cannot set back) or the
inode, and the next restore checks that file again. A file on a read-only loop mount (``coldstart
snapshot mount`` of a packed image) is also recorded by the image file's identity, which a fresh
mount of the same image keeps while the loop device changes. ``coldstart snapshot verify`` pays the first
check ahead of time (e.g. right after a copy). Residual risk, documented in docs/pipeline.md: a
change below the file system (bit rot) that keeps ctime is caught only by ``--verify full``.
fs-verity would close it, but this kernel does not have it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xxhash

from coldstart.errors import ColdstartError
from coldstart.fsutil import identity
from coldstart.state import node_dir

CHUNK = 4 << 20  # digest granularity: small enough to name where a file is damaged, ~460 per GiB
READ = 1 << 20  # one pread; xxhash releases the GIL, so threads hash in parallel
# Readers per file: the check mostly waits on the disk. A first restore on a node, which checks
# everything beside the restore, reached its first token at 4.03-4.60 s with 8 (and the restore's
# order, pipeline.restore._Checks) against 4.75-4.97 s with 2 (bench snapshot, Intel AMX host,
# results/spot-checks/first-on-node).
THREADS = 8
VERIFY_MODES = ("auto", "full", "off")


class IntegrityError(ColdstartError):
    """A file's bytes differ from the snapshot's digests (names the file and the chunk)."""


@dataclass(frozen=True)
class Digests:
    xxh3: str  # xxh3_128 of the whole file (hex)
    chunks: tuple[str, ...]  # xxh3_64 (hex) of each CHUNK-sized piece, the last one shorter


def file_digests(path: Path) -> Digests:
    """One pass over ``path``: the whole-file xxh3_128 and the per-chunk xxh3_64 list."""
    whole = xxhash.xxh3_128()
    chunks: list[str] = []
    buf = bytearray(READ)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        part = xxhash.xxh3_64()
        in_part = 0
        while n := f.readinto(buf):
            whole.update(view[:n])
            pos = 0
            while pos < n:
                take = min(n - pos, CHUNK - in_part)
                part.update(view[pos:pos + take])
                in_part += take
                pos += take
                if in_part == CHUNK:
                    chunks.append(part.hexdigest())
                    part, in_part = xxhash.xxh3_64(), 0
        if in_part:
            chunks.append(part.hexdigest())
    return Digests(whole.hexdigest(), tuple(chunks))


def _zero_digest(n: int) -> str:
    return xxhash.xxh3_64(bytes(n)).hexdigest()


def _is_hole(fd: int, off: int, end: int) -> bool:
    """Whether [off, end) holds no data at all (a hole reads as zeros by definition): sparse files
    such as vLLM's /dev/shm buffers are then checked without reading them."""
    try:
        return os.lseek(fd, off, os.SEEK_DATA) >= end
    except OSError:  # ENXIO: no data after off
        return True


def _check_chunk(fd: int, i: int, size: int, want: str) -> bool:
    h = xxhash.xxh3_64()
    off, end = i * CHUNK, min((i + 1) * CHUNK, size)
    if _is_hole(fd, off, end):
        return want == _zero_digest(end - off)
    while off < end:
        b = os.pread(fd, min(READ, end - off), off)
        if not b:
            return False
        h.update(b)
        off += len(b)
    return h.hexdigest() == want


def check_file(path: Path, rel: str, size: int, chunks: list[str], threads: int = THREADS) -> None:
    """Raise IntegrityError naming the first bad chunk of ``path`` (chunks checked in parallel)."""
    from concurrent.futures import ThreadPoolExecutor  # (here: a restore imports this module before CRIU starts)

    fd = os.open(path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size != size:
            raise IntegrityError(f"file {rel}: size {os.fstat(fd).st_size}, manifest says {size}")
        with ThreadPoolExecutor(max(1, threads)) as pool:
            ok = list(pool.map(lambda i: _check_chunk(fd, i, size, chunks[i]), range(len(chunks))))
    finally:
        os.close(fd)
    bad = [i for i, good in enumerate(ok) if not good]
    if bad:
        i = bad[0]
        lo, hi = i * CHUNK, min((i + 1) * CHUNK, size) - 1
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise IntegrityError(f"file {rel}: chunk {i} (bytes {lo}-{hi}) does not match its digest{more}: "
                             "the snapshot is corrupt")


def _loop_image(dev: int) -> tuple | None:
    """For a read-only loop device, the identity of the image file behind it: a packed snapshot
    mounted again (another loop device, the same unchanged image) holds the same files."""
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    try:
        if (sysfs / "ro").read_text().strip() != "1":
            return None
        st = os.stat((sysfs / "loop" / "backing_file").read_text().rstrip("\n"))
    except (OSError, ValueError):
        return None  # not a loop device, or its image is gone or out of sight
    return ("loop-image", *identity(st))


class NodeRecord:
    """What this node has verified: one small file per (file identity, expected digests).

    Why a record and not a hash at every start: see the module docstring. Writing it is best effort
    (a read-only node just re-checks); it is only ever written after a full check passed."""

    def __init__(self, root: Path | None = None):
        self.root = (root or node_dir()) / "verified"

    @staticmethod
    def _keys(path: Path, xxh3: str, chunks: list[str]) -> list[str]:
        """The file's key by its device, and for a file on a read-only loop device also by the image
        behind it (stable across remounts; unseen inside a container, where the image's path is not)."""
        import hashlib

        st = os.stat(path)
        digests = (xxh3, hashlib.sha256("".join(chunks).encode()).hexdigest())
        devs = [st.st_dev] + [d for d in [_loop_image(st.st_dev)] if d]
        return [xxhash.xxh3_128(repr((d, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, *digests)).encode()).hexdigest()
                for d in devs]

    def forget(self, snapshot_dir: Path, files: dict) -> int:
        """Drop the records of one snapshot's files (``files``: the manifest's rel -> FileEntry): its
        next restore verifies it as a first one would, other snapshots on the node keep theirs.
        Returns the records removed."""
        n = 0
        for rel, fe in files.items():
            try:
                keys = self._keys(Path(snapshot_dir) / rel, fe.xxh3, list(fe.chunks))
            except OSError:
                continue
            for key in keys:
                try:
                    (self.root / key).unlink()
                    n += 1
                except OSError:
                    pass
        return n

    def has(self, path: Path, xxh3: str, chunks: list[str]) -> bool:
        try:
            return any((self.root / key).exists() for key in self._keys(path, xxh3, chunks))
        except OSError:
            return False

    def add(self, path: Path, xxh3: str, chunks: list[str]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for key in self._keys(path, xxh3, chunks):
                (self.root / key).write_text(json.dumps({"path": str(path)}) + "\n")
        except OSError:
            pass


def verify(snapshot_dir: Path, files: dict, mode: str = "auto", threads: int = THREADS,
           record: NodeRecord | None = None, on_file: Callable[[Path], None] | None = None) -> dict:
    """Check the files of a snapshot (``files``: rel -> FileEntry with ``chunks``) against their
    digests. ``mode`` auto: skip files this node has verified unchanged; full: check every file;
    off: nothing. Raises IntegrityError on the first bad file. ``on_file(path)``: called before a
    file is read (a profile recorder must not take the check's reads for the restore's).
    Returns {"checked": n, "skipped": n, "bytes": n} for the timeline."""
    if mode not in VERIFY_MODES:
        raise ColdstartError(f"unknown verify mode {mode!r} (expected one of {', '.join(VERIFY_MODES)})")
    stats = {"checked": 0, "skipped": 0, "bytes": 0}
    if mode == "off":
        return stats
    record = record or NodeRecord()
    for rel, fe in sorted(files.items(), key=lambda kv: kv[1].size):  # small files first: fail fast
        path = Path(snapshot_dir) / rel
        chunks = list(fe.chunks)
        if len(chunks) != -(-fe.size // CHUNK):  # (schema 2 writes one per CHUNK: never vacuous)
            raise IntegrityError(f"file {rel}: the manifest has {len(chunks)} chunk digests for "
                                 f"{fe.size} bytes (expected {-(-fe.size // CHUNK)})")
        if mode == "auto" and record.has(path, fe.xxh3, chunks):
            stats["skipped"] += 1
            continue
        if on_file is not None:
            on_file(path)
        check_file(path, rel, fe.size, chunks, threads=threads)
        record.add(path, fe.xxh3, chunks)
        stats["checked"] += 1
        stats["bytes"] += fe.size
    return stats
