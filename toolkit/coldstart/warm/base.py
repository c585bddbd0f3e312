"""What every warmer shares: the plan (which byte ranges, in which order), stats, the protocol.

The plan is where the ordering policy lives, so both warmers (vmtouch processes, native threads)
follow the same order: a recorded access profile first, else small metadata files, CRIU
``pages-*.img``, then the weights file, then the rest.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from coldstart.warm.residency import expand_paths

log = logging.getLogger("coldstart.warm")

MiB = 1 << 20
SMALL_FILE = 1 * MiB  # below this a file is metadata read early by everyone; costs nothing to warm first

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes planned)


@dataclass(frozen=True)
class Range:
    """``length`` bytes at ``offset`` of ``path``: one unit of warming work."""

    path: Path
    offset: int
    length: int


@dataclass
class FileStats:
    path: str
    size: int = 0
    bytes: int = 0  # bytes warmed (read / advised / touched) by this warm
    error: str | None = None


@dataclass
class WarmStats:
    """The outcome of one warm: what was done, how long it took, what failed (never raised)."""

    mode: str
    bytes: int = 0  # bytes warmed
    planned: int = 0  # bytes planned
    seconds: float = 0.0
    finished: bool = False  # every reader has stopped
    cancelled: bool = False
    profile_used: bool = False
    per_file: dict[str, FileStats] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def gib_s(self) -> float:
        return self.bytes / (1 << 30) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gib_s"] = round(self.gib_s, 3)
        return d


class Warmer(Protocol):
    """Started in the background at container start; cancellable; never raises for a bad file."""

    mode: str

    def start(self) -> "Warmer": ...

    def cancel(self) -> None: ...

    def wait(self, timeout: float | None = None) -> WarmStats: ...

    @property
    def done(self) -> bool: ...

    def issued(self) -> list[Range]: ...


def file_rank(p: Path) -> tuple[int, str]:
    """Default warming order without a profile (lower first)."""
    name = p.name
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    if name.startswith("pages-") and name.endswith(".img"):
        return 1, str(p)
    if name.endswith(".flat"):
        return 2, str(p)
    if size < SMALL_FILE:
        return 0, str(p)
    return 3, str(p)


def _split(path: Path, offset: int, length: int, chunk: int) -> list[Range]:
    if chunk < 1:  # (a loop that never ends: the callers check the shape they are given)
        raise ValueError(f"chunk must be at least 1 byte, not {chunk}")
    out = []
    end = offset + length
    while offset < end:
        n = min(chunk, end - offset)
        out.append(Range(path, offset, n))
        offset += n
    return out


@dataclass
class Plan:
    ranges: list[Range]
    files: dict[Path, int]  # readable files -> size
    errors: dict[Path, str]  # files that cannot be warmed -> why
    profile_used: bool = False
    profile_end: int = 0  # ranges[:profile_end] come from the profile, the rest is "the rest"
    mapped: list[Path] = field(default_factory=list)  # profile-only files (mapped libraries) being warmed

    @property
    def total(self) -> int:
        return sum(r.length for r in self.ranges)


def _profile_root(profile: Path, files: dict[Path, int]) -> Path:
    """What a profile's relative paths are relative to: its own folder when it ships inside a
    snapshot, else (a node's stored profile) the snapshot the warmed files belong to."""
    if (profile.parent / "manifest.json").is_file():
        return profile.parent
    for p in files:
        for d in p.parents:
            if (d / "manifest.json").is_file():
                return d
    return profile.parent


def make_plan(paths: list[Path] | list[str], *, chunk: int, profile: Path | None = None,
              order: list[Path] | None = None, profile_only: list[Path] | None = None,
              remap: Callable[[Path], Path] | None = None) -> Plan:
    """Ranges to warm, in order. ``order`` puts the files it names first (in that order);
    ``profile`` puts its recorded ranges before everything else. ``profile_only``: files of which
    only the profile's ranges are warmed, never the rest (the libraries the restored server maps:
    gigabytes, of which it touches tens of MiB). ``remap``: where those files (recorded under the
    restoring side's absolute paths) are seen from here. A bad profile is logged and ignored:
    warming in the default order is still better than none."""
    files: dict[Path, int] = {}
    errors: dict[Path, str] = {}
    only = {(remap or (lambda x: x))(Path(o).absolute()) for o in profile_only or ()}
    for p in expand_paths([*paths, *sorted(only - set(map(Path, paths)))]):
        try:
            # O_NONBLOCK: a FIFO named by mistake must not hang the restore
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            if p in only:
                errors[p] = (f"{p}: mapped by the restored server per the access profile, but cannot be opened "
                             f"({e.strerror or e}): skipped")
            else:
                errors[p] = f"{p}: cannot open for warming: {e.strerror or e}"
            continue
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            errors[p] = f"{p}: not a regular file, not warmed"
            continue
        files[p] = st.st_size

    names = sorted(files, key=file_rank)
    if order:
        first = [Path(o).absolute() for o in order]
        rank = {p: i for i, p in enumerate(first)}
        names = sorted(names, key=lambda p: (rank.get(p, len(rank)),))  # stable: keeps default after

    ranges: list[Range] = []
    covered: dict[Path, list[tuple[int, int]]] = {}
    # CRIU pages images beside a parent/ directory (coldstart's hot layout: criu/layout.py) hold the
    # pages a restore touches, stored together for it: all of them are read first, whole; the ranges
    # the restore touches before its canary's forward pass (early_ranges) before the rest of them
    hot = [p for p in names if _hot_pages(p) and files[p]]
    early = early_ranges(hot)
    for p, off, n in early:
        ranges.extend(_split(p, off, n, chunk))
        covered.setdefault(p, []).append((off, off + n))
    hot_rest: list[Range] = []
    for p in hot:
        hot_rest.extend(_gaps(p, files[p], covered.get(p, []), chunk))
        covered[p] = [(0, files[p])]
    # the rest of the child after the profile's ranges: with the packed handles kept it is 1.2 GB that
    # only the canary's forward pass reads, and the libraries' and the weights' ranges before it are
    # needed sooner (cold bench restore with host warming: 2.03 s against 2.84 with it before them,
    # results/spot-checks/hot-first)
    if not early:
        ranges.extend(hot_rest)
    lead = len(ranges)
    profile_used = False
    if profile is not None:
        from coldstart.warm.profile import load_profile

        try:
            prof = load_profile(profile)
        except Exception as e:  # noqa: BLE001 - any bad profile means: warm without it
            errors[Path(profile)] = f"profile ignored: {e}"
        else:
            for path, off, length in prof.resolve(_profile_root(Path(profile), files), files, remap):
                if _hot_pages(path):
                    continue
                ranges.extend(_split(path, off, length, chunk))
                covered.setdefault(path, []).append((off, off + length))
            profile_used = len(ranges) > lead
            # the weights last within the profile: a first restore's warmer and loader read them
            # before the restored server had faulted in most of its pages, and the recorder saw that
            # order; a restore needs them only at its wake, after those pages (sort is stable)
            ranges.sort(key=lambda r: r.path.suffix == ".flat")
    if early:
        ranges.extend(hot_rest)
    profile_end = len(ranges)
    for p in names:
        if p not in only:
            ranges.extend(_gaps(p, files[p], covered.get(p, []), chunk))
    return Plan(ranges=ranges, files=files, errors=errors, profile_used=profile_used, profile_end=profile_end,
                mapped=[p for p in files if p in only])


def early_ranges(hot: list[Path]) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of the hot layout's child pages images ``hot`` that a restore touches
    before its canary's forward pass, as the checkpoint recorded them (the snapshot's manifest,
    ``layout.early``; criu.layout.early_ranges reads it), in file order. With the bench model's
    packed GEMM handles kept, the child is 1.3 GB, and what CRIU and the wake need (~100 MB) lies
    spread through it, between handles that only the forward pass reads. make_plan reads these
    first, the profile's ranges next, the rest of the child after them. Empty without a record
    (older snapshots) or with criu.layout.HOT_FIRST_ENV=0."""
    import json

    from coldstart.criu import layout

    out: list[tuple[Path, int, int]] = []
    for images in dict.fromkeys(p.parent for p in hot):
        try:
            early = (json.loads((images.parent / "manifest.json").read_text()).get("layout") or {}).get("early")
        except (OSError, ValueError, AttributeError):
            continue
        out += [r for r in layout.early_ranges(images, early) if r[0] in hot]
    return out


def _gaps(p: Path, size: int, covered: list[tuple[int, int]], chunk: int) -> list[Range]:
    """The ranges of ``p`` (``size`` bytes) that ``covered`` leaves out, in file order, in chunks."""
    out: list[Range] = []
    pos = 0
    for a, b in _merge(covered):
        if a > pos:
            out.extend(_split(p, pos, a - pos, chunk))
        pos = max(pos, b)
    if pos < size:
        out.extend(_split(p, pos, size - pos, chunk))
    return out


def _hot_pages(p: Path) -> bool:
    """A CRIU pages image in the hot layout (a child image: its directory has parent/)."""
    return p.name.startswith("pages-") and p.name.endswith(".img") and (p.parent / "parent").is_dir()


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class BaseWarmer:
    """Bookkeeping shared by the warmers: plan, stats, issued order, cancel flag, progress."""

    mode = "base"

    def __init__(self, paths: list[Path] | list[str], *, chunk: int, profile: Path | None = None,
                 order: list[Path] | None = None, progress: ProgressFn | None = None,
                 profile_only: list[Path] | None = None, rest: str = "now",
                 remap: Callable[[Path], Path] | None = None, gate: threading.Event | None = None):
        if rest not in ("now", "after", "never"):
            raise ValueError(f"rest={rest!r}: now | after | never")
        self.plan = make_plan(paths, chunk=chunk, profile=profile, order=order, profile_only=profile_only,
                              remap=remap)
        self.progress = progress
        self._cancel = threading.Event()
        self._gate = gate
        # with a profile, what it does not name can wait: "after" = until release() (first token),
        # "never" = not warmed at all. Unneeded bytes read during the restore compete for the disk.
        self.rest = rest if self.plan.profile_used else "now"
        self._released = threading.Event()
        if self.rest == "never":
            self.plan.ranges = self.plan.ranges[:self.plan.profile_end]
        self._held_back = self.rest == "after"
        if not self._held_back:
            self._released.set()
        self._lock = threading.Lock()
        self._issued: list[Range] = []
        self._t0 = 0.0
        self._t1: float | None = None
        self.stats = WarmStats(mode=self.mode, planned=self.plan.total, profile_used=self.plan.profile_used)
        for p, size in self.plan.files.items():
            self.stats.per_file[str(p)] = FileStats(path=str(p), size=size)
        for p, why in self.plan.errors.items():
            self._error(p, why)

    def _error(self, path: Path, why: str) -> None:
        """Record a file's failure once; the other files carry on."""
        with self._lock:
            fs = self.stats.per_file.setdefault(str(path), FileStats(path=str(path)))
            if fs.error is None:
                fs.error = why
                self.stats.errors.append(why)
                log.warning("warm: %s", why)

    def _done_range(self, r: Range, n: int) -> None:
        with self._lock:
            self.stats.bytes += n
            self.stats.per_file[str(r.path)].bytes += n
            done, total = self.stats.bytes, self.stats.planned
        if self.progress is not None:
            self.progress(done, total)

    def _finish(self) -> None:
        self._t1 = time.monotonic()
        self.stats.seconds = round(self._t1 - self._t0, 6)
        self.stats.finished = True
        self.stats.cancelled = self._cancel.is_set()

    def issued(self) -> list[Range]:
        """Ranges handed to a reader so far, in issue order (what a profile test checks)."""
        with self._lock:
            return list(self._issued)

    def release(self) -> None:
        """The restore is through (first token): the ranges held back by ``rest="after"`` may go."""
        self._released.set()

    def _await_gate(self) -> bool:
        """Readers hold their first read until ``gate`` opens (or cancel()); the plan is made at once.
        A host warming for a container waits for docker's start call: runc, the shim and
        docker-proxy are read cold from the host's disk, one small read after another, and each
        waited behind the warmer's queue (the start call took 1.3-2.5 s instead of 0.3-0.5 s)."""
        if self._gate is None:
            return True
        while not self._gate.wait(0.02):
            if self._cancel.is_set():
                return False
        return not self._cancel.is_set()

    def _may_take(self, index: int) -> bool:
        """Block a reader at the start of the held-back rest until release() or cancel(); the rest
        is then read at the lowest CPU priority (``background_priority``)."""
        if index < self.plan.profile_end:
            return True
        if self._held_back:
            while not self._released.wait(0.05):
                if self._cancel.is_set():
                    return False
            background_priority()
        return not self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()

    def __enter__(self):
        return self.start()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.cancel()
        self.wait()  # type: ignore[attr-defined]


class NullWarmer(BaseWarmer):
    """mode="none": the baseline of the benchmarks (restore reads straight from the device)."""

    mode = "none"

    def __init__(self, paths: list[Path] | list[str] = (), **_: object):
        super().__init__([], chunk=MiB)

    def start(self) -> "NullWarmer":
        self._t0 = time.monotonic()
        self._finish()
        return self

    def wait(self, timeout: float | None = None) -> WarmStats:
        return self.stats

    @property
    def done(self) -> bool:
        return True


_prio = threading.local()


def background_priority() -> None:
    """Lower the calling thread (only it: Linux nice values are per thread; threads it starts
    inherit it) to the lowest CPU priority: warming after the first token must not slow the
    server's first requests (on 2 cores it took a second from the first completion)."""
    if getattr(_prio, "low", False):
        return
    _prio.low = True
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass


IO_CLASSES = ("idle", "be")


def io_class(default: str = "idle") -> str:
    """The I/O class warming reads run in: $COLDSTART_WARM_IOPRIO (idle | be), else ``default``."""
    c = os.environ.get("COLDSTART_WARM_IOPRIO", default)
    return c if c in IO_CLASSES else default


def background_io(cls: str = "idle") -> bool:
    """Put the calling thread's reads (and those of the processes it starts) in the idle I/O class
    (``cls`` "idle"; "be" leaves them as they are): a scheduler that honours classes (mq-deadline,
    bfq) dispatches everyone else's reads first. Warming is prefetch and must not delay the reads
    it is there to serve: with mq-deadline on a disk marked rotational, a restore's 4 KiB read
    waited up to its 500 ms read_expire behind 8 x 8 MiB of warming sorted by sector. Changes
    nothing where the scheduler ignores classes (none, the usual NVMe setting). False: refused."""
    if cls != "idle":
        return False
    import psutil

    try:
        psutil.Process(threading.get_native_id()).ionice(psutil.IOPRIO_CLASS_IDLE)
        return True
    except (OSError, psutil.Error):
        return False
