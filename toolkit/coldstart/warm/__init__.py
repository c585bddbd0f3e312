"""Page-cache warming of a snapshot, overlapped with the restore (issue 5).

The pipeline calls ``start_warming(paths, mode=..., profile=...)`` at container start and carries
on with the restore; ``warmer.wait()`` gives the stats, ``warmer.cancel()`` stops the readers.
Warming never raises for a bad file: it records the error and warms the rest.
"""
from __future__ import annotations

import os
from pathlib import Path

from coldstart.warm.where import snapshot_id  # noqa: F401 (re-exported)

# What the package re-exports from its modules, loaded on first use: importing the package (e.g. for
# coldstart.warm.where) loads no warmer and no numpy (where.py says why).
_LAZY = {"NullWarmer": "base", "Range": "base", "WarmStats": "base", "Warmer": "base",
         "ResidencySampler": "residency", "evict": "residency", "expand_paths": "residency",
         "resident_bytes": "residency"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"coldstart.warm.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["start_warming", "make_warmer", "warm_modes", "default_profile", "Warmer", "WarmStats", "Range",
           "ResidencySampler", "resident_bytes", "evict", "MODES"]

MODES = ("native", "vmtouch", "none")


def warm_modes() -> list[dict]:
    """The warming variants the benchmarks compare (name -> start_warming kwargs).

    ``odirect`` is not a warmer: it is the loader reading weights with O_DIRECT (no page cache,
    Dynamo's choice) while no warming runs; the benchmark passes it on to the loader when supported."""
    return [
        {"name": "none", "mode": "none", "profile": False},
        {"name": "vmtouch", "mode": "vmtouch", "profile": False},
        {"name": "native", "mode": "native", "profile": False},
        {"name": "native+profile", "mode": "native", "profile": True},
        {"name": "native-pread+profile", "mode": "native", "method": "pread", "profile": True},
        {"name": "native-populate+profile", "mode": "native", "method": "populate", "profile": True},
        {"name": "native-willneed+profile", "mode": "native", "method": "willneed", "profile": True},
        {"name": "odirect", "mode": "none", "profile": False, "loader_odirect": True},
    ]


def default_profile(snapshot_dir: Path) -> Path | None:
    """``profile.json`` next to the manifest, if one was recorded."""
    p = Path(snapshot_dir) / "profile.json"
    return p if p.is_file() else None


def make_warmer(paths: list[Path] | list[str], *, mode: str = "native", profile: Path | None = None,
                order: list[Path] | None = None, threads: int | None = None, progress=None,
                **kw) -> Warmer:
    """A warmer, not started (for callers that want to attach a sampler or recorder first)."""
    if mode == "native":
        from coldstart.warm.native import NativeWarmer

        if threads:
            kw["threads"] = threads
        return NativeWarmer(paths, profile=profile, order=order, progress=progress, **kw)
    if mode == "vmtouch":
        from coldstart.warm.vmtouch import VmtouchWarmer

        if threads:
            kw["procs"] = threads
        return VmtouchWarmer(paths, profile=profile, order=order, progress=progress, **kw)
    if mode == "none":
        from coldstart.warm.base import NullWarmer

        return NullWarmer(paths)
    from coldstart.errors import ColdstartError

    raise ColdstartError(f"unknown warming mode {mode!r} (choose from {', '.join(MODES)})")


def start_recording(paths: list[Path] | list[str], *, old_pids: set[int] | None = None,
                    others: list[Path] | None = None, pagecache: bool = True):
    """Record this node's access profile of the snapshot ``paths`` lie in without warming it, while
    the node has none (COLDSTART_WARM_RECORD): for a restore that finds it all in the page cache
    (just pulled or checkpointed) or whose warming is done from outside (a container's host, then
    ``pagecache`` False: the page cache shows that reader's order). Without it such a node would keep
    following the shipped profile, which names neither the container entrypoint's files nor this
    node's libraries. A RecordingWarmer (end_recording() saves, cancel() drops), or None."""
    from coldstart.warm import where

    root = where.snapshot_root(paths)
    if root is None or not where.node_lacks_profile(root):
        return None
    from coldstart.warm import snapshot as snapmod
    from coldstart.warm.base import NullWarmer
    from coldstart.warm.residency import expand_paths

    return snapmod.RecordingWarmer(NullWarmer(paths), root, [p for p in expand_paths(list(paths)) if p.is_file()],
                                   snapshot_id=snapshot_id(root), old_pids=old_pids, others=others,
                                   pagecache=pagecache).start()


def start_warming(paths: list[Path] | list[str], *, mode: str | None = None, profile: Path | None | str = "auto",
                  order: list[Path] | None = None, threads: int | None = None, progress=None,
                  record: bool | str | None = None, mapped: bool = True, rest: str = "now",
                  remap=None, old_pids: set[int] | None = None, others: list[Path] | None = None,
                  **kw) -> Warmer:
    """Start warming ``paths`` (files or directories) in the background and return at once.

    Order: ``profile`` ranges first, then ``order``'s files, then small files, CRIU
    ``pages-*.img``, ``*.flat`` weights, the rest. ``mode`` None = $COLDSTART_WARM_MODE or native.
    ``profile="auto"``: the snapshot's profile.json when the paths lie in a snapshot directory (one
    with manifest.json) and its snapshot id matches ($COLDSTART_WARM_PROFILE decides when not given);
    "off"/None: no profile. ``record``: True/"force", False/"off", None/"auto" = record one when
    there is none (saved at ``end_recording()``/``wait()``, dropped at ``cancel()``; see
    coldstart.warm.snapshot). ``mapped``: also warm the profile's ranges of the files the restored
    server maps outside the snapshot (shared libraries), and record them. ``rest`` (native mode,
    with a profile): what the profile does not name is warmed "now" (after the profile's ranges),
    "after" ``release()`` (the restore calls it at first token) or "never". ``remap`` (native mode):
    where the profile's absolute-path files are seen from here (a container's files seen from the
    host, through the image's layers). ``old_pids``: processes alive before the restore began (the
    recorder watches the others: the restored tree). ``others``: files another reader reads whole
    from when they are appended (ProfileRecorder). Never raises for a bad file or profile: errors land in
    ``wait().errors``."""
    import logging

    from coldstart.warm import snapshot as snapmod
    from coldstart.warm.residency import expand_paths

    mode = mode or snapmod.env_mode()
    if mode == "native" and "method" not in kw and os.environ.get("COLDSTART_WARM_METHOD"):
        kw["method"] = os.environ["COLDSTART_WARM_METHOD"]  # sendfile | pread | populate | willneed
    shape = os.environ.get("COLDSTART_WARM_SHAPE", "")  # READERSxMIB, e.g. 2x2: readers x chunk in flight
    if mode == "native" and shape and threads is None and "chunk" not in kw:
        try:
            r, c = shape.lower().split("x")
            if int(r) < 1 or int(c) < 1:
                raise ValueError(shape)
            threads, kw["chunk"] = int(r), int(c) << 20
        except ValueError:
            logging.getLogger("coldstart.warm").warning("warm: COLDSTART_WARM_SHAPE=%r is not READERSxMIB", shape)
    root = snapmod.snapshot_root(paths)
    sid = snapshot_id(root) if root is not None else ""
    log = logging.getLogger("coldstart.warm")
    if profile == "auto":
        profile = snapmod.resolve_profile(root)
    elif profile in ("off", "", None):
        profile = None
    elif isinstance(profile, str):
        profile = Path(profile)
    only: list[Path] = []
    if profile is not None:
        from coldstart.warm.profile import load_profile

        try:
            prof = load_profile(profile)
        except Exception:  # noqa: BLE001 - make_plan reports a bad profile in the stats
            prof = None
        if prof is not None and sid and prof.snapshot_id not in ("", sid):
            log.warning("warm: %s was recorded for another snapshot; ignored", profile)
            profile = None
        elif prof is not None and mapped:
            only = prof.mapped_files()
    if mode == "native" and rest != "now":
        kw["rest"] = rest
    if mode == "native" and remap is not None:
        kw["remap"] = remap
    w = make_warmer(paths, mode=mode, profile=profile, order=order, threads=threads, progress=progress,
                    profile_only=only or None, **kw)
    if isinstance(record, str):
        record = {"force": True, "on": True, "off": False}.get(record)  # "auto" -> None
    if root is not None and (record if record is not None else snapmod.should_record(root, profile)):
        return snapmod.RecordingWarmer(w, root, [p for p in expand_paths(list(paths)) if p.is_file()],
                                        snapshot_id=sid, track_mapped=mapped, old_pids=old_pids,
                                        others=others).start()
    return w.start()
