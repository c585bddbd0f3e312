"""The namespaces a restore runs in, and a loopback forwarder into a private network namespace.

Why: a snapshot's server reopens its run dir at one fixed path, holds /dev/shm buffers by name,
listens on a fixed 127.0.0.1 port and holds loopback TCP connections (gloo). Several restores of one
snapshot on one host, or a read-only snapshot, would collide on or write into all of these. Every
restore gets its own mount namespace (its run dir as an overlay over the snapshot's, a private
/dev/shm); a restore that cannot have the snapshot's port on the host also gets its own network
namespace (only ``lo``) and a small TCP forwarder on a host port. Containers already get a network
namespace from the runtime, so the entrypoint uses ``net="host"`` there.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000
# the programs wrap_argv's script runs before CRIU (with criu itself, a restore's first exec'd files:
# a container image lists them with their libraries so the host can warm them, containers.helpers)
WRAPPER_TOOLS = ("unshare", "sh", "ip", "mount", "cp", "chmod", "mkdir", "stat", "setsid")


def _setns(path: str, nstype: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, nstype) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def _ovl_escape(p: Path) -> str:
    return str(p).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def wrap_argv(argv: list[str], *, run_lower: Path, run_upper: Path, run_work: Path, run_at: str,
              shm: dict[Path, int] | None = None, run_modes: dict[str, int] | None = None,
              private_net: bool = False, binds: dict[Path, str] | None = None) -> list[str]:
    """``argv`` (a ``criu restore``) in the namespaces a restore needs, as PID 1 of a fresh PID
    namespace (the restored tree keeps its dumped PIDs there, whatever runs on the host), session
    leader (``setsid``: required by CRIU for a vLLM tree here), killed with its launcher
    (``--kill-child``), with that namespace's own /proc (CRIU's kernel-feature probe needs it).

    Always a private mount namespace holding this restore's writable state, so that nothing is
    written into the snapshot and restores never collide:
    - ``run_at`` (the run dir the server was checkpointed with) is an overlay: the snapshot's
      ``run/`` as the read-only lower layer, ``run_upper`` for what this server writes (its log);
      ``run_modes`` (path under it -> mode) are the files the server holds open, given their modes
      back where a read-only store changed them (CRIU checks; only those are copied up);
    - /dev/shm is a private tmpfs holding copies of ``shm`` (source -> mode; CRIU checks modes, and a
      read-only store may have changed them);
    - ``binds`` (source -> path): read-only bind mounts, e.g. a runtime mounted lazily elsewhere, put
      where the server was checkpointed with it.
    With ``private_net`` also a network namespace with only ``lo`` (a Forwarder makes it reachable)."""
    import shlex
    import shutil

    q = shlex.quote
    unshare = shutil.which("unshare") or "unshare"
    script = "set -e; "
    if private_net:
        script += f"{q(shutil.which('ip') or 'ip')} link set lo up; "
    script += "mount -t tmpfs -o mode=1777 tmpfs /dev/shm; "
    if shm:
        script += "cp --sparse=always -- " + " ".join(q(str(p)) for p in shm) + " /dev/shm/; "
        script += "".join(f"chmod {mode:o} {q('/dev/shm/' + p.name)}; " for p, mode in shm.items())
    opts = f"lowerdir={_ovl_escape(run_lower)},upperdir={_ovl_escape(run_upper)},workdir={_ovl_escape(run_work)}"
    script += f"mkdir -p {q(run_at)}; mount -t overlay overlay -o {q(opts)} {q(run_at)}; "
    for src, at in (binds or {}).items():
        script += f"mkdir -p {q(at)}; mount --bind -o ro {q(str(src))} {q(at)}; "
    for rel, mode in (run_modes or {}).items():
        f = q(f"{run_at}/{rel}")
        script += f'[ "$(stat -c %a {f})" = {mode:o} ] || chmod {mode:o} {f}; '
    script += "exec setsid " + " ".join(q(a) for a in argv)
    ns = ["--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation", "private"]
    if private_net:
        ns.append("--net")
    return [unshare, *ns, "--", "/bin/sh", "-c", script]


class Forwarder:
    """Accepts on ``listen`` (host netns) and connects each client to ``target`` inside the network
    namespace of ``ns_pid``. One thread per direction per connection: simple and enough for an HTTP
    API (the hop costs ~0.1 ms on loopback).

    The address is bound and listening from construction (the port is reserved), but nothing is
    accepted until ``start``: the restore starts the public forwarder only once the canary passed, so
    no client is answered by a server that has not been checked, and a client that connected before
    waits in the listen queue and is relayed then (``close`` before ``start`` resets it)."""

    def __init__(self, ns_pid: int, target: tuple[str, int], listen: tuple[str, int]):
        self.ns_path = f"/proc/{ns_pid}/ns/net"
        self._ns_fd = os.open(self.ns_path, os.O_RDONLY)  # keep the namespace reachable by fd
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(listen)
        self.sock.listen(128)
        self.address = self.sock.getsockname()
        self._stop = threading.Event()
        self.links: set[socket.socket] = set()  # the relayed sockets now open, both sides (ended by close)
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
            for x in (c, s):
                # relayed writes go out at once: with Nagle's algorithm a response's last segment
                # waited for the client's delayed ACK, and a restore's checks through the forwarder
                # took ~0.3 s longer than on the host network (results/spot-checks/forwarder-nodelay)
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.links.update((c, s))
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=_pump, args=(a, b, self.links), daemon=True).start()

    def close(self) -> None:
        """No more connections, and the open ones ended."""
        self._stop.set()
        _shutdown(*self.links)
        try:
            self.sock.close()
        finally:
            try:
                os.close(self._ns_fd)
            except OSError:
                pass


def _pump(a: socket.socket, b: socket.socket, links: set[socket.socket]) -> None:
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    finally:
        _shutdown(a, b)
        links.discard(a)
        try:
            a.close()
        except OSError:
            pass


def _shutdown(*socks: socket.socket) -> None:
    """Both directions of each socket ended (its relay, if any, sees EOF); already closed ones skipped."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
