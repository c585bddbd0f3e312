"""The largest request the block device under the weights gets (its queue's max_sectors_kb), chosen
by measuring the read the engine does.

The kernel's readahead sends requests of up to max_sectors_kb, and some virtual disks serve large
ones slower: on the Intel Xeon AMX VM (virtio disk, max_sectors_kb 4096, read_ahead_kb 8192) a cold
1.25 GiB file mapped and populated, as a map reload reads it, came in at 1.76 GiB/s with the
default and 2.00-2.05 GiB/s with requests of 1 MiB or less, paired over 8 rounds, above fio's
O_DIRECT reads in the same rounds (results/spot-checks/request-size). The setting belongs to the
node (every reader of the device gets it), so nothing in coldstart changes it by itself: ``probe``
measures each candidate and puts the queue back as it found it, ``apply`` writes the choice, which
lasts until reboot (``udev_rule`` makes it permanent).
"""
from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from coldstart.errors import ColdstartError

CANDIDATES_KB = (1024, 512, 256)  # tried beside the device's current value
SPAN_BYTES = 512 << 20  # the file's head each probe read populates
ROUNDS = 3  # each candidate once per round, in a rotated order: the disk drifts between seconds
MARGIN = 1.05  # another value must beat the current one's median by this much to be chosen
THREADS, PIECE = 4, 64 << 20  # the map reload's populate (engine.arena)


@dataclass(frozen=True)
class QueueProbe:
    """One device's probe: cold populate rates (GiB/s, one per round) for each max_sectors_kb."""

    device: str  # "name (MAJ:MIN)" of the queue's device
    queue: str  # its sysfs queue directory
    current_kb: int  # max_sectors_kb found before the probe (and left so)
    hw_max_kb: int
    gib_s: dict[int, tuple[float, ...]]
    choice_kb: int
    probed_file: str
    span_bytes: int

    def median(self, kb: int) -> float:
        return statistics.median(self.gib_s[kb])

    def why(self) -> str:
        rates = ", ".join(f"{kb} KiB {self.median(kb):.2f}" for kb in sorted(self.gib_s, reverse=True))
        return f"{self.device}: max_sectors_kb {rates} GiB/s (medians of {len(self.gib_s[self.current_kb])})"


def queue_dir(path: Path | str) -> Path:
    """The sysfs queue directory of the block device holding ``path`` (a partition's is its disk's)."""
    try:
        dev = os.stat(path).st_dev
    except OSError as e:
        raise ColdstartError(f"{path}: {e.strerror}") from None
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not node.exists():
        raise ColdstartError(f"{path}: on no block device ({os.major(dev)}:{os.minor(dev)}: not in /sys/dev/block)")
    real = node.resolve()
    q = real / "queue" if (real / "queue").is_dir() else real.parent / "queue"
    if not (q / "max_sectors_kb").exists():
        raise ColdstartError(f"{path}: device {real.name} has no request queue to tune")
    return q


def _label(q: Path) -> str:
    disk = q.parent
    dev = (disk / "dev").read_text().strip() if (disk / "dev").exists() else "?"
    return f"{disk.name} ({dev})"


def current_kb(q: Path) -> int:
    return int((q / "max_sectors_kb").read_text())


def settings(q: Path) -> dict[str, int | str]:
    """What a benchmark records of the queue: its disk's name, max_sectors_kb and read_ahead_kb."""
    return {"device": q.parent.name, "max_sectors_kb": current_kb(q),
            "read_ahead_kb": int((q / "read_ahead_kb").read_text())}


def apply(q: Path, kb: int) -> None:
    """Set ``q``'s max_sectors_kb (root, a writable /sys: on the node, not in a container)."""
    hw = int((q / "max_hw_sectors_kb").read_text())
    if not 4 <= kb <= hw:
        raise ColdstartError(f"max_sectors_kb {kb}: out of range for {_label(q)} (4 to {hw})")
    try:
        (q / "max_sectors_kb").write_text(str(kb))
    except OSError as e:
        raise ColdstartError(f"cannot set max_sectors_kb of {_label(q)}: {e.strerror} "
                             "(run as root on the node, where /sys is writable)") from None


def udev_rule(q: Path, kb: int) -> str:
    """A udev rule that sets the same value at every boot (for /etc/udev/rules.d/)."""
    return f'ACTION=="add|change", KERNEL=="{q.parent.name}", ATTR{{queue/max_sectors_kb}}="{kb}"'


def populate_cold(path: Path, span: int) -> float:
    """Seconds to bring the first ``span`` bytes of ``path`` in from the device, evicted first, by
    MADV_POPULATE_READ in THREADS threads of PIECE pieces, into 2 MiB page-cache folios (the
    engine's map reload: WeightArena.map_file)."""
    from coldstart.warm.residency import evict, populate_fd, range_resident

    evict(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if range_resident(fd, 0, min(span, 1 << 20)):
            raise ColdstartError(f"{path}: its pages stay in the page cache after eviction "
                                 "(mapped by a process?); cannot probe cold reads")
        pieces = [(o, min(PIECE, span - o)) for o in range(0, span, PIECE)]
        t0 = time.perf_counter()
        try:
            with ThreadPoolExecutor(THREADS) as ex:  # each thread takes the next piece in file order
                list(ex.map(lambda p: populate_fd(fd, *p, huge=True), pieces))
        except OSError as e:
            raise ColdstartError(f"{path}: reading for the probe failed: {e}") from None
        secs = time.perf_counter() - t0
    finally:
        os.close(fd)
    return secs


def probe(path: Path | str, candidates: tuple[int, ...] = CANDIDATES_KB, span: int = SPAN_BYTES,
          rounds: int = ROUNDS, say=lambda s: None) -> QueueProbe:
    """Populate the head of ``path`` cold under each max_sectors_kb (the device's current one and
    ``candidates`` up to its hardware limit), ``rounds`` times in rotated orders, then put the
    queue back. The choice is the fastest median, unless it beats the current value by less than
    MARGIN. Root only: it writes the queue's setting while it measures."""
    path = Path(path)
    q = queue_dir(path)
    size = path.stat().st_size
    span = min(span, size - size % 4096)
    if span < PIECE:
        raise ColdstartError(f"{path}: {size} bytes is too small to probe with (at least {PIECE >> 20} MiB)")
    cur, hw = current_kb(q), int((q / "max_hw_sectors_kb").read_text())
    sizes = list(dict.fromkeys([cur, *(kb for kb in candidates if 4 <= kb <= hw)]))
    rates: dict[int, list[float]] = {kb: [] for kb in sizes}
    try:
        for r in range(rounds):
            for kb in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
                apply(q, kb)
                rates[kb].append(round(span / 2**30 / populate_cold(path, span), 3))
                say(f"round {r + 1}/{rounds}: max_sectors_kb {kb}: {rates[kb][-1]:.2f} GiB/s")
    finally:
        try:
            apply(q, cur)
        except ColdstartError:
            pass  # (apply itself refused to start with: nothing was changed)
    best = max(sizes, key=lambda kb: statistics.median(rates[kb]))
    choice = best if statistics.median(rates[best]) >= MARGIN * statistics.median(rates[cur]) else cur
    return QueueProbe(device=_label(q), queue=str(q), current_kb=cur, hw_max_kb=hw,
                      gib_s={kb: tuple(v) for kb, v in rates.items()}, choice_kb=choice,
                      probed_file=str(path), span_bytes=span)
