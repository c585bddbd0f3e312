"""Warming a snapshot directory at restore: follow its profile, or record one.

``start_warming`` finds the snapshot a set of paths belongs to (the nearest ancestor holding
``manifest.json``). With a profile this node recorded for it (in the node's state dir,
coldstart.state: a snapshot is never written after publish), else the ``profile.json`` shipped in it
(recorded by the checkpoint, or published with it to a registry), the warm follows it. While this node
has none of its own, a ``ProfileRecorder`` runs next to the warmer and, when the restore reports
success by calling ``wait()``, the recorded order is saved (atomically) in the node's profile store:
a node's first restore follows the shipped profile, and the next ones the node's own, which also
names the container entrypoint's own files (warmed by the host for the next replica). In a container, a
restore that does not warm (the snapshot all cached, or warmed by the host) records all the same
(``start_recording``: a recorder beside no warmer).
A failed restore calls ``cancel()``: nothing is saved, a failed run's access order is no guide.
Without either call, recording ends and saves after RECORD_MAX_S.

Environment knobs, for the container entrypoint (one process, no flags to thread through):
  COLDSTART_WARM_MODE    native (default) | vmtouch | none
  COLDSTART_WARM_METHOD  sendfile (default) | pread | populate | willneed   (native mode)
  COLDSTART_WARM_PROFILE auto (default: this node's, else DIR/profile.json) | off | PATH
  COLDSTART_WARM_RECORD  auto (default: while this node has none) | off | force
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from coldstart.warm.base import Range, WarmStats
from coldstart.warm.profile import ProfileRecorder, own_files_ranges
from coldstart.warm.where import (PROFILE_NAME, node_lacks_profile, node_profile, resolve_profile,  # noqa: F401
                                  should_record, snapshot_root)  # (re-exported: where they were)

log = logging.getLogger("coldstart.warm")

# A recorder nobody stops ends here and saves: the restore succeeded but did not call wait() (it
# does only once the warm is done); accesses after the first token land at the profile's end.
RECORD_MAX_S = 120.0


def env_mode(default: str = "native") -> str:
    return os.environ.get("COLDSTART_WARM_MODE", default) or default


class RecordingWarmer:
    """A warmer plus a profile recorder; same interface as the warmer it wraps."""

    def __init__(self, warmer, root: Path, paths: list[Path], snapshot_id: str = "", track_mapped: bool = True,
                 old_pids: set[int] | None = None, others: list[Path] | None = None, pagecache: bool = True):
        self.inner = warmer
        self.mode = warmer.mode
        self.root = root
        self.recorder = ProfileRecorder(paths, root=root, warmer=warmer, interval=0.05, snapshot_id=snapshot_id,
                                        track_mapped=track_mapped, old_pids=old_pids, others=others,
                                        use_pagecache=pagecache)
        self.profile_path: Path | None = None
        self._ended = threading.Lock()
        self._over = False
        self._timer = threading.Timer(RECORD_MAX_S, self._end, kwargs={"save": True})
        self._timer.daemon = True

    def start(self) -> "RecordingWarmer":
        self.recorder.start()  # baseline before the warmer touches anything
        self.inner.start()
        self._timer.start()
        return self

    def _end(self, save: bool) -> None:
        with self._ended:
            if self._over:
                return
            self._over = True
        self._timer.cancel()
        prof = self.recorder.stop()
        if not save:
            return
        # in a container, what the entrypoint itself read before the recorder started: the host
        # warms those files (through the image's layers) for the next replica's entrypoint
        if self.recorder.track_mapped and os.environ.get("COLDSTART_IN_CONTAINER") == "1":
            own, sizes = own_files_ranges()
            prof.ranges = own + prof.ranges
            prof.files.update(sizes)
        if not prof.ranges:
            log.info("warm: nothing recorded for a profile (snapshot already in memory?)")
            return
        try:
            dest = node_profile(self.root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.profile_path = prof.save(dest)
            log.info("warm: recorded access profile %s (%d ranges, %.1f MiB)", self.profile_path,
                     len(prof.ranges), prof.bytes / 2**20)
        except OSError as e:
            log.warning("warm: could not save the access profile in %s: %s", self.root, e)

    def end_recording(self) -> Path | None:
        """The restore is through (first token): stop recording, save the profile; the warm itself
        goes on. Returns the saved profile's path (None: nothing recorded or not writable)."""
        self._end(save=True)
        return self.profile_path

    def wait(self, timeout: float | None = None) -> WarmStats:
        """The restore is through: save the recorded profile, then give the warm's stats."""
        self._end(save=True)
        return self.inner.wait(timeout)

    def release(self) -> None:
        getattr(self.inner, "release", lambda: None)()

    def cancel(self) -> None:
        self._end(save=False)
        self.inner.cancel()

    @property
    def done(self) -> bool:
        return self.inner.done

    @property
    def stats(self) -> WarmStats:
        return self.inner.stats

    @property
    def plan(self):
        return self.inner.plan

    def issued(self) -> list[Range]:
        return self.inner.issued()
