"""Write the flat format from a safetensors directory or from live tensors (a running engine).

The dump goes to a hidden staging directory next to the output (same filesystem), the data file and
then the index are written and fsynced, and the staging directory is renamed into place: whatever
kills the process (SIGKILL, disk full), the output path either does not exist or is a complete
dump. Staging directories left by dead processes are removed by the next dump into the same place.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterable

from coldstart.errors import ColdstartError
from coldstart.fsutil import pid_alive
from coldstart.weights.format import (
    DATA_NAME,
    DEFAULT_ALIGNMENT,
    DEFAULT_CHUNK_BYTES,
    FORMAT_VERSION,
    INDEX_NAME,
    FlatIndex,
    TensorEntry,
    align_up,
    dtype_name,
    fsync_dir,
    hasher,
)

Progress = Callable[[int, int], None]  # (bytes done, bytes total; total 0 when unknown)
_STAGING_RE = re.compile(r"^\.(?P<name>.+)\.staging-(?P<pid>\d+)-[0-9a-f]+$")


def _clean_stale_staging(out_dir: Path) -> None:
    """Remove staging dirs for ``out_dir`` whose writer is dead (a SIGKILLed earlier dump)."""
    if not out_dir.parent.exists():
        return
    for p in out_dir.parent.iterdir():
        m = _STAGING_RE.match(p.name)
        if m and m["name"] == out_dir.name and not pid_alive(int(m["pid"])):
            shutil.rmtree(p, ignore_errors=True)


def _as_bytes(t):
    """A contiguous CPU uint8 view (numpy array, writable buffer) of a tensor's bytes."""
    import torch

    if t.device.type != "cpu":
        t = t.detach().to("cpu")
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.reshape(-1).view(torch.uint8).numpy()


def _pwrite_all(fd: int, buf, offset: int) -> None:
    mv = memoryview(buf)
    while len(mv):
        n = os.pwrite(fd, mv, offset)
        mv = mv[n:]
        offset += n


def dump_tensors(
    named: Iterable[tuple[str, "object"]],
    out_dir: Path,
    *,
    alignment: int = DEFAULT_ALIGNMENT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    digest_algo: str = "xxh3_64",
    overwrite: bool = False,
    progress: Progress | None = None,
    total_bytes: int = 0,
) -> FlatIndex:
    """Dump ``(name, tensor)`` pairs (e.g. a module's named_parameters() + named_buffers(), on any
    device) to ``out_dir`` (weights.flat + weights.index.json), atomically. Tensors are written in
    the order given, each at the next ``alignment``-aligned offset."""
    if alignment <= 0 or alignment & (alignment - 1) or alignment < 512:
        raise ColdstartError(f"alignment {alignment} must be a power of two >= 512")
    if chunk_bytes <= 0 or chunk_bytes % alignment:
        raise ColdstartError(f"chunk size {chunk_bytes} must be a positive multiple of the alignment {alignment}")
    digest = hasher(digest_algo)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ColdstartError(f"{out_dir} already exists (remove it or pass --overwrite)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_staging(out_dir)
    staging = out_dir.parent / f".{out_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        entries: list[TensorEntry] = []
        seen: set[str] = set()
        pos = 0
        done = 0
        fd = os.open(staging / DATA_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for name, tensor in named:
                if name in seen:
                    raise ColdstartError(f"tensor {name!r} appears twice in the dump source")
                seen.add(name)
                dt = dtype_name(tensor.dtype)
                shape = [int(s) for s in tensor.shape]
                raw = _as_bytes(tensor)
                offset = align_up(pos, alignment)
                digests = []
                for start in range(0, raw.nbytes, chunk_bytes):
                    piece = raw[start:start + chunk_bytes]
                    digests.append(digest(piece))
                    _pwrite_all(fd, piece, offset + start)
                    done += piece.nbytes
                    if progress:
                        progress(done, total_bytes)
                entries.append(TensorEntry(name=name, dtype=dt, shape=shape, offset=offset,
                                           nbytes=int(raw.nbytes), chunk_digests=digests))
                pos = offset + raw.nbytes
            data_size = align_up(pos, alignment)
            os.ftruncate(fd, data_size)  # pad: O_DIRECT reads of the last tensor stay inside the file
            os.fsync(fd)
        finally:
            os.close(fd)
        index = FlatIndex(version=FORMAT_VERSION, alignment=alignment, chunk_bytes=chunk_bytes,
                          digest_algo=digest_algo, data_file=DATA_NAME, data_size=data_size, tensors=entries)
        # the index is written last: a directory with an index is a finished dump
        tmp = staging / (INDEX_NAME + ".tmp")
        with open(tmp, "w") as f:
            f.write(index.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, staging / INDEX_NAME)
        fsync_dir(staging)
        if out_dir.exists():  # overwrite: move the old dump aside, then publish
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(staging, out_dir)
        fsync_dir(out_dir.parent)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ColdstartError(f"no space left writing the weights dump to {out_dir.parent}") from None
        raise ColdstartError(f"writing the weights dump to {out_dir} failed: {e}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    index.data_file = str((out_dir / DATA_NAME).resolve())
    return index


def safetensors_files(src_dir: Path) -> list[Path]:
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise ColdstartError(f"{src_dir}: not a directory")
    files = sorted(src_dir.glob("*.safetensors"))
    if not files:
        raise ColdstartError(f"{src_dir}: no *.safetensors files")
    return files


def iter_safetensors(src_dir: Path):
    """(name, tensor) for every tensor of every *.safetensors file in ``src_dir`` (mmapped)."""
    from safetensors import safe_open

    for f in safetensors_files(src_dir):
        try:
            handle = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for bad headers
            raise ColdstartError(f"{f}: cannot read safetensors file ({e})") from None
        with handle as h:
            for name in h.keys():
                try:
                    yield name, h.get_tensor(name)
                except Exception as e:
                    raise ColdstartError(f"{f}: cannot read tensor {name!r} ({e})") from None


def dump_safetensors(
    src_dir: Path,
    out_dir: Path,
    *,
    alignment: int = DEFAULT_ALIGNMENT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    digest_algo: str = "xxh3_64",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> FlatIndex:
    """Dump every tensor of a Hugging Face safetensors directory to the flat format."""
    files = safetensors_files(src_dir)
    total = sum(f.stat().st_size for f in files)  # upper bound (headers included), for progress
    return dump_tensors(iter_safetensors(src_dir), out_dir, alignment=alignment, chunk_bytes=chunk_bytes,
                        digest_algo=digest_algo, overwrite=overwrite, progress=progress, total_bytes=total)
