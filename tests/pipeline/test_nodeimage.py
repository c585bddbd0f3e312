"""A snapshot packed into a compressed read-only image (EROFS) for the node's disk, mounted, and
restored from the mount: real mkfs.erofs, a real loop mount, a real restore."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coldstart.errors import ColdstartError
from coldstart.pipeline import nodeimage
from coldstart.pipeline.restore import RestoreOptions, restore

pytestmark = pytest.mark.timeout(900)


def test_a_packed_snapshot_is_smaller_and_restores_from_its_mount(snapshot, tmp_path):
    snap, m = snapshot
    image = tmp_path / "snap.erofs"
    st = nodeimage.pack(snap, image)
    assert image.is_file() and st["bytes"] < st["snapshot_bytes"] / 2, st  # the tiny model's pages compress well
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing staged left
    at = nodeimage.mount(image, tmp_path / "mnt")
    try:
        with pytest.raises(OSError):
            (at / "probe").write_text("x")  # read-only
        lines: list[str] = []
        res = restore(RestoreOptions(snapshot=at, fallback=False), say=lines.append)
        try:
            assert res.restored and res.canary_ok, lines
        finally:
            res.stop()
    finally:
        nodeimage.unmount(at)
    assert not os.path.ismount(at)


def test_bad_input_is_one_clear_line_and_leaves_no_image(snapshot, tmp_path):
    snap, _ = snapshot
    with pytest.raises(ColdstartError, match="manifest"):
        nodeimage.pack(tmp_path, tmp_path / "x.erofs")  # not a snapshot
    image = tmp_path / "bad.erofs"
    with pytest.raises(ColdstartError, match="packing .* failed"):
        nodeimage.pack(snap, image, compressor="nope")  # mkfs.erofs refuses: no image, nothing staged
    assert not image.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]
    image.write_bytes(b"")
    with pytest.raises(ColdstartError, match="exists"):
        nodeimage.pack(snap, image)
    with pytest.raises(ColdstartError, match="not a mount point"):
        nodeimage.unmount(tmp_path)
    out = subprocess.run([sys.executable, "-m", "coldstart", "snapshot", "mount", str(tmp_path / "none.erofs"),
                          str(tmp_path / "m")], capture_output=True, text=True)
    assert out.returncode != 0 and "no such image" in out.stderr, out
