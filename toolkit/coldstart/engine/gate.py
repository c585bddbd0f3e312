"""An ASGI middleware (vLLM's ``--middleware``) on every server of ours that runs vLLM's dev mode: its
control routes answer only requests that carry the server's control token, and a snapshot's server
stays closed to everyone else until the restore that woke it has checked its canary.

Why: our servers run vLLM's dev mode (sleep, wake, collective_rpc: what checkpoint and restore drive).
Anyone who reaches those routes could put the server to sleep or call into its workers, so they are
never served without the token (403). Loopback is no proof of who is asking: a restore on a private
network relays the network's clients into the server's namespace from loopback (pipeline/netns.py),
and in a Kubernetes pod every sidecar shares the server's loopback.

A snapshot's server is restored listening where it was checkpointed: on loopback (a host-network
restore) or on a wildcard address (in a container: the container's port, which clients reach
directly, with no relay of ours in the data path; results/container-serve). Either way it listens
from CRIU's restore on, asleep, its weights not yet reloaded nor checked, so every snapshot is taken
with the gate closed, and until the restore opens it a request without the token is held, and
passed on the moment the gate opens: a client (or a load balancer, or a readiness probe) that
connects as soon as the port accepts gets its answer when the server is checked, not a 503 and a
retry on its own clock. One still closed after ``HOLD_S`` (a restore that failed, or is slow) gets
503 with Retry-After. The restore's own checks carry the token, as did the checkpoint's warm-up.

The token is the server's environment variable ``COLDSTART_CONTROL_TOKEN``: a snapshot's server keeps
the one it was checkpointed with, and its manifest records it (``control_token``), so it is as secret
as the snapshot's files, whose memory images hold it anyway. A server started without one (a
snapshot from before the token) trusts loopback instead, as it did then.

Kept free of imports beyond the standard library (coldstart.netutil is standard library only): it loads
into vLLM's API server process.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import os

from coldstart.netutil import is_loopback

OPEN_PATH = "/coldstart/gate/open"  # POST with the token: clients may come in now
STATE_PATH = "/coldstart/gate"  # GET with the token: {"open": bool}
IMPORT_PATH = "coldstart.engine.gate.Gate"  # what the launcher passes to vLLM's --middleware
TOKEN_ENV = "COLDSTART_CONTROL_TOKEN"  # the server's control token (launcher.EngineSpec.control_token)
TOKEN_HEADER = "X-Coldstart-Token"  # the request header that carries it (engine.client.EngineClient)
CLOSED_ENV = "COLDSTART_GATE"  # "closed": the server starts held closed (a snapshot's, until its restore)
HOLD_ENV = "COLDSTART_GATE_HOLD_S"  # how long a closed gate holds a request (read at the server's start: a
# snapshot's server keeps its checkpoint's); 0: answer 503 at once
# the routes vLLM's dev mode adds (VLLM_SERVER_DEV_MODE: its dev and RL routers; a test holds this list
# to the installed vLLM's)
DEV_PATHS = frozenset((
    "/abort_requests", "/collective_rpc", "/finish_weight_update", "/get_world_size", "/init_weight_transfer_engine",
    "/is_paused", "/is_sleeping", "/pause", "/release_kv_cache_memory", "/reset_encoder_cache", "/reset_mm_cache",
    "/reset_prefix_cache", "/resume", "/server_info", "/shutdown_weight_transfer_engine", "/sleep",
    "/start_draft_weight_update", "/start_weight_update", "/update_weight_version", "/update_weights", "/wake_up",
    "/weight_checker", "/weight_info"))
# module-level: outlives a rebuild of the middleware stack
_state = {"open": os.environ.get(CLOSED_ENV) != "closed", "token": os.environ.get(TOKEN_ENV, "").encode()}


def parse_hold(value: str | None) -> float | None:
    """Seconds a closed gate holds a request, from ``HOLD_ENV``'s value (unset: 30); None when it is
    not a finite number ≥ 0."""
    try:
        s = float(value or 30)
    except ValueError:
        return None
    return s if math.isfinite(s) and s >= 0 else None


HOLD_S = parse_hold(os.environ.get(HOLD_ENV))
if HOLD_S is None:  # refused in one line by the checkpoint, before a server starts with it
    HOLD_S = 30.0
_held: list = []  # the futures of the requests a closed gate holds; set when it opens
_HEADER = TOKEN_HEADER.lower().encode()  # ASGI header names arrive lower-cased
_CONTROL_ONLY = json.dumps({"error": {"message": f"coldstart: this route needs the server's control token "
                                      f"({TOKEN_HEADER})", "type": "Forbidden", "code": 403}}).encode()
_CLOSED = json.dumps({"error": {"message": "coldstart: this server was just restored and its canary answer "
                                "is being checked; it takes requests in a moment", "type": "ServiceUnavailable",
                                "code": 503}}).encode()


def _trusted(scope) -> bool:
    """The request carries the control token; on a server without one, it comes from loopback."""
    token = _state["token"]
    if not token:
        client = scope.get("client")
        return not client or is_loopback(client[0])  # no client address: a Unix socket, local
    given = next((v for k, v in scope.get("headers") or () if k == _HEADER), b"")
    return hmac.compare_digest(given, token)


def _route(scope) -> str:
    """The path a route matches: without the app's root path (vLLM's --root-path), which a server may
    or may not be sent with the request's path."""
    path, root = scope.get("path", ""), scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return path.rstrip("/")


async def _send_json(send, status: int, body: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """Passes requests with the control token always, others once opened and never to dev-mode
    routes; serves the two gate paths to requests with the token."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        trusted = _trusted(scope)
        if kind == "http" and trusted and scope.get("path") in (OPEN_PATH, STATE_PATH):
            if scope["path"] == OPEN_PATH and scope.get("method") == "POST":
                _open()
            return await _send_json(send, 200, json.dumps({"open": _state["open"]}).encode())
        if trusted:
            return await self.app(scope, receive, send)
        route = _route(scope)
        if route in DEV_PATHS or route in (OPEN_PATH, STATE_PATH):
            if kind == "websocket":
                return await send({"type": "websocket.close", "code": 1008})  # policy violation
            return await _send_json(send, 403, _CONTROL_ONLY)
        if _state["open"] or await _held_until_open():
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1013})  # try again later
        await _send_json(send, 503, _CLOSED, [(b"retry-after", b"1")])


def _open() -> None:
    _state["open"] = True
    while _held:
        fut = _held.pop()
        fut.get_loop().call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))


async def _held_until_open() -> bool:
    """Wait for the gate to open, at most HOLD_S; whether it did."""
    if HOLD_S <= 0:
        return False
    fut = asyncio.get_running_loop().create_future()
    _held.append(fut)
    if _state["open"]:  # opened from another thread's loop since the caller looked
        _held.remove(fut)
        return True
    try:
        await asyncio.wait_for(fut, HOLD_S)
    except asyncio.TimeoutError:
        pass
    finally:
        if fut in _held:
            _held.remove(fut)
    return _state["open"]
