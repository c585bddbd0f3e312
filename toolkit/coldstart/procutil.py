"""Process helpers shared by the stages that start long-lived children."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when the thread that started it dies (kept across exec),
    so a killed checkpoint leaves neither its server nor its ``criu dump`` running."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_MARK: tuple[int, frozenset[str]] | None = None


def _mapped_files() -> list[str]:
    try:
        with open("/proc/self/maps") as fh:
            return [p[5].strip() for p in (ln.split(None, 5) for ln in fh) if len(p) == 6 and p[5].startswith("/")]
    except OSError:
        return []


def mark_loaded_files() -> None:
    """Remember what this process has loaded so far (its modules, the files it maps), so that
    ``loaded_files`` can tell those from what it loads after (a restore's entrypoint marks the moment
    it starts CRIU: what it loaded before is what a warmer must read first)."""
    global _MARK
    _MARK = (len(sys.modules), frozenset(_mapped_files()))


def loaded_files() -> list[tuple[str, bool]]:
    """The files this process read to get here, each once, with whether it loaded it after
    ``mark_loaded_files`` (all False without a mark), in the order it needed them: the files it
    maps first (the interpreter, libpython, the C libraries, mapped before any module loads),
    then its modules in import order; then the same two for what came after the mark. A module is
    its bytecode where that exists (Python only stats the source then), else its file."""
    count, mapped_before = _MARK if _MARK is not None else (None, None)
    mods: list[tuple[str, bool]] = []
    for i, m in enumerate(list(sys.modules.values())):
        spec = getattr(m, "__spec__", None)
        cached = getattr(spec, "cached", None) if spec is not None else None
        f = cached if cached and os.path.exists(cached) else getattr(m, "__file__", None)
        if f:
            mods.append((f, count is not None and i >= count))
    maps = [(f, mapped_before is not None and f not in mapped_before) for f in _mapped_files()]
    ordered = [x for x in maps if not x[1]] + [x for x in mods if not x[1]] + \
              [x for x in mods if x[1]] + [x for x in maps if x[1]]
    seen: set[str] = set()
    out: list[tuple[str, bool]] = []
    for f, late in ordered:
        if f.startswith("/") and f not in seen:
            seen.add(f)
            out.append((f, late))
    return out
