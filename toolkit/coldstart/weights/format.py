"""The flat weight format: one data file + one JSON index.

``weights.flat`` holds every tensor's raw bytes at an ``alignment``-aligned offset (4 KiB by
default, so O_DIRECT reads and page-granular mmap/prefetch work on any tensor), and the file is
padded to a multiple of the alignment. ``weights.index.json`` lists, per tensor: name, dtype, shape,
offset, nbytes and one digest per ``chunk_bytes`` chunk of the tensor (chunks start at the tensor's
first byte, the last one may be short), so a loader can verify while it streams.

The index is written last and the directory is published by an atomic rename, so a directory that
has an index is a finished dump.

A dump may leave tensors out (``omit_tensors``): their bytes become a hole, the index keeps their
digests, and ``weights.absent.json`` names them and says where their only copy is (the packed GEMM
handles a snapshot's CRIU image holds). Every reader of tensor bytes refuses them (``require_present``)
rather than read zeros; a dump of the serving process rebuilds them exactly.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import fsync_dir  # noqa: F401  (re-exported: weights.dump imports it from here)

FORMAT_VERSION = 1
DATA_NAME = "weights.flat"
INDEX_NAME = "weights.index.json"
ABSENT_NAME = "weights.absent.json"
DEFAULT_ALIGNMENT = 4096
DEFAULT_CHUNK_BYTES = 16 << 20  # digest granularity; the loader reads multiples of it when verifying
DIGEST_ALGOS = ("xxh3_64", "blake3")

# dtype name (torch's, without "torch.") -> item size in bytes. Kept torch-free so reading an index
# (manifest checks, `coldstart weights verify`) does not import torch.
DTYPE_SIZES: dict[str, int] = {
    "bfloat16": 2, "float16": 2, "float32": 4, "float64": 8,
    "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "complex64": 8,
}


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    chunk_digests: list[str] = field(default_factory=list)


@dataclass
class FlatIndex:
    version: int
    alignment: int
    chunk_bytes: int
    digest_algo: str
    data_file: str  # on disk: the data file's name; after read_index: its absolute path
    data_size: int
    tensors: list[TensorEntry]
    # tensors whose bytes are not in the data file (weights.absent.json; not part of the index)
    absent: frozenset[str] = frozenset()
    absent_why: str = ""

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> str:
        d = asdict(self)
        del d["absent"], d["absent_why"]
        d["data_file"] = Path(self.data_file).name
        d["format"] = "coldstart-flat"
        return json.dumps(d, separators=(",", ":")) + "\n"


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def n_chunks(nbytes: int, chunk_bytes: int) -> int:
    return max(1, math.ceil(nbytes / chunk_bytes)) if nbytes else 0


def resolve_paths(path: Path | str) -> tuple[Path, Path]:
    """(index path, directory) from a dump dir, its weights.flat or its weights.index.json."""
    p = Path(path)
    if p.is_dir():
        return p / INDEX_NAME, p
    if not p.exists():
        raise ColdstartError(f"{p}: no such file or directory")
    if p.name == INDEX_NAME:
        return p, p.parent
    return p.parent / INDEX_NAME, p.parent


def read_index(path: Path | str) -> FlatIndex:
    """Read and validate a dump's index (and the data file's size) before any byte is loaded."""
    idx_path, d = resolve_paths(path)
    if not d.exists():
        raise ColdstartError(f"{d}: no such directory")
    if not idx_path.exists():
        raise ColdstartError(f"{idx_path}: missing index (not a finished coldstart weights dump)")
    try:
        raw = json.loads(idx_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ColdstartError(f"{idx_path}: corrupt index ({e.__class__.__name__}: {e})") from None
    if not isinstance(raw, dict) or raw.get("format") != "coldstart-flat":
        raise ColdstartError(f"{idx_path}: not a coldstart flat weights index")
    version = raw.get("version")
    if version != FORMAT_VERSION:
        raise ColdstartError(f"{idx_path}: format version {version!r} is not supported (this coldstart reads {FORMAT_VERSION})")
    try:
        tensors = [TensorEntry(name=str(t["name"]), dtype=str(t["dtype"]), shape=[int(s) for s in t["shape"]],
                               offset=int(t["offset"]), nbytes=int(t["nbytes"]),
                               chunk_digests=[str(x) for x in t["chunk_digests"]]) for t in raw["tensors"]]
        index = FlatIndex(version=version, alignment=int(raw["alignment"]), chunk_bytes=int(raw["chunk_bytes"]),
                          digest_algo=str(raw["digest_algo"]), data_file=str(raw["data_file"]),
                          data_size=int(raw["data_size"]), tensors=tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise ColdstartError(f"{idx_path}: corrupt index (bad or missing field: {e})") from None
    _validate(index, idx_path)
    data = d / Path(index.data_file).name
    if not data.exists():
        raise ColdstartError(f"{data}: data file missing")
    size = data.stat().st_size
    if size < index.data_size:
        raise ColdstartError(f"{data}: truncated ({size} bytes, the index says {index.data_size})")
    if size != index.data_size:
        raise ColdstartError(f"{data}: size {size} does not match the index ({index.data_size} bytes)")
    index.data_file = str(data.resolve())
    index.absent, index.absent_why = _read_absent(d / ABSENT_NAME, index)
    return index


def _read_absent(path: Path, index: FlatIndex) -> tuple[frozenset[str], str]:
    if not path.exists():
        return frozenset(), ""
    try:
        raw = json.loads(path.read_text())
        names = frozenset(str(n) for n in raw["tensors"])
        why = str(raw.get("why", ""))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ColdstartError(f"{path}: corrupt list of absent tensors ({e.__class__.__name__}: {e})") from None
    unknown = names - index.by_name().keys()
    if unknown:
        raise ColdstartError(f"{path}: names tensors the index does not have: {sorted(unknown)[:3]}")
    return names, why


def require_present(index: FlatIndex, names, doing: str) -> None:
    """Raise, naming them, if any of ``names`` is left out of the data file (``omit_tensors``):
    its bytes there are zeros."""
    missing = sorted(index.absent.intersection(names))
    if missing:
        raise ColdstartError(
            f"{Path(index.data_file).name}: {doing} needs {len(missing)} tensors this dump left out "
            f"({', '.join(missing[:2])}{', ...' if len(missing) > 2 else ''}): {index.absent_why or 'absent'}")


def omit_tensors(path: Path | str, names, why: str) -> int:
    """Leave ``names`` out of a finished dump: their bytes become holes (zeros written where the
    filesystem cannot punch), the index keeps their digests, and ``weights.absent.json`` lists them
    with ``why`` (written atomically, last). Returns the bytes left out."""
    from coldstart.fsutil import punch_hole, write_atomic

    index = read_index(path)
    by = index.by_name()
    unknown = set(names) - by.keys()
    if unknown:
        raise ColdstartError(f"cannot leave out tensors the dump does not have: {sorted(unknown)[:3]}")
    names = sorted(set(names) | index.absent)
    fd = os.open(index.data_file, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for n in names:
            e = by[n]
            if not punch_hole(fd, e.offset, e.nbytes):
                zeros = bytes(1 << 20)
                for k in range(0, e.nbytes, len(zeros)):
                    os.pwrite(fd, zeros[:min(len(zeros), e.nbytes - k)], e.offset + k)
        os.fsync(fd)
    finally:
        os.close(fd)
    write_atomic(Path(index.data_file).parent / ABSENT_NAME,
                 json.dumps({"format": "coldstart-flat-absent", "tensors": names, "why": why}, indent=1) + "\n")
    return sum(by[n].nbytes for n in names)


def _validate(index: FlatIndex, where: Path) -> None:
    if index.alignment <= 0 or index.alignment & (index.alignment - 1):
        raise ColdstartError(f"{where}: alignment {index.alignment} is not a power of two")
    if index.chunk_bytes <= 0:
        raise ColdstartError(f"{where}: bad chunk_bytes {index.chunk_bytes}")
    if index.digest_algo not in DIGEST_ALGOS:
        raise ColdstartError(f"{where}: unknown digest algorithm {index.digest_algo!r}")
    seen: set[str] = set()
    end = 0
    for t in sorted(index.tensors, key=lambda t: t.offset):
        if t.name in seen:
            raise ColdstartError(f"{where}: tensor {t.name!r} listed twice")
        seen.add(t.name)
        if t.dtype not in DTYPE_SIZES:
            raise ColdstartError(f"{where}: tensor {t.name!r} has unsupported dtype {t.dtype!r}")
        want = math.prod(t.shape) * DTYPE_SIZES[t.dtype]
        if t.nbytes != want:
            raise ColdstartError(f"{where}: tensor {t.name!r}: nbytes {t.nbytes} != shape {t.shape} x {t.dtype}")
        if t.offset % index.alignment or t.offset < end:
            raise ColdstartError(f"{where}: tensor {t.name!r}: bad offset {t.offset}")
        end = t.offset + t.nbytes
        if end > index.data_size:
            raise ColdstartError(f"{where}: tensor {t.name!r} ends past the data file ({end} > {index.data_size})")
        if len(t.chunk_digests) != n_chunks(t.nbytes, index.chunk_bytes):
            raise ColdstartError(f"{where}: tensor {t.name!r}: wrong number of chunk digests")


def hasher(algo: str):
    """A function bytes-like -> hex digest for ``algo``."""
    if algo == "xxh3_64":
        import xxhash

        return xxhash.xxh3_64_hexdigest
    if algo == "blake3":
        import blake3

        return lambda b: blake3.blake3(b).hexdigest()
    raise ColdstartError(f"unknown digest algorithm {algo!r} (choose from {', '.join(DIGEST_ALGOS)})")


def torch_dtype(name: str):
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ColdstartError(f"dtype {name!r} is not available in this torch")
    return dt


def dtype_name(dt) -> str:
    """torch.bfloat16 -> "bfloat16" (the index's spelling)."""
    name = str(dt).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise ColdstartError(f"dtype {name} is not supported by the flat format")
    return name
