"""The hot layout (coldstart.criu.layout, patches/criu 0009): images split into a child holding some
pages and a parent holding all of them restore with identical memory in a forked tree, the parent's
pages mapped lazily; a recording restore finds the pages the tasks touched, and little else."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from coldstart.criu import layout
from coldstart.criu.dump import DumpOptions, dump
from coldstart.criu.restore import restore

from .conftest import DUMP, ropts
from .test_mmap_fork_tree import _wait

# Each process holds N MiB of random bytes; SIGUSR1 logs the digest of all of it, SIGUSR2 reads
# (touches) its first eighth only and logs that part's digest.
PROG = r"""
import hashlib, os, signal, sys, time
n = int(sys.argv[1]) << 20
log = open(sys.argv[2], "a", buffering=1)
buf = bytearray(os.urandom(n))
role = "parent"
pid = os.fork()
if pid == 0:
    role = "child"
    buf[: n // 4] = os.urandom(n // 4)
def dig(tag, b):
    log.write(f"{tag} {role} {hashlib.blake2b(b).hexdigest()} {buf.__len__()}\n")
signal.signal(signal.SIGUSR1, lambda *a: dig("all", buf))
signal.signal(signal.SIGUSR2, lambda *a: dig("part", bytes(memoryview(buf)[: n // 8])))
dig("all", buf)
dig("part", bytes(memoryview(buf)[: n // 8]))
while True:
    time.sleep(0.1)
"""
MIB = 64


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    d = tmp_path_factory.mktemp("hot")
    log = d / "log"
    p = subprocess.Popen([sys.executable, "-c", PROG, str(MIB), str(log)], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: len(_lines4(log, "all")) == 2 and len(_lines4(log, "part")) == 2)
        want = {"all": _lines4(log, "all"), "part": _lines4(log, "part")}
        dump(p.pid, d / "images", DumpOptions(**DUMP))
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return d, want


def _lines4(log, tag):
    try:
        return {r: dg for t, r, dg, _ in (line.split() for line in log.read_text().splitlines()) if t == tag}
    except FileNotFoundError:
        return {}


def _copy(src, dst):
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def _tree(r):
    kids = [int(x) for x in open(f"/proc/{r.pid}/task/{r.pid}/children").read().split()]
    assert len(kids) == 1
    return [r.pid, kids[0]]


def _digests(r, log, sig, tag):
    log.write_text("")
    for pid in _tree(r):
        os.kill(pid, sig)
    _wait(lambda: len(_lines4(log, tag)) == 2)
    return _lines4(log, tag)


def test_split_images_restore_identical_with_the_parent_mapped(dumped, tmp_path, has_mmap):
    if not has_mmap:
        pytest.skip("the patched criu has no --mmap-pages")
    d, want = dumped
    images = _copy(d / "images", tmp_path / "images")
    # an arbitrary hot set: every 5th page, and 32-page clusters every 1000 pages
    hot = {}
    for ipid, pm in layout.task_pagemaps(images).items():
        pages = {r.vaddr // 4096 + i for r in layout.read_pagemap(pm).runs for i in range(r.nr_pages)}
        hot[ipid] = {p for p in pages if p % 5 == 0 or p % 1000 < 32}
    facts = layout.split(images, hot)
    assert 0 < facts.total_child_bytes < facts.parent_bytes / 3
    # the parent's copies of the child's pages are holes (where the filesystem can punch them);
    # the restore below reads every page and must still see the dumped bytes
    assert facts.parent_holes in (0, facts.total_child_bytes)
    if facts.parent_holes:
        parent_pages = list((images / "parent").glob("pages-*.img"))
        allocated = sum(p.stat().st_blocks * 512 for p in parent_pages)
        assert allocated <= facts.parent_bytes - facts.parent_holes + len(parent_pages) * (1 << 20)
    assert sorted(p.name for p in (images / "parent").iterdir()) == sorted(
        [pm.name for pm in layout.task_pagemaps(images).values()]
        + [f"pages-{layout.read_pagemap(pm).pages_id}.img" for pm in layout.task_pagemaps(images).values()])

    r = restore(images, ropts("mmap", pidns=True, log_level=4))
    try:
        assert _digests(r, d / "log", signal.SIGUSR1, "all") == want["all"]
        for pid in _tree(r):
            maps = open(f"/proc/{pid}/maps").read()
            assert "/parent/pages-" in maps, f"pid {pid}: nothing mapped from the parent's pages"
        assert "from the parent's" in (r.log_path.read_text())
    finally:
        r.kill()


def test_child_ranges_name_where_the_child_stores_given_pages(dumped, tmp_path):
    """The ranges a warmer reads first (criu.layout.child_ranges): for a set of pages, where the
    split child's pages file holds them; pages the child does not hold are left out."""
    d, _ = dumped
    orig = d / "images"
    images = _copy(orig, tmp_path / "images")
    hot, some, want = {}, {}, {}
    for ipid, pm_path in layout.task_pagemaps(orig).items():
        pm = layout.read_pagemap(pm_path)
        where, off = {}, 0
        for r in pm.runs:
            if r.present:
                where.update({r.vaddr // 4096 + i: off + i * 4096 for i in range(r.nr_pages)})
                off += r.nr_pages * 4096
        hot[ipid] = {p for p in where if p % 3 == 0}
        some[ipid] = {p for p in where if p % 7 == 0}  # a third of them in the child
        with open(orig / f"pages-{pm.pages_id}.img", "rb") as f:
            want[f"pages-{pm.pages_id}.img"] = b"".join(os.pread(f.fileno(), 4096, where[p])
                                                       for p in sorted(some[ipid] & hot[ipid]))
    layout.split(images, hot)
    got = layout.child_ranges(images, some, gap=0)
    assert set(got) == set(want)
    for name, ranges in got.items():
        assert ranges == sorted(ranges)
        with open(images / name, "rb") as f:
            assert b"".join(os.pread(f.fileno(), n, off) for off, n in ranges) == want[name]
    # joined when closer than the gap: fewer ranges, the same pages among them
    joined = layout.child_ranges(images, some)
    for name, ranges in joined.items():
        assert len(ranges) <= len(got[name])
        assert all(any(a <= off and off + n <= a + m for a, m in ranges) for off, n in got[name])


def test_recording_restore_finds_the_touched_pages(dumped, tmp_path, has_mmap, monkeypatch):
    if not has_mmap:
        pytest.skip("the patched criu has no --mmap-pages")
    d, want = dumped
    images = _copy(d / "images", tmp_path / "images")
    for p in images.glob("pages-*.img"):  # a cold start: what is cached cannot be told from what is read
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    monkeypatch.setenv(layout.RECORD_ENV, "1")
    r = restore(images, ropts("mmap", pidns=True))
    try:
        assert _digests(r, d / "log", signal.SIGUSR2, "part") == want["part"]
        hot = layout.record(images, layout.tree_pids(r.pid))
    finally:
        r.kill()
    monkeypatch.delenv(layout.RECORD_ENV)
    total = sum(r.nr_pages for pm in layout.task_pagemaps(images).values()
                for r in layout.read_pagemap(pm).runs) * 4096
    touched = sum(len(s) for s in hot.values()) * 4096
    # each process read an eighth of its 64 MiB buffer: that, the interpreter's own pages, little else
    assert 2 * (MIB << 20) // 8 <= touched < total / 2, (touched, total)

    facts = layout.split(images, hot)
    assert facts.total_child_bytes == touched
    r = restore(images, ropts("mmap", pidns=True))
    try:
        assert _digests(r, d / "log", signal.SIGUSR1, "all") == want["all"]
    finally:
        r.kill()



def test_redump_of_a_hot_layout_restore_is_self_contained(bins, tmp_path, has_mmap):
    """A restored process maps the parent's pages (images/parent/pages-N.img): the patched dump
    saves them as its own memory (patch 0005 with 0009), so the new images need neither old one."""
    if not has_mmap:
        pytest.skip("the patched criu has no --mmap-pages")
    from coldstart.errors import ColdstartError

    from .conftest import Held, start_and_dump

    held = start_and_dump(bins["memhold"], ["64", "33"], tmp_path / "a", before=["digest"])
    hot = {}
    for ipid, pm in layout.task_pagemaps(held.images).items():
        pages = {r.vaddr // 4096 + i for r in layout.read_pagemap(pm).runs for i in range(r.nr_pages)}
        hot[ipid] = {p for p in pages if p % 7 == 0}
    layout.split(held.images, hot)
    try:
        r = held.restore(ropts("mmap", pidns=False))
    except ColdstartError as e:
        if "in use" in str(e) or "File exists" in str(e):
            pytest.skip(f"dumped pid reused on this busy host: {e}")
        raise
    try:
        assert "/parent/pages-" in open(f"/proc/{r.pid}/maps").read()
        d2 = dump(r.pid, tmp_path / "b" / "images", DumpOptions(**{**DUMP, "variant": "patched"}))
    finally:
        r.kill()
    assert d2.pages_bytes >= 64 << 20
    (tmp_path / "a" / "images").rename(tmp_path / "a" / "images.gone")
    held2 = Held(tmp_path / "b" / "images", held.ctl, {"dump": d2})
    for mode in ("stock", "mmap"):
        r2 = held2.restore(ropts(mode, pidns=True))
        try:
            assert held.ctl.request(r2.pid, "digest") == held.facts["digest"], mode
            assert "images.gone" not in open(f"/proc/{r2.pid}/maps").read()
        finally:
            r2.kill()
