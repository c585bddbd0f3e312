"""Metrics fixtures: a real Prometheus + Pushgateway (Debian's packages) on free 127.0.0.1 ports,
started by scripts/start-observability for the session and stopped at the end."""
from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def observability(tmp_path_factory):
    """{"prometheus": url, "pushgateway": url} of a private Prometheus scraping a private Pushgateway."""
    for b in ("prometheus", "prometheus-pushgateway"):
        if shutil.which(b) is None:
            pytest.fail(f"{b} is not installed: run `make setup` (scripts/setup.d/40-observability.sh)")
    d = tmp_path_factory.mktemp("observability")
    argv = [str(ROOT / "scripts" / "start-observability"), "--dir", str(d), "--prometheus-port", str(free_port()),
            "--pushgateway-port", str(free_port())]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    env = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
    try:
        yield {"prometheus": env["PROMETHEUS_URL"], "pushgateway": env["PUSHGATEWAY_URL"], "dir": d}
    finally:
        subprocess.run([str(ROOT / "scripts" / "stop-observability"), "--dir", str(d)], capture_output=True,
                       timeout=60)
