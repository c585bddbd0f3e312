"""Small C programs that hold known memory / sockets, and the file+signal protocol to drive them.

Used by `coldstart bench criu` and tests/criu. The protocol holds no file descriptor open between
requests (request in CTLDIR/req, SIGUSR1, answer in CTLDIR/resp), so a restored copy never
conflicts with the original process, and a restore in a new PID namespace is driven the same way
through the host pid.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from coldstart.errors import ColdstartError

PROGS = Path(__file__).with_name("progs")


def build(src: str | Path, out_dir: str | Path, extra: list[str] | None = None) -> Path:
    """Compile a C program with gcc into `out_dir` (cached by the source's digest)."""
    src = Path(src)
    if not src.is_absolute():
        src = PROGS / src
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise ColdstartError("gcc not found: the CRIU test programs are compiled at run time (apt install gcc)")
    tag = hashlib.sha256(src.read_bytes() + " ".join(extra or []).encode()).hexdigest()[:12]
    out = Path(out_dir) / f"{src.stem}-{tag}"
    if not out.exists():
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        r = subprocess.run([cc, "-O2", "-Wall", "-pthread", "-o", str(tmp), str(src), "-ldl", *(extra or [])],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ColdstartError(f"compiling {src.name} failed: {r.stderr.strip().splitlines()[-1:]}")
        os.rename(tmp, out)
    return out


class Ctl:
    """Client side of the CTLDIR protocol."""

    _nonces = itertools.count(1)

    def __init__(self, ctl_dir: str | Path):
        self.dir = Path(ctl_dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def start(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
        """Start a program in its own session (stdio on /dev/null) and wait for its "ready" line."""
        (self.dir / "resp").unlink(missing_ok=True)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        return p, self._wait("ready", timeout, proc=p)

    def request(self, pid: int, cmd: str, timeout: float = 120.0) -> str:
        """Send `cmd` to `pid` and return its answer (without the nonce)."""
        nonce = f"n{os.getpid()}-{next(self._nonces)}"
        (self.dir / "resp").unlink(missing_ok=True)
        tmp = self.dir / "req.tmp"
        tmp.write_text(f"{nonce} {cmd}\n")
        os.rename(tmp, self.dir / "req")
        os.kill(pid, signal.SIGUSR1)
        return self._wait(nonce, timeout, pid=pid)

    def _wait(self, nonce: str, timeout: float, proc: subprocess.Popen | None = None, pid: int | None = None) -> str:
        resp = self.dir / "resp"
        end = time.monotonic() + timeout
        while True:
            try:
                text = resp.read_text()
                if text.startswith(nonce + " ") and text.endswith("\n"):
                    return text[len(nonce) + 1 :].strip()
            except FileNotFoundError:
                pass
            if proc is not None and proc.poll() is not None:
                raise ColdstartError(f"{proc.args[0]} exited with {proc.returncode} before answering")
            if pid is not None and not os.path.exists(f"/proc/{pid}"):
                raise ColdstartError(f"pid {pid} is gone before answering")
            if time.monotonic() > end:
                raise ColdstartError(f"no answer to {nonce} within {timeout:.0f} s")
            time.sleep(0.0005)
