"""The hot layout (pipeline/layout.py) on the real thing: a recording restore of the tiny snapshot,
the split, then a restore that reads the child, maps the parent, passes every digest and the
canary."""
from __future__ import annotations

from coldstart.pipeline.layout import make_hot
from coldstart.pipeline.manifest import read_manifest, write_manifest
from coldstart.pipeline.restore import RestoreOptions, restore


def test_hot_layout_restores_with_the_parent_mapped(snapshot_copy):
    snap = snapshot_copy("hot")
    m = read_manifest(snap)
    m.files, m.layout = make_hot(snap, m.files)
    m.created_at += "+hot"  # its own node profile
    write_manifest(snap, m)
    assert (snap / "criu" / "parent").is_dir()
    assert 0 < m.layout["child_bytes"] < m.layout["parent_bytes"] / 4
    assert any(rel.startswith("criu/parent/pages-") for rel in m.files)

    res = restore(RestoreOptions(snapshot=snap, verify="full", fallback=False), say=lambda s: None)
    try:
        assert res.restored and res.canary_ok
        maps = open(f"/proc/{res.engine.root_pid}/maps").read()
        assert "/criu/parent/pages-" in maps  # the parent's pages: mapped, not read
    finally:
        res.stop()
