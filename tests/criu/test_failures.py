"""Bad input gives one clear line and leaves nothing behind (no half image, no half process)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from coldstart.criu.dump import DumpOptions, dump
from coldstart.criu.restore import restore
from coldstart.errors import ColdstartError

from .conftest import DUMP, copy_images, marked, ropts, start_and_dump, wait_until


def _damage(images, how: str) -> None:
    if how == "pagemap-magic":
        p = sorted(images.glob("pagemap-*.img"))[0]
        with open(p, "r+b") as f:
            f.write(b"\xde\xad\xbe\xef")
    elif how == "pagemap-truncated":
        p = sorted(images.glob("pagemap-*.img"))[0]
        os.truncate(p, p.stat().st_size - 5)
    elif how == "core-magic":  # passes our size checks: CRIU itself must fail and clean up
        p = sorted(images.glob("core-*.img"))[0]
        with open(p, "r+b") as f:
            f.seek(4)
            f.write(b"\xde\xad\xbe\xef")
    elif how == "mm-truncated":
        p = sorted(images.glob("mm-*.img"))[0]
        os.truncate(p, p.stat().st_size - 3)
    elif how == "pages-truncated":
        p = sorted(images.glob("pages-*.img"))[0]
        os.truncate(p, p.stat().st_size // 2)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["pagemap-magic", "pagemap-truncated", "pages-truncated", "core-magic", "mm-truncated"])
def test_damaged_image_fails_clearly(mem64, tmp_path, restore_mode, how):
    images = copy_images(mem64.images, tmp_path / "images")
    _damage(images, how)
    marker = str(mem64.ctl.dir)
    assert not marked(marker)
    with pytest.raises(ColdstartError) as e:
        restore(images, ropts(restore_mode, work_dir=tmp_path / "work"))
    msg = str(e.value)
    # refused: our own checks before CRIU runs (pagemap/pages sizes); failed: CRIU's error line
    assert msg.startswith((f"criu restore of {images} refused: ", f"criu restore of {images} failed: ")), msg
    assert "\n" not in msg and len(msg) < 800, msg
    if how in ("core-magic", "mm-truncated"):
        assert "failed: " in msg and "(full log: " in msg, msg
    else:
        assert "refused: " in msg and ("pagemap" in msg or "pages-" in msg), msg
    # nothing half-restored keeps running (give the kernel a moment to reap)
    assert wait_until(lambda: not marked(marker), 10), marked(marker)


def test_restore_refuses_when_pid_taken(bins, tmp_path):
    """Without --pidns a taken root pid is reported before criu runs (original still alive)."""
    held = start_and_dump(bins["memhold"], ["8", "3"], tmp_path, leave_running=True)
    try:
        with pytest.raises(ColdstartError, match="in use on this host: stop it or restore with --pidns"):
            restore(held.images, ropts("stock", pidns=False))
    finally:
        held.facts["proc"].kill()
        held.facts["proc"].wait()


IO_URING_PROG = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)   # io_uring_setup: CRIU cannot dump io_uring
print(fd, flush=True)
time.sleep(600)
"""


def test_dump_failure_leaves_no_image_and_names_the_problem(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", IO_URING_PROG], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        fd = int(p.stdout.readline())
        if fd < 0:
            pytest.skip("io_uring disabled on this host")
        target = tmp_path / "out" / "images"
        with pytest.raises(ColdstartError) as e:
            dump(p.pid, target, DumpOptions(**DUMP))
        msg = str(e.value)
        assert msg.startswith(f"criu dump of pid {p.pid} failed: ") and "\n" not in msg, msg
        assert not target.exists()
        assert [x.name for x in target.parent.iterdir() if "staging" in x.name] == []
        time.sleep(0.2)
        assert p.poll() is None  # CRIU resumed the tree after the failed dump
    finally:
        p.kill()
        p.wait()


def test_dump_refuses_existing_dir_and_missing_pid(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ColdstartError, match="already exists"):
        dump(os.getpid(), tmp_path / "x")
    with pytest.raises(ColdstartError, match="no process"):
        dump(2**22 + 7, tmp_path / "y")


def test_restore_of_non_image_dir(tmp_path):
    with pytest.raises(ColdstartError, match="not a CRIU image directory"):
        restore(tmp_path)


def test_read_runs_name_the_small_runs_of_the_pages_images(mem64):
    """The restore's read-ahead hint (criu.images.read_runs): with no size limit the runs tile every
    pages image exactly (the offsets follow the pagemaps); with the mmap threshold they are a part,
    each inside its file."""
    from coldstart.criu.images import MMAP_MIN_KB, check_pages, read_runs

    every = read_runs(mem64.images, min_kb=1 << 30)
    assert sum(n for _, _, n in every) == check_pages(mem64.images)
    for pages in {p for p, _, _ in every}:
        mine = sorted((o, n) for p, o, n in every if p == pages)
        assert mine[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert mine[-1][0] + mine[-1][1] == pages.stat().st_size
    small = read_runs(mem64.images, min_kb=MMAP_MIN_KB)
    assert 0 < sum(n for _, _, n in small) < sum(n for _, _, n in every)
    assert all(0 <= o and o + n <= p.stat().st_size for p, o, n in small)


def test_read_ahead_leaves_the_hot_layouts_child_to_the_warmer(mem64, tmp_path, monkeypatch):
    """The restore's ReadAhead asks for the small runs of images as dumped; of a hot layout's child
    (images with a parent/) for none when the restore's own warmer reads it (``child`` False: asking
    for it too gained nothing, results/spot-checks/host-warm-shape/bench-aheadall.jsonl), for all of
    it otherwise or with "all"."""
    from coldstart.pipeline.restore import READ_AHEAD_ENV, ReadAhead

    def ran(*a, **kw) -> ReadAhead:
        ra = ReadAhead(*a, **kw)
        ra._t.join(30)
        assert ra.error is None
        return ra

    dumped = ran(mem64.images, child=False)
    assert dumped.runs > 0 and dumped.bytes > 0
    hot = copy_images(mem64.images, tmp_path / "hot")
    (hot / "parent").mkdir()
    left = ran(hot, child=False)
    assert left.runs == 0 and left.bytes == 0 and left.heads == dumped.heads
    assert ran(hot).runs > 0
    monkeypatch.setenv(READ_AHEAD_ENV, "all")
    assert ran(hot, child=False).runs > 0
