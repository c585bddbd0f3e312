"""Round trips through the real criu: stock copy restore and mmap restore give the same memory."""
from __future__ import annotations

import socket

import pytest

from coldstart.criu.images import image_facts
from coldstart.criu.restore import alive

from .conftest import GIB, pages_digest, ropts, start_and_dump, wait_until


def test_image_facts_of_1gib_dump(mem1g):
    f = image_facts(mem1g.images)
    assert f.n_processes == 1
    assert f.root_pid == mem1g.facts["pid"]
    assert f.pages_bytes >= GIB << 20
    assert f.pages_bytes == mem1g.facts["dump"].pages_bytes


def test_roundtrip_1gib_same_digest(mem1g, restore_mode):
    r = mem1g.restore(ropts(restore_mode))
    try:
        assert r.ns_pid == mem1g.facts["pid"]
        assert mem1g.ctl.request(r.pid, "digest") == mem1g.facts["digest"]
        assert mem1g.ctl.request(r.pid, "verify") == "ok"
    finally:
        r.kill()


def test_writes_never_change_image_and_second_restore_works(mem1g, restore_mode):
    """Writes after a (mmap) restore stay private: the image is byte-identical afterwards."""
    r = mem1g.restore(ropts(restore_mode))
    try:
        new = mem1g.ctl.request(r.pid, "write 424242")  # rewrites every page
        assert new != mem1g.facts["digest"]
        assert mem1g.ctl.request(r.pid, "digest") == new
    finally:
        r.kill()
    assert pages_digest(mem1g.images) == mem1g.facts["pages_sha"]
    r2 = mem1g.restore(ropts(restore_mode))
    try:
        assert mem1g.ctl.request(r2.pid, "digest") == mem1g.facts["digest"]
    finally:
        r2.kill()


def test_madv_dontneed_after_restore(mem1g, restore_mode):
    """A range the restored process releases with MADV_DONTNEED and touches again.

    Anonymous memory (stock restore) reads back as zeros. After an mmap restore the range is a
    private file mapping of pages-*.img, and the kernel refills it from the file: the process
    sees the bytes it had at dump time, never anything else (documented in docs/criu.md).
    """
    r = mem1g.restore(ropts(restore_mode))
    try:
        got = mem1g.ctl.request(r.pid, f"madv {1 << 20} {4 << 20}")
        # stock: anonymous memory; mmap: patches/criu 0003 documents "image bytes, not zeroes"
        assert got == ("zeros" if restore_mode == "stock" else "image"), got
        # the rest of the region is untouched by the madvise
        assert mem1g.ctl.request(r.pid, "ping").startswith("ok")
    finally:
        r.kill()


def test_restore_in_new_pidns_while_original_alive(bins, tmp_path, restore_mode):
    held = start_and_dump(bins["memhold"], ["64", "21"], tmp_path, before=["digest"], leave_running=True)
    orig = held.facts["proc"]
    try:
        r = held.restore(ropts(restore_mode, pidns=True))
    except BaseException:
        orig.kill()
        orig.wait()
        raise
    try:
        assert orig.poll() is None and alive(orig.pid)
        assert r.pid != orig.pid and r.ns_pid == orig.pid
        assert held.ctl.request(r.pid, "digest") == held.facts["digest"]
        changed = held.ctl.request(r.pid, "write 7")
        assert changed != held.facts["digest"]
        # two distinct processes: the original still holds its own data
        assert held.ctl.request(orig.pid, "digest") == held.facts["digest"]
    finally:
        r.kill()
        orig.kill()
        orig.wait()
    assert wait_until(lambda: not alive(r.pid))


@pytest.fixture(scope="module")
def tcp_held(bins, tmp_path_factory):
    """tcpecho: server (root) + client child with an established loopback connection, dumped."""
    work = tmp_path_factory.mktemp("tcp")
    held = start_and_dump(bins["tcpecho"], [], work)
    _, child, parent, port = held.facts["ready"].split()
    held.facts.update(child=int(child), parent=int(parent), port=int(port))
    return held


def test_tcp_tree_image_has_two_processes(tcp_held):
    f = image_facts(tcp_held.images)
    assert f.n_processes == 2
    assert set(f.pids) == {tcp_held.facts["child"], tcp_held.facts["parent"]}


def test_tcp_listening_and_established_survive_restore(tcp_held, restore_mode):
    r = tcp_held.restore(ropts(restore_mode))
    try:
        assert r.ns_pid == tcp_held.facts["parent"]
        child = r.host_pid(tcp_held.facts["child"])
        # the connection that existed at dump time still works, in both directions
        for _ in range(2):
            got = tcp_held.ctl.request(child, "ping", timeout=30)
            assert got.startswith(f"ok echo {tcp_held.facts['parent']} hello"), got
        # and the restored listening socket accepts new connections
        with socket.create_connection(("127.0.0.1", tcp_held.facts["port"]), timeout=10) as s:
            s.sendall(b"new client\n")
            assert s.makefile().readline().strip() == f"echo {tcp_held.facts['parent']} new client"
    finally:
        r.kill()


def test_detached_restore_without_pidns(mem64):
    """The fastest mode (criu -d, dumped PIDs reused on the host); skipped if a PID was taken."""
    from coldstart.errors import ColdstartError

    try:
        r = mem64.restore(ropts("stock", pidns=False))
    except ColdstartError as e:
        if "in use" in str(e) or "File exists" in str(e):
            pytest.skip(f"dumped pid reused on this busy host: {e}")
        raise
    try:
        assert r.pid == r.ns_pid == mem64.facts["pid"] and r.process is None
        assert mem64.ctl.request(r.pid, "digest") == mem64.facts["digest"]
    finally:
        r.kill()
