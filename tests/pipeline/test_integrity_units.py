"""The digest checks alone (pipeline/integrity.py): no vLLM, no criu."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from coldstart.pipeline import integrity
from coldstart.pipeline.manifest import FileEntry

CH = integrity.CHUNK


def _entry(p: Path) -> FileEntry:
    d = integrity.file_digests(p)
    return FileEntry(size=p.stat().st_size, xxh3=d.xxh3, chunks=list(d.chunks))


def test_a_flipped_byte_is_named_by_file_and_chunk(tmp_path):
    p = tmp_path / "pages-1.img"
    p.write_bytes(os.urandom(3 * CH + 123))
    fe = _entry(p)
    assert len(fe.chunks) == 4
    integrity.check_file(p, "criu/pages-1.img", fe.size, fe.chunks)
    with open(p, "r+b") as f:
        f.seek(2 * CH + 7)
        b = f.read(1)
        f.seek(2 * CH + 7)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(integrity.IntegrityError, match=r"criu/pages-1.img: chunk 2 \(bytes"):
        integrity.check_file(p, "criu/pages-1.img", fe.size, fe.chunks)


def test_sparse_files_check_their_holes_without_reading(tmp_path):
    p = tmp_path / "psm_1"
    with open(p, "wb") as f:
        f.truncate(8 * CH)
        f.seek(5 * CH + 10)
        f.write(b"data")
    fe = _entry(p)
    integrity.check_file(p, "shm/psm_1", fe.size, fe.chunks)
    assert integrity._is_hole(os.open(p, os.O_RDONLY), 0, CH)
    fe.chunks[0] = "0" * 16  # a hole whose digest does not match zeros is still caught
    with pytest.raises(integrity.IntegrityError, match="chunk 0"):
        integrity.check_file(p, "shm/psm_1", fe.size, fe.chunks)


def test_the_node_record_is_dropped_by_any_write(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "weights.flat").write_bytes(os.urandom(CH + 5))
    files = {"weights.flat": _entry(snap / "weights.flat")}
    rec = integrity.NodeRecord(tmp_path / "state")
    assert integrity.verify(snap, files, "auto", record=rec)["checked"] == 1
    assert integrity.verify(snap, files, "auto", record=rec)["skipped"] == 1  # verified before: skipped
    assert integrity.verify(snap, files, "full", record=rec)["checked"] == 1
    with open(snap / "weights.flat", "r+b") as f:  # same size, one byte, in place
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(integrity.IntegrityError, match="weights.flat: chunk 0"):
        integrity.verify(snap, files, "auto", record=rec)
    assert integrity.verify(snap, files, "off", record=rec)["checked"] == 0


def test_forgetting_one_snapshot_keeps_the_others_records(tmp_path):
    rec = integrity.NodeRecord(tmp_path / "state")
    snaps = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.flat").write_bytes(os.urandom(CH + 5))
        snaps[name] = {"weights.flat": _entry(tmp_path / name / "weights.flat")}
        assert integrity.verify(tmp_path / name, snaps[name], "auto", record=rec)["checked"] == 1
    assert rec.forget(tmp_path / "a", snaps["a"]) == 1
    assert integrity.verify(tmp_path / "a", snaps["a"], "auto", record=rec)["checked"] == 1  # a first one again
    assert integrity.verify(tmp_path / "b", snaps["b"], "auto", record=rec)["skipped"] == 1  # b still known


def test_sparse_copy_and_data_extents_skip_holes(tmp_path):
    """vLLM's /dev/shm buffers are long sparse files: the copy and the host's early reads see only
    their data runs (fsutil.data_extents), and the copy's bytes equal the source's."""
    import os

    from coldstart.containers.run import _read_data
    from coldstart.fsutil import data_extents
    from coldstart.pipeline.manifest import sparse_copy

    src = tmp_path / "shm"
    with open(src, "wb") as f:
        f.truncate(64 << 20)
        f.seek(10 << 20)
        f.write(b"x" * 5000)
        f.seek(40 << 20)
        f.write(os.urandom(3 << 20))
    with open(src, "rb") as f:
        runs = list(data_extents(f.fileno()))
    assert runs and all(a < b for a, b in runs) and sum(b - a for a, b in runs) < 8 << 20
    data = 5000 + (3 << 20)
    assert _read_data(src) == sum(b - a for a, b in runs) >= data
    assert sparse_copy(src, tmp_path / "copy") >= data
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()


def _checks_failing_after(seconds: float | None):
    """The restore's digest checks (pipeline.restore._Checks) reduced to their verdict: a failure
    naming a file after ``seconds`` (None: every digest matches)."""
    import threading
    import time

    from coldstart.pipeline.restore import _Checks

    checks = _Checks.__new__(_Checks)
    checks._error = None
    checks._tree, checks._log = [], ""

    def verify() -> None:
        if seconds is not None:
            time.sleep(seconds)
            checks._error = integrity.IntegrityError("file criu/pages-1.img: chunk 3 does not match its digest")

    checks._t = threading.Thread(target=verify)
    checks._t.start()
    return checks


def test_a_digest_failure_ends_a_call_the_damaged_server_never_answers():
    import threading

    from coldstart.pipeline.restore import RestoreFailed

    hung = threading.Event()  # never set: a request a server restored from a damaged image never answers
    with pytest.raises(RestoreFailed, match="pages-1.img"):
        _checks_failing_after(0.2).guard(hung.wait)
    hung.set()


def test_a_watched_process_that_exits_ends_a_call_nobody_answers():
    """An engine that dies under a live API server: the call waits on it, the watch ends the wait."""
    import subprocess
    import threading

    from coldstart.pipeline.restore import RestoreFailed

    engine = subprocess.Popen(["sleep", "60"])
    checks = _checks_failing_after(None)
    checks.watch([engine.pid], "server.log")
    assert checks.exited() is None
    threading.Timer(0.2, engine.kill).start()  # left a zombie: not reaped until the end
    hung = threading.Event()
    with pytest.raises(RestoreFailed, match=rf"pid {engine.pid} \(sleep\).*server.log"):
        checks.guard(hung.wait)
    hung.set()
    engine.wait()


def test_a_guarded_call_returns_or_raises_as_it_would_alone():
    checks = _checks_failing_after(None)
    assert checks.guard(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        checks.guard(lambda: 1 / 0)


def test_a_first_restore_checks_what_it_reads_first(tmp_path, monkeypatch):
    """The restore's checks read CRIU's metadata, then what the restore reads in bulk (the hot
    layout's child pages, the weights file), then the rest (the parent's pages, mapped lazily), and
    only by size inside each group: smallest first had the parent's images ahead of the child's."""
    from coldstart.pipeline.events import Timeline
    from coldstart.pipeline.manifest import Canary, Manifest
    from coldstart.pipeline.restore import _Checks

    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))
    snap = tmp_path / "snap"
    sizes = {"criu/inventory.img": 100, "criu/pagemap-7.img": 5000, "criu/pages-1.img": 3 * CH,
             "criu/parent/pages-1.img": CH // 2, "criu/parent/pagemap-7.img": 300,
             "weights/weights.flat": 2 * CH, "run/server.log": 10}
    for rel, n in sizes.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(os.urandom(n))
    m = Manifest(model="/m", model_digest="d", served_model_name="/m", engine_args=[], host={},
                 canary=Canary(prompt="p", token_ids=[1]), files={rel: _entry(snap / rel) for rel in sizes},
                 weights={"flat": "weights/weights.flat"})
    checks = _Checks(snap, m, "full", Timeline())
    checks.join()
    order = [str(Path(p).relative_to(snap)) for p in checks.reading]
    assert sorted(order) == sorted(sizes)
    assert set(order[:3]) == {"criu/inventory.img", "criu/pagemap-7.img", "criu/parent/pagemap-7.img"}
    assert order[3:5] == ["weights/weights.flat", "criu/pages-1.img"]  # smallest first within the group
    assert set(order[5:]) == {"criu/parent/pages-1.img", "run/server.log"}
