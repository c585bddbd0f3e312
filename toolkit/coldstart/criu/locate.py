"""Find the criu binary coldstart runs, and what it can do.

Why: the host's Debian criu (3.17) does not work on recent kernels, so coldstart uses its own
CRIU 4.2.1 builds from scripts/build-criu: "patched" (mmap restore, the default) and "stock"
(the benchmark baseline). ``COLDSTART_CRIU`` overrides both, e.g. for a system-wide install.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.state import cache_root

VARIANTS = ("patched", "stock")
MMAP_FLAG = "--mmap-pages"


def criu_cache_dir() -> Path:
    """Where scripts/build-criu installs its builds ($COLDSTART_CACHE/criu)."""
    return cache_root() / "criu"


def find_criu(variant: str = "patched") -> Path:
    """Path of the criu binary to run: $COLDSTART_CRIU, else the cached build of ``variant``."""
    if variant not in VARIANTS:
        raise ColdstartError(f"unknown criu variant {variant!r} (expected one of {', '.join(VARIANTS)})")
    env = os.environ.get("COLDSTART_CRIU")
    if env:
        p = Path(env)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ColdstartError(f"COLDSTART_CRIU={env} is not an executable file")
        return p
    p = criu_cache_dir() / f"current-{variant}" / "sbin" / "criu"
    if p.is_file() and os.access(p, os.X_OK):
        return p.resolve()
    raise ColdstartError("criu not found: run make setup (scripts/build-criu)")


def _run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise ColdstartError(f"cannot run {path}: {e.strerror}") from e


@functools.lru_cache(maxsize=16)
def _version(path: str) -> str:
    r = _run(Path(path), "--version")
    for line in r.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise ColdstartError(f"{path} --version printed no version (exit {r.returncode})")


def criu_version(path: Path) -> str:
    """The criu release, e.g. "4.2.1" (from ``criu --version``)."""
    return _version(str(path))


@functools.lru_cache(maxsize=16)
def _supports_mmap(path: str) -> bool:
    r = _run(Path(path), "--help")
    return MMAP_FLAG in (r.stdout + r.stderr)


def criu_supports_mmap(path: Path) -> bool:
    """True if this criu has our mmap restore (``--mmap-pages`` in its help text)."""
    return _supports_mmap(str(path))


def build_info(path: Path) -> dict[str, str]:
    """key=value facts scripts/build-criu wrote next to the binary (variant, tarball, patches)."""
    info: dict[str, str] = {}
    f = Path(path).resolve().parent.parent / "BUILDINFO"
    if f.is_file():
        for line in f.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                info[k] = f"{info[k]},{v}" if k in info else v
    return info
