"""The public forwarder of a restore in a private network: its port is reserved and listening at once,
but nothing is relayed until it is started (after the canary), so no client reaches an unchecked
server, and one that connected before is relayed then."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from coldstart.pipeline.netns import Forwarder


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(c.recv(100))
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_holds_connections_until_started_then_forwards():
    srv, port = _echo_server()
    fwd = Forwarder(os.getpid(), ("127.0.0.1", port), ("127.0.0.1", 0))  # this process's own netns
    try:
        early = socket.create_connection(fwd.address, timeout=5)  # queued, not refused
        early.sendall(b"early")
        early.settimeout(0.5)
        with pytest.raises(TimeoutError):
            early.recv(100)  # nothing relayed before start
        fwd.start()
        early.settimeout(5)
        assert early.recv(100) == b"early"
        early.close()
        with socket.create_connection(fwd.address, timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(100) == b"ping"
    finally:
        fwd.close()
        srv.close()


def test_close_before_start_resets_the_waiting_clients():
    """A restore that fails before its canary passed closes its forwarder unstarted: the clients that
    waited get a reset, never an answer."""
    srv, port = _echo_server()
    fwd = Forwarder(os.getpid(), ("127.0.0.1", port), ("127.0.0.1", 0))
    try:
        early = socket.create_connection(fwd.address, timeout=5)
        early.sendall(b"early")
        fwd.close()
        with pytest.raises(ConnectionResetError):
            early.recv(100)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(fwd.address, timeout=5)
    finally:
        fwd.close()
        srv.close()


def test_relays_without_nagle_and_close_ends_open_connections():
    """Both relayed sockets send at once (TCP_NODELAY: else each response's last segment waits for
    the client's delayed ACK); close() ends the connections still open, not only the listener."""
    srv, port = _echo_server()
    fwd = Forwarder(os.getpid(), ("127.0.0.1", port), ("127.0.0.1", 0)).start()
    try:
        c = socket.create_connection(fwd.address, timeout=5)  # the echo server waits for its bytes
        for _ in range(100):  # the accept thread registers the link right after connecting inside
            if len(fwd.links) == 2:
                break
            threading.Event().wait(0.05)
        links = list(fwd.links)
        assert len(links) == 2 and all(x.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for x in links)
        fwd.close()
        assert c.recv(100) == b""  # ended by close()
    finally:
        fwd.close()
        srv.close()
