"""`coldstart mount`: the lazy FUSE daemon (lazyfs/) on a real registry. Every byte read through the
mount equals the original, whatever the access pattern; a corrupt chunk is never returned (from the
registry or from the node cache); a registry gone mid-read gives EIO within the timeout; mounts on
one node share the chunk cache, and a bound on it never evicts what a live mount uses; a snapshot
restores from a registry reference and serves."""
from __future__ import annotations

import errno
import mmap
import os
import random
import time
from pathlib import Path

import pytest

from coldstart.engine.launcher import free_port
from coldstart.registry import artifact, mount, server
from coldstart.registry.distribution import Ref, Registry

from .test_push_pull import SMALL, same_tree

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(autouse=True)
def _lazy_cache(tmp_path, monkeypatch):
    """An empty node cache per test (a fresh node), unless the test shares one on purpose."""
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    try:
        mount.daemon_binary()
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the lazy daemon is not built: {e}")


@pytest.fixture
def mounted(registry, tree, tmp_path):
    ref = f"{registry.host}/t/mount:v1"
    artifact.push(tree, ref, **SMALL)
    m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=5)
    yield m
    m.unmount()


def test_reads_are_identical_sequential_random_and_mmap(mounted, tree):
    same_tree(tree, mounted.mountpoint)
    rnd = random.Random(0)
    for name in ("big.bin", "text.txt", "weights.flat"):  # chunks as is, zstd frames, byte-grouped frames
        src, dst = (tree / name).read_bytes(), mounted.mountpoint / name
        with open(dst, "rb", buffering=0) as f:
            for _ in range(200):
                off = rnd.randrange(len(src))
                n = rnd.randrange(1, 300_000)
                assert os.pread(f.fileno(), n, off) == src[off:off + n]
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                for _ in range(200):
                    off = rnd.randrange(len(src) - 4096)
                    assert mm[off:off + 4096] == src[off:off + 4096]
    with pytest.raises(OSError) as e:
        open(mounted.mountpoint / "big.bin", "r+b")
    assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def _pack_of(ref: str, path: str) -> tuple[str, int]:
    """The digest of the pack holding ``path``'s first chunk, and that chunk's offset in it."""
    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    e = next(e for e in index.entries if e.path == path)
    c = index.chunks[e.chunks[0]]
    return index.packs[c.pack].digest, c.offset


@pytest.mark.parametrize("name", ["big.bin", "text.txt", "weights.flat"])  # as is, zstd, byte-grouped zstd
def test_chunk_corrupt_in_registry_gives_eio_never_bytes(registry, tree, tmp_path, name):
    ref = f"{registry.host}/t/badchunk-{name.replace('.', '-')}:v1"
    artifact.push(tree, ref, **SMALL)
    digest, off = _pack_of(ref, name)
    blob = registry.blob_path(digest)
    original = blob.read_bytes()
    data = bytearray(original)
    data[off + 10] ^= 0xFF
    blob.write_bytes(bytes(data))
    m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=5)
    try:
        with open(m.mountpoint / name, "rb", buffering=0) as f:
            with pytest.raises(OSError) as e:
                os.pread(f.fileno(), 4096, 0)
            assert e.value.errno == errno.EIO
            good = (tree / name).read_bytes()
            assert os.pread(f.fileno(), 4096, 64 << 10) == good[64 << 10:(64 << 10) + 4096]  # next chunk is fine
        # what the restore's watch reads (RestoreResult.damaged): the daemon's line, mapped to the file
        index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
        chunk = index.chunks[next(e for e in index.entries if e.path == name).chunks[0]]
        deadline = time.monotonic() + 10
        while not m.corrupt_chunks() and time.monotonic() < deadline:
            time.sleep(0.1)
        bad = m.corrupt_chunks()
        assert list(bad) == [chunk.digest] and name in bad[chunk.digest], (bad, m.log.read_text()[-800:])
    finally:
        m.unmount()
        blob.write_bytes(original)
    assert any(w in m.log.read_text().lower() for w in ("mismatch", "corrupt", "digest"))


def test_chunk_corrupt_in_node_cache_is_refetched(registry, tree, tmp_path):
    ref = f"{registry.host}/t/badcache:v1"
    artifact.push(tree, ref, **SMALL)
    m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=5)
    try:
        assert (m.mountpoint / "big.bin").read_bytes() == (tree / "big.bin").read_bytes()
    finally:
        m.unmount()
    cached = sorted((mount.cache_dir() / "chunks").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    victim = [p for p in cached if p.is_file() and p.stat().st_size == 64 << 10][0]
    raw = bytearray(victim.read_bytes())
    raw[5] ^= 0xFF
    victim.write_bytes(bytes(raw))
    m = mount.mount(ref, tmp_path / "mnt2", prefetch=False, timeout_s=5)
    try:
        same_tree(tree, m.mountpoint)
    finally:
        m.unmount()


@pytest.fixture
def own_registry(tree, tmp_path):
    """A registry of this test's own, the tree pushed to it: the test may stop it (stopped again at
    teardown, harmlessly). Yields (server, ref)."""
    srv = server.start(tmp_path / "reg", free_port())
    ref = f"{srv.host}/t/own:v1"
    artifact.push(tree, ref, **SMALL)
    yield srv, ref
    srv.stop()


def test_registry_gone_mid_read_gives_eio_within_timeout(own_registry, tree, tmp_path):
    srv, ref = own_registry
    m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=3)
    try:
        with open(m.mountpoint / "big.bin", "rb", buffering=0) as f:
            assert os.pread(f.fileno(), 100, 0) == (tree / "big.bin").read_bytes()[:100]
            srv.stop()
            t0 = time.monotonic()
            with pytest.raises(OSError) as e:
                os.pread(f.fileno(), 4096, 3 << 20)  # a chunk not fetched yet
            assert e.value.errno == errno.EIO and time.monotonic() - t0 < 20
    finally:
        m.unmount()


def test_two_mounts_share_the_node_cache(own_registry, tree, tmp_path):
    srv, ref = own_registry
    a = mount.mount(ref, tmp_path / "a", prefetch=True, timeout_s=5)
    try:
        same_tree(tree, a.mountpoint)  # every chunk now in the node cache
        b = mount.mount(ref, tmp_path / "b", prefetch=False, timeout_s=3)
        srv.stop()  # the second mount must be served from the cache alone
        try:
            same_tree(tree, b.mountpoint)
        finally:
            b.unmount()
    finally:
        a.unmount()


def _chunk_bytes() -> tuple[int, int]:
    """Bytes of the chunk files in the node cache, and of those that live mounts pin (link count > 1)."""
    st = [p.stat() for p in (mount.cache_dir() / "chunks").rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sum(s.st_size for s in st), sum(s.st_size for s in st if s.st_nlink > 1)


def test_bounded_cache_evicts_only_chunks_no_live_mount_uses(registry, tree, tmp_path):
    ref = f"{registry.host}/t/bounded:v1"
    artifact.push(tree, ref, **SMALL)
    bound = 1 << 20  # the tree is about 4 MiB
    a = mount.mount(ref, tmp_path / "a", prefetch=True, timeout_s=5, cache_max_bytes=bound)
    try:
        same_tree(tree, a.mountpoint)
        b = mount.mount(ref, tmp_path / "b", prefetch=False, timeout_s=5, cache_max_bytes=bound)
        try:
            same_tree(tree, b.mountpoint)
            total, pinned = _chunk_bytes()
            assert bound < total <= bound + pinned
        finally:
            b.unmount()
    finally:
        a.unmount()
    assert not any((mount.cache_dir() / "pins").iterdir())
    # once no mount uses them, the next daemon trims the chunks to the bound, and fetches again what it evicted
    c = mount.mount(ref, tmp_path / "c", prefetch=False, timeout_s=5, cache_max_bytes=bound)
    try:
        end = time.monotonic() + 10
        while "cache eviction" not in c.log.read_text() and time.monotonic() < end:
            time.sleep(0.05)
        assert _chunk_bytes()[0] <= bound
        same_tree(tree, c.mountpoint)
    finally:
        c.unmount()
    assert not any((mount.cache_dir() / "pins").iterdir())


def test_cli_mount_and_umount(registry, tree, tmp_path):
    import json
    import subprocess
    import sys

    ref = f"{registry.host}/t/climount:v1"
    artifact.push(tree, ref, **SMALL)
    p = subprocess.run([sys.executable, "-m", "coldstart.cli", "mount", ref, str(tmp_path / "mnt")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    try:
        same_tree(tree, Path(info["mountpoint"]))
    finally:
        subprocess.run([sys.executable, "-m", "coldstart.cli", "umount", info["mountpoint"]], check=True, timeout=60)
    assert not os.path.ismount(info["mountpoint"])


def test_a_mount_whose_daemon_was_killed_is_swept(registry, tree, tmp_path):
    """A daemon SIGKILLed under its mount leaves a dead mount point (every access fails);
    sweep_dead unmounts and removes it, and leaves a live mount beside it alone."""
    import signal

    ref = f"{registry.host}/t/sweep:v1"
    artifact.push(tree, ref, **SMALL)
    root = tmp_path / "mounts"
    dead = mount.mount(ref, root / "dead-1", prefetch=False, timeout_s=5)
    live = mount.mount(ref, root / "live-2", prefetch=False, timeout_s=5)
    try:
        os.kill(dead.pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.statvfs(root / "dead-1")
            except OSError as e:
                assert e.errno in mount.DEAD_MOUNT
                break
            time.sleep(0.05)
        else:
            pytest.fail("the mount stayed readable after its daemon was killed")
        assert mount.sweep_dead(root) == [root / "dead-1"]
        assert not (root / "dead-1").exists() and not os.path.ismount(root / "dead-1")
        assert os.path.ismount(root / "live-2")
        same_tree(tree, root / "live-2")
        assert mount.sweep_dead(root) == []
    finally:
        live.unmount()
