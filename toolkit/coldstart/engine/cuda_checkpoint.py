"""The CUDA driver's process checkpoint API (driver >= 550), through ctypes on libcuda.

``cuCheckpointProcessLock / Checkpoint / Restore / Unlock`` act on another process by PID: after
Checkpoint, that process's device memory and CUDA state live in its own host memory and it holds no
GPU resources, so CRIU can dump it like a CPU process; Restore puts the state back on a GPU.

Also a command line with the interface of NVIDIA's ``cuda-checkpoint`` utility (``--action``,
``--get-state``, ``--get-restore-tid``, ``--toggle``), which CRIU's CUDA plugin runs from PATH:
``command_dir()`` writes a ``cuda-checkpoint`` that runs it, for hosts without NVIDIA's utility (the
GPU machines we can reach have none). Verified on an H100 (docs/gpu.md).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error string."""


_lib: ctypes.CDLL | None = None


def libcuda() -> ctypes.CDLL:
    """libcuda.so.1, initialised once (cuInit creates no context)."""
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(f"libcuda.so.1 cannot be loaded ({e}): no NVIDIA driver on this machine") from None
        _lib = lib
        check(lib.cuInit(0), "cuInit")
    return _lib


def error_string(code: int) -> str:
    s = ctypes.c_char_p()
    try:
        _lib.cuGetErrorString(code, ctypes.byref(s))  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001
        return f"CUDA error {code}"
    return f"{s.value.decode() if s.value else 'unknown'} ({code})"


def check(code: int, what: str) -> None:
    if code != 0:
        raise CudaError(f"{what} failed: {error_string(code)}")


def _fn(name: str):
    lib = libcuda()
    try:
        return getattr(lib, name)
    except AttributeError:
        raise CudaError(f"{name} is not in this libcuda (the checkpoint API needs driver >= 550)") from None


class _Args64(ctypes.Structure):
    """The Lock/Checkpoint/Restore/Unlock argument structs are 64 bytes; Lock's starts with timeoutMs."""

    _fields_ = [("timeout_ms", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


def get_state(pid: int) -> str:
    st = ctypes.c_int(-1)
    check(_fn("cuCheckpointProcessGetState")(int(pid), ctypes.byref(st)), f"cuCheckpointProcessGetState({pid})")
    return STATES.get(st.value, f"unknown({st.value})")


def restore_tid(pid: int) -> int:
    tid = ctypes.c_int(0)
    check(_fn("cuCheckpointProcessGetRestoreThreadId")(int(pid), ctypes.byref(tid)),
          f"cuCheckpointProcessGetRestoreThreadId({pid})")
    return tid.value


def lock(pid: int, timeout_ms: int = 0) -> None:
    """Block further CUDA calls of ``pid`` and wait for its work to finish (0: no timeout)."""
    args = _Args64(timeout_ms=int(timeout_ms))
    check(_fn("cuCheckpointProcessLock")(int(pid), ctypes.byref(args)), f"cuCheckpointProcessLock({pid})")


def checkpoint(pid: int) -> None:
    """Move a locked process's device memory and CUDA state into its host memory."""
    args = _Args64()
    check(_fn("cuCheckpointProcessCheckpoint")(int(pid), ctypes.byref(args)), f"cuCheckpointProcessCheckpoint({pid})")


def restore(pid: int) -> None:
    """Put a checkpointed process's state back on the GPU (it stays locked)."""
    args = _Args64()
    check(_fn("cuCheckpointProcessRestore")(int(pid), ctypes.byref(args)), f"cuCheckpointProcessRestore({pid})")


def unlock(pid: int) -> None:
    args = _Args64()
    check(_fn("cuCheckpointProcessUnlock")(int(pid), ctypes.byref(args)), f"cuCheckpointProcessUnlock({pid})")


@dataclass
class StepTimes:
    """Seconds each driver step of one checkpoint (lock + checkpoint) or restore (restore + unlock) took."""

    first: float
    second: float


def suspend(pid: int, timeout_ms: int = 0) -> StepTimes:
    """lock + checkpoint: afterwards ``pid`` holds no GPU resources."""
    t0 = time.perf_counter()
    lock(pid, timeout_ms)
    t1 = time.perf_counter()
    checkpoint(pid)
    return StepTimes(t1 - t0, time.perf_counter() - t1)


def resume(pid: int) -> StepTimes:
    """restore + unlock: ``pid`` runs on the GPU again."""
    t0 = time.perf_counter()
    restore(pid)
    t1 = time.perf_counter()
    unlock(pid)
    return StepTimes(t1 - t0, time.perf_counter() - t1)


def api_available() -> str:
    """'' when this host's driver offers the checkpoint API, else why not."""
    try:
        _fn("cuCheckpointProcessLock")
    except CudaError as e:
        return str(e)
    return ""


def command_dir(parent: Path) -> Path:
    """``parent/bin`` holding a ``cuda-checkpoint`` that runs this module with this Python (written
    atomically, rewritten only when it differs); put the directory first on CRIU's PATH."""
    d = Path(parent) / "bin"
    d.mkdir(parents=True, exist_ok=True)
    pkg_root = Path(__file__).resolve().parents[2]  # the directory holding the coldstart package
    text = (f"#!/bin/sh\n# written by coldstart: NVIDIA's cuda-checkpoint command line over the driver API\n"
            f"PYTHONPATH={pkg_root}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} -m {__name__} \"$@\"\n")
    p = d / "cuda-checkpoint"
    if not (p.exists() and p.read_text() == text):
        tmp = d / f".cuda-checkpoint.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, p)
    return d


HELP = """usage: cuda-checkpoint (coldstart's implementation of its command line)
  --action {lock,checkpoint,restore,unlock} --pid PID [--timeout MS]
  --toggle --pid PID         running -> checkpointed, checkpointed -> running
  --get-state --pid PID      prints running | locked | checkpointed | failed
  --get-restore-tid --pid PID
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cuda-checkpoint", add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--action", choices=["lock", "checkpoint", "restore", "unlock"])
    p.add_argument("--toggle", action="store_true")
    p.add_argument("--get-state", action="store_true")
    p.add_argument("--get-restore-tid", action="store_true")
    p.add_argument("--pid", "-p", type=int)
    p.add_argument("--timeout", type=int, default=0)
    a = p.parse_args(argv)
    if a.help or not (a.action or a.toggle or a.get_state or a.get_restore_tid):
        print(HELP, end="")
        return 0 if a.help else 2
    if a.pid is None:
        print("cuda-checkpoint: --pid is required", file=sys.stderr)
        return 2
    try:
        if a.get_state:
            print(get_state(a.pid))
        elif a.get_restore_tid:
            print(restore_tid(a.pid))
        elif a.toggle:
            if get_state(a.pid) == "running":
                suspend(a.pid, a.timeout)
            else:
                resume(a.pid)
        else:
            {"lock": lambda: lock(a.pid, a.timeout), "checkpoint": lambda: checkpoint(a.pid),
             "restore": lambda: restore(a.pid), "unlock": lambda: unlock(a.pid)}[a.action]()
    except CudaError as e:
        print(f"cuda-checkpoint: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
