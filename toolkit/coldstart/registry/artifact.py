"""A directory tree (a snapshot, or the runtime's read-mostly tree) as an OCI artifact.

Layout in the registry (one OCI image manifest, artifactType ARTIFACT_TYPE):
- config: the OCI empty descriptor;
- layer 0: the index blob (JSON, INDEX_TYPE): every entry (file, dir, symlink with mode and size),
  each file as a list of chunks, each chunk's BLAKE3 digest, size, and place (pack, offset);
- layers 1..n: packs (PACK_TYPE), the chunks concatenated in first-access order: the files every
  restore reads whole (CRIU's small images, the manifest), then the page runs CRIU's restorer reads,
  then the access profile's ranges, then the rest in path order. Prefetch is then a few large range
  GETs from the start of pack 0.

Chunks are CHUNK bytes of one file (the last one shorter) and content-addressed: identical chunks are
stored once. A chunk is stored in its pack as a zstd frame when that saves at least a sixteenth of it
(``codec`` "zstd", ``stored`` bytes in the pack; the dumped processes' memory compresses ~4x; a
weights file's chunks, and any chunk that plain zstd barely shrinks, may be byte-grouped first,
GROUPED_CODEC), else as is: fewer bytes cross the
link before a lazy restore's first token. Its digest is of its bytes, not of the frame. A chunk is
verified (BLAKE3, after decompression) before any of its bytes are used; a pack as a whole is
verified by the registry (sha256) at upload and by ``pull`` at download. Packs are deterministic
for a given tree and profile, so a second push finds every blob present and uploads none. The
registry's manifest size cap (4 MiB) is why chunks are not layers of their own.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import blake3

from coldstart.errors import ColdstartError
from coldstart.fsutil import publish_dir, remove_dead_stages
from coldstart.registry.distribution import OCI_MANIFEST, Ref, Registry, RegistryError, sha256_digest

ARTIFACT_TYPE = "application/vnd.coldstart.snapshot.v1"
INDEX_TYPE = "application/vnd.coldstart.snapshot.index.v1+json"
PACK_TYPE = "application/vnd.coldstart.snapshot.pack.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
INDEX_VERSION = 2  # 2: chunks may be stored compressed (Chunk.codec, Chunk.stored)
READABLE_VERSIONS = (1, 2)
CODECS = ("zstd", "none")
ZSTD_LEVEL = 3  # zstd's default: ~250 MB/s per core here, within 10% of the ratio of level 9
CHUNK = 1 << 20  # as Nydus: small enough that a random read fetches little, large enough for few requests
PACK = 64 << 20  # a pack is one blob: a few of them cover what a restore reads first
READ = 8 << 20
SMALL = 1 << 20  # files up to this size are read whole by a restore (CRIU's images, the manifest): first
RUNTIME_KIND = "coldstart.runtime"

Say = Callable[[str], None]


class ArtifactError(ColdstartError):
    """The artifact is malformed, corrupt (a digest mismatch, naming the chunk) or not ours."""


class _FrameChanged(ArtifactError):
    """A chunk compressed to another size than the index says (another zstandard than when indexed)."""


@dataclass
class Chunk:
    digest: str  # "blake3:<hex>" of the chunk's bytes (decompressed)
    size: int
    pack: int = -1
    offset: int = 0  # within the pack
    stored: int = 0  # bytes in the pack (= size unless compressed)
    codec: str = ""  # "" (as is), "zstd" (one zstd frame) or "zstd-bg2" (GROUPED_CODEC)


# A 16-bit weight's high byte (sign and most of the exponent) varies little across a tensor, its low
# byte (mantissa) a lot; zstd sees that only when the bytes are grouped: the even bytes of the chunk,
# then the odd ones, then one frame. Tried on the weights files (WEIGHT_SUFFIXES) only, kept where it
# beats plain zstd: the bench model's bf16 weights 0.78 -> 0.71 of their size.
GROUPED_CODEC = "zstd-bg2"
CHUNK_CODECS = ("", "zstd", GROUPED_CODEC)
WEIGHT_SUFFIXES = (".flat", ".safetensors")

_codecs = threading.local()


def _group2(data: bytes) -> bytes:
    import numpy as np

    a = np.frombuffer(data, dtype=np.uint8)
    return a[0::2].tobytes() + a[1::2].tobytes()


def _ungroup2(data: bytes) -> bytes:
    import numpy as np

    a = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(len(a), dtype=np.uint8)
    h = (len(a) + 1) // 2
    out[0::2], out[1::2] = a[:h], a[h:]
    return out.tobytes()


def _encode(data: bytes, codec: str = "zstd") -> bytes:
    """The chunk as one zstd frame, of its bytes grouped first for GROUPED_CODEC (deterministic for a
    zstd version and level: a second push of the same tree makes the same packs). One compressor per
    thread: they are not thread-safe."""
    c = getattr(_codecs, "c", None)
    if c is None:
        import zstandard  # here: a node that only mounts (the daemon decodes) needs no zstandard

        c = _codecs.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c.compress(_group2(data) if codec == GROUPED_CODEC else data)


def _decode(data: bytes, c: Chunk) -> bytes:
    """A stored chunk's bytes (not yet verified); ArtifactError if the frame does not decode to its size."""
    if not c.codec:
        return data
    import zstandard

    d = getattr(_codecs, "d", None)
    if d is None:
        d = _codecs.d = zstandard.ZstdDecompressor()
    try:
        out = d.decompress(data, max_output_size=c.size)
    except zstandard.ZstdError as e:
        raise ArtifactError(f"chunk {c.digest[:23]}: its zstd frame does not decode ({e})") from None
    if len(out) != c.size:
        raise ArtifactError(f"chunk {c.digest[:23]}: its zstd frame decodes to {len(out)} bytes, not {c.size}")
    return _ungroup2(out) if c.codec == GROUPED_CODEC else out


def _stored_form(data: bytes, compress: str, weights: bool = False) -> tuple[bytes, str]:
    """(bytes to put in the pack, codec): compressed only where that saves a sixteenth or more;
    the grouped codec tried too, the smaller frame kept, for ``weights`` and for any chunk plain zstd
    shrinks by less than a quarter (weights in a process's memory: e.g. the packed GEMM handles a
    CPU snapshot keeps, docs/engine.md; the processes' own state compresses ~4x and is not tried)."""
    if compress == "zstd":
        z, codec = _encode(data), "zstd"
        if weights or len(z) > len(data) - len(data) // 4:
            g = _encode(data, GROUPED_CODEC)
            if len(g) < len(z):
                z, codec = g, GROUPED_CODEC
        if len(z) <= len(data) - len(data) // 16:
            return z, codec
    return data, ""


ENTRY_TYPES = ("file", "dir", "symlink", "socket", "fifo")


@dataclass
class Entry:
    path: str  # relative, "/"-separated
    type: str  # file | dir | symlink | socket | fifo
    mode: int
    size: int = 0
    target: str = ""  # symlink target
    chunks: list[int] = field(default_factory=list)  # indices into Index.chunks


@dataclass
class Pack:
    digest: str  # sha256 (the blob's)
    size: int
    chunks: tuple[int, int] = (0, 0)  # [first, last) index into Index.chunks (chunks are in pack order)


@dataclass
class Index:
    chunk_size: int
    entries: list[Entry]
    chunks: list[Chunk]  # in pack order = prefetch order
    packs: list[Pack]
    profiled: int = 0  # the first ``profiled`` chunks are what the access profile (or small files) named
    version: int = INDEX_VERSION
    kind: str = "coldstart.tree"  # or RUNTIME_KIND
    prefix: str = ""  # a runtime: the absolute path its server was checkpointed with it at (where it is mounted)
    compress: str = ""  # what push asked for ("zstd", "none"; "" in indexes from before it was recorded)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> "Index":
        """From a parsed index (_index_dict: its version checked)."""
        try:
            return cls(chunk_size=int(d["chunk_size"]), entries=[Entry(**e) for e in d["entries"]],
                       chunks=[Chunk(**{"stored": c.get("size", 0), **c}) for c in d["chunks"]],
                       packs=[Pack(p["digest"], int(p["size"]), tuple(p["chunks"])) for p in d["packs"]],
                       profiled=int(d.get("profiled", 0)), version=d["version"], kind=str(d.get("kind", "")),
                       prefix=str(d.get("prefix", "")), compress=str(d.get("compress", "")))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise ArtifactError(f"malformed artifact index ({type(e).__name__}: {e})") from None

    def __post_init__(self) -> None:
        for i, c in enumerate(self.chunks):
            if c.codec not in CHUNK_CODECS or c.stored <= 0 or (not c.codec and c.stored != c.size):
                raise ArtifactError(f"malformed artifact index (chunk {i}: codec {c.codec!r}, {c.stored} bytes "
                                    f"stored for {c.size})")
        # what a pull writes comes from the registry: every path stays inside the tree it makes (none
        # absolute, none with "..", none under a symlink of the tree), every index points into its list
        links = {e.path for e in self.entries if e.type == "symlink"}
        for e in self.entries:
            parts = e.path.split("/") if isinstance(e.path, str) else [""]
            if e.type not in ENTRY_TYPES or e.path.startswith("/") or any(x in ("", ".", "..") for x in parts):
                raise ArtifactError(f"malformed artifact index (entry {e.path!r} of type {e.type!r} would not "
                                    "stay inside the tree)")
            if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
                raise ArtifactError(f"malformed artifact index (entry {e.path!r} lies under a symlink)")
            if any(not 0 <= ci < len(self.chunks) for ci in e.chunks):
                raise ArtifactError(f"malformed artifact index (entry {e.path!r} names a chunk it does not hold)")
        for p in self.packs:
            if not 0 <= p.chunks[0] <= p.chunks[1] <= len(self.chunks):
                raise ArtifactError(f"malformed artifact index (pack {p.digest[:19]} covers chunks {p.chunks})")

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.packs)

    def locations(self) -> dict[int, list[tuple[Entry, int]]]:
        """chunk index -> every (file entry, offset in the file) holding it."""
        out: dict[int, list[tuple[Entry, int]]] = {}
        for e in self.entries:
            off = 0
            for ci in e.chunks:
                out.setdefault(ci, []).append((e, off))
                off += self.chunks[ci].size
        return out


@dataclass
class PushResult:
    ref: str
    manifest_digest: str
    blobs: int
    uploaded: int  # blobs that crossed the wire (the rest were present)
    uploaded_bytes: int
    total_bytes: int
    seconds: float


@dataclass
class PullResult:
    dir: Path
    manifest_digest: str
    files: int
    bytes: int
    seconds: float


def _blake3(data) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def _file_state(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Kept:
    """What build_index made, for the rest of one push: each chunk's stored form (up to ``budget``
    bytes in all), so that the pack digests and the upload send the frames as made instead of
    reading and compressing the tree twice more, and each file's size and times as it was read, so
    that a file changed since is refused rather than published torn. The frames live in anonymous
    maps of their own, which close() gives back: a process that pushed keeps none of that memory
    (in the heap, freed frames stayed resident: 2.1 GB after a push of the 6 GB venv)."""

    BLOCK = 64 << 20

    def __init__(self, budget: int):
        self.budget, self.held, self.missed = budget, 0, 0
        self.frames: dict[str, tuple[int, int, int]] = {}  # digest -> (block, offset, length)
        self.states: dict[str, tuple[int, int, int]] = {}
        self._blocks: list[mmap.mmap] = []
        self._fill = 0
        self._lock = threading.Lock()

    @classmethod
    def for_this_host(cls) -> "Kept":
        """A quarter of the memory available now: a 6 GB venv's 3 GB of frames fit on a 24 GB node;
        what does not fit is made again from the tree as it is packed."""
        import psutil

        return cls(psutil.virtual_memory().available // 4)

    def keep(self, digest: str, frame: bytes) -> None:
        n = len(frame)
        with self._lock:
            if digest in self.frames:
                return
            if self.held + n > self.budget:
                self.missed += n
                return
            if not self._blocks or self._fill + n > len(self._blocks[-1]):
                self._blocks.append(mmap.mmap(-1, max(self.BLOCK, n)))
                self._fill = 0
            self._blocks[-1][self._fill:self._fill + n] = frame
            self.frames[digest] = (len(self._blocks) - 1, self._fill, n)
            self._fill += n
            self.held += n

    def frame(self, digest: str) -> bytes | None:
        at = self.frames.get(digest)
        if at is None:
            return None
        b, off, n = at
        return self._blocks[b][off:off + n]

    def close(self) -> None:
        self.frames.clear()
        for b in self._blocks:
            b.close()
        self._blocks.clear()

    def check_unchanged(self, root: Path) -> None:
        for rel, was in self.states.items():
            try:
                now = _file_state(os.lstat(root / rel))
            except OSError:
                now = None
            if now != was:
                raise ArtifactError(f"{root / rel} changed while it was being pushed")


def _walk(root: Path) -> list[Entry]:
    """Every entry under ``root`` in path order. Unix sockets and FIFOs are kept as entries with no
    data (a snapshot's run dir holds vLLM's RPC sockets; pull recreates them as such); devices are
    refused."""
    out: list[Entry] = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out.append(Entry(rel, "symlink", mode, target=os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(Entry(rel, "dir", mode))
            elif stat.S_ISREG(st.st_mode):
                out.append(Entry(rel, "file", mode, size=st.st_size))
            elif stat.S_ISSOCK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
                out.append(Entry(rel, "socket" if stat.S_ISSOCK(st.st_mode) else "fifo", mode))
            else:
                raise ArtifactError(f"{p}: a device file; it cannot be published")
    return sorted(out, key=lambda e: e.path)


def _profile_ranges(snapshot: Path) -> list:
    """The snapshot's access profile's ranges, first-needed first: its own profile.json, else the one
    this node recorded for it; [] without one. Files in the snapshot are relative to it, the ones its
    server maps from elsewhere (libraries) absolute."""
    try:
        from coldstart.warm.profile import load_profile
        from coldstart.warm.snapshot import resolve_profile

        p = resolve_profile(Path(snapshot))
        return list(load_profile(p).ranges) if p is not None else []
    except (ColdstartError, OSError, ImportError):
        return []


def _first_ranges(root: Path) -> list[tuple[str, int, int]]:
    """What a restore of the snapshot at ``root`` reads first (relative path, offset, length): in the
    hot layout the child's pages the restore touches before its canary's forward pass (the
    manifest's ``layout.early``: with packed handles kept, the child is 1.3 GB, of which the restore
    needs 99 MiB before that pass), then the page runs CRIU's restorer reads rather than maps
    (criu.images.read_runs: they come before the restored server runs, so the access profile,
    recorded from there on, never names them; in the hot layout the whole child), then the access
    profile's ranges of the snapshot's own files."""
    from coldstart.criu.images import read_runs
    from coldstart.criu.layout import early_ranges

    criu = Path(root) / "criu"
    if not criu.is_dir():
        return [(r.file, r.offset, r.length) for r in _profile_ranges(root) if not os.path.isabs(r.file)]
    try:  # a hint: any problem with the manifest is the restore's to name
        early = json.loads((Path(root) / "manifest.json").read_text()).get("layout", {}).get("early")
    except (OSError, ValueError, AttributeError):
        early = None
    runs = [(str(p.relative_to(root)), off, n) for p, off, n in early_ranges(criu, early) + read_runs(criu)]
    return runs + [(r.file, r.offset, r.length) for r in _profile_ranges(root) if not os.path.isabs(r.file)]


def profile_files(root: Path) -> list[str]:
    """The files of the access profile (relative to root), in the order they were first needed."""
    return list(dict.fromkeys(f for f, _, _ in _first_ranges(root)))


def shipped_profile(root: Path) -> dict[str, bytes]:
    """The access profile this node recorded for the snapshot at ``root``, as a ``profile.json`` to
    publish with it (a snapshot is never written after publish, so it is not in the tree): a node
    that mounts the artifact then warms in first-access order at once. {} when the tree has its own
    profile.json or none was recorded."""
    if (Path(root) / "profile.json").exists():
        return {}
    try:
        from coldstart.warm.snapshot import resolve_profile

        p = resolve_profile(Path(root))
        return {"profile.json": p.read_bytes()} if p is not None else {}
    except (ColdstartError, OSError, ImportError):
        return {}


def build_index(root: Path, *, chunk_size: int = CHUNK, pack_size: int = PACK, say: Say = lambda s: None,
                extra: dict[str, bytes] | None = None, ranges: list[tuple[str, int, int]] | None = None,
                small_first: bool = True, compress: str = "zstd",
                known: dict[str, tuple[int, str]] | None = None, kept: Kept | None = None) -> Index:
    """Chunk, hash (BLAKE3) and, with ``compress`` "zstd", compress every file, on threads (both
    release the GIL), then order the chunks: small files (``small_first``), the profile's ranges
    (``ranges``, default the tree's own profile), the rest; cut into packs. The index holds only the
    stored sizes: without ``kept``, the packs compress again as they are hashed and sent.
    ``extra``: files published with the tree that are not in it (relative path -> bytes).
    ``known``: chunk digest -> (stored, codec) from an index pushed before (previous_frames): those
    chunks are not compressed again (a second push of a 6 GB venv is then hashing only). ``kept``:
    where to keep the stored forms and the files' states for the rest of the push."""
    if compress not in CODECS:
        raise ArtifactError(f"compression must be one of {', '.join(CODECS)}, not {compress!r}")
    root = Path(root)
    ranges = _first_ranges(root) if ranges is None else ranges
    extra = extra or {}
    entries = sorted(_walk(root) + [Entry(rel, "file", 0o644, size=len(b)) for rel, b in extra.items()],
                     key=lambda e: e.path)
    files = [e for e in entries if e.type == "file"]
    total = sum(e.size for e in files)
    say(f"hashing{' and compressing' if compress == 'zstd' else ''} {len(files)} files, {total / 2**20:.0f} MiB, "
        f"in {chunk_size >> 10} KiB chunks")
    per_file: dict[str, list[tuple[str, int, int, str]]] = {}  # path -> (digest, size, stored, codec) per chunk
    done = [0]  # bytes hashed, for the progress lines

    def one_chunk(b: bytes, weights: bool = False) -> tuple[str, int, int, str]:
        digest = _blake3(b)
        if compress == "zstd" and known and digest in known:
            return (digest, len(b), *known[digest])
        frame, codec = _stored_form(b, compress, weights)
        if kept is not None:
            kept.keep(digest, frame)
        return digest, len(b), len(frame), codec

    def hash_file(e: Entry) -> None:
        if e.path in extra:
            b = extra[e.path]
            per_file[e.path] = [one_chunk(b[i:i + chunk_size]) for i in range(0, len(b), chunk_size)]
            return
        out = []
        weights = e.path.endswith(WEIGHT_SUFFIXES)
        with open(root / e.path, "rb", buffering=0) as f:
            before = _file_state(os.fstat(f.fileno()))
            while True:
                b = f.read(chunk_size)
                if not b:
                    break
                out.append(one_chunk(b, weights))
                done[0] += len(b)
            if _file_state(os.fstat(f.fileno())) != before:
                raise ArtifactError(f"{root / e.path} changed while it was being pushed")
        if kept is not None:
            kept.states[e.path] = before
        per_file[e.path] = out

    with _saying_every(10.0, say, lambda: f"hashed {done[0] / 2**20:.0f} of {total / 2**20:.0f} MiB"), \
            ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        list(ex.map(hash_file, files))
    if kept is not None and kept.missed:
        say(f"{kept.held / 2**20:.0f} MiB of frames kept in memory, {kept.missed / 2**20:.0f} MiB over the "
            f"budget: those are read and compressed again as they are sent")

    # order of first use: (file, chunk number) keys
    order: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()

    def want(path: str, k: int) -> None:
        if (path, k) not in seen and k < len(per_file.get(path, ())):
            seen.add((path, k))
            order.append((path, k))

    for e in sorted((e for e in files if e.size <= SMALL and small_first),
                    key=lambda e: (e.path != "manifest.json", e.path)):
        for k in range(len(per_file[e.path])):
            want(e.path, k)
    for path, off, length in ranges:
        for k in range(off // chunk_size, (off + max(length, 1) - 1) // chunk_size + 1):
            want(path, k)
    profiled_keys = len(order)
    for e in files:
        for k in range(len(per_file[e.path])):
            want(e.path, k)

    chunks: list[Chunk] = []
    by_digest: dict[str, int] = {}
    key_to_chunk: dict[tuple[str, int], int] = {}
    profiled = 0
    for n, (path, k) in enumerate(order):
        digest, size, stored, codec = per_file[path][k]
        ci = by_digest.get(digest)
        if ci is None:
            ci = by_digest[digest] = len(chunks)
            chunks.append(Chunk(digest, size, stored=stored, codec=codec))
        key_to_chunk[(path, k)] = ci
        if n < profiled_keys:
            profiled = len(chunks)
    for e in files:
        e.chunks = [key_to_chunk[(e.path, k)] for k in range(len(per_file[e.path]))]

    packs: list[Pack] = []
    start, fill = 0, 0
    for i, c in enumerate(chunks):
        c.pack, c.offset = len(packs), fill
        fill += c.stored
        if fill >= pack_size or i == len(chunks) - 1:
            packs.append(Pack("", fill, (start, i + 1)))
            start, fill = i + 1, 0
    return Index(chunk_size=chunk_size, entries=entries, chunks=chunks, packs=packs, profiled=profiled,
                 compress=compress)


@contextmanager
def _saying_every(every: float, say: Say, progress: Callable[[], str]):
    """Say ``progress()`` every ``every`` seconds while the block runs: hashing a 6 GB tree takes
    half a minute, a pull longer."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            say(progress())

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def _chunk_source(index: Index) -> dict[int, tuple[str, int]]:
    """chunk index -> one (file path, offset) to read it from."""
    src: dict[int, tuple[str, int]] = {}
    for ci, locs in index.locations().items():
        e, off = locs[0]
        src.setdefault(ci, (e.path, off))
    return src


def _pack_pieces(root: Path, index: Index, p: Pack, src: dict[int, tuple[str, int]],
                 extra: dict[str, bytes] | None = None, kept: Kept | None = None):
    """The pack's bytes as pieces in pack order: the frames ``kept`` holds as made, the others read
    from the tree and compressed as the index says, each checked again, so a file changed since
    hashing cannot be published under its old digest (nor a frame that came out other than when
    the index was built)."""
    # one file open at a time: a pack holds a file's chunks in a row, and a pack of compressed small
    # files (a venv's) spans more files than a process may hold open
    cur: tuple[str, object] | None = None
    extra = extra or {}
    try:
        for ci in range(*p.chunks):
            c = index.chunks[ci]
            if kept is not None and (frame := kept.frame(c.digest)) is not None:
                yield frame
                continue
            path, off = src[ci]
            if path in extra:
                b = extra[path][off:off + c.size]
            else:
                if cur is None or cur[0] != path:
                    if cur is not None:
                        cur[1].close()
                    cur = (path, open(root / path, "rb", buffering=0))
                b = os.pread(cur[1].fileno(), c.size, off)
            if len(b) != c.size or _blake3(b) != c.digest:
                raise ArtifactError(f"{root / path} changed while it was being pushed (chunk at {off})")
            if c.codec:
                b = _encode(b, c.codec)
                if len(b) != c.stored:
                    raise _FrameChanged(f"{root / path}: the chunk at {off} compressed to {len(b)} bytes, "
                                        f"{c.stored} when indexed (zstandard changed during the push?)")
            yield b
    finally:
        if cur is not None:
            cur[1].close()


def _thread_registry(local: threading.local, reg: Registry) -> Registry:
    """One Registry (one HTTP session) per worker thread: requests' sessions are not thread-safe."""
    if not hasattr(local, "reg"):
        local.reg = reg.clone()
    return local.reg


def _pack_key(index: Index, p: Pack) -> tuple:
    """What a pack's bytes are made of: its chunks, in order, each as stored."""
    return tuple((c.digest, c.stored, c.codec) for c in index.chunks[p.chunks[0]:p.chunks[1]])


def pack_digests(root: Path, index: Index, threads: int = 2, extra: dict[str, bytes] | None = None,
                 reuse: dict[tuple, str] | None = None, kept: Kept | None = None) -> None:
    """Each pack's sha256, computed from the tree; ``reuse``: pack key (_pack_key) -> the digest of a
    pack of the same chunks, stored the same, that the registry already has (its bytes are those)."""
    src = _chunk_source(index)

    def one(p: Pack) -> None:
        if reuse and (d := reuse.get(_pack_key(index, p))):
            p.digest = d
            return
        h = hashlib.sha256()
        for b in _pack_pieces(root, index, p, src, extra, kept):
            h.update(b)
        p.digest = "sha256:" + h.hexdigest()

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, index.packs))


def manifest_for(index_blob: bytes, index: Index, annotations: dict[str, str] | None = None) -> bytes:
    m = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
         "config": {"mediaType": EMPTY_TYPE, "digest": sha256_digest(EMPTY), "size": len(EMPTY)},
         "layers": [{"mediaType": INDEX_TYPE, "digest": sha256_digest(index_blob), "size": len(index_blob)}]
         + [{"mediaType": PACK_TYPE, "digest": p.digest, "size": p.size} for p in index.packs],
         "annotations": annotations or {}}
    return json.dumps(m, separators=(",", ":"), sort_keys=True).encode()


def runtime_ranges(tree: Path, snapshot: Path) -> list[tuple[str, int, int]]:
    """The ranges of ``tree``'s files (relative to it) that ``snapshot``'s access profile names, in
    first-needed order: what its restored server maps from the runtime before its first token."""
    root = os.path.realpath(tree) + os.sep
    return [(r.file[len(root):], r.offset, r.length) for r in _profile_ranges(snapshot) if r.file.startswith(root)]


def push_runtime(tree: Path, ref: str, ranges: list[tuple[str, int, int]], **kw) -> PushResult:
    """Publish the runtime ``tree`` (the venv a snapshot's server runs from) so that a restore can
    mount it lazily at the same path: ``ranges`` (runtime_ranges: what that server maps first) lead,
    the rest follows (fetched only on demand: a restore reads a few percent of a venv)."""
    if not ranges:
        raise ArtifactError(f"no access profile names files of {tree}: restore the snapshot once on this node "
                            "(the restore records one), then push its runtime")
    # the real path: what the server's mappings name, and so where a restore must find the files again
    return push(tree, ref, ranges=ranges, small_first=False, kind=RUNTIME_KIND, prefix=os.path.realpath(tree),
                profile=False, **kw)


def push(root: Path, ref: str, *, chunk_size: int = CHUNK, pack_size: int = PACK, threads: int = 4,
         say: Say = lambda s: None, ranges: list[tuple[str, int, int]] | None = None, small_first: bool = True,
         kind: str = "coldstart.tree", prefix: str = "", profile: bool = True, compress: str = "zstd",
         keep_bytes: int | None = None) -> PushResult:
    """Publish ``root`` as ``ref`` (``profile``: with the node's recorded access profile:
    shipped_profile; ``compress``: "zstd" or "none", see the module docstring). Blobs the repository
    already has are not sent again. ``keep_bytes``: memory for the frames made while hashing, sent
    as made (Kept; default a quarter of what is available, 0: every pack read and made again)."""
    t0 = time.monotonic()
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such directory")
    r = Ref.parse(ref)
    reg = Registry(r)
    extra = shipped_profile(root) if profile else {}
    # what this ref held before (a new ref: what the repository's other tags hold): its chunks' frames
    # need not be made again to be sized, nor its packs (those the registry still has) to be hashed,
    # when the tree has not changed
    prevs = _previous_indexes(reg) if compress == "zstd" else []
    known = {k: v for prev in reversed(prevs) for k, v in previous_frames(prev).items()} or None
    present = {d for d in {p.digest for prev in prevs for p in prev.packs} if reg.has_blob(d)}
    reuse = {_pack_key(prev, p): p.digest for prev in prevs for p in prev.packs if p.digest in present} or None

    def indexed(known, reuse) -> tuple[Index, Kept]:
        kept = Kept.for_this_host() if keep_bytes is None else Kept(keep_bytes)
        try:
            ix = build_index(root, chunk_size=chunk_size, pack_size=pack_size, say=say, extra=extra, ranges=ranges,
                             small_first=small_first, compress=compress, known=known, kept=kept)
            ix.kind, ix.prefix = kind, prefix
            pack_digests(root, ix, extra=extra, reuse=reuse, kept=kept)
        except BaseException:
            kept.close()
            raise
        return ix, kept

    try:
        index, kept = indexed(known, reuse)
    except _FrameChanged:
        if not known:
            raise
        say("this zstandard compresses differently from the one that pushed the ref before: compressing anew")
        index, kept = indexed(None, None)
    try:
        return _send(reg, r, root, index, kept, extra, present, threads, say, t0)
    finally:
        kept.close()


def _send(reg: Registry, r: Ref, root: Path, index: Index, kept: Kept, extra: dict[str, bytes], present: set[str],
          threads: int, say: Say, t0: float) -> PushResult:
    """Upload the blobs the registry lacks, then the manifest, if no file changed meanwhile."""
    index_blob = index.to_bytes()
    src = _chunk_source(index)
    blobs: list[tuple[str, int, object]] = [(sha256_digest(EMPTY), len(EMPTY), EMPTY),
                                            (sha256_digest(index_blob), len(index_blob), index_blob)]
    blobs += [(p.digest, p.size, p) for p in index.packs]
    uploaded, up_bytes = [0], [0]
    lock = threading.Lock()
    local = threading.local()

    def one(b: tuple[str, int, object]) -> None:
        digest, size, body = b
        rg = _thread_registry(local, reg)
        if digest in present or rg.has_blob(digest):  # (present: asked just before, for reuse)
            return
        data = body if isinstance(body, bytes) else _pack_pieces(root, index, body, src, extra, kept)
        rg.push_blob(data, digest, size)
        with lock:
            uploaded[0] += 1
            up_bytes[0] += size
            say(f"uploaded {digest[:19]} ({size / 2**20:.1f} MiB)")

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, blobs))
    kept.check_unchanged(root)  # (the frames sent as made were read before this)
    digest = reg.put_manifest(manifest_for(index_blob, index))
    return PushResult(str(r), digest, len(blobs), uploaded[0], up_bytes[0], index.bytes,
                      round(time.monotonic() - t0, 3))


def previous_frames(prev: Index) -> dict[str, tuple[int, str]]:
    """chunk digest -> (stored, codec) as ``prev`` stored it: what build_index need not compress
    again. Its chunks stored as is too when ``prev`` was pushed compressed (zstd saved too little on
    them: random or already compressed bytes), not when it was pushed as is or did not record how."""
    return {c.digest: (c.stored, c.codec) for c in prev.chunks if c.codec or prev.compress == "zstd"}


SIBLINGS = 4  # a new ref: how many of its repository's other tags push reads the frames of


def _previous_indexes(reg: Registry) -> list[Index]:
    """The index the ref names now; for a new ref, those of up to SIBLINGS other tags of its
    repository (a new version pushed under a new tag is mostly the old one's chunks: without them
    every chunk was compressed again). Unreadable ones are skipped: they are only a shortcut."""
    own = _previous_index(reg)
    if own is not None:
        return [own]
    try:
        tags = [t for t in reg.tags() if t != reg.ref.tag]
    except RegistryError:
        return []
    out = []
    for t in sorted(tags, reverse=True)[:SIBLINGS]:
        ix = _previous_index(reg.at(t))
        if ix is not None:
            out.append(ix)
    return out


def _previous_index(reg: Registry) -> Index | None:
    """The index the ref names now, if any and readable (a first push has none)."""
    try:
        return fetch_index(reg)[0]
    except (RegistryError, ArtifactError):
        return None


def _index_dict(raw: bytes) -> dict:
    """An index blob parsed, its version checked."""
    try:
        d = json.loads(raw)
        version = d.get("version")
    except (ValueError, AttributeError) as e:
        raise ArtifactError(f"malformed artifact index ({type(e).__name__}: {e})") from None
    if version not in READABLE_VERSIONS:
        raise ArtifactError(f"artifact index version {version!r} is not one of "
                            f"{', '.join(map(str, READABLE_VERSIONS))} (pushed by another coldstart version)")
    return d


def fetch_index(reg: Registry) -> tuple[Index, str, dict]:
    """The manifest (by the ref's tag or digest) and the verified index blob it names."""
    _, d, mdigest, m = fetch_index_blob(reg)
    return Index.from_dict(d), mdigest, m


def fetch_index_blob(reg: Registry) -> tuple[bytes, dict, str, dict]:
    """(index blob, the blob parsed, manifest digest, manifest): the blob verified (sha256), its
    version and its packs checked against the manifest's layers. The blob as fetched is what the
    mount hands to the daemon (a runtime's index is ~20 MB of JSON for 63 k files: no dataclasses)."""
    body, mdigest = reg.get_manifest()
    try:
        m = json.loads(body)
        layers = m["layers"]
    except (ValueError, KeyError, TypeError):
        raise ArtifactError(f"{reg.ref}: the manifest is not an OCI image manifest") from None
    if m.get("artifactType") != ARTIFACT_TYPE or not layers or layers[0].get("mediaType") != INDEX_TYPE:
        raise ArtifactError(f"{reg.ref}: not a coldstart artifact (artifactType {m.get('artifactType')!r})")
    raw = reg.get_blob(layers[0]["digest"])
    if sha256_digest(raw) != layers[0]["digest"]:
        raise ArtifactError(f"{reg.ref}: the index blob does not match its digest")
    d = _index_dict(raw)
    try:
        packs_ok = [p["digest"] for p in d["packs"]] == [layer["digest"] for layer in layers[1:]]
    except (KeyError, TypeError) as e:
        raise ArtifactError(f"malformed artifact index ({type(e).__name__}: {e})") from None
    if not packs_ok:
        raise ArtifactError(f"{reg.ref}: the manifest's packs differ from the index's")
    return raw, d, mdigest, m


def pull(ref: str, dest: Path, *, threads: int = 4, say: Say = lambda s: None) -> PullResult:
    """Download ``ref`` into ``dest`` (which must not exist): every chunk verified against its BLAKE3
    digest and every pack against its sha256 before ``dest`` appears, all at once (staging dir,
    fsync, rename). A failure leaves nothing at ``dest``."""
    t0 = time.monotonic()
    dest = Path(dest)
    if dest.exists():
        raise ArtifactError(f"{dest} already exists (pull publishes a new directory)")
    reg = Registry(Ref.parse(ref))
    index, mdigest, _ = fetch_index(reg)
    stage = dest.parent / f".{dest.name}.pull-{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_stages(dest.parent, dest.name)  # a killed pull's
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        try:
            _materialize(index, reg, stage, threads, say)
            publish_dir(stage, dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    except OSError as e:  # not writable, the disk full: one line (nothing is left at dest)
        raise ArtifactError(f"pull of {ref} into {dest}: {e.strerror or e}"
                            + (f" ({e.filename})" if e.filename else "")) from None
    files = sum(1 for e in index.entries if e.type == "file")
    return PullResult(dest, mdigest, files, index.bytes, round(time.monotonic() - t0, 3))


def _materialize(index: Index, reg: Registry, stage: Path, threads: int, say: Say) -> None:
    for e in index.entries:
        p = stage / e.path
        if e.type == "dir":
            p.mkdir(parents=True, exist_ok=True)
        elif e.type == "file":
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as f:
                f.truncate(e.size)
    locs = index.locations()
    done, total, lock, t0 = [0], index.bytes, threading.Lock(), time.monotonic()
    local = threading.local()

    def one(p: Pack) -> None:
        rg = _thread_registry(local, reg)
        h = hashlib.sha256()
        buf = bytearray()
        ci = p.chunks[0]
        for piece in rg.stream_blob(p.digest):
            h.update(piece)
            buf += piece
            while ci < p.chunks[1] and len(buf) >= index.chunks[ci].stored:
                c = index.chunks[ci]
                try:
                    data = _decode(bytes(buf[:c.stored]), c)  # (a frame decodes to exactly c.size or raises)
                    good = len(data) == c.size and _blake3(data) == c.digest
                except ArtifactError:
                    good = False
                del buf[:c.stored]
                if not good:
                    raise ArtifactError(f"{reg.ref}: chunk {ci} ({c.digest[:23]}) of pack {p.digest[:19]} is corrupt")
                for e, off in locs.get(ci, ()):  # (opened per write: a venv has 63 k files, over any fd limit)
                    fd = os.open(stage / e.path, os.O_WRONLY)
                    try:
                        os.pwrite(fd, data, off)
                    finally:
                        os.close(fd)
                ci += 1
                with lock:
                    done[0] += c.stored
        if ci != p.chunks[1] or buf or "sha256:" + h.hexdigest() != p.digest:
            raise ArtifactError(f"{reg.ref}: pack {p.digest[:19]} is truncated or corrupt")

    def progress() -> str:
        dt = time.monotonic() - t0
        return f"pulled {done[0] / 2**20:.0f}/{total / 2**20:.0f} MiB ({done[0] / 2**20 / max(dt, 1e-3):.0f} MiB/s)"

    with _saying_every(2.0, say, progress), ThreadPoolExecutor(threads) as ex:
        for f in [ex.submit(one, p) for p in index.packs]:
            f.result()
    for e in index.entries:
        p = stage / e.path
        if e.type == "symlink":
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(e.target, p)
        elif e.type in ("socket", "fifo"):
            p.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(p, e.mode | (stat.S_IFSOCK if e.type == "socket" else stat.S_IFIFO))
        elif e.type == "file":
            os.chmod(p, e.mode)
    for e in sorted((e for e in index.entries if e.type == "dir"), key=lambda e: -e.path.count("/")):
        os.chmod(stage / e.path, e.mode)
    say(f"pulled {total / 2**20:.0f} MiB in {time.monotonic() - t0:.1f} s, every chunk verified")


__all__ = ["ARTIFACT_TYPE", "Index", "PullResult", "PushResult", "RegistryError", "build_index", "fetch_index",
           "fetch_index_blob", "pull", "push", "push_runtime"]
