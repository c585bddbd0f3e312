"""A snapshot packed into a compressed read-only image (EROFS) for the node's disk, mounted, and
restored from the mount: real mkfs.erofs, a real loop mount, a real restore."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from coldstart.errors import ColdstartError
from coldstart.pipeline import integrity, nodeimage
from coldstart.pipeline.integrity import NodeRecord
from coldstart.pipeline.restore import RestoreOptions, restore

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("compressor", ["lz4hc", "zstd"])
def test_a_packed_snapshot_is_smaller_and_restores_from_its_mount(snapshot, tmp_path, compressor):
    snap, m = snapshot
    image = tmp_path / "snap.erofs"
    st = nodeimage.pack(snap, image, compressor=compressor)
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
        record = NodeRecord(tmp_path / "node")
        assert integrity.verify(at, m.files, record=record)["checked"] == len(m.files)
        dev = os.stat(at).st_dev
    finally:
        nodeimage.unmount(at)
    assert not os.path.ismount(at)
    # the same image mounted again on another loop device (the one it had is taken meanwhile) is the
    # same files to the node's record: verified once, skipped after; a changed image is checked again
    (tmp_path / "other").write_bytes(bytes(1 << 20))
    other = f"/dev/loop{os.minor(dev)}"
    for _ in range(100):  # the kernel detaches it after the unmount
        if subprocess.run(["losetup", "--read-only", other, str(tmp_path / "other")],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"{other} was not detached after the unmount")
    try:
        again = nodeimage.mount(image, tmp_path / "again")
        try:
            assert os.stat(again).st_dev != dev
            st = integrity.verify(again, m.files, record=record)
            assert st["checked"] == 0 and st["skipped"] == len(m.files), st
        finally:
            nodeimage.unmount(again)
        os.utime(image)  # the image changed, as far as the node can tell
        again = nodeimage.mount(image, tmp_path / "again")
        try:
            assert integrity.verify(again, m.files, record=record)["checked"] == len(m.files)
        finally:
            nodeimage.unmount(again)
    finally:
        subprocess.run(["losetup", "-d", other], check=False)


def test_bad_input_is_one_clear_line_and_leaves_no_image(snapshot, tmp_path):
    snap, _ = snapshot
    with pytest.raises(ColdstartError, match="manifest"):
        nodeimage.pack(tmp_path, tmp_path / "x.erofs")  # not a snapshot
    image = tmp_path / "bad.erofs"
    with pytest.raises(ColdstartError, match="unknown compressor 'nope'"):
        nodeimage.pack(snap, image, compressor="nope")
    with pytest.raises(ColdstartError, match="packing .* failed .*clustersize"):
        nodeimage.pack(snap, image, cluster=1000)  # mkfs.erofs refuses: its reason, no image, nothing staged
    assert not image.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]
    image.write_bytes(b"")
    with pytest.raises(ColdstartError, match="exists"):
        nodeimage.pack(snap, image)
    with pytest.raises(ColdstartError, match="not a mount point"):
        nodeimage.unmount(tmp_path)
    out = subprocess.run([sys.executable, "-m", "coldstart", "snapshot", "mount", str(tmp_path / "none.erofs"),
                          str(tmp_path / "m")], capture_output=True, text=True)
    assert out.returncode != 0 and "no such image" in out.stderr, out


def test_restore_takes_the_image_itself_and_mounts_it_once(snapshot, tmp_path, monkeypatch):
    """`coldstart restore IMAGE`: the entrypoint mounts the image under the node dir and restores from
    there; a second look finds that mount instead of mounting again."""
    import json
    import signal

    import psutil

    snap, _ = snapshot
    image = tmp_path / "snap.erofs"
    nodeimage.pack(snap, image)
    node = tmp_path / "node"
    env = {**os.environ, "COLDSTART_NODE_DIR": str(node)}
    p = subprocess.run([sys.executable, "-m", "coldstart", "restore", str(image), "--no-serve", "--no-fallback"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    try:
        assert summary["restored"] and summary["canary_ok"], summary
    finally:
        server = psutil.Process(summary["pid"])
        tree = [server, *server.children(recursive=True)]
        server.send_signal(signal.SIGTERM)
        psutil.wait_procs(tree, timeout=60)
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(node))
    [at] = [d for d in (node / "images").iterdir() if d.is_dir()]
    assert os.path.ismount(at) and nodeimage.mounted(image) == at  # the same mount, not a second one
    # unmounted by the image's name, the path its user knows
    out = subprocess.run([sys.executable, "-m", "coldstart", "snapshot", "unmount", str(image)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and str(at) in out.stderr + out.stdout, out
    assert not os.path.ismount(at)
    with pytest.raises(ColdstartError, match="not mounted under the node dir"):
        nodeimage.unmount(image)
    with pytest.raises(ColdstartError, match="not an image"):
        nodeimage.mounted(snap / "manifest.json")
