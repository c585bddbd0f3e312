"""The hot layout (pipeline/layout.py) on the real thing: the session's snapshot, checkpointed with
the default layout, was recorded and split (HOT_LAYOUT); a restore reads the child, maps the
parent, passes every digest and the canary. A second split is refused."""
from __future__ import annotations

import pytest

from coldstart.errors import ColdstartError
from coldstart.pipeline.layout import make_hot
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.restore import RestoreOptions, restore, warm_paths
from coldstart.warm.base import early_ranges, make_plan


def test_the_default_checkpoint_is_hot_and_restores_with_the_parent_mapped(tiny_snapshot):
    snap = tiny_snapshot.out
    m = read_manifest(snap)
    assert (snap / "criu" / "parent").is_dir()
    assert 0 < m.layout["child_bytes"] < m.layout["parent_bytes"] / 4
    assert any(rel.startswith("criu/parent/pages-") for rel in m.files)
    assert "HOT_LAYOUT" in {e.name for e in tiny_snapshot.timeline.events}

    res = restore(RestoreOptions(snapshot=snap, verify="full", fallback=False), say=lambda s: None)
    try:
        assert res.restored and res.canary_ok
        maps = open(f"/proc/{res.engine.root_pid}/maps").read()
        assert "/criu/parent/pages-" in maps  # the parent's pages: mapped, not read
    finally:
        res.stop()


def test_the_pages_needed_before_the_canary_are_recorded_and_warmed_first(tiny_snapshot, monkeypatch):
    """The recording also notes which of the child's pages the restore touched before its canary's
    forward pass (manifest layout.early); every warmer's plan reads those before the rest."""
    snap = tiny_snapshot.out
    m = read_manifest(snap)
    early = m.layout["early"]
    assert early and 0 < m.layout["early_bytes"] <= m.layout["child_bytes"]
    for name, ranges in early.items():
        size = (snap / "criu" / name).stat().st_size
        assert ranges == sorted(ranges) and all(0 <= off and off + n <= size for off, n in ranges)
    hot = sorted((snap / "criu").glob("pages-*.img"))
    first = early_ranges(hot)
    assert sum(n for _, _, n in first) == m.layout["early_bytes"]

    plan = make_plan(warm_paths(snap, m), chunk=1 << 20)
    k = 0
    for p, off, n in first:  # the plan opens with exactly these ranges (cut into chunks)
        while n > 0:
            r = plan.ranges[k]
            assert (r.path, r.offset) == (p, off)
            off, n, k = off + r.length, n - r.length, k + 1
    # then each child file whole, once: every byte of it planned exactly once
    for p in hot:
        spans = sorted((r.offset, r.length) for r in plan.ranges if r.path == p)
        pos = 0
        for off, n in spans:
            assert off == pos
            pos += n
        assert pos == p.stat().st_size
    # pushed to a registry, the artifact's chunks open with them too (what a lazy mount prefetches first)
    from coldstart.registry.artifact import CHUNK, build_index

    ix = build_index(snap, compress="none")
    want = list(dict.fromkeys((str(p.relative_to(snap)), k) for p, off, n in first
                              for k in range(off // CHUNK, (off + n - 1) // CHUNK + 1)))
    files = {e.path: e for e in ix.entries}
    pages = sorted(i for e in ix.entries if e.path.startswith("criu/pages-") for i in e.chunks)
    assert pages[:len(want)] == [files[p].chunks[k] for p, k in want]
    monkeypatch.setenv("COLDSTART_WARM_HOT_FIRST", "0")
    assert early_ranges(hot) == []
    assert make_plan(warm_paths(snap, m), chunk=1 << 20).ranges[0].offset == 0


def test_a_hot_snapshot_is_not_split_again(snapshot_copy):
    snap = snapshot_copy("hot-twice")
    with pytest.raises(ColdstartError, match="parent"):
        make_hot(snap, read_manifest(snap).files)
