"""Bad paths given to the container commands: one clear line, a non-zero exit, before any image build
or container, and no directory left behind (docker creates a missing bind-mount source)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from coldstart.engine.launcher import free_port


@pytest.mark.parametrize("args, says", [  # (a free --port: a server on the default 8000 is no bad path)
    (["container", "restore", "{missing}", "--model", "{model}", "--port", "{port}"],
     "snapshot {missing}: no such directory"),
    (["container", "restore", "{tmp}", "--model", "{missing}", "--port", "{port}"], "model {missing} not found"),
    (["container", "run-cold", "{missing}", "--port", "{port}"], "model {missing} not found"),
    (["container", "checkpoint", "{missing}", "--out", "{tmp}/snap"], "model {missing} not found"),
    (["container", "restore", "{tmp}", "--model", "{model}", "--port", "{port}", "--verify", "some"],
     "--verify 'some': not one of auto, full, off"),
])
def test_a_missing_path_is_one_line_and_creates_nothing(tmp_path, args, says):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    missing = tmp_path / "no-such-dir"
    fill = {"missing": missing, "model": model, "tmp": tmp_path, "port": free_port()}
    p = subprocess.run([sys.executable, "-m", "coldstart", *(a.format(**fill) for a in args),
                        "--host", "unix:///nonexistent/docker.sock"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, p
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says.format(**fill) in lines[0], p.stderr
    assert not missing.exists()


@pytest.mark.parametrize("cmd", [["container", "restore", "{tmp}", "--model", "{model}"],
                                 ["container", "run-cold", "{model}"], ["container", "pod"]])
def test_a_busy_port_is_one_line_before_any_container(tmp_path, cmd):
    import socket

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "coldstart", *(a.format(tmp=tmp_path, model=model) for a in cmd),
                            "--port", str(port), "--host", "unix:///nonexistent/docker.sock"],
                           capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and len(lines) == 1 and f"port {port} on 127.0.0.1 is busy" in lines[0], p.stderr


def test_a_restore_container_that_exits_without_its_summary_line_is_one_line_naming_it(docker_client, app_image,
                                                                                        tmp_path):
    """`container restore` follows the entrypoint until its summary line; an entrypoint that dies
    before printing one is named at once with its reason, not waited for until the deadline."""
    import time

    from coldstart.containers import run
    from coldstart.errors import ColdstartError

    snap, model = tmp_path / "snap", tmp_path / "model"
    snap.mkdir()
    model.mkdir()
    (model / "config.json").write_text("{}")
    ctr = run.create_restore(docker_client, app_image.tag, snap, model, free_port(), node=False,
                             entrypoint=["sh", "-c", "echo 'RuntimeError: the entrypoint broke' >&2; exit 3"])
    try:
        run.start(ctr)
        with pytest.raises(ColdstartError) as e:
            run.summary(ctr, time.monotonic() + 900)
        msg = str(e.value)  # the exit named (the deadline's line says "before the deadline")
        assert ctr.name in msg and "exited" in msg and "RuntimeError: the entrypoint broke" in msg, msg
    finally:
        ctr.remove(force=True)
