"""`coldstart criu check|dump|restore` end to end through the real CLI."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from coldstart.criu.testprog import Ctl

from .conftest import marked, wait_until

CS = [sys.executable, "-m", "coldstart.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CS, *args], capture_output=True, text=True, timeout=300)


def test_check_both_variants():
    stock = run("criu", "check", "--variant", "stock")
    assert stock.returncode == 0, stock.stderr
    assert "version:     4.2.1" in stock.stdout and "mmap-pages:  no" in stock.stdout
    assert "Looks good" in stock.stdout
    patched = run("criu", "check")
    assert patched.returncode == 0 and "mmap-pages:  yes" in patched.stdout, patched.stdout + patched.stderr


def test_dump_and_restore_in_pidns(bins, tmp_path):
    ctl = Ctl(tmp_path / "ctl")
    p, _ = ctl.start([str(bins["memhold"]), "16", "4", str(ctl.dir)])
    digest = ctl.request(p.pid, "digest")
    d = run("criu", "dump", str(p.pid), str(tmp_path / "img"))
    if d.returncode != 0:
        p.kill()
    assert d.returncode == 0, d.stderr
    p.wait(30)
    again = run("criu", "dump", "1", str(tmp_path / "img"))
    assert again.returncode == 1 and again.stderr.startswith("error: ") and "already exists" in again.stderr
    r = run("criu", "restore", str(tmp_path / "img"), "--pidns", "--work-dir", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    m = re.match(r"restored pid (\d+), pid (\d+) in its namespace", r.stdout)
    assert m and int(m.group(2)) == p.pid, r.stdout
    host = int(m.group(1))
    try:
        assert ctl.request(host, "digest") == digest
    finally:
        os.kill(host, 9)
    assert wait_until(lambda: not marked(str(ctl.dir)))


def test_restore_error_is_one_line(tmp_path):
    r = run("criu", "restore", str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: criu restore of"), r.stderr
