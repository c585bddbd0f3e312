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
    """A TCP port free on ``host`` right now (for tests and parallel servers), below the kernel's
    ephemeral range where it can: a port in that range can become the local end of any outgoing
    connection a moment later (a test's second restore found the port it had been given taken
    that way by the first restore's own connections), and a snapshot keeps its server's port for
    every restore after."""
    import random

    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded host: any port it gives
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range; 32768 if unread)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(2048, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def client_host(listen: str) -> str:
    """Where a local client reaches a server listening on ``listen`` (a wildcard: loopback)."""
    return "127.0.0.1" if listen in ("0.0.0.0", "") else "[::1]" if listen == "::" else listen
