"""Fixtures for the CRIU tests: real criu as root, compiled test programs, shared dumps.

Expensive things (a 1 GiB dump) are made once per session and restored many times; every
restore is killed by the test that made it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from coldstart.criu.dump import DumpOptions, dump
from coldstart.criu.restore import RestoreOptions, RestoreResult, alive, restore
from coldstart.criu.testprog import Ctl, build

PROGS = Path(__file__).with_name("progs")
GIB = 1024  # MiB
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")

if os.geteuid() != 0:
    pytest.skip("CRIU tests need root", allow_module_level=True)


@pytest.fixture(autouse=True)
def _restores_work_in_tmp_path(tmp_path, monkeypatch):
    """A restore without a work dir makes its own temp dir (restore.log, pidfile) and leaves it for
    the caller to read: here that lands in the test's tmp_path, which pytest prunes, not in /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture(scope="session")
def criu_paths() -> dict[str, Path]:
    from coldstart.criu.locate import find_criu

    return {v: find_criu(v) for v in ("stock", "patched")}


@pytest.fixture(scope="session")
def has_mmap(criu_paths) -> bool:
    from coldstart.criu.locate import criu_supports_mmap

    return criu_supports_mmap(criu_paths["patched"])


@pytest.fixture(params=["stock", "mmap"])
def restore_mode(request, has_mmap) -> str:
    """Every round-trip test runs with the stock copy restore and with the mmap restore."""
    if request.param == "mmap" and not has_mmap:
        pytest.skip("the patched criu has no --mmap-pages yet (patches/criu)")
    return request.param


def ropts(mode: str, **kw) -> RestoreOptions:
    """Restore options for a mode. Tests restore into a fresh PID namespace by default: on this
    shared host (pid_max 32768, busy teammates) a dumped PID or TID is often reused within minutes."""
    kw.setdefault("pidns", True)
    if mode == "stock":
        return RestoreOptions(variant="stock", **kw)
    return RestoreOptions(variant="patched", mmap_pages=0, **kw)


DUMP = dict(variant="stock")


@pytest.fixture(scope="session")
def bins(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bin")
    return {
        "memhold": build("memhold.c", d),
        "alloc_stress": build(PROGS / "alloc_stress.c", d),
        "tcpecho": build(PROGS / "tcpecho.c", d),
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def pages_digest(images: Path) -> str:
    return "".join(sha256(p) for p in sorted(images.glob("pages-*.img")))


def marked(marker: str) -> list[int]:
    """PIDs of live processes whose command line contains `marker` (a test's unique ctl dir)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and alive(int(d)):
            out.append(int(d))
    return out


class Held:
    """A dumped test program: its image dir, ctl channel and what it answered before the dump."""

    def __init__(self, images: Path, ctl: Ctl, facts: dict):
        self.images, self.ctl, self.facts = images, ctl, facts

    def restore(self, opts: RestoreOptions) -> RestoreResult:
        return restore(self.images, opts)


def start_and_dump(bin_: Path, args: list[str], work: Path, before: list[str] | None = None,
                   env: dict | None = None, leave_running: bool = False):
    ctl = Ctl(work / "ctl")
    p, ready = ctl.start([str(bin_), *args, str(ctl.dir)] if args is not None else [str(bin_)], env=env)
    facts = {"ready": ready, "pid": p.pid}
    try:
        for cmd in before or []:
            facts[cmd] = ctl.request(p.pid, cmd)
        r = dump(p.pid, work / "images", DumpOptions(leave_running=leave_running, **DUMP))
    except BaseException:
        # a failed dump leaves the tree running: never leak it (the tree may have children)
        from coldstart.criu.restore import descendants

        for pid in [p.pid] + descendants(p.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        p.wait(30)
        raise
    facts["dump"] = r
    if not leave_running:
        p.wait(30)
    facts["proc"] = p
    return Held(work / "images", ctl, facts)


@pytest.fixture(scope="session")
def mem1g(bins, tmp_path_factory) -> Held:
    """memhold with 1 GiB of known pseudo-random data, digest taken, then dumped (and killed)."""
    work = tmp_path_factory.mktemp("mem1g")
    held = start_and_dump(bins["memhold"], [str(GIB), "11"], work, before=["digest"])
    held.facts["pages_sha"] = pages_digest(held.images)
    return held


@pytest.fixture(scope="session")
def mem64(bins, tmp_path_factory) -> Held:
    """A small memhold dump for the failure tests (copied and damaged per test)."""
    work = tmp_path_factory.mktemp("mem64")
    return start_and_dump(bins["memhold"], ["64", "5"], work, before=["digest"])


def wait_until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def copy_images(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
