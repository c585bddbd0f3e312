"""The hot layout (pipeline/layout.py) on the real thing: the session's snapshot, checkpointed with
the default layout, was recorded and split (HOT_LAYOUT); a restore reads the child, maps the
parent, passes every digest and the canary. A second split is refused."""
from __future__ import annotations

import pytest

from coldstart.errors import ColdstartError
from coldstart.pipeline.layout import make_hot
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.restore import RestoreOptions, restore


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


def test_a_hot_snapshot_is_not_split_again(snapshot_copy):
    snap = snapshot_copy("hot-twice")
    with pytest.raises(ColdstartError, match="parent"):
        make_hot(snap, read_manifest(snap).files)
