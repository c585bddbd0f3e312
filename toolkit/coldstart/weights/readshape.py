"""Which way a device reads a cold file faster: O_DIRECT or through the page cache.

Hosts disagree, by a factor of two either way: on the Intel Xeon VM fio read 2.0 GiB/s with
O_DIRECT against 0.9 through the page cache (results/spot-checks/odirect), on an AMD EPYC Zen 3 VM
0.83 against 1.74 (results/bench-load-avx2), so a rule fixed on one host loses half the disk on the
other. ``probe`` asks the device instead: it loads the head of a real flat dump cold with the loader
itself, both ways, alternately, into page-aligned destinations (the case the choice is for), and
``save``s the result in the node dir, keyed by the device and the boot. ``cached`` answers from that
record for every later load on the node at the cost of one small file read.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import write_atomic
from coldstart.state import node_dir
from coldstart.weights.format import FlatIndex, read_index, torch_dtype

SPAN_BYTES = 128 << 20  # the head of the file each probe read loads (about 0.1 s at these disks' speed)
ROUNDS = 2  # alternating (O_DIRECT, buffered) pairs: the disk drifts between seconds
DIRECT_MARGIN = 0.95  # O_DIRECT wins unless buffered reads are faster than this share of it
AUTO_PROBE_MIN = 1 << 30  # a cold load of a file at least this big probes an unprobed device first


@dataclass(frozen=True)
class ReadShape:
    """One device's probe: the two cold read rates (GiB/s, one per round) and the choice."""

    device: str  # "MAJ:MIN (name)" of the block device holding the probed file
    boot_id: str
    direct_gib_s: tuple[float, ...]
    buffered_gib_s: tuple[float, ...]
    direct: bool  # the choice: True = O_DIRECT for cold files into aligned destinations
    span_bytes: int
    probed_file: str
    probed_at: float  # unix time

    @property
    def way(self) -> str:
        return "O_DIRECT" if self.direct else "buffered"

    def why(self) -> str:
        """The record in a few words, for the loader's ``direct_choice``."""
        d, b = statistics.median(self.direct_gib_s), statistics.median(self.buffered_gib_s)
        return f"device {self.device} probed: O_DIRECT {d:.2f}, buffered {b:.2f} GiB/s"


def device_of(path: Path | str) -> tuple[str, str]:
    """(key, label) of the block device holding ``path``: "MAJ-MIN" and "MAJ:MIN (name)"."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    name = "?"
    try:
        name = Path(os.path.realpath(f"/sys/dev/block/{major}:{minor}")).name
    except OSError:
        pass
    return f"{major}-{minor}", f"{major}:{minor} ({name})"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def record_path(path: Path | str) -> Path:
    """Where the record for the device holding ``path`` lives (one per device and boot)."""
    key, _ = device_of(path)
    return node_dir() / "read-shape" / f"{key}-{_boot_id()[:8]}.json"


def cached(path: Path | str) -> ReadShape | None:
    """The device's record, or None when it was not probed since boot (or the record is unreadable)."""
    try:
        raw = json.loads(record_path(path).read_text())
        rec = ReadShape(**{**raw, "direct_gib_s": tuple(raw["direct_gib_s"]),
                           "buffered_gib_s": tuple(raw["buffered_gib_s"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return rec if rec.boot_id == _boot_id() else None


def save(rec: ReadShape, path: Path | str) -> Path:
    out = record_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(asdict(rec), indent=1) + "\n")
    return out


def _head(index: FlatIndex, span: int):
    """The dump's first tensors up to ``span`` bytes (at least one), and page-aligned destinations
    for them at the file's own relative offsets (one anonymous mapping); (dest, first offset, bytes,
    the mapping)."""
    import torch

    from coldstart.weights.loader import _aligned_buffer

    entries = sorted(index.tensors, key=lambda e: e.offset)
    if not entries:
        raise ColdstartError(f"{index.data_file}: no tensors to probe with")
    base = entries[0].offset
    head = [e for e in entries if e.offset + e.nbytes - base <= span] or entries[:1]
    size = max(e.offset + e.nbytes for e in head) - base
    buf = _aligned_buffer(size)
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    raw.fill_(0)  # touched, as a live model's memory is
    dest = {e.name: raw[e.offset - base:e.offset - base + e.nbytes].view(torch_dtype(e.dtype)).view(e.shape)
            for e in head}
    return dest, base, size, buf


def probe(flat: Path | str | FlatIndex, span: int = SPAN_BYTES, rounds: int = ROUNDS) -> ReadShape:
    """Load the head of ``flat`` cold ``rounds`` times each way (the page cache emptied of the file
    before each read) and choose. Raises ColdstartError when the file's pages cannot be evicted
    (another process maps them), since then neither read is cold, or when the file system refuses
    O_DIRECT."""
    from coldstart.warm.residency import evict, range_resident
    from coldstart.weights.loader import direct_refused, load_into

    index = flat if isinstance(flat, FlatIndex) else read_index(flat)
    data = Path(index.data_file)
    refused = direct_refused(data)
    if refused:
        raise ColdstartError(f"{data}: O_DIRECT refused ({refused}); nothing to choose")
    dest, first, size, _buf = _head(index, span)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for direct in ((True, False) if r % 2 == 0 else (False, True)):
            evict(data)
            fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if range_resident(fd, first, min(size, 1 << 20)):
                    raise ColdstartError(f"{data}: its pages stay in the page cache after eviction "
                                         "(mapped by a process?); cannot probe cold reads")
            finally:
                os.close(fd)
            st = load_into(index, dest, strict=False, direct=direct)
            rates[direct].append(round(st.gib_per_s, 3))
    d, b = statistics.median(rates[True]), statistics.median(rates[False])
    _, label = device_of(data)
    return ReadShape(device=label, boot_id=_boot_id(), direct_gib_s=tuple(rates[True]),
                     buffered_gib_s=tuple(rates[False]), direct=b < d / DIRECT_MARGIN, span_bytes=size,
                     probed_file=str(data), probed_at=round(time.time(), 3))


def probe_and_save(flat: Path | str | FlatIndex, span: int = SPAN_BYTES, rounds: int = ROUNDS) -> ReadShape:
    index = flat if isinstance(flat, FlatIndex) else read_index(flat)
    rec = probe(index, span, rounds)
    save(rec, index.data_file)
    return rec
