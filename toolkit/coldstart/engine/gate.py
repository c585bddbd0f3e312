"""An ASGI middleware (vLLM's ``--middleware``) that holds a snapshot's server closed to the network
until the restore that woke it has checked its canary.

Why: a server checkpointed listening on a wildcard address (in a container: the container's port) is
restored listening there, and clients reach it directly, with no relay of ours in the data path
(results/container-serve). It is restored asleep, its weights not yet reloaded nor checked, so until
the restore opens the gate it answers every client that is not on loopback with 503. The restore's own checks come from
loopback, as did the checkpoint's warm-up, and the snapshot is taken with the gate closed.

Our servers run vLLM's dev mode (sleep, wake, collective_rpc: what checkpoint and restore drive).
Those routes stay loopback-only for good (403 to the network): anyone who reaches the port could
otherwise put the server to sleep or call into its workers.

Kept free of imports beyond the standard library (coldstart.netutil is standard library only): it loads
into vLLM's API server process.
"""
from __future__ import annotations

import json

from coldstart.netutil import is_loopback

OPEN_PATH = "/coldstart/gate/open"  # POST from loopback: clients may come in now
STATE_PATH = "/coldstart/gate"  # GET: {"open": bool}
IMPORT_PATH = "coldstart.engine.gate.Gate"  # what the launcher passes to vLLM's --middleware
# the routes vLLM's dev mode adds (VLLM_SERVER_DEV_MODE: its dev and RL routers; a test holds this list
# to the installed vLLM's)
DEV_PATHS = frozenset((
    "/abort_requests", "/collective_rpc", "/finish_weight_update", "/get_world_size", "/init_weight_transfer_engine",
    "/is_paused", "/is_sleeping", "/pause", "/release_kv_cache_memory", "/reset_encoder_cache", "/reset_mm_cache",
    "/reset_prefix_cache", "/resume", "/server_info", "/shutdown_weight_transfer_engine", "/sleep",
    "/start_draft_weight_update", "/start_weight_update", "/update_weight_version", "/update_weights", "/wake_up",
    "/weight_checker", "/weight_info"))
_state = {"open": False}  # module-level: outlives a rebuild of the middleware stack
_DEV_ONLY = json.dumps({"error": {"message": "coldstart: this route is served on loopback only", "type": "Forbidden",
                                  "code": 403}}).encode()
_CLOSED = json.dumps({"error": {"message": "coldstart: this server was just restored and its canary answer "
                                "is being checked; it takes requests in a moment", "type": "ServiceUnavailable",
                                "code": 503}}).encode()


def _loopback(scope) -> bool:
    client = scope.get("client")
    return not client or is_loopback(client[0])  # no client address: a Unix socket, local


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
    """Passes loopback clients always, others once opened and never to dev-mode routes; serves the two
    gate paths to loopback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        local = _loopback(scope)
        if kind == "http" and local and scope.get("path") in (OPEN_PATH, STATE_PATH):
            if scope["path"] == OPEN_PATH and scope.get("method") == "POST":
                _state["open"] = True
            return await _send_json(send, 200, json.dumps({"open": _state["open"]}).encode())
        if local:
            return await self.app(scope, receive, send)
        if _route(scope) in DEV_PATHS:
            if kind == "websocket":
                return await send({"type": "websocket.close", "code": 1008})  # policy violation
            return await _send_json(send, 403, _DEV_ONLY)
        if _state["open"]:
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1013})  # try again later
        await _send_json(send, 503, _CLOSED, [(b"retry-after", b"1")])
