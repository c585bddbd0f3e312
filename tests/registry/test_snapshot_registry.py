"""A real snapshot through a real registry: pushed, pulled on an "emptied node" (a new directory,
no verification record), restored, and its canary served."""
from __future__ import annotations

import os

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
    out = artifact.pull(ref, tmp_path / "pulled").dir
    r = restore(RestoreOptions(snapshot=out, fallback=False, port=free_port()), say=lambda s: None)
    try:
        assert r.restored and r.canary_ok, r.fallback_reason
        m = tiny_snapshot.manifest
        got = EngineClient(r.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
        assert got.token_ids[:1] == m.canary.token_ids[:1]
    finally:
        r.stop()


def test_restore_from_a_registry_reference_on_an_emptied_node(registry, tiny_snapshot, tmp_path, monkeypatch):
    """Mount (lazy, prefetch) → mmap restore from the mount → canary; the mount goes with the server."""
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
        m = tiny_snapshot.manifest
        got = EngineClient(r.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
        assert got.token_ids[:1] == m.canary.token_ids[:1]
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
