"""A snapshot taken inside a container and restored in a new container from a read-only mount serves
the canary's completion through the host's port (broad security settings for now: docs/containers.md)."""
from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.request

import pytest

from coldstart.containers import run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def container_snapshot(docker_client, app_image, tiny_model_dir, tmp_path_factory):
    port = _free_port()
    res = run.checkpoint(docker_client, app_image.tag, tiny_model_dir, tmp_path_factory.mktemp("csnap") / "tiny",
                         port=port)
    assert res.exit_code == 0, res.logs[-3000:]
    assert (res.snapshot / "manifest.json").exists()
    yield res.snapshot, port
    shutil.rmtree(res.snapshot.parent, ignore_errors=True)  # 2.4 GB: pytest keeps three sessions' tmp dirs


def _completion(port: int, model: str) -> dict:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_restore_in_a_new_container_from_a_read_only_mount(docker_client, app_image, container_snapshot,
                                                           tiny_model_dir):
    snap, port = container_snapshot
    ctr = run.start_restore(docker_client, app_image.tag, snap, tiny_model_dir)
    try:
        deadline = time.monotonic() + 240
        logs = ""
        while time.monotonic() < deadline:
            logs = ctr.logs().decode(errors="replace")
            if '"restored": ' in logs:
                break
            ctr.reload()
            assert ctr.status in ("created", "running"), logs[-3000:]
            time.sleep(0.2)
        summary = json.loads(next(ln for ln in logs.splitlines() if ln.startswith('{"url"')))
        assert summary["restored"] is True and summary["canary_ok"] is True, logs[-3000:]
        out = _completion(port, str(tiny_model_dir))
        assert out["choices"][0]["text"], out
    finally:
        ctr.remove(force=True)
