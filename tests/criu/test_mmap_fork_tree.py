"""A forked tree (parent + child sharing copy-on-write memory, like vLLM's engine and worker)
restores with identical memory in both processes, and with --mmap-pages both are really mapped
(patches/criu 0007: CRIU's parent/child COW restore copies every page, so mappable VMAs are not
linked into COW pairs). Owned by the patch author (h3)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from coldstart.criu.dump import DumpOptions, dump
from coldstart.criu.restore import restore

from .conftest import DUMP, ropts

PROG = r"""
import hashlib, os, signal, sys, time
n = int(sys.argv[1]) << 20
log = open(sys.argv[2], "a", buffering=1)
buf = bytearray(os.urandom(n))
role = "parent"
pid = os.fork()
if pid == 0:
    role = "child"
    buf[: n // 4] = os.urandom(n // 4)  # the child diverges on a quarter, shares the rest
def dig(tag):
    log.write(f"{tag} {role} {hashlib.blake2b(buf).hexdigest()}\n")
signal.signal(signal.SIGUSR1, lambda *a: dig("now"))
dig("start")
while True:
    time.sleep(0.1)
"""


def _lines(log, tag):
    try:
        return {r: d for t, r, d in (line.split() for line in log.read_text().splitlines()) if t == tag}
    except FileNotFoundError:
        return {}


def _wait(pred, timeout=120.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_forked_tree_identical_and_mapped(tmp_path, has_mmap):
    log = tmp_path / "log"
    p = subprocess.Popen([sys.executable, "-c", PROG, "96", str(log)], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: len(_lines(log, "start")) == 2)
        start = _lines(log, "start")
        assert start["parent"] != start["child"]
        dump(p.pid, tmp_path / "images", DumpOptions(**DUMP))
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for mode in ("stock", "mmap") if has_mmap else ("stock",):
        log.write_text("")
        r = restore(tmp_path / "images", ropts(mode, pidns=True))
        try:
            kids = [int(x) for x in open(f"/proc/{r.pid}/task/{r.pid}/children").read().split()]
            assert len(kids) == 1
            for pid in (r.pid, kids[0]):
                os.kill(pid, signal.SIGUSR1)
            _wait(lambda: len(_lines(log, "now")) == 2)
            assert _lines(log, "now") == start, mode
            if mode == "mmap":
                for pid in (r.pid, kids[0]):
                    assert "pages-" in open(f"/proc/{pid}/maps").read(), f"{mode}: pid {pid} not mapped"
        finally:
            r.kill()
