"""Make ``io_uring_setup`` fail with ENOSYS for a process tree (a seccomp filter), then exec.

Why: CRIU cannot dump io_uring file descriptors, and uvloop (vLLM's event loop) opens one whatever
``UV_USE_IO_URING`` says. libuv falls back to epoll when ``io_uring_setup`` fails, so a filter that
answers ENOSYS to that one syscall makes the whole server dumpable without touching the host-wide
``kernel.io_uring_disabled`` sysctl. Seccomp filters are inherited across fork and exec (and CRIU
dumps and restores them), so installing it once before exec covers every process of the server.

Used as an exec wrapper: ``python -m coldstart.engine.noiouring -- CMD ARGS...``, or in-process via
``install()`` (e.g. from a ``preexec_fn``). Pure ctypes: nothing to compile.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct
import sys

# Linux UAPI constants (linux/seccomp.h, linux/filter.h, linux/audit.h, linux/prctl.h)
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
# io_uring_setup has the same number (425) on every architecture (the unified table since 5.1).
NR_IO_URING_SETUP = 425
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "ppc64le": 0xC0000015, "s390x": 0x80000016}


def _filter_program() -> bytes:
    """The BPF program: on our arch, io_uring_setup → ENOSYS; everything else → allow."""
    arch = AUDIT_ARCH.get(platform.machine())
    if arch is None:
        raise OSError(errno.ENOTSUP, f"no seccomp arch constant for {platform.machine()}")
    ins = [
        (BPF_LD_W_ABS, 0, 0, 4),  # A = seccomp_data.arch
        (BPF_JEQ_K, 0, 3, arch),  # other arch → allow
        (BPF_LD_W_ABS, 0, 0, 0),  # A = seccomp_data.nr
        (BPF_JEQ_K, 0, 1, NR_IO_URING_SETUP),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Install the filter on the calling thread's process (inherited by children and execs)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prog = _filter_program()
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_SECCOMP): {os.strerror(e)}")


def io_uring_blocked() -> bool:
    """True if io_uring_setup fails with ENOSYS in this process (the filter, or a kernel without it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(NR_IO_URING_SETUP, 1, params)
    if fd >= 0:
        os.close(fd)
        return False
    return ctypes.get_errno() == errno.ENOSYS


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m coldstart.engine.noiouring -- CMD [ARGS...]", file=sys.stderr)
        sys.exit(2)
    install()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
