"""Access profiles: the order in which a restore first needs the snapshot's byte ranges.

Recorded during one restore, saved as ``profile.json`` next to the manifest, followed by the next
warm (profile ranges first, then the rest in the default order).

How the order is observed (two signals, sampled every ``interval`` seconds):
1. Page tables (``/proc/PID/maps`` + ``/proc/PID/pagemap``) of every process that maps a snapshot
   file. With the mmap restore the restored server maps ``pages-*.img``; a page present in its page
   tables was touched by it. This signal is independent of the page cache, so warming running at
   the same time does not blur it. The kernel answers the runs of present pages (PAGEMAP_SCAN,
   residency.PresentScan): a restored vLLM tree maps gigabytes in thousands of mappings.
   (fanotify FAN_ACCESS carries no offsets; pre-content events need an HSM-enabled filesystem;
   blktrace sees device sectors, not file offsets, and misses cache hits.)
2. Page cache (mincore) for files read with read()/pread() (the weights loader): a range that
   becomes resident *before the concurrent warmer issued it* was demanded by the restore ahead of
   the warmer: exactly what the next warm must fetch earlier. Ranges resident when recording starts
   are not attributed (their order is unknown) and stay in the default order.

Mapped files (``track_mapped``): the restored processes also fault in the files they map that are
not part of the snapshot (the venv's shared libraries: torch, vLLM's _C, libpython...). After a
cold node start those come from the disk too, 4-128 KiB per fault. The recorder follows the
restored tree's other file-backed mappings with the page-table signal and records their touched
ranges under their absolute paths; the next warm reads those ranges (and only those: the files
are gigabytes, the restore touches tens of MiB of them) in the recorded order.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from stat import S_ISREG
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from coldstart.warm._numpy import np

from coldstart.errors import ColdstartError
from coldstart.warm.base import Range
from coldstart.warm.residency import PAGE, PresentScan, _mincore_fd, expand_paths
from coldstart.warm.where import PROFILE_NAME  # noqa: F401 (re-exported: its callers import it from here)

PROFILE_VERSION = 1
MERGE_GAP = 256 * 1024  # runs closer than this in one sample become one range (readahead-sized)


@dataclass
class ProfileRange:
    file: str  # path relative to the profile's directory
    offset: int
    length: int
    t: float  # seconds since recording started when first seen
    source: str  # "pagemap" | "pagecache"


@dataclass
class Profile:
    version: int = PROFILE_VERSION
    snapshot_id: str = ""
    created_at: str = ""
    files: dict[str, int] = field(default_factory=dict)  # relative path -> size at recording
    ranges: list[ProfileRange] = field(default_factory=list)  # in first-needed order
    meta: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(r.length for r in self.ranges)

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: Path) -> Path:
        """Atomic write (fsutil.write_atomic): a crash never leaves half a profile, and replicas
        recording at once on a new node each write their own temporary file."""
        from coldstart.fsutil import write_atomic

        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1))
        return Path(path)

    def mapped_files(self) -> list[Path]:
        """Files outside the snapshot the restored processes mapped (absolute paths in ``files``)."""
        return [Path(f) for f in self.files if os.path.isabs(f)]

    def resolve(self, root: Path, files: dict[Path, int],
                remap: "Callable[[Path], Path] | None" = None) -> list[tuple[Path, int, int]]:
        """The profile's ranges as (absolute path, offset, length) for the files being warmed whose
        size still matches the recording (a changed file's ranges would be noise). ``remap``: where
        a file recorded under an absolute path is seen from here (a container's file, from the host)."""
        out = []
        for r in self.ranges:
            p = (root / r.file).absolute()
            if remap is not None and os.path.isabs(r.file):
                p = remap(p)
            size = files.get(p)
            if size is None or self.files.get(r.file) != size:
                continue
            end = min(r.offset + r.length, size)
            if end > r.offset:
                out.append((p, r.offset, end - r.offset))
        return out


def load_profile(path: Path) -> Profile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ColdstartError(f"{path}: no such profile") from None
    except (OSError, ValueError) as e:
        raise ColdstartError(f"{path}: unreadable profile ({e})") from None
    if not isinstance(raw, dict) or raw.get("version") != PROFILE_VERSION:
        raise ColdstartError(f"{path}: profile version {raw.get('version') if isinstance(raw, dict) else '?'}"
                             f" is not {PROFILE_VERSION}")
    try:
        ranges = [ProfileRange(**r) for r in raw.get("ranges", [])]
        bad = next((r for r in ranges if not (isinstance(r.file, str) and r.file and _whole(r.offset) and r.offset >= 0
                                              and _whole(r.length) and r.length > 0)), None)
        if bad is not None:  # (resolve and the readers take these as they are)
            raise ValueError(f"range {bad.file!r} at {bad.offset!r}, length {bad.length!r}")
        files, meta = raw.get("files", {}), raw.get("meta", {})
        if not isinstance(files, dict) or not isinstance(meta, dict):
            raise ValueError("files and meta must be objects")
        return Profile(version=raw["version"], snapshot_id=str(raw.get("snapshot_id", "")),
                       created_at=str(raw.get("created_at", "")),
                       files={str(k): int(v) for k, v in files.items()}, ranges=ranges, meta=dict(meta))
    except (TypeError, ValueError, KeyError) as e:
        raise ColdstartError(f"{path}: malformed profile ({e})") from None


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) page runs of True in a bool vector, merging gaps under MERGE_GAP."""
    if not mask.any():
        return []
    idx = np.flatnonzero(mask)
    gap = max(1, MERGE_GAP // PAGE)
    breaks = np.flatnonzero(np.diff(idx) > gap)
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist()))



class _Vmas:
    """One process's mappings of the watched files, as parsed from its /proc/PID/maps ``text``:
    (start, end, file offset, path) sorted by address, and as arrays for PresentScan's runs."""

    def __init__(self, text: str, vmas: list[tuple[int, int, int, Path]], mapped: set[Path]):
        self.text = text
        self.vmas = vmas
        self.mapped = mapped  # (the recorder's set: files outside the snapshot)
        self.paths = list(dict.fromkeys(v[3] for v in vmas))
        self._arrays: dict[bool, tuple[np.ndarray, ...]] = {}
        self.seen: dict[bool, np.ndarray] = {}  # the present runs at the last scan (keys), per ``full``

    def arrays(self, full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, first file page, index in ``paths``) of the mappings (``full`` False: the
        snapshot's only), int64, by address."""
        got = self._arrays.get(full)
        if got is None:
            pos = {p: i for i, p in enumerate(self.paths)}
            sel = [v for v in self.vmas if full or v[3] not in self.mapped]
            got = self._arrays[full] = (
                np.array([v[0] for v in sel], dtype=np.int64), np.array([v[1] for v in sel], dtype=np.int64),
                np.array([v[2] // PAGE for v in sel], dtype=np.int64), np.array([pos[v[3]] for v in sel], dtype=np.int64))
        return got


class ProfileRecorder:
    """Records which ranges of ``paths`` a restore needs first, and when.

    ``warmer``: the warmer running concurrently (its issued ranges are not demand, see above).
    ``others``: files another reader reads whole from the moment they are appended to this list
    (the restore's digest check, on a new node: the restore that records): their page-cache signal
    from then on is not demand either. Unheeded, the check's reads put the 1.3 GB weights file of
    the bench model before the restored tree's own pages in the profile, and the next replica's
    warming read it first.
    ``pids``: processes whose page tables to watch; None = any process started after ``start()``
    that maps the files (the restored tree).
    ``use_pagecache`` False: the page tables only, for a restore whose snapshot another reader warms
    (a container's host): the page cache would show that reader's order, not the restore's."""

    def __init__(self, paths: list[Path] | list[str], *, root: Path | None = None, interval: float = 0.02,
                 warmer=None, pids: list[int] | None = None, snapshot_id: str = "",
                 use_pagemap: bool = True, track_mapped: bool = False, trim: bool = True,
                 old_pids: set[int] | None = None, others: list[Path] | None = None,
                 use_pagecache: bool = True):
        self.paths = [p for p in expand_paths(list(paths)) if p.is_file()]
        self.root = Path(root).absolute() if root else Path(os.path.commonpath([str(p.parent) for p in self.paths])) if self.paths else Path.cwd()
        self.interval = interval
        self.warmer = warmer
        self.pids = pids
        # processes that are not the restored tree: those alive when the restore began (the caller's
        # list; else those alive at start(): a recorder started after CRIU had forked the restored
        # tasks took them for old ones and recorded neither their page faults nor their libraries)
        self._given_old = old_pids
        self.snapshot_id = snapshot_id
        self.use_pagemap = use_pagemap
        self.use_pagecache = use_pagecache or not use_pagemap
        self.track_mapped = track_mapped and use_pagemap
        self.trim = trim and use_pagemap
        self.mapped: set[Path] = set()  # files outside the snapshot the restored tree maps (track_mapped)
        self._not_mapped: set[str] = set()  # paths looked at and refused (not regular, vanished)
        self._mapped_by_name: dict[str, Path] = {}
        self._touched: dict[Path, np.ndarray] = {}  # snapshot pages present in the tree's page tables
        self._vma_cover: dict[Path, np.ndarray] = {}  # snapshot pages inside the tree's mappings
        self.sizes: dict[Path, int] = {}
        self.inodes: dict[tuple[int, int], Path] = {}
        for p in self.paths:
            st = p.stat()
            self.sizes[p] = st.st_size
            self.inodes[(st.st_dev, st.st_ino)] = p
        self._pc_all: set[Path] = set()  # files all resident (at the start or since): not sampled again
        self._pc_seen: dict[Path, np.ndarray] = {}  # page cache: resident at some sample (or at start)
        self._recorded: dict[Path, np.ndarray] = {}  # pages already in the profile (either signal)
        self._issued_mask: dict[Path, np.ndarray] = {}
        self._issued_n = 0
        self._others = others if others is not None else []
        self._others_n = 0
        self._ranges: list[ProfileRange] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._samples = 0
        self._samples_done = 0
        self._cpu = 0.0  # the sampling thread's CPU time: what recording costs a restore beside it
        self._scan_errors: dict[str, int] = {}  # PAGEMAP_SCAN's failures by errno (meta: said, not hidden)
        self._cond = threading.Condition()
        self._baseline = 0
        self._maps: dict[int, _Vmas] = {}
        self._names: dict[str, Path] = {}
        self._lines: dict[str, tuple[int, int, int, Path] | None] = {}  # a maps line -> its watched mapping
        self._scan: PresentScan | None = PresentScan() if use_pagemap else None
        self._maps_at = -1.0
        self._old_pids: set[int] = set()
        self._old_mappers: set[int] = set()

    # -- signals
    def _npages(self, p: Path) -> int:
        return (self.sizes[p] + PAGE - 1) // PAGE

    def _pagecache(self, p: Path) -> np.ndarray:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _mincore_fd(fd, 0, self.sizes[p]) if self.sizes[p] else np.zeros(0, bool)
        finally:
            os.close(fd)

    def _refresh_maps(self) -> None:
        """Which processes map which part of which snapshot file (re-read 5 times a second, and at
        the final sample: see stop(); parsed again only where a process's maps changed: a restored
        vLLM process has ~3000 mappings).

        Only processes born after recording started are scanned (the restored tree is): reading
        every /proc/PID/maps of a busy host costs ~0.3 s of CPU, next to nothing for a few pids."""
        now = time.monotonic()
        if now - self._maps_at < 0.2:
            return
        self._maps_at = now
        if self.pids is not None:
            pids = list(self.pids)
        else:
            pids = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in self._old_pids]
            pids += list(self._old_mappers)
        me = os.getpid()
        maps: dict[int, _Vmas] = {}
        for pid in pids:
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/maps") as f:
                    text = f.read()
            except OSError:
                continue
            old = self._maps.get(pid)
            vm = old if old is not None and old.text == text else self._parse_maps(text)
            if vm is not None:
                maps[pid] = vm
        self._maps = maps

    def _parse_maps(self, text: str) -> "_Vmas | None":
        """One process's mappings of the watched files (None: it maps none of the snapshot's): the
        snapshot's own and (track_mapped) its other regular files, in address order. Each line is
        parsed once (``_lines``): a restored tree's maps change while it wakes, a few lines at a time.
        Another process's files (CRIU's own, a helper's) are not followed: only the tree's are."""
        if not self._names:
            self._names = {str(p): p for p in self.paths}
            self._names.update({str(p.resolve()): p for p in self.paths})  # /proc/PID/maps shows real paths
        vmas: list[tuple[int, int, int, Path]] = []
        others: list[tuple[int, int, int, str]] = []
        for line in text.splitlines():
            if "/" not in line:
                continue  # anonymous
            v = self._lines.get(line, False)
            if v is False:
                v = self._lines[line] = self._parse_line(line)
            if v is not None:
                (others if isinstance(v[3], str) else vmas).append(v)
        if not vmas:
            return None
        if others:
            for start, end, off, name in others:
                path = self._add_mapped(name)
                if path is not None:
                    vmas.append((start, end, off, path))
            vmas.sort(key=lambda v: v[0])
        return _Vmas(text, vmas, self.mapped)

    def _parse_line(self, line: str) -> tuple[int, int, int, Path | str] | None:
        """A maps line as (start, end, file offset, snapshot file), or with the name (a str) of
        another file (track_mapped), or None. Marks the snapshot pages a mapping covers
        (_vma_cover: the trim's "inside the tree's mappings")."""
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            return None
        a, _, b = parts[0].partition("-")
        start, end, off = int(a, 16), int(b, 16), int(parts[2], 16)
        path = self._names.get(parts[5].removesuffix(" (deleted)"))
        if path is not None:
            first, total = off // PAGE, self._npages(path)
            if first < total:
                cover = self._vma_cover.get(path)
                if cover is None:
                    cover = self._vma_cover[path] = np.zeros(total, dtype=bool)
                cover[first:first + min((end - start) // PAGE, total - first)] = True
            return start, end, off, path
        return (start, end, off, parts[5]) if self.track_mapped else None

    def _add_mapped(self, name: str) -> Path | None:
        """Start following a file the restored tree maps (outside the snapshot), or None to skip it:
        deleted files, device/memfd/shm mappings, anything not a regular file, and the snapshot's own
        files that are not warmed (the hot layout's parent pages images: mapped lazily)."""
        p = self._mapped_by_name.get(name)
        if p is not None:
            return p
        if name in self._not_mapped:
            return None
        ok = not (name.endswith(" (deleted)") or name.startswith(("/dev/", "/proc/", "/sys/", "/memfd:")))
        path = Path(name)
        try:
            st = path.stat() if ok else None
        except OSError:
            st = None
        if st is None or not S_ISREG(st.st_mode) or st.st_size == 0 or path in self.sizes \
                or name.startswith(f"{self.root}/"):
            self._not_mapped.add(name)
            return None
        self.sizes[path] = st.st_size
        self._recorded[path] = np.zeros(self._npages(path), dtype=bool)
        self.mapped.add(path)
        self._mapped_by_name[name] = path
        return path

    def _scan_old(self) -> None:
        targets = {str(p) for p in self.paths} | {str(p.resolve()) for p in self.paths}
        for pid in sorted(self._old_pids):
            if self._stop.is_set():
                return
            try:
                with open(f"/proc/{pid}/maps") as f:
                    if any(line.rstrip("\n").removesuffix(" (deleted)").split(maxsplit=5)[-1] in targets
                           for line in f if "/" in line):
                        self._old_mappers.add(pid)
                        self._maps_at = -1.0  # pick it up at the next sample
            except OSError:
                continue

    def _pagemap(self, full: bool = True) -> dict[Path, np.ndarray]:
        """Pages present in the watched processes' page tables, per file. ``full`` False skips the
        mapped files outside the snapshot. By PAGEMAP_SCAN where the kernel has it (residency.PresentScan:
        the runs only), else by reading pagemap (8 bytes per mapped page)."""
        out: dict[Path, np.ndarray] = {}
        self._refresh_maps()
        for pid, vm in self._maps.items():
            try:
                fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if self._scan is not None:
                    try:
                        self._scan_present(fd, vm, full, out)
                        continue
                    except OSError as e:  # counted (meta scan_errors), then this sample reads pagemap
                        name = errno.errorcode.get(e.errno, str(e.errno))
                        self._scan_errors[name] = self._scan_errors.get(name, 0) + 1
                        if e.errno == errno.ENOTTY:
                            self._scan = None  # a kernel without it: read pagemap from now on
                self._read_present(fd, vm, full, out)
            finally:
                os.close(fd)
        for path, mask in out.items():
            if path not in self.mapped:
                self._touched.setdefault(path, np.zeros(len(mask), dtype=bool))[:] |= mask
        # the snapshot's files before the libraries: within one sample that is the profile's order
        return dict(sorted(out.items(), key=lambda kv: kv[0] in self.mapped))

    def _scan_present(self, fd: int, vm: "_Vmas", full: bool, out: dict[Path, np.ndarray]) -> None:
        """``_pagemap`` for one process by PAGEMAP_SCAN: one call over its watched span, the runs
        cut at the watched mappings' bounds and turned into file pages (vectorised)."""
        vs, ve, vpg, vfile = vm.arrays(full)
        if not len(vs):
            return
        r = self._scan.regions(fd, int(vs[0]), int(ve[-1])).astype(np.int64)
        # only the runs that were not there at this process's last sample (the same maps): the
        # rest is recorded already. (start, end) as one complex key: exact below 2**53.
        key = r[:, 0].astype(np.float64) + 1j * r[:, 1].astype(np.float64)
        prev = vm.seen.get(full)
        vm.seen[full] = key
        if prev is not None:
            r = r[~np.isin(key, prev)]
        if not len(r):
            return
        rs, re_ = r[:, 0], r[:, 1]
        i0 = np.searchsorted(ve, rs, side="right")  # the first mapping ending after the run starts
        i1 = np.searchsorted(vs, re_, side="left")  # past the last one starting before it ends
        cnt = np.maximum(i1 - i0, 0)
        if not cnt.any():
            return
        run = np.repeat(np.arange(len(rs)), cnt)
        idx = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(i0, cnt)
        a = np.maximum(rs[run], vs[idx])
        b = np.minimum(re_[run], ve[idx])
        fa = vpg[idx] + (a - vs[idx]) // PAGE
        fb = fa + (b - a) // PAGE
        order = np.argsort(vfile[idx], kind="stable")
        files, fa, fb = vfile[idx][order], fa[order], fb[order]
        cuts = np.flatnonzero(np.diff(files)) + 1
        for x0, x1 in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(files)])).tolist()):
            path = vm.paths[int(files[x0])]
            total = self._npages(path)
            lo, hi = np.minimum(fa[x0:x1], total), np.minimum(fb[x0:x1], total)
            mask = out.get(path)
            if mask is None:
                mask = out[path] = np.zeros(total, dtype=bool)
            if len(lo) <= 64:
                for x, y in zip(lo.tolist(), hi.tolist()):
                    mask[x:y] = True
            else:  # a difference array: +1 at each run's start, -1 at its end
                d = np.zeros(total + 1, dtype=np.int32)
                np.add.at(d, lo, 1)
                np.add.at(d, hi, -1)
                mask |= np.cumsum(d[:-1]) > 0

    def _read_present(self, fd: int, vm: "_Vmas", full: bool, out: dict[Path, np.ndarray]) -> None:
        """``_pagemap`` for one process by reading its pagemap, mapping by mapping."""
        for start, end, off, path in vm.vmas:
            if not full and path in vm.mapped:
                continue
            first, total = off // PAGE, self._npages(path)
            if first >= total:
                continue
            try:
                raw = os.pread(fd, (end - start) // PAGE * 8, (start // PAGE) * 8)
            except OSError:
                continue
            ent = np.frombuffer(raw, dtype=np.uint64)
            present = (ent >> np.uint64(63)) | ((ent >> np.uint64(62)) & np.uint64(1))
            k = min(len(ent), total - first)
            mask = out.get(path)
            if mask is None:
                mask = out[path] = np.zeros(total, dtype=bool)
            mask[first:first + k] |= present[:k].astype(bool)

    def _update_issued(self) -> None:
        others = self._others[self._others_n:]  # (appended from another thread: take a copy once)
        self._others_n += len(others)
        for p in map(lambda q: Path(q).absolute(), others):
            if p in self.sizes:
                self._issued_mask[p] = np.ones(self._npages(p), dtype=bool)
        if self.warmer is None:
            return
        issued = self.warmer.issued()
        for r in issued[self._issued_n:]:
            if r.path not in self.sizes:
                continue
            m = self._issued_mask.setdefault(r.path, np.zeros(self._npages(r.path), dtype=bool))
            m[r.offset // PAGE:(r.offset + r.length + PAGE - 1) // PAGE] = True
        self._issued_n = len(issued)

    # -- sampling
    def _sample(self, final: bool = False) -> None:
        t = round(time.monotonic() - self._t0, 4)
        self._samples += 1
        self._update_issued()  # before mincore: a range issued now may become resident in this sample
        new_by_source: list[tuple[str, Path, np.ndarray]] = []
        if self.use_pagemap:
            for p, mask in self._pagemap(full=final or self._samples % 4 == 1).items():
                new_by_source.append(("pagemap", p, mask))
        for p in self.paths if self.use_pagecache else ():
            if p in self._pc_all:
                continue  # every page already resident: nothing new can show here
            try:
                res = self._pagecache(p)
            except OSError:
                continue
            issued = self._issued_mask.get(p)
            if issued is not None:
                res = res & ~issued
            new_by_source.append(("pagecache", p, res))
        for source, p, mask in new_by_source:
            if source == "pagecache":  # only pages that were not resident before count
                fresh = mask & ~self._pc_seen[p]
                self._pc_seen[p] |= mask
                if self._pc_seen[p].all():
                    self._pc_all.add(p)
                mask = fresh
            recorded = self._recorded[p]
            new = mask & ~recorded
            if not new.any():
                continue
            recorded |= new
            for a, b in _runs(new):
                off = a * PAGE
                length = min(b * PAGE, self.sizes[p]) - off
                self._ranges.append(ProfileRange(file=self._name(p), offset=off, length=length, t=t,
                                                 source=source))

    def _name(self, p: Path) -> str:
        """Snapshot files relative to the profile's directory (the snapshot moves with it); mapped
        files outside it by absolute path (they are where the image says they are)."""
        return str(p) if p in self.mapped else os.path.relpath(p, self.root)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            c0 = time.thread_time()
            self._sample()
            self._cpu += time.thread_time() - c0
            with self._cond:
                self._samples_done += 1
                self._cond.notify_all()

    def sync(self, timeout: float | None = 10.0) -> None:
        """Return once a sample that started after this call has completed: what happened before
        the call is then ordered before anything after it (accesses within one sample are not)."""
        with self._cond:
            target = self._samples_done + 2
            self._cond.wait_for(lambda: self._samples_done >= target or self._stop.is_set(), timeout)

    def recorded(self, path: Path | str, offset: int) -> bool:
        """Whether the page at ``offset`` of ``path`` is in the profile yet (a caller that must
        order its steps waits for this: a page touched before the tree's mappings are re-read is
        first seen in the same sample as the next one, and a sample orders its pages by offset)."""
        mask = self._recorded.get(Path(path).absolute())
        return bool(mask is not None and offset // PAGE < len(mask) and mask[offset // PAGE])

    def start(self) -> "ProfileRecorder":
        self._t0 = time.monotonic()
        self._old_pids = (set(self._given_old) if self._given_old is not None
                          else {int(d) for d in os.listdir("/proc") if d.isdigit()})
        if self.pids is None:  # processes that mapped the files before we started: one slow scan, aside
            threading.Thread(target=self._scan_old, name="coldstart-profile-scan", daemon=True).start()
        for p in self.paths:  # baseline: already-resident pages have no known order
            self._recorded[p] = np.zeros(self._npages(p), dtype=bool)
            if not self.use_pagecache:
                continue  # (page tables only: no mincore of gigabytes here)
            try:
                base = self._pagecache(p)
            except OSError:
                base = np.zeros(self._npages(p), dtype=bool)
            self._baseline += int(base.sum()) * PAGE
            self._pc_seen[p] = base.copy()
            if len(base) and base.all():
                self._pc_all.add(p)
        self._thread = threading.Thread(target=self._run, name="coldstart-profile", daemon=True)
        self._thread.start()
        return self

    def _trim(self, ranges: list[ProfileRange]) -> tuple[list[ProfileRange], int]:
        """Drop the page-cache ranges of a snapshot file that lie inside the restored tree's mappings
        of it but were never present in its page tables: the kernel's read-around of a page fault
        (up to read_ahead_kb, 8 MiB here, per fault) read them, nothing used them. What CRIU copied
        (outside the mappings) and what the processes touched stay."""
        out: list[ProfileRange] = []
        dropped = 0
        by_name = {self._name(p): p for p in self._vma_cover}
        for r in ranges:
            p = by_name.get(r.file)
            if r.source != "pagecache" or p is None:
                out.append(r)
                continue
            a, b = r.offset // PAGE, (r.offset + r.length + PAGE - 1) // PAGE
            touched = self._touched.get(p)  # (none: mapped, never present in any sample)
            keep = ~self._vma_cover[p][a:b] | (touched[a:b] if touched is not None else False)
            dropped += int((~keep).sum()) * PAGE
            for x, y in _runs(keep):
                off = (a + x) * PAGE
                out.append(ProfileRange(file=r.file, offset=off, length=min((a + y) * PAGE, self.sizes[p]) - off,
                                        t=r.t, source=r.source))
        return out, dropped

    def stop(self) -> Profile:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # the maps read again: a small model's restore ends ~0.2 s after recording starts, and its
        # last mappings would be younger than the last refresh
        self._maps_at = -1.0
        self._sample(final=True)
        ranges, trimmed = self._trim(self._ranges) if self.trim else (list(self._ranges), 0)
        return Profile(
            snapshot_id=self.snapshot_id,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            files={self._name(p): s for p, s in self.sizes.items()},
            ranges=ranges,
            meta={"interval_s": self.interval, "samples": self._samples, "baseline_resident_bytes": self._baseline,
                  "seconds": round(time.monotonic() - self._t0, 3), "cpu_s": round(self._cpu, 3),
                  "scan_errors": dict(self._scan_errors), "processes": len(self._maps),
                  "signals": ["pagemap"] * self.use_pagemap + ["pagecache"] * self.use_pagecache, "page_size": PAGE,
                  "mapped_files": len(self.mapped), "readaround_trimmed_bytes": trimmed,
                  "mapped_bytes": sum(r.length for r in self._ranges if os.path.isabs(r.file))},
        )

    def __enter__(self) -> "ProfileRecorder":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()


def profile_from_ranges(root: Path, ranges: list[Range], snapshot_id: str = "") -> Profile:
    """A profile from an explicit list of ranges (e.g. the loader's own read order)."""
    root = Path(root).absolute()
    files = {os.path.relpath(r.path, root): Path(r.path).stat().st_size for r in ranges}
    return Profile(snapshot_id=snapshot_id, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   files=files, ranges=[ProfileRange(file=os.path.relpath(r.path, root), offset=r.offset,
                                                     length=r.length, t=float(i), source="explicit")
                                        for i, r in enumerate(ranges)], meta={})


def own_files_ranges() -> tuple[list[ProfileRange], dict[str, int]]:
    """Whole-file ranges (t=0, source "process") for what this process itself read to get here: its
    Python modules (sources and bytecode) and the files it maps (libpython, extension modules). A
    restore's entrypoint reads them before anything else, one small read at a time: after a cold
    start they are seconds of latency that a warmer outside the container can take off. Absolute
    paths, like the restored server's mapped files. Recorded in containers only
    (COLDSTART_IN_CONTAINER, the image's environment): on a host nobody warms them ahead.
    numpy's modules and the libraries its import mapped (warm._numpy.MAPPED) are left out: the
    recording restore loads them for its warmer, a restore warmed from its host only after its
    first token; read first, they were 44 MB of 100 ahead of the snapshot pages CRIU waits for."""
    import sys

    from coldstart.warm import _numpy

    seen: dict[str, int] = {}
    names: list[str] = []
    for name, m in list(sys.modules.items()):
        if name == "numpy" or name.startswith("numpy."):
            continue
        spec = getattr(m, "__spec__", None)
        for f in (getattr(m, "__file__", None), getattr(spec, "cached", None) if spec else None):
            if f:
                names.append(f)
    names += _numpy.mapped_files()
    out: list[ProfileRange] = []
    for f in names:
        if not f.startswith("/") or f in seen or f in _numpy.MAPPED:
            continue
        try:
            st = os.stat(f)
        except OSError:
            continue
        if not S_ISREG(st.st_mode) or st.st_size == 0:
            continue
        seen[f] = st.st_size
        out.append(ProfileRange(file=f, offset=0, length=st.st_size, t=0.0, source="process"))
    return out, seen
