"""x86 dynamic xstate permission (Intel AMX) across a real CRIU dump + restore.

CRIU 4.2.1 does not carry the ARCH_REQ_XCOMP_PERM permission over a restore; a restored process
that then runs AMX code dies of SIGILL (what broke vLLM restores on AMX hosts). These tests pin our
criu patch 0008 (the permission kept) and the request the engine's workers make for snapshots
dumped without it (coldstart.engine.xstate).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coldstart.criu.dump import DumpOptions, dump
from coldstart.criu.restore import restore
from coldstart.engine import xstate

from .conftest import ropts, wait_until

XTILEDATA = 18


def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_missing_is_the_lost_dynamic_features_only():
    assert xstate.missing(0x600E7, now=0x200E7) == [XTILEDATA]
    assert xstate.missing(0x600E7, now=0x600E7) == []
    assert xstate.missing(0x2E7, now=0x0E7) == []  # static features are never asked for
    assert xstate.missing(None) == [] and xstate.restore_xcomp_perm(None) == []


def test_a_feature_the_cpu_cannot_grant_is_a_named_error():
    if xstate.xcomp_perm() is None:
        pytest.skip("no ARCH_GET_XCOMP_PERM here (not x86_64 Linux >= 5.16)")
    with pytest.raises(OSError, match=r"ARCH_REQ_XCOMP_PERM, 40\) refused"):
        xstate.restore_xcomp_perm(xstate.xcomp_perm() | 1 << 40)


def test_this_process_reports_its_permissions():
    perm = xstate.xcomp_perm()
    if perm is None:
        pytest.skip("no ARCH_GET_XCOMP_PERM here (not x86_64 Linux >= 5.16)")
    assert perm & 0b11 == 0b11  # x87 and SSE are always permitted


def test_a_fresh_process_asks_for_amx_where_the_cpu_has_it():
    """What the engine's worker does at start: vLLM's attention kernel uses AMX without asking."""
    code = "from coldstart.engine import xstate; b = xstate.xcomp_perm(); print(xstate.ask_amx(), b, xstate.xcomp_perm())"
    asked, before, after = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                          text=True).stdout.split()
    if not _has_amx() or before == "None":
        assert asked == "False"
        return
    assert asked == "True" and not int(before) >> XTILEDATA & 1 and int(after) >> XTILEDATA & 1


PROG = r"""
import sys, time
from pathlib import Path
from coldstart.engine import xstate
out = Path(sys.argv[1])
xstate.ask_amx()
recorded = xstate.xcomp_perm()
fixed = False
while True:
    if not fixed and (out.parent / "fix").exists():
        xstate.restore_xcomp_perm(recorded)
        fixed = True
    out.write_text(f"{recorded} {xstate.xcomp_perm()} {int(fixed)}")
    time.sleep(0.05)
"""


def _start(state: Path) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-c", PROG, str(state)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    assert wait_until(lambda: state.exists() and state.read_text().count(" ") == 2, 30)
    recorded = int(state.read_text().split()[0])
    assert recorded >> XTILEDATA & 1, "the program could not get the AMX permission"
    return p, recorded


def _dump_and_restore(tmp_path: Path, state: Path, variant: str, has_mmap: bool):
    p, recorded = _start(state)
    try:
        dump(p.pid, tmp_path / "images", DumpOptions(variant=variant))
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    state.unlink()
    mode = "mmap" if variant == "patched" and has_mmap else "stock"
    r = restore(tmp_path / "images", ropts(mode, work_dir=tmp_path / "work"))
    assert wait_until(lambda: state.exists() and state.read_text().count(" ") == 2, 30)
    return r, recorded


@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX (no dynamic xstate feature to lose)")
def test_stock_criu_drops_the_amx_permission_and_the_process_gets_it_back(tmp_path, has_mmap):
    """Stock CRIU 4.2.1: the restored process has lost XTILEDATA; restore_xcomp_perm (what our
    workers run at restore) asks for it again."""
    state = tmp_path / "state"
    r, recorded = _dump_and_restore(tmp_path, state, "stock", has_mmap)
    try:
        rec, now, fixed = (int(x) for x in state.read_text().split())
        assert rec == recorded and not fixed
        assert not now >> XTILEDATA & 1, "stock criu kept the AMX permission: this test's premise changed"
        (tmp_path / "fix").touch()
        assert wait_until(lambda: state.read_text().endswith(" 1"), 30)
        rec, now, fixed = (int(x) for x in state.read_text().split())
        assert now >> XTILEDATA & 1, "permission not back after restore_xcomp_perm"
    finally:
        r.kill()


@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX (no dynamic xstate feature to lose)")
def test_patched_criu_keeps_the_amx_permission(tmp_path, has_mmap):
    """Our patch 0008: the dump saves the permission mask, the restorer asks for it again."""
    state = tmp_path / "state"
    r, recorded = _dump_and_restore(tmp_path, state, "patched", has_mmap)
    try:
        rec, now, fixed = (int(x) for x in state.read_text().split())
        assert rec == recorded and not fixed
        assert now == recorded, f"xstate permission {now:#x} after restore, {recorded:#x} before"
    finally:
        r.kill()
