"""The gate a snapshot's server holds its port closed with (vLLM's --middleware): until a restore
opens it from loopback, clients from the network get 503 and loopback clients (the restore's own
checks) pass; after it, everyone passes. Driven through a real ASGI stack (Starlette, as vLLM's
FastAPI app), clients given their source addresses."""
from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from coldstart.engine import gate
from coldstart.engine.launcher import EngineSpec


@pytest.fixture()
def app():
    gate._state["open"] = False
    ok = lambda request: JSONResponse({"data": ["m"]})  # noqa: E731
    a = Starlette(routes=[Route("/v1/models", ok), Route("/sleep", ok, methods=["POST"])])
    a.add_middleware(gate.Gate)
    yield a
    gate._state["open"] = False


def _client(app, host: str) -> TestClient:
    return TestClient(app, client=(host, 40000))


def test_network_clients_wait_for_the_gate_loopback_ones_do_not(app):
    remote, local = _client(app, "172.18.0.1"), _client(app, "127.0.0.1")
    closed = remote.get("/v1/models")
    assert closed.status_code == 503 and closed.headers["retry-after"] == "1"
    assert "canary" in closed.json()["error"]["message"]
    assert local.get("/v1/models").json() == {"data": ["m"]}
    assert local.get(gate.STATE_PATH).json() == {"open": False}
    assert remote.post(gate.OPEN_PATH).status_code == 503  # the network cannot open it
    assert local.post(gate.OPEN_PATH).json() == {"open": True}
    assert remote.get("/v1/models").json() == {"data": ["m"]}
    # vLLM's dev-mode routes (sleep, wake, collective_rpc) stay loopback-only
    assert remote.post("/sleep").status_code == 403 and local.post("/sleep").status_code == 200


def test_dev_routes_stay_closed_under_a_root_path():
    """vLLM's --root-path: the request's path may carry it (uvicorn passes it through, Starlette strips
    it to route); either way the dev route is closed to the network."""
    gate._state["open"] = True
    try:
        for path in ("/sleep", "/sleep/", "/api/sleep", "/api/sleep/"):
            assert asyncio.run(_status(gate.Gate(_ok), path, root_path="/api")) == 403, path
        assert asyncio.run(_status(gate.Gate(_ok), "/api/v1/models", root_path="/api")) == 200
    finally:
        gate._state["open"] = False


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _status(app, path: str, root_path: str = "") -> int:
    """One request from the network through ``app`` (raw ASGI, as uvicorn sends it); its status."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    await app({"type": "http", "method": "POST", "path": path, "root_path": root_path, "headers": [],
               "client": ("172.18.0.1", 40000)}, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_the_dev_routes_are_the_installed_vllms():
    from fastapi import FastAPI
    from vllm.entrypoints.rl.factories import register_rl_api_routers
    from vllm.entrypoints.serve import register_vllm_dev_api_routers

    app = FastAPI()
    before = {r.path for r in app.routes}
    register_vllm_dev_api_routers(app)
    register_rl_api_routers(app)
    assert {r.path for r in app.routes} - before == gate.DEV_PATHS


def test_loopback_addresses():
    from coldstart.netutil import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1", "localhost",
                                        "localhost:5000", "127.0.0.1:5000", "[::1]:5000", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "172.18.0.1", "::", "10.1.2.3", "registry.example:5000",
                                            "10.0.0.1:5000", "[2001:db8::1]:5000", "fe80::1"))


def test_only_a_gated_spec_passes_the_middleware_to_vllm(tmp_path):
    plain = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r").vllm_args()
    gated = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r", host="0.0.0.0", gate=True).vllm_args()
    assert "--middleware" not in plain
    assert gated[gated.index("--middleware") + 1] == gate.IMPORT_PATH == f"{gate.__name__}.{gate.Gate.__name__}"
