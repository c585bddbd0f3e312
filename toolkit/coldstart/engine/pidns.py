"""Make vLLM's PID lookups correct inside our PID namespace, where /proc is the host's.

The server runs in its own PID namespace without its own /proc mount (``--mount-proc`` broke CRIU
restore here), so ``os.getpid()`` is a namespace PID while ``/proc/<pid>`` names host PIDs.
vLLM does that lookup in two places that matter:
- ``cpu_resource_utils.get_memory_affinity()`` reads ``/proc/{os.getpid()}/status`` when the CPU
  worker starts: it reads a stranger's status, or crashes with FileNotFoundError when no host
  process has that number (seen here: the worker failed to start at random);
- ``system_utils.kill_process_tree(pid)`` (shutdown of EngineCore/workers) walks
  ``psutil.Process(pid).children()`` with a namespace PID: the host process of that number.

``install()`` (called by the plugin in every vLLM process, and only when /proc is not our
namespace's) swaps those two functions for versions that resolve PIDs through ``/proc/self`` and the
``NSpid`` lines of the host's /proc. Outside a namespace nothing changes.
"""
from __future__ import annotations

import os
import signal


def proc_is_foreign() -> bool:
    """True when /proc belongs to another PID namespace than ours (its 'self' is not our PID)."""
    try:
        return os.readlink("/proc/self") != str(os.getpid())
    except OSError:
        return False


def _own_pidns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _nspid(proc_dir: str) -> list[int]:
    with open(f"{proc_dir}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def host_pid_of(ns_pid: int) -> int | None:
    """The /proc (host) PID of the process that is ``ns_pid`` in our PID namespace."""
    if ns_pid == os.getpid():
        return int(os.readlink("/proc/self"))
    me = _own_pidns()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ids = _nspid(f"/proc/{name}")
            if ids and ids[-1] == ns_pid and len(ids) > 1 and os.stat(f"/proc/{name}/ns/pid").st_ino == me:
                return int(name)
        except (OSError, ValueError):
            continue
    return None


def get_memory_affinity(pid: int = 0) -> list[int]:
    """vLLM's get_memory_affinity, reading our own status through /proc/self."""
    from vllm.utils.cpu_resource_utils import parse_id_list

    path = "/proc/self/status" if pid in (0, os.getpid()) else f"/proc/{host_pid_of(pid) or pid}/status"
    with open(path) as f:
        for line in f:
            if line.startswith("Mems_allowed_list:"):
                return parse_id_list(line.split(":", 1)[1].strip())
    return []


def kill_process_tree(pid: int) -> None:
    """vLLM's kill_process_tree for a namespace PID: SIGKILL the descendants, then the process."""
    import psutil

    host = host_pid_of(pid)
    if host is None:
        return
    try:
        children = psutil.Process(host).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            ids = _nspid(f"/proc/{child.pid}")
        except (OSError, ValueError):
            continue
        if ids:
            try:
                os.kill(ids[-1], signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def install() -> bool:
    """Patch vLLM's two PID lookups if /proc is foreign; returns whether it did."""
    if not proc_is_foreign():
        return False
    import importlib

    targets = {
        "vllm.utils.cpu_resource_utils": {"get_memory_affinity": get_memory_affinity},
        "vllm.utils.system_utils": {"kill_process_tree": kill_process_tree},
        "vllm.v1.utils": {"kill_process_tree": kill_process_tree},
    }
    for module, attrs in targets.items():
        try:
            mod = importlib.import_module(module)
        except Exception:
            continue
        for name, fn in attrs.items():
            if hasattr(mod, name):
                setattr(mod, name, fn)
    return True
