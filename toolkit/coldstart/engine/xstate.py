"""x86 dynamic xstate permissions (Intel AMX) across a CRIU checkpoint.

Why: since Linux 5.16 a process must ask for permission (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``) before it may execute AMX tile instructions; torch/oneDNN ask at start-up on
CPUs that have AMX (Sapphire Rapids and later, the usual host CPU of a GPU server). The permission is
kernel state of the process that CRIU 4.2.1 neither dumps nor restores: a restored process has lost
it, and its first bf16 matmul through AMX dies with SIGILL (measured here: the worker "died
unexpectedly" at the first forward pass after restore). Our criu patch 0008 carries it over for
every process; for snapshots dumped without it, the checkpoint records the worker's mask (RPC
``coldstart_xstate``, ``manifest.xcomp_perm``) and the restore has the worker ask for whatever is
missing before its first forward pass.

A fresh process needs asking too: vLLM's CPU attention kernel executes AMX instructions without
asking, while oneDNN asks on its first AMX GEMM, so a one-word prompt ("Hello": attention before
any AMX GEMM) killed vLLM's engine with SIGILL on the Intel AMX host, stock worker included
(experiments/prepack_short_prompt.py). Our worker asks at start (``ask_amx``).

Linux only; every function returns quietly where the syscall does not exist (other architectures,
kernels before 5.16).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
# features a process may hold without asking (x87, SSE, AVX, AVX-512 ...) are below this bit;
# the dynamic, permission-gated ones (XTILECFG=17 is static, XTILEDATA=18 is dynamic) above it
FIRST_DYNAMIC_FEATURE = 18
XFEATURE_XTILEDATA = 18
XFEATURE_NAMES = {XFEATURE_XTILEDATA: "XTILEDATA (AMX tiles)"}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def xcomp_perm() -> int | None:
    """The xstate features this process may use (a bit mask), or None where there is no such call."""
    if not supported():
        return None
    mask = ctypes.c_uint64(0)
    if _libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return None
    return int(mask.value)


def missing(recorded: int | None, now: int | None = None) -> list[int]:
    """The dynamic features in ``recorded`` that the process does not hold now."""
    now = xcomp_perm() if now is None else now
    if recorded is None or now is None:
        return []
    lost = recorded & ~now
    return [b for b in range(FIRST_DYNAMIC_FEATURE, 64) if lost >> b & 1]


def ask_amx() -> bool:
    """Ask for the AMX tile data permission; False where the CPU or kernel has no AMX (nothing to ask)."""
    if not supported():
        return False
    return _libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


def restore_xcomp_perm(recorded: int | None) -> list[int]:
    """Ask again for every dynamic feature of ``recorded`` this process lost; returns those asked
    for. Raises OSError naming the feature when the kernel refuses (e.g. a sigaltstack too small)."""
    asked = []
    for bit in missing(recorded):
        if _libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, bit) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"arch_prctl(ARCH_REQ_XCOMP_PERM, {XFEATURE_NAMES.get(bit, bit)}) refused: "
                               f"{os.strerror(err)}")
        asked.append(bit)
    return asked
