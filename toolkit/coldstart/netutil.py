"""Address and port helpers shared by the stages that decide by where a peer or a server is: the gate
(a client on loopback passes), checkpoint and restore (a server listening on loopback needs a relay in
a container; is its port free here) and the registry client (plain HTTP to a registry on this host).
Standard library only: the gate imports it inside vLLM's API server process, and the restore before
its CRIU starts, where every import is part of the start."""
from __future__ import annotations

import socket


def is_loopback(host: str) -> bool:
    """``host`` (an address, "localhost", or a ``host:port`` / ``[v6]:port`` as a registry reference
    spells it) is this host's loopback."""
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not listen on (host, port) right now; None when it could."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def port_free(host: str, port: int) -> bool:
    return bind_error(host, port) is None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def client_host(listen: str) -> str:
    """Where a local client reaches a server listening on ``listen`` (a wildcard: loopback)."""
    return "127.0.0.1" if listen in ("0.0.0.0", "") else "[::1]" if listen == "::" else listen
