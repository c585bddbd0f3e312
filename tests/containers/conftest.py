"""A real dockerd for the container tests (scripts/start-docker: its own data root and socket; left
running for the next session, like the image cache it holds)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_host() -> str:
    """The address of our dockerd (started if it is not running)."""
    p = subprocess.run([str(REPO / "scripts" / "start-docker")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split("=", 1)[1]


@pytest.fixture(scope="session")
def docker_client(docker_host):
    from coldstart.containers import docker_api

    return docker_api.client(docker_host)


@pytest.fixture(scope="session")
def app_image(docker_client):
    """The runtime image (built once per machine and input change; cached by dockerd)."""
    from coldstart.containers import image

    return image.app_image(docker_client, REPO, say=print)
