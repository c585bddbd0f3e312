"""`coldstart checkpoint` refuses bad input in one line before it starts a server."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("addr, says", [("203.0.113.254", "cannot listen on 203.0.113.254:"), ("127.0.0.1", "is busy")])
def test_checkpoint_names_an_address_it_cannot_listen_on(tiny_model_dir, tmp_path, addr, says):
    """Before any server starts: an address not on this host, or a port taken, in one line; nothing written."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "checkpoint", str(tiny_model_dir),
                            "--out", str(tmp_path / "snap"), "--listen", addr, "--port", str(port)],
                           capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and says in p.stderr.strip().splitlines()[-1], p.stderr[-1000:]
    assert not (tmp_path / "snap").exists()


@pytest.mark.parametrize("value", ["thirty", "-1", "inf"])
def test_checkpoint_names_a_gate_hold_that_is_not_a_number(tiny_model_dir, tmp_path, value):
    """The restored server's gate reads it at its start: refused before that, in one line."""
    import os

    p = subprocess.run([str(Path(sys.executable).with_name("coldstart")), "checkpoint", str(tiny_model_dir),
                        "--out", str(tmp_path / "snap")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLDSTART_GATE_HOLD_S": value})
    assert p.returncode != 0 and f"COLDSTART_GATE_HOLD_S='{value}' is not a number" in p.stderr.strip().splitlines()[-1], \
        p.stderr[-1000:]
    assert not (tmp_path / "snap").exists()
