"""The native warmer: threads pulling a snapshot into the page cache in a chosen order.

Methods:
- ``sendfile`` (default): each thread sends its chunk to /dev/null with sendfile(2). The kernel
  reads the chunk into the page cache and hands its pages to /dev/null, which drops them: the read
  waits for the data like ``pread`` (completion known, so the in-flight amount is exactly
  ``threads x chunk`` and the issue order is the read order) but copies nothing to user space. On
  the 2-core AVX-512 VM, 1.25 GiB read cold cost 0.05-0.06 s of CPU this way against 0.31-2.5 s
  with ``pread``, CPU the restore needs (results/spot-checks/warm-read-cpu). A kernel that refuses
  (EINVAL, ENOSYS) gets ``pread`` instead.
- ``pread``: each thread reads its chunk into a private buffer.
- ``populate``: each thread maps its chunk and asks MADV_POPULATE_READ for it: waits for the
  data like ``pread`` (bounded in flight, issue order = arrival order) without the copy to user
  space, which on a 2-core host is CPU the restore needs.
- ``willneed``: one thread issues posix_fadvise(WILLNEED) per chunk (no copy, the kernel reads
  asynchronously) and keeps at most ``max_inflight`` bytes ahead of what mincore says is resident;
  a chunk whose residency stops growing (advice clamped or dropped) is read with pread instead.

Cancellation is checked between chunks, so readers stop within one chunk (default 8 MiB).

Readers run in the idle I/O class (``io_class``; warm.base.background_io): warming is prefetch, and
the restore's own reads, which it is racing to serve, go first where the scheduler can tell.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from pathlib import Path

from coldstart.fsutil import will_need
from coldstart.warm.base import MiB, BaseWarmer, ProgressFn, Range, WarmStats, background_io
from coldstart.warm.base import io_class as default_io_class
from coldstart.warm.residency import PAGE, _mincore_fd, exact_pipe, populate_fd, read_into_cache

DEFAULT_CHUNK = 8 * MiB  # = read_ahead_kb here; large enough for full-size device requests
DEFAULT_THREADS = 8  # like fast-vllm's 8 vmtouch processes; readers mostly wait on the device
EXACT_RUN = 8 * MiB  # profiled runs shorter than this are read without readahead (= read_ahead_kb here)
METHODS = ("sendfile", "pread", "willneed", "populate")
DEFAULT_METHOD = "sendfile"


def _room_for(descriptors: int) -> None:
    """Raise this process's soft limit on open files towards its hard limit when the warmer will hold
    ``descriptors`` more than it leaves room for: a host warmer's plan names ~1000 image files, and a
    node's shell often starts programs with a soft limit of 1024 (systemd's default, which it asks
    programs that need more to raise themselves). Past the hard limit, opens fail and the files are
    named in the errors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = descriptors + 256  # what the process holds besides
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(hard, want)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, new), hard))
        except (ValueError, OSError):
            pass  # left as it is: the opens that fail are named in the errors


class NativeWarmer(BaseWarmer):
    mode = "native"

    def __init__(self, paths: list[Path] | list[str], *, threads: int = DEFAULT_THREADS,
                 chunk: int = DEFAULT_CHUNK, method: str = DEFAULT_METHOD, max_inflight: int | None = None,
                 profile: Path | None = None, order: list[Path] | None = None,
                 progress: ProgressFn | None = None, profile_only: list[Path] | None = None,
                 rest: str = "now", remap=None, gate: threading.Event | None = None,
                 io_class: str | None = None):
        if method not in METHODS:
            raise ValueError(f"unknown native warming method {method!r} ({'|'.join(METHODS)})")
        super().__init__(paths, chunk=chunk, profile=profile, order=order, progress=progress,
                         profile_only=profile_only, rest=rest, remap=remap, gate=gate)
        self.method = method
        self.io_class = io_class or default_io_class()
        self.chunk = chunk
        self.max_inflight = max_inflight or threads * chunk
        # bounded in-flight: never more reader threads than chunks allowed in flight
        self.threads = max(1, min(threads, self.max_inflight // chunk)) if method != "willneed" else 1
        self._next = 0
        self._fds: dict[Path, int] = {}
        self._rfds: dict[Path, int] = {}  # the same files opened with POSIX_FADV_RANDOM (sendfile)
        self._exact: set[tuple[Path, int]] = set()
        self._workers: list[threading.Thread] = []
        self._failed: set[Path] = set()
        self._reaper: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> "NativeWarmer":
        self._t0 = time.monotonic()
        _room_for(2 * len(self.plan.files))  # every file open, and a second descriptor for short ranges
        for p in self.plan.files:
            try:
                self._fds[p] = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                self._error(p, f"{p}: cannot open for warming: {e.strerror or e}")
                self._failed.add(p)
        if self.method == "sendfile":
            self._exact = self._exact_ranges()
        run = {"sendfile": self._run_sendfile, "pread": self._run_pread, "willneed": self._run_willneed,
               "populate": self._run_populate}[self.method]

        def target() -> None:
            background_io(self.io_class)
            try:
                run()
            except Exception as e:  # noqa: BLE001 - a reader that dies is an error in the stats, not a finished warm
                self._error(Path(f"<{threading.current_thread().name}>"),
                            f"{threading.current_thread().name} stopped: {type(e).__name__}: {e}")

        self._workers = [threading.Thread(target=target, name=f"coldstart-warm-{i}", daemon=True)
                         for i in range(self.threads)]
        for t in self._workers:
            t.start()
        self._reaper = threading.Thread(target=self._reap, name="coldstart-warm-reaper", daemon=True)
        self._reaper.start()
        return self

    def _reap(self) -> None:
        for t in self._workers:
            t.join()
        for fd in [*self._fds.values(), *self._rfds.values()]:
            os.close(fd)
        self._fds.clear()
        self._rfds.clear()
        self._finish()

    def wait(self, timeout: float | None = None) -> WarmStats:
        """Stats once every reader has stopped, or a partial snapshot (finished=False) at timeout."""
        if self._reaper is None:
            raise RuntimeError("wait() before start()")
        self._reaper.join(timeout)
        return self.stats

    @property
    def done(self) -> bool:
        return self.stats.finished

    @property
    def workers(self) -> list[threading.Thread]:
        return list(self._workers)

    # -- work
    def _take(self) -> Range | None:
        if self._gate is not None and not self._gate.is_set() and not self._await_gate():
            return None
        ranges = self.plan.ranges
        while True:
            with self._lock:  # (whether a range of the held-back rest may go: decided with the taking)
                while self._next < len(ranges) and ranges[self._next].path in self._failed:
                    self._next += 1
                if self._next >= len(ranges):
                    return None
                idx = self._next
                rest = idx >= self.plan.profile_end and not self._released.is_set()
                if not (rest and self._held_back):
                    self._next += 1
                    self._issued.append(ranges[idx])
            if not rest:
                return ranges[idx]
            if not self._may_take(idx):  # the rest: held back until release() (or cancel), then low priority
                return None
            if not self._held_back:
                return ranges[idx]

    def _run_pread(self) -> None:
        buf = bytearray(self.chunk)
        mv = memoryview(buf)
        while not self._cancel.is_set():
            r = self._take()
            if r is None:
                return
            fd = self._fds[r.path]
            got = 0
            try:
                while got < r.length and not self._cancel.is_set():
                    n = os.preadv(fd, [mv[: r.length - got]], r.offset + got)
                    if n <= 0:
                        break  # file shrank under us: nothing more to warm
                    got += n
            except OSError as e:
                self._failed.add(r.path)
                self._error(r.path, f"{r.path}: read failed at offset {r.offset + got}: {e.strerror or e}")
            self._done_range(r, got)

    def _exact_ranges(self) -> set[tuple[Path, int]]:
        """The profile's ranges that belong to runs shorter than EXACT_RUN: read without readahead
        (read_into_cache's ``pipe``), which would otherwise read up to a window past each of them."""
        out: set[tuple[Path, int]] = set()
        run: list[Range] = []

        def close() -> None:
            if run and run[-1].offset + run[-1].length - run[0].offset < EXACT_RUN:
                out.update((r.path, r.offset) for r in run)
            run.clear()

        for r in self.plan.ranges[: self.plan.profile_end]:
            if run and (r.path != run[-1].path or r.offset != run[-1].offset + run[-1].length):
                close()
            run.append(r)
        close()
        return out

    def _random_fd(self, path: Path) -> int:
        with self._lock:
            fd = self._rfds.get(path)
            if fd is None:
                fd = self._rfds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            return fd

    def _run_sendfile(self) -> None:
        pipe = None
        try:
            while not self._cancel.is_set():
                r = self._take()
                if r is None:
                    return
                try:
                    if (r.path, r.offset) in self._exact:
                        pipe = pipe or exact_pipe()
                        got = read_into_cache(self._random_fd(r.path), r.offset, r.length, self._cancel.is_set, pipe)
                    else:
                        got = read_into_cache(self._fds[r.path], r.offset, r.length, self._cancel.is_set)
                except OSError as e:
                    self._failed.add(r.path)
                    self._error(r.path, f"{r.path}: read failed at offset {r.offset}: {e.strerror or e}")
                    got = 0
                self._done_range(r, got)
        finally:
            for fd in pipe or ():
                os.close(fd)

    def _run_populate(self) -> None:
        while not self._cancel.is_set():
            r = self._take()
            if r is None:
                return
            a = r.offset - r.offset % PAGE
            n = min(r.offset + r.length, self.plan.files[r.path]) - a
            try:
                populate_fd(self._fds[r.path], a, n)
            except OSError as e:
                if e.errno == errno.EINVAL:  # kernel without MADV_POPULATE_READ: read instead
                    self.method = "pread"
                    self._run_pread_one(r)
                    continue
                self._failed.add(r.path)
                self._error(r.path, f"{r.path}: populate failed at offset {r.offset}: {e.strerror or e}")
                continue
            self._done_range(r, r.length)

    def _run_pread_one(self, r: Range) -> None:
        buf = bytearray(min(r.length, self.chunk))
        mv = memoryview(buf)
        got = 0
        while got < r.length:
            k = os.preadv(self._fds[r.path], [mv[: min(len(buf), r.length - got)]], r.offset + got)
            if k <= 0:
                break
            got += k
        self._done_range(r, got)

    def _run_willneed(self) -> None:
        inflight: deque[tuple[Range, float]] = deque()
        inflight_bytes = 0

        buf = bytearray(self.chunk)

        def settle(r: Range, issued_at: float) -> None:
            # wait (cancellably) until the kernel has read the chunk. The kernel may cut a WILLNEED
            # short (it clamps one call to max(read_ahead_kb, the device's optimal I/O size)) or
            # drop it under memory pressure: when residency stops growing, read the rest ourselves.
            fd = self._fds.get(r.path)
            last, still = -1, 0
            while fd is not None and not self._cancel.is_set():
                try:
                    n = int(_mincore_fd(fd, r.offset - r.offset % PAGE, r.length + r.offset % PAGE).sum())
                except OSError:
                    return
                if n * PAGE >= r.length + r.offset % PAGE:
                    return
                still = still + 1 if n == last else 0
                last = n
                if still >= 20:  # ~20 ms without progress
                    mv = memoryview(buf)
                    got = 0
                    while got < r.length and not self._cancel.is_set():
                        k = os.preadv(fd, [mv[: r.length - got]], r.offset + got)
                        if k <= 0:
                            break
                        got += k
                    return
                time.sleep(0.001)

        while not self._cancel.is_set():
            r = self._take()
            if r is None:
                break
            try:
                will_need(self._fds[r.path], r.offset, r.length)
            except OSError as e:
                self._failed.add(r.path)
                self._error(r.path, f"{r.path}: readahead failed at offset {r.offset}: {e.strerror or e}")
                continue
            inflight.append((r, time.monotonic()))
            inflight_bytes += r.length
            while inflight_bytes > self.max_inflight and inflight and not self._cancel.is_set():
                old, at = inflight.popleft()
                settle(old, at)
                inflight_bytes -= old.length
                self._done_range(old, old.length)
        while inflight and not self._cancel.is_set():
            old, at = inflight.popleft()
            settle(old, at)
            self._done_range(old, old.length)
