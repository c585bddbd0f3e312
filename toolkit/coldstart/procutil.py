"""Process helpers shared by the stages that start long-lived children."""
from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when the thread that started it dies (kept across exec),
    so a killed checkpoint leaves neither its server nor its ``criu dump`` running."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
