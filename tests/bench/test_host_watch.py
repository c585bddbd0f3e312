"""A benchmark's host line names what else ran: a busy process outside the benchmark is seen, the
benchmark's own children are not."""
from __future__ import annotations

import subprocess
import sys
import time

from coldstart.bench.host import HostWatch


def test_a_busy_process_outside_the_benchmark_is_named_and_its_own_child_is_not() -> None:
    # the outer shell exits at once: its busy child is re-parented, no longer this process's descendant
    subprocess.run(["sh", "-c", "(exec timeout 4 sh -c 'while :; do :; done') >/dev/null 2>&1 &"], check=True)
    own = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 6\nwhile time.time() < end: pass"])
    w = HostWatch(every=0.5, min_cores=0.2).start()
    try:
        time.sleep(2.6)
    finally:
        w.stop()
        own.kill()
        own.wait()
    names = " ".join(w.heavy)
    assert "sh (" in names, w.heavy
    assert f"({own.pid})" not in names
    text = w.describe()
    assert "load average (1 min) over the run" in text and "sh (" in text


def test_an_idle_watch_says_none_seen() -> None:
    w = HostWatch(every=0.2, min_cores=50.0).start()  # nothing uses 50 cores
    time.sleep(0.5)
    w.stop()
    assert "none seen" in w.describe()


def _fake_reporting(tmp_path, monkeypatch, order: int, kib: int):
    from coldstart.bench import host

    d = tmp_path / "page_reporting"
    d.mkdir(exist_ok=True)
    (d / "page_reporting_order").write_text(f"{order}\n")
    (d / "reported_kib").write_text(f"{kib}\n")
    monkeypatch.setattr(host, "PAGE_REPORTING", d)
    return d


def test_the_line_says_how_much_memory_the_vm_handed_back(tmp_path, monkeypatch) -> None:
    # a kernel's sysfs files for the balloon's free page reporting, stood in by a directory: the real
    # ones are the VM's setting, which a test must not change
    d = _fake_reporting(tmp_path, monkeypatch, 9, 1 << 20)
    w = HostWatch(every=0.2, min_cores=50.0)
    (d / "reported_kib").write_text(f"{(1 << 20) + 3 * (1 << 20)}\n")  # 3 GiB reported since
    assert "free page reporting on (order 9): 3.0 GiB handed back" in w.describe()


def test_no_page_reporting_adds_nothing(tmp_path, monkeypatch) -> None:
    from coldstart.bench import host

    monkeypatch.setattr(host, "PAGE_REPORTING", tmp_path / "absent")
    assert host.page_reporting() is None
    assert "page reporting" not in HostWatch(every=0.2, min_cores=50.0).describe()


def test_memory_kept_turns_the_reporting_off_and_puts_it_back(tmp_path, monkeypatch) -> None:
    from coldstart.bench import host

    d = _fake_reporting(tmp_path, monkeypatch, 9, 0)
    monkeypatch.setattr(host, "_active", HostWatch(every=0.2, min_cores=50.0))  # this test's own, not the session's
    (d / "reported_kib").write_text(f"{2 << 20}\n")  # 2 GiB reported before (a benchmark's setup: builds)
    with host.memory_kept(margin=1 << 60, say=lambda m: None) as kept:  # (a margin above any memory: touches none)
        assert (d / "page_reporting_order").read_text().strip() == str(host.REPORTING_OFF_ORDER)
        assert kept == {"order_was": 9, "touched_bytes": 0}
    assert (d / "page_reporting_order").read_text().strip() == "9"
    line = host.watch().describe()
    assert "turned off for the measurements" in line
    # what the setup handed back is not told as handed back during the measurements
    assert "0.0 GiB handed back to the hypervisor while it was off, 2.0 GiB before or after" in line, line


def test_every_benchmark_that_drops_the_page_cache_can_keep_the_vms_memory() -> None:
    """bench container, lazy and mount, and the matrix, drop the page cache before their cold cases:
    each takes --keep-memory (the reporting off for the run), with the same help."""
    from typer.testing import CliRunner

    from coldstart.cli import app

    for cmd in (["bench", "container"], ["bench", "lazy"], ["bench", "mount"], ["matrix", "run"]):
        r = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (cmd, r.output)
        assert "--keep-memory" in r.output and "balloon reports free pages" in r.output, (cmd, r.output)


def test_a_benchmark_killed_with_sigterm_unwinds(tmp_path) -> None:
    """SIGTERM to a benchmark runs its finally blocks (where it stops the servers it started)."""
    mark = tmp_path / "unwound"
    code = ("import os, signal, sys, time\n"
            "from coldstart.bench.host import unwind_on_sigterm\n"
            "unwind_on_sigterm()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "finally:\n"
            "    open(sys.argv[1], 'w').write('stopped')\n")
    r = subprocess.run([sys.executable, "-c", code, str(mark)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and mark.read_text() == "stopped", r.stderr


def test_the_line_names_the_cpus_kind() -> None:
    from coldstart.bench import host

    intel = "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 143\nflags\t\t: avx2 avx512f avx512_bf16 amx_tile\n\n"
    amd = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fma avx2\n\nprocessor\t: 1\nflags: avx512f\n"
    assert host.cpu_kind(intel) == "family 6 model 143, AMX"
    assert host.cpu_kind(amd) == "family 25 model 1, AVX2"  # the first processor's, not the next one's
    assert host.cpu_kind("processor\t: 0\nFeatures\t: asimd\n") == ""
    if kind := host.cpu_kind():
        assert f"({kind})," in host.line()
