"""The gate on our servers' port (vLLM's --middleware): vLLM's dev-mode routes answer only requests
with the server's control token; a snapshot's server answers nothing else until a restore, with the
token, opens it; after that everyone passes. A server without a token (a snapshot from before it)
trusts loopback instead. Driven through a real ASGI stack (Starlette, as vLLM's FastAPI app),
clients given their source addresses."""
from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from coldstart.engine import gate
from coldstart.engine.launcher import EngineSpec


TOKEN = "s3cret-token"


@pytest.fixture()
def app(monkeypatch):
    saved = dict(gate._state)
    gate._state.update(open=False, token=b"")
    monkeypatch.setattr(gate, "HOLD_S", 0)  # what a closed gate answers once its hold is over, at once
    ok = lambda request: JSONResponse({"data": ["m"]})  # noqa: E731
    a = Starlette(routes=[Route("/v1/models", ok), Route("/sleep", ok, methods=["POST"])])
    a.add_middleware(gate.Gate)
    yield a
    gate._state.update(saved)


def _client(app, host: str, token: str | None = None) -> TestClient:
    return TestClient(app, client=(host, 40000), headers={gate.TOKEN_HEADER: token} if token else None)


def test_only_the_control_token_passes_a_closed_gate_and_the_dev_routes(app):
    """Loopback is no proof: a private network's forwarder relays the network from loopback, and a
    pod's sidecars share it."""
    gate._state["token"] = TOKEN.encode()
    remote, local = _client(app, "172.18.0.1"), _client(app, "127.0.0.1")
    ours, wrong = _client(app, "127.0.0.1", TOKEN), _client(app, "127.0.0.1", "s3cret-tokem")
    for c in (remote, local, wrong):
        assert c.get("/v1/models").status_code == 503
        assert c.get(gate.STATE_PATH).status_code == 403 and c.post(gate.OPEN_PATH).status_code == 403
        assert c.post("/sleep").status_code == 403
    assert ours.get("/v1/models").json() == {"data": ["m"]} and ours.post("/sleep").status_code == 200
    assert ours.get(gate.STATE_PATH).json() == {"open": False}
    assert _client(app, "172.18.0.1", TOKEN).post(gate.OPEN_PATH).json() == {"open": True}  # any address
    for c in (remote, local, wrong):
        assert c.get("/v1/models").json() == {"data": ["m"]}
        assert c.post("/sleep").status_code == 403 and c.post(gate.OPEN_PATH).status_code == 403
    assert ours.post("/sleep").status_code == 200


def test_without_a_token_loopback_is_trusted(app):
    """A server started before the token (an older snapshot): the gate as it was then."""
    remote, local = _client(app, "172.18.0.1"), _client(app, "127.0.0.1")
    closed = remote.get("/v1/models")
    assert closed.status_code == 503 and closed.headers["retry-after"] == "1"
    assert "canary" in closed.json()["error"]["message"]
    assert local.get("/v1/models").json() == {"data": ["m"]}
    assert local.get(gate.STATE_PATH).json() == {"open": False}
    assert remote.post(gate.OPEN_PATH).status_code == 403  # the network cannot open it
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


def test_a_closed_gate_holds_a_request_until_it_opens(monkeypatch):
    """A client that connects while the restore checks its canary gets its answer when the gate opens,
    not a 503 to retry on; one held longer than HOLD_S gets the 503; dev routes are refused at once."""
    monkeypatch.setitem(gate._state, "open", False)
    monkeypatch.setitem(gate._state, "token", TOKEN.encode())
    g = gate.Gate(_ok)

    async def scenario():
        monkeypatch.setattr(gate, "HOLD_S", 0.2)
        assert await _status(g, "/v1/completions") == 503  # not opened within the hold
        assert await asyncio.wait_for(_status(g, "/sleep"), 0.1) == 403
        monkeypatch.setattr(gate, "HOLD_S", 30)
        held = [asyncio.create_task(_status(g, "/v1/completions")) for _ in range(3)]
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in held) and len(gate._held) == 3
        assert await _status(g, gate.OPEN_PATH, headers=[(gate.TOKEN_HEADER.lower().encode(), TOKEN.encode())]) == 200
        assert await asyncio.wait_for(asyncio.gather(*held), 1) == [200, 200, 200]
        assert gate._held == []

    asyncio.run(scenario())


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _status(app, path: str, root_path: str = "", headers: list | None = None) -> int:
    """One POST from the network through ``app`` (raw ASGI, as uvicorn sends it); its status."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    await app({"type": "http", "method": "POST", "path": path, "root_path": root_path, "headers": headers or [],
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


def test_a_server_with_dev_mode_gets_the_gate_and_its_own_token(tmp_path):
    """Every server of ours with vLLM's dev mode runs behind the gate with a token of its own; only a
    snapshot's (gate=True) starts closed; a cold boot runs without dev mode, so without either."""
    plain = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r")
    gated = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r", host="0.0.0.0", gate=True)
    cold = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r", sleep_mode=False, dev_mode=False)
    for spec in (plain, gated):
        args, env = spec.vllm_args(), spec.env_overrides()
        assert args[args.index("--middleware") + 1] == gate.IMPORT_PATH == f"{gate.__name__}.{gate.Gate.__name__}"
        assert env["VLLM_SERVER_DEV_MODE"] == "1" and len(env[gate.TOKEN_ENV]) >= 32 == len(spec.control_token)
        assert spec.client()._s.headers[gate.TOKEN_HEADER] == spec.control_token
    assert plain.control_token != gated.control_token
    assert gate.CLOSED_ENV not in plain.env_overrides() and gated.env_overrides()[gate.CLOSED_ENV] == "closed"
    assert "--middleware" not in cold.vllm_args() and cold.control_token == ""
    assert not {"VLLM_SERVER_DEV_MODE", gate.TOKEN_ENV} & set(cold.env_overrides())
    assert gate.TOKEN_HEADER not in cold.client()._s.headers
    # a snapshot from before the token: restored without one (its gate trusts loopback), none sent
    assert EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r", control_token="").env_overrides().get(
        gate.TOKEN_ENV) is None


@pytest.mark.parametrize("value, seconds", [(None, 30.0), ("", 30.0), ("0", 0.0), ("2.5", 2.5),
                                             ("thirty", None), ("-1", None), ("inf", None), ("nan", None)])
def test_the_hold_is_a_finite_number_of_seconds(value, seconds):
    """The one reading of COLDSTART_GATE_HOLD_S: the gate falls back to 30 on None, the checkpoint refuses it."""
    assert gate.parse_hold(value) == seconds


def test_a_free_port_is_below_the_ephemeral_range_and_free():
    """free_port picks below net.ipv4.ip_local_port_range, where no outgoing connection's local end
    can take the port between the pick and the server's bind."""
    import socket

    from coldstart.netutil import _ephemeral_low, free_port

    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free
