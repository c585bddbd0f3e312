"""A private network + mount namespace for a restore, and a loopback forwarder into it.

Why: a snapshot's server listens on a fixed 127.0.0.1 port and holds loopback TCP connections (gloo)
and /dev/shm buffers by name. A second restore of the same snapshot on the same host (while the
first still serves) would collide on all three. Restoring into its own network namespace (only
``lo``) and its own mount namespace (a private tmpfs on /dev/shm) removes every collision; a small
TCP forwarder on a host port then makes the server reachable. Containers already get both
namespaces from the runtime, so the entrypoint uses ``net="host"`` there.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000


def _setns(path: str, nstype: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, nstype) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def wrap_argv(argv: list[str], shm_sources: list[Path] | None = None, private_net: bool = False) -> list[str]:
    """``argv`` (a ``criu restore``) as PID 1 of a fresh PID namespace (the restored tree keeps its
    dumped PIDs there, whatever runs on the host), session leader (``setsid``: required by CRIU for
    a vLLM tree here), killed with its launcher (``--kill-child``), with that namespace's own /proc
    (``--mount-proc``: CRIU's kernel-feature probe needs it, /run being no tmpfs here it has no
    cached copy, and the restored server's /proc/<pid> paths then name itself). With ``private_net`` also a new
    network + mount namespace: ``lo`` up, a private tmpfs on /dev/shm holding ``shm_sources``."""
    import shlex
    import shutil

    unshare = shutil.which("unshare") or "unshare"
    if not private_net:
        return [unshare, "--pid", "--fork", "--kill-child", "--mount-proc", "setsid", *argv]
    ip = shutil.which("ip") or "ip"
    script = "set -e; {ip} link set lo up; mount -t tmpfs -o mode=1777 tmpfs /dev/shm; ".format(ip=shlex.quote(ip))
    if shm_sources:
        script += "cp -p --sparse=always -- " + " ".join(shlex.quote(str(p)) for p in shm_sources) + " /dev/shm/; "
    script += "exec setsid " + " ".join(shlex.quote(a) for a in argv)
    return [unshare, "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", script]


class Forwarder:
    """Accepts on ``listen`` (host netns) and connects each client to ``target`` inside the network
    namespace of ``ns_pid``. One thread per direction per connection: simple and enough for an HTTP
    API (the hop costs ~0.1 ms on loopback)."""

    def __init__(self, ns_pid: int, target: tuple[str, int], listen: tuple[str, int]):
        self.ns_path = f"/proc/{ns_pid}/ns/net"
        self._ns_fd = os.open(self.ns_path, os.O_RDONLY)  # keep the namespace reachable by fd
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(listen)
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._accept, name="coldstart-forwarder", daemon=True)

    def start(self) -> "Forwarder":
        self._t.start()
        return self

    def _connect_inside(self) -> socket.socket:
        out: dict = {}

        def run() -> None:  # setns changes only this short-lived thread's namespace
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(self._ns_fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({self.ns_path})")
                out["s"] = socket.create_connection(self.target, timeout=10)
                out["s"].settimeout(None)
            except OSError as e:
                out["e"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join()
        if "e" in out:
            raise out["e"]
        return out["s"]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                s = self._connect_inside()
            except OSError:
                c.close()
                continue
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        finally:
            try:
                os.close(self._ns_fd)
            except OSError:
                pass


def _pump(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            a.close()
        except OSError:
            pass
