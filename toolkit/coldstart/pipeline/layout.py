"""The snapshot's hot layout, made at checkpoint: one recording restore, then the images split.

A recording restore (``RestoreOptions.record_pages``: no readahead on the images, every run mapped,
no warming) of the unpublished snapshot does what every restore does before its first token (CRIU,
wake, reload, canary); the image pages its processes then hold are the ones a restore needs.
criu/layout.py splits the images around them: a restore reads the child's few MB in one pass and
maps the parent's pages lazily (docs/criu.md, "The hot layout"). The pages touched before the
canary's forward pass are also recorded (manifest ``layout.early``: byte ranges of the child's pages
files), so that warmers read them before the rest of the child: with the packed GEMM handles kept,
the child is 1.3 GB, most of it the handles, which only that forward pass reads.

Then one more restore records the snapshot's access profile (``record_profile``), shipped in it as
``profile.json``: a node that has never restored the snapshot warms in first-access order at once
instead of reading the files whole (results/spot-checks/first-on-node-io: bench 0.46 s sooner).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from coldstart.criu import layout
from coldstart.errors import ColdstartError
from coldstart.pipeline.manifest import FileEntry, file_entry
from coldstart.warm.residency import evict, evict_all, residency_vector, will_need_all


class RecordingFailed(ColdstartError):
    """The recording restore did not reach its first token: the images are untouched."""


def make_hot(snap: Path, files: dict[str, FileEntry], say: Callable[[str], None] = lambda s: None,
             timeout: float = 600.0) -> tuple[dict[str, FileEntry], dict]:
    """Record and split ``snap`` (complete, manifest written, not yet published). Returns the new
    file entries (moved images keep their digests, the child's and the parent's pages images, holed
    where the child holds their pages, are computed again) and the facts for the manifest. RecordingFailed: nothing was changed (the
    snapshot works as dumped)."""
    from coldstart.pipeline.restore import RestoreOptions, restore

    images = snap / "criu"
    if (images / layout.PARENT).exists():
        raise ColdstartError(f"{images} is already in the hot layout (it has {layout.PARENT}/)")
    # a page cached before the recording would be mapped by fault-around without being touched
    for p in sorted(images.glob("pages-*.img")):
        evict(p)
    t0 = time.monotonic()
    early: dict[int, set[int]] = {}

    def before_canary(eng) -> None:  # what the restore touched before the canary's forward pass
        early.update(layout.record(images, layout.tree_pids(eng.root_pid),
                                   {p.name: residency_vector(p) for p in images.glob("pages-*.img")}))

    try:
        res = restore(RestoreOptions(snapshot=snap, verify="off", warm=False, fallback=False, warm_record="off",
                                     settle=False, record_pages=True, before_canary=before_canary,
                                     timeout=timeout), say=lambda s: None)
    except ColdstartError as e:
        raise RecordingFailed(f"the recording restore failed: {e}") from None
    try:
        if not res.restored:
            raise RecordingFailed(f"the recording restore failed: {res.fallback_reason}")
        tree = layout.tree_pids(res.engine.root_pid)
        # read before reading the page tables: the pages images were evicted and nothing else reads them
        read = {p.name: residency_vector(p) for p in images.glob("pages-*.img")}
        hot = layout.record(images, tree, read)
    finally:
        res.stop()
    recorded_s = time.monotonic() - t0
    facts = layout.split(images, hot)
    out = {}
    moved = {f"criu/{n}": f"criu/{layout.PARENT}/{n}" for n in facts.moved}
    for rel, fe in files.items():
        out[moved.get(rel, rel)] = fe
    for n in facts.moved:
        out[f"criu/{n}"] = file_entry(images / n)
        if facts.parent_holes and n.startswith("pages-"):  # its hot pages are holes now
            out[f"criu/{layout.PARENT}/{n}"] = file_entry(images / layout.PARENT / n)
    first = layout.child_ranges(images, early)
    first_bytes = sum(n for rs in first.values() for _, n in rs)
    info = {"child_bytes": facts.total_child_bytes, "parent_bytes": facts.parent_bytes,
            "parent_holes": facts.parent_holes, "recording_restore_s": round(recorded_s, 3),
            "early": first, "early_bytes": first_bytes}
    say(f"hot layout: {facts.total_child_bytes / 2**20:.1f} MiB of {facts.parent_bytes / 2**20:.0f} MiB of pages "
        f"touched by a restore, stored together ({first_bytes / 2**20:.1f} MiB of them before its canary)")
    return out, info


def record_profile(snap: Path, say: Callable[[str], None] = lambda s: None, timeout: float = 600.0) -> FileEntry:
    """Restore ``snap`` (complete, manifest written, not yet published) once with its files evicted
    from the page cache and record its access profile (warm.profile, the restore's own recorder);
    save it as ``snap``/profile.json. Returns that file's manifest entry. RecordingFailed: no profile
    (the snapshot works without one; each node then records its own on its first restore)."""
    from coldstart.pipeline.restore import RestoreOptions, restore
    from coldstart.warm.profile import PROFILE_NAME, load_profile
    from coldstart.warm.snapshot import node_profile

    node = node_profile(snap)  # where the restore's recorder saves it (by snapshot id)
    if node is None:
        raise RecordingFailed("the snapshot has no id for a profile (manifest.json unreadable)")
    node.unlink(missing_ok=True)
    evict_all([snap])  # a cached range would be recorded at no time or not at all
    try:
        try:
            res = restore(RestoreOptions(snapshot=snap, verify="off", fallback=False, warm_record="force",
                                         settle=False, timeout=timeout), say=lambda s: None)
        except ColdstartError as e:
            raise RecordingFailed(f"the profile's restore failed: {e}") from None
        ws = res.timeline.get("WARM_START")
        why = (ws.attrs.get("profile_error") if ws is not None else None) or ""
        try:
            if not res.restored:
                raise RecordingFailed(f"the profile's restore failed: {res.fallback_reason}")
        finally:
            res.stop()
    finally:
        # back where the checkpoint, which had just written them, found them: a restore on this host
        # right after a checkpoint runs as it did before this restore evicted them
        will_need_all([snap])
    try:
        prof = load_profile(node)
    except (ColdstartError, OSError) as e:
        raise RecordingFailed(f"the restore recorded no profile ({why or e})") from None
    finally:
        node.unlink(missing_ok=True)
    # this process's own files (source "process") are a checkpoint's, not a restore entrypoint's
    prof.ranges = [r for r in prof.ranges if r.source != "process"]
    named = {r.file for r in prof.ranges}
    prof.files = {f: n for f, n in prof.files.items() if f in named}
    prof.meta["recorded_by"] = "checkpoint"
    if not prof.ranges:
        raise RecordingFailed("the restore recorded no profile (nothing read from the disk)")
    prof.save(snap / PROFILE_NAME)
    say(f"access profile: {len(prof.ranges)} ranges, {prof.bytes / 2**20:.0f} MiB in first-access order "
        f"({len(prof.mapped_files())} of the runtime's files), shipped as {PROFILE_NAME}")
    return file_entry(snap / PROFILE_NAME)

