"""A real snapshot through a real registry: pushed, pulled on an "emptied node" (a new directory,
no verification record), restored, and its canary served."""
from __future__ import annotations

import json
import os
import time

import pytest

from coldstart.engine.client import EngineClient
from coldstart.engine.launcher import free_port
from coldstart.pipeline.restore import RestoreOptions, restore
from coldstart.registry import artifact

pytestmark = pytest.mark.timeout(1500)


def test_pulled_snapshot_restores_and_serves(registry, tiny_snapshot, tmp_path, monkeypatch):
    ref = f"{registry.host}/snapshots/tiny:v1"
    res = artifact.push(tiny_snapshot.out, ref)
    assert res.uploaded == res.blobs
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))  # nothing verified on this "node"
    import subprocess
    import sys

    out = tmp_path / "pulled"
    p = subprocess.run([sys.executable, "-m", "coldstart", "pull", ref, str(out)], capture_output=True, text=True,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-500:]
    r = restore(RestoreOptions(snapshot=out, fallback=False, port=free_port()), say=lambda s: None)
    try:
        assert r.restored and r.canary_ok, r.fallback_reason
        # the pull checked the snapshot against its manifest and recorded it: the restore hashes nothing
        v = r.timeline.get("VERIFIED").attrs
        assert v["checked"] == 0 and v["skipped"] > 0, v
        m = tiny_snapshot.manifest
        got = EngineClient(r.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
        assert got.token_ids[:1] == m.canary.token_ids[:1]
    finally:
        r.stop()


def test_pull_pack_keeps_an_image_that_restores_with_nothing_to_hash(registry, tiny_snapshot, tmp_path, monkeypatch):
    """`coldstart pull REF IMAGE --pack`: no directory left, an image that the node mounted and checked,
    a restore from it that hashes nothing; bad input is one line and leaves no image."""
    import json
    import subprocess
    import sys

    from coldstart.pipeline import nodeimage

    ref = f"{registry.host}/snapshots/tiny-packed:v1"
    artifact.push(tiny_snapshot.out, ref)
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))  # nothing verified on this "node"
    image = tmp_path / "pulled" / "tiny.erofs"
    p = subprocess.run([sys.executable, "-m", "coldstart", "pull", ref, str(image), "--pack"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert p.returncode == 0, p.stderr[-1500:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["checked"] and nodeimage.is_image(image)
    assert sorted(x.name for x in image.parent.iterdir()) == ["tiny.erofs"]  # the pulled directory is gone
    at = nodeimage.mounted(image)
    try:
        assert str(at) == res["mounted_at"]
        r = restore(RestoreOptions(snapshot=at, fallback=False, port=free_port()), say=lambda s: None)
        try:
            assert r.restored and r.canary_ok, r.fallback_reason
            v = r.timeline.get("VERIFIED").attrs
            assert v["checked"] == 0 and v["skipped"] > 0, v
        finally:
            r.stop()
    finally:
        nodeimage.unmount(at)
    for argv, needle in [([ref, str(image), "--pack"], "exists"),
                         ([ref, str(tmp_path / "x.erofs"), "--pack", "--compressor", "lzma"], "unknown compressor")]:
        p = subprocess.run([sys.executable, "-m", "coldstart", "pull", *argv], capture_output=True, text=True,
                           env=dict(os.environ), timeout=120)
        assert p.returncode != 0 and needle in p.stderr.strip().splitlines()[-1], p.stderr[-800:]
    assert not (tmp_path / "x.erofs").exists() and sorted(x.name for x in image.parent.iterdir()) == ["tiny.erofs"]


def test_restore_from_a_registry_reference_on_an_emptied_node(registry, tiny_snapshot, tmp_path, monkeypatch):
    """Mount (lazy, prefetch of the profiled chunks) → mmap restore from the mount → canary; after
    the first token the daemon fetches the rest; the mount goes with the server."""
    ref = f"{registry.host}/snapshots/tiny-lazy:v1"
    artifact.push(tiny_snapshot.out, ref)
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    mnt = tmp_path / "mnt"
    lines: list[str] = []
    r = restore(RestoreOptions(snapshot=mnt, ref=ref, fallback=False, port=free_port()), say=lines.append)
    try:
        assert r.restored and r.canary_ok, r.fallback_reason
        assert r.timeline.get("LAZY_MOUNTED") is not None
        assert r.mount.prefetch == "profiled"
        assert r.timeline.get("READY").attrs.get("snapshot_fetch_all") is True
        m = tiny_snapshot.manifest
        got = EngineClient(r.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
        assert got.token_ids[:1] == m.canary.token_ids[:1]
        deadline = time.monotonic() + 30
        while "SIGUSR1: prefetching every chunk" not in r.mount.log.read_text():
            assert time.monotonic() < deadline, r.mount.log.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        r.stop()
    assert not mnt.exists() or not os.path.ismount(mnt)


def test_registry_down_falls_back_naming_it(tiny_snapshot, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    ref = f"127.0.0.1:{free_port()}/snapshots/tiny:v1"  # nothing listens there
    lines: list[str] = []
    r = restore(RestoreOptions(snapshot=tmp_path / "mnt", ref=ref, model=str(tiny_model_dir), port=free_port()),
                say=lines.append)
    try:
        assert not r.restored and "lazy mount of" in (r.fallback_reason or "") and "unreachable" in r.fallback_reason
        assert any(ln.startswith("fallback: lazy mount of") for ln in lines)
        assert EngineClient(r.base_url, timeout=300).complete("Hello", max_tokens=2).text is not None
    finally:
        r.stop()


def test_registry_stopped_after_the_mount_falls_back_naming_the_read(tiny_snapshot, tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    """The registry goes away after the mount has fetched its index, before the restore read its files
    (no prefetch, an empty node cache): the mount answers the reads with EIO within its timeout, and
    the restore falls back to a cold boot that serves, saying why."""
    from coldstart.registry import mount as mount_mod
    from coldstart.registry import server

    srv = server.start(tmp_path / "registry", free_port())
    ref = f"{srv.host}/snapshots/tiny-gone:v1"
    artifact.push(tiny_snapshot.out, ref)
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    real = mount_mod.mount

    def mount_then_stop(r, mountpoint, **kw):
        m = real(r, mountpoint, prefetch="none", timeout_s=5.0)
        srv.stop()  # mid-restore: the index is in, not one file chunk
        return m

    monkeypatch.setattr(mount_mod, "mount", mount_then_stop)
    lines: list[str] = []
    r = restore(RestoreOptions(snapshot=tmp_path / "mnt", ref=ref, model=str(tiny_model_dir), port=free_port()),
                say=lines.append)
    try:
        assert not r.restored and r.fallback_reason, r.fallback_reason
        assert any(ln.startswith("fallback: ") for ln in lines), lines
        assert r.timeline.get("LAZY_MOUNTED") is not None
        assert EngineClient(r.base_url, timeout=300).complete("Hello", max_tokens=2).text is not None
    finally:
        r.stop()


def test_restore_with_its_runtime_from_the_registry(registry, tiny_snapshot, tmp_path, monkeypatch):
    """A node with neither the snapshot nor the runtime: the venv the server runs from is pushed as the
    snapshot's runtime, mounted lazily and seen by the restored server at its checkpoint path; only
    the chunks the server maps are prefetched, so most of the venv never crosses."""
    import sys
    from pathlib import Path

    from coldstart.errors import ColdstartError
    from coldstart.registry.cli import runtime_ranges_of
    from coldstart.registry.mount import as_reference

    venv = Path(os.path.realpath(sys.prefix))
    # the checkpoint node records the access profile at a restore; the runtime push orders by it
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "checkpoint-node"))
    r0 = restore(RestoreOptions(snapshot=tiny_snapshot.out, fallback=False, port=free_port(), warm_record="force"),
                 say=lambda s: None)
    r0.stop()
    snap_ref = f"{registry.host}/snapshots/tiny-rt:v1"
    rt_ref = f"{registry.host}/runtimes/tiny:v1"
    artifact.push(tiny_snapshot.out, snap_ref)
    pushed = artifact.push_runtime(venv, rt_ref, runtime_ranges_of(venv, tiny_snapshot.out))
    assert as_reference(rt_ref) == rt_ref

    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))  # the fresh node
    cache = tmp_path / "lazy-cache"
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(cache))
    with pytest.raises(ColdstartError, match="not a runtime"):  # a snapshot is not a runtime
        restore(RestoreOptions(snapshot=tmp_path / "mnt0", ref=snap_ref, runtime=snap_ref, fallback=False,
                               port=free_port()), say=lambda s: None)
    monkeypatch.setenv("COLDSTART_LAZY_RUNTIME_REST", "leave")  # (count what the restore itself fetched)
    r = restore(RestoreOptions(snapshot=tmp_path / "mnt", ref=snap_ref, runtime=rt_ref, fallback=False,
                               port=free_port()), say=lambda s: None)
    try:
        assert r.restored and r.canary_ok, r.fallback_reason
        assert r.timeline.get("RUNTIME_MOUNTED") is not None
        assert "runtime_fetch_all" not in r.timeline.get("READY").attrs
        # inside the restore's mount namespace the venv's path is the lazy mount
        mounts = Path(f"/proc/{r.engine.root_pid}/mountinfo").read_text().splitlines()
        assert any(ln.split()[4] == str(venv) and "coldstart-lazyfs" in ln for ln in mounts), mounts[-5:]
        m = tiny_snapshot.manifest
        got = EngineClient(r.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
        assert got.token_ids[:1] == m.canary.token_ids[:1]
        chunks = sum(f.stat().st_size for f in (cache / "chunks").rglob("*") if f.is_file())  # (pins/ are links)
        snap_bytes = sum(f.stat().st_size for f in tiny_snapshot.out.rglob("*") if f.is_file())
        assert chunks < snap_bytes + pushed.total_bytes // 4, (chunks, snap_bytes, pushed.total_bytes)
        # by default the restore asks the runtime's daemon for every other chunk after its first
        # token (the same call): it starts fetching the rest in the background
        assert r.runtime.mount.fetch_all()
        deadline = time.monotonic() + 30
        while "SIGUSR1: prefetching every chunk" not in r.runtime.mount.log.read_text():
            assert time.monotonic() < deadline, r.runtime.mount.log.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        r.stop()
    monkeypatch.delenv("COLDSTART_LAZY_RUNTIME_REST")

    # a restore that fails after the runtime is mounted cold-boots from that runtime (the node may
    # have no venv of its own), not from the node's
    monkeypatch.setenv("COLDSTART_CRIU", str(tmp_path / "no-criu"))
    r = restore(RestoreOptions(snapshot=tmp_path / "mnt2", ref=snap_ref, runtime=rt_ref, port=free_port(),
                               model=str(tiny_snapshot.manifest.model)), say=lambda s: None)
    try:
        assert not r.restored and "criu" in (r.fallback_reason or ""), r.fallback_reason
        mounts = Path(f"/proc/{r.engine.root_pid}/mountinfo").read_text().splitlines()
        assert any(ln.split()[4] == str(venv) and "coldstart-lazyfs" in ln for ln in mounts), mounts[-5:]
        assert EngineClient(r.base_url, timeout=300).complete("Hello", max_tokens=2).text is not None
    finally:
        r.stop()


def test_damage_found_after_ready_hands_the_port_to_a_cold_boot(registry, tiny_snapshot, tiny_model_dir, tmp_path):
    """A chunk that the restore does not read before its first token (the last of a hot-layout parent
    pages image) is damaged in the registry. The entrypoint restores from the reference and serves;
    the daemon's background fetch of the rest finds the chunk bad; the entrypoint then stops the
    restored server and cold-boots in its place, naming the chunk and its file; SIGTERM ends it and
    leaves no mount."""
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from coldstart.registry.distribution import Ref, Registry

    ref = f"{registry.host}/snapshots/tiny-late:v1"
    artifact.push(tiny_snapshot.out, ref)
    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    elsewhere = {ci for e in index.entries if not e.path.startswith("criu/parent/") for ci in e.chunks}
    e = max((e for e in index.entries if re.fullmatch(r"criu/parent/pages-\d+\.img", e.path)), key=lambda e: e.size)
    c = index.chunks[next(ci for ci in reversed(e.chunks) if ci not in elsewhere)]
    blob = registry.blob_path(index.packs[c.pack].digest)
    original = blob.read_bytes()
    data = bytearray(original)
    data[c.offset + c.stored // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="cs-t-"))  # short: the cold boot's vLLM IPC sockets live under it
    env = {**os.environ, "COLDSTART_NODE_DIR": str(tmp_path / "node"),
           "COLDSTART_LAZY_CACHE": str(tmp_path / "lazy-cache"), "TMPDIR": str(tmp)}
    err_path = tmp_path / "entry.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "coldstart", "restore", ref, "--model", str(tiny_model_dir)],
                             stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        summary = json.loads(p.stdout.readline())
        assert summary["restored"] is True, summary  # served restored first
        deadline = time.monotonic() + 600
        while "(cold boot)" not in err_path.read_text():
            assert p.poll() is None and time.monotonic() < deadline, err_path.read_text()[-2000:]
            time.sleep(0.5)
        lines = err_path.read_text().splitlines()
        fell = [ln for ln in lines if ln.startswith("fallback: after READY: ")]
        assert fell and c.digest[:19] in fell[0] and e.path in fell[0] and ref in fell[0], lines[-5:]
        url = next(ln for ln in lines if ln.endswith("(cold boot)")).split()[1]
        assert EngineClient(url, timeout=300).complete("Hello", max_tokens=2).text is not None
        mounted = [Path(ln.split(" at ")[1].split()[0]) for ln in lines if ln.startswith("mounted ")]
        assert mounted and not os.path.ismount(mounted[0])  # unmounted before the cold boot
        assert list(tmp.glob("coldstart-cold-*"))  # the cold boot's run dir, while it serves
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) is not None
        assert not list(tmp.glob("coldstart-cold-*"))  # gone with its server
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        blob.write_bytes(original)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_no_serve_restores_mount_goes_with_the_next_restore_once_its_server_is_gone(registry, tiny_snapshot,
                                                                                        tmp_path, monkeypatch):
    """`coldstart inspect REF` reads the manifest through a mount of its own, gone after.
    `coldstart restore REF --no-serve` leaves its server running on its lazy mount and exits: nobody
    is left to unmount it. The next restore's clean-up (gc_restore_dirs) leaves it while the server
    runs and unmounts it, with the restore's state dir, once the server is gone."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from coldstart.criu.restore import alive
    from coldstart.pipeline.snapshots import gc_restore_dirs

    ref = f"{registry.host}/snapshots/tiny-noserve:v1"
    artifact.push(tiny_snapshot.out, ref)
    for k, sub in (("COLDSTART_STATE_DIR", "state"), ("COLDSTART_NODE_DIR", "node"), ("COLDSTART_LAZY_CACHE", "lazy")):
        monkeypatch.setenv(k, str(tmp_path / sub))
    # first a look at it, as a node would before a roll-out: `inspect REF` mounts it for the look only
    p = subprocess.run([sys.executable, "-m", "coldstart", "inspect", ref], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    assert p.returncode == 0, p.stderr[-1500:]
    seen = json.loads(p.stdout)
    assert seen["fits_this_host"] and seen["model"] == tiny_snapshot.manifest.model, seen
    assert not list((tmp_path / "state").rglob("*inspect-*"))  # its mount point went with it
    p = subprocess.run([sys.executable, "-m", "coldstart", "restore", ref, "--no-serve"], capture_output=True,
                       text=True, env=dict(os.environ), timeout=600)
    assert p.returncode == 0, p.stderr[-1500:]
    pid = json.loads(p.stdout.strip().splitlines()[-1])["pid"]
    mnt = Path(next(ln for ln in p.stderr.splitlines() if ln.startswith("mounted ")).split(" at ")[1].split()[0])
    try:
        assert os.path.ismount(mnt)
        assert gc_restore_dirs() == [] and os.path.ismount(mnt)  # its server still runs on it
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(pid):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        removed = gc_restore_dirs()
        assert len(removed) == 1 and not removed[0].exists()
        assert not os.path.ismount(mnt) and not mnt.exists()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])


def test_a_reference_that_is_no_snapshot_is_named_as_such(registry, tmp_path):
    """A pushed tree without a manifest (a venv, a wrong directory): `inspect REF` and `restore REF
    --no-fallback` name the reference, not the mount point they read it through, and leave no mount."""
    import subprocess
    import sys

    tree = tmp_path / "not-a-snapshot"
    tree.mkdir()
    (tree / "file.txt").write_text("hello")
    ref = f"{registry.host}/t/not-a-snapshot:v1"
    artifact.push(tree, ref)
    env = {**os.environ, "COLDSTART_STATE_DIR": str(tmp_path / "state"), "COLDSTART_LAZY_CACHE": str(tmp_path / "lazy")}
    for argv in (["inspect", ref], ["restore", ref, "--no-serve", "--no-fallback"]):
        p = subprocess.run([sys.executable, "-m", "coldstart", *argv], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode != 0
        assert p.stderr.strip().splitlines()[-1] == (f"error: {ref} is not a snapshot: the artifact has no "
                                                     "manifest.json (`coldstart push` of a directory that was not one?)")
        mounts = tmp_path / "state" / "mounts"
        assert not mounts.exists() or not list(mounts.iterdir()), list(mounts.iterdir())


def test_damage_found_before_ready_is_named_as_the_cause_of_the_fallback(registry, tiny_snapshot, tiny_model_dir,
                                                                         tmp_path, monkeypatch):
    """A chunk the restore needs (CRIU's process tree image) damaged in the registry: every read of it is
    EIO, CRIU fails on it, and the fallback's reason names the damaged chunk, its file and the
    reference (the cause) before what CRIU said of its EIO (the symptom); the cold boot serves."""
    from coldstart.registry.distribution import Ref, Registry

    ref = f"{registry.host}/snapshots/tiny-early-damage:v1"
    artifact.push(tiny_snapshot.out, ref)
    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    e = next(e for e in index.entries if e.path == "criu/pstree.img")
    assert all(e.chunks[0] not in o.chunks for o in index.entries if o is not e)
    c = index.chunks[e.chunks[0]]
    blob = registry.blob_path(index.packs[c.pack].digest)
    original = blob.read_bytes()
    data = bytearray(original)
    data[c.offset + c.stored // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    try:
        r = restore(RestoreOptions(snapshot=tmp_path / "mnt", ref=ref, model=str(tiny_model_dir), port=free_port()),
                    say=lambda s: None)
        try:
            assert not r.restored
            assert r.fallback_reason.startswith(f"chunk {c.digest[:19]} of criu/pstree.img of {ref} failed its "
                                                "digest twice: the registry serves it damaged ("), r.fallback_reason
            assert EngineClient(r.base_url, timeout=300).complete("Hello", max_tokens=2).text is not None
        finally:
            r.stop()
    finally:
        blob.write_bytes(original)
