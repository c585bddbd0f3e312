"""`coldstart restore`, the container entrypoint, as a process: its own light parser, nothing heavy
imported before the restore starts, one clear line for a bad snapshot."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COLDSTART = str(Path(sys.executable).with_name("coldstart"))


def test_restore_imports_neither_the_cli_nor_http_nor_tables(tmp_path):
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "coldstart", "restore", str(tmp_path / "missing"),
                        "--no-fallback", "--no-serve"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    errors = [ln for ln in p.stderr.splitlines() if not ln.startswith("import time:")]
    assert errors == [f"error: snapshot directory {tmp_path / 'missing'} does not exist"], errors
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    assert "coldstart.pipeline.restore" in imported
    for heavy in ("typer", "pydantic", "rich", "requests", "torch", "vllm", "importlib.metadata"):
        assert heavy not in imported, heavy


def test_console_script_and_typer_cli_both_reach_the_entrypoint(tmp_path):
    h = subprocess.run([COLDSTART, "restore", "--help"], capture_output=True, text=True, timeout=120)
    assert h.returncode == 0 and "--no-fallback" in h.stdout and "COLDSTART_VERIFY" in h.stdout
    # the typer CLI's `restore` forwards to the same parser (python -m coldstart.cli restore ...)
    p = subprocess.run([sys.executable, "-m", "coldstart.cli", "restore", str(tmp_path / "gone"), "--no-fallback"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip() == f"error: snapshot directory {tmp_path / 'gone'} does not exist"
    bad = subprocess.run([COLDSTART, "restore", "--verify", "sometimes"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'sometimes'" in bad.stderr


def test_a_bad_setting_from_the_environment_is_refused_like_one_on_the_command_line(tmp_path):
    """A container's settings come from its environment (the image's ENV, a pod spec): argparse checks
    choices only for values typed on the command line, so the entrypoint checks the others, before
    any restore (a bad COLDSTART_VERIFY used to reach the restore and cold-boot silently)."""
    for var, value, says in (("COLDSTART_VERIFY", "sometimes", "COLDSTART_VERIFY='sometimes': not one of auto, full, off"),
                             ("COLDSTART_RESTORE_NET", "bridge", "COLDSTART_RESTORE_NET='bridge': not one of auto, host, private"),
                             ("COLDSTART_PORT", "abc", "argument --port: invalid int value: 'abc'")):
        p = subprocess.run([COLDSTART, "restore", str(tmp_path / "missing")], capture_output=True, text=True,
                           timeout=120, env={**os.environ, var: value})
        assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith(says), p.stderr
    h = subprocess.run([COLDSTART, "restore", "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLDSTART_PORT": "abc"})
    assert h.returncode == 0 and "COLDSTART_PORT" in h.stdout  # --help still answers


def test_clock_started_by_the_entrypoint_itself_puts_its_exec_at_zero(monkeypatch):
    """No COLDSTART_T0 from outside: the entrypoint sets it to its own exec time, and ENTRYPOINT_START
    must then be exactly 0 (two readings of the exec time differed by a microsecond)."""
    from coldstart.pipeline.events import Timeline, exec_wall_time

    for _ in range(50):
        monkeypatch.setenv("COLDSTART_T0", repr(exec_wall_time()))
        ev = {e.name: e.t for e in Timeline.from_container_start("restore").events}
        assert ev["ENTRYPOINT_START"] == 0 and ev["ENTRY_READY"] >= 0, ev


def test_the_entrypoints_first_line_of_python_is_marked_between_its_exec_and_ready(monkeypatch):
    """A container's entrypoint process is created (runc's init) well before it execs: ENTRY_PYTHON
    says when our first line ran, so that docker's start and the interpreter's are not counted as ours."""
    from coldstart.pipeline.events import PYTHON_T_ENV, Timeline, exec_wall_time

    t0 = exec_wall_time() - 0.5  # as if the host's create call came half a second before the exec
    monkeypatch.setenv("COLDSTART_T0", repr(t0))
    monkeypatch.setenv(PYTHON_T_ENV, repr(t0 + 0.7))
    ev = {e.name: e.t for e in Timeline.from_container_start("restore").events}
    assert list(ev) == ["CONTAINER_START", "ENTRYPOINT_START", "ENTRY_PYTHON", "ENTRY_READY"], ev
    assert abs(ev["ENTRYPOINT_START"] - 0.5) < 0.02 and abs(ev["ENTRY_PYTHON"] - 0.7) < 1e-6, ev
    monkeypatch.delenv(PYTHON_T_ENV)  # not run as `coldstart` (e.g. imported by another program): no event
    assert "ENTRY_PYTHON" not in {e.name for e in Timeline.from_container_start("restore").events}
    monkeypatch.setenv(PYTHON_T_ENV, repr(t0 + 0.1))  # before this process's exec: a parent's, inherited
    assert "ENTRY_PYTHON" not in {e.name for e in Timeline.from_container_start("restore").events}


def test_host_root_is_found_while_helpers_come_and_go():
    """launcher → CRIU's init → the restored root, and beside the root helpers that exit and are
    reaped at any moment: a helper gone between the listing and the look at it must not make the
    restored tree look absent (_host_root returned 0 on that race: a fallback)."""
    import time

    from coldstart.pipeline.restore import _host_root

    # the root, and short-lived helpers all the time (three at once: the old code returned 0 in
    # about one call of eight)
    init = "sleep 30 & while :; do /bin/true & /bin/true & /bin/true & wait $!; done"
    import psutil

    launcher = subprocess.Popen(["sh", "-c", f"sh -c '{init}'; :"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the root is up
            kids = psutil.Process(launcher.pid).children()
            if kids and any(c.name() == "sleep" for c in kids[0].children()):
                break
            time.sleep(0.01)
        root = next(c.pid for c in psutil.Process(launcher.pid).children()[0].children() if c.name() == "sleep")
        found, t0 = set(), time.monotonic()
        while time.monotonic() - t0 < 3:
            found.add(_host_root(launcher.pid, settle=5.0))
        assert found == {root}
    finally:
        for p in psutil.Process(launcher.pid).children(recursive=True):
            try:
                p.kill()
            except psutil.NoSuchProcess:  # a helper that exited since the listing: the race under test
                pass
        launcher.kill()
        launcher.wait()


def test_command_lists_show_each_commands_first_sentence_on_one_line():
    """`coldstart --help` and a group's --help list a command by its docstring's first sentence
    (typer alone printed the whole first paragraph, with its hard line breaks)."""
    env = {**os.environ, "COLUMNS": "400"}
    top = subprocess.run([COLDSTART, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert top.returncode == 0
    row = next(ln for ln in top.stdout.splitlines() if ln.strip("│ ").startswith("restore "))
    assert row.split("restore", 1)[1].strip(" │") == \
        "Restore a snapshot and serve (the container entrypoint); any failure → cold boot, reason printed."
    assert "Credentials" not in top.stdout  # push's later sentences stay in `coldstart push --help`
    snap = subprocess.run([COLDSTART, "snapshot", "--help"], capture_output=True, text=True, timeout=120, env=env)
    row = next(ln for ln in snap.stdout.splitlines() if ln.strip("│ ").startswith("verify "))
    assert row.split("verify", 1)[1].strip(" │") == \
        "Check every file's digests now and remember the result on this node (restores then skip it)."


def test_a_failed_restores_criu_log_outlives_its_directory(tmp_path, monkeypatch):
    """The error names a copy under the state dir's failed/ (the latest FAILED_LOGS_KEPT): the
    restore's own directory, where CRIU wrote the log, is removed as the restore fails."""
    from coldstart.pipeline import restore as r

    monkeypatch.setenv("COLDSTART_STATE_DIR", str(tmp_path / "state"))
    log = tmp_path / "restore.log"
    for n in range(r.FAILED_LOGS_KEPT + 3):
        log.write_text(f"Error (criu/files.c:1221): attempt {n}\n")
        kept = r._keep_failed_log(log, f"snap-{n}")
        os.utime(kept, (n, n))  # one per second, oldest first
    assert kept == tmp_path / "state" / "failed" / f"snap-{r.FAILED_LOGS_KEPT + 2}-restore.log"
    assert kept.read_text() == log.read_text()
    assert len(list(kept.parent.iterdir())) == r.FAILED_LOGS_KEPT and not (kept.parent / "snap-0-restore.log").exists()
    assert r._keep_failed_log(tmp_path / "gone.log", "x") == tmp_path / "gone.log"  # nothing to copy: as it was


def test_a_failed_restore_names_the_first_error_of_criu_s_log(tmp_path, monkeypatch):
    """When one restored task fails, the others fail after it and CRIU's last lines are theirs: the
    one line names the first error, which restore() matches to retry in a private network."""
    from coldstart.pipeline import restore as r

    monkeypatch.setenv("COLDSTART_STATE_DIR", str(tmp_path / "state"))
    log = tmp_path / "restore.log"
    log.write_text("(00.1) 85: Error (criu/sk-inet.c:1003): Can't connect inet socket back: Address already in use\n"
                   "(00.2) 59: Error (criu/files.c:1104): Can't sent fd 31 to 85\n"
                   "(00.2) 59: Error (criu/files.c:1221): Unable to open fd=31 id=0xe1\n"
                   "(00.3) Error (criu/cr-restore.c:1269): 59 exited, status=1\n"
                   "(00.3) Error (criu/cr-restore.c:2335): Restoring FAILED.\n")
    said = r._criu_failure(log, "", "snap-1")
    assert said.startswith(f"criu restore failed (log {tmp_path / 'state' / 'failed' / 'snap-1-restore.log'}): "
                           "Can't connect inet socket back: Address already in use"), said
    assert r._criu_failure(tmp_path / "none.log", "criu: not found", "x").endswith("): criu: not found")
