"""The snapshot's hot layout, made at checkpoint: one recording restore, then the images split.

A recording restore (``RestoreOptions.record_pages``: no readahead on the images, every run mapped,
no warming) of the unpublished snapshot does what every restore does before its first token (CRIU,
wake, reload, canary); the image pages its processes then hold are the ones a restore needs.
criu/layout.py splits the images around them: a restore reads the child's few MB in one pass and
maps the parent's pages lazily (docs/criu.md, "The hot layout"). The pages touched before the
canary's forward pass are also recorded (manifest ``layout.early``: byte ranges of the child's pages
files), so that warmers read them before the rest of the child: with the packed GEMM handles kept,
the child is 1.3 GB, most of it the handles, which only that forward pass reads.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from coldstart.criu import layout
from coldstart.errors import ColdstartError
from coldstart.pipeline.manifest import FileEntry, file_entry
from coldstart.warm.residency import evict, residency_vector


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
