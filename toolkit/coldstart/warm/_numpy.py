"""numpy as the warm stage imports it: with OpenBLAS limited to one thread. Warming does no linear
algebra, but OpenBLAS starts a thread per CPU at load that spins for a while: ~0.09 CPU-s during a
restore's entrypoint on 2 cores (a whole-machine profile). The variable is set only around the
import, so a process started later (a cold boot's vLLM) does not inherit it; numpy already loaded
is left as it is.

``MAPPED``: the files that numpy's import mapped into this process (OpenBLAS, its extension
modules), when it was imported here. A recorded profile leaves them and numpy's modules out of the
entrypoint's own files (profile.own_files_ranges): a restore warmed from its host imports the
warmer only after its first token, so a host that read them first would delay what the restore
waits for."""
import os
import sys


def mapped_files() -> list[str]:
    """The paths this process maps (files, and pseudo names such as [heap]), once each, in
    /proc/self/maps order."""
    try:
        with open("/proc/self/maps") as fh:
            return list(dict.fromkeys(p[5].strip() for p in (ln.split(None, 5) for ln in fh) if len(p) == 6))
    except OSError:
        return []


MAPPED: frozenset[str] = frozenset()
if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
    _before = set(mapped_files())
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]
    MAPPED = frozenset(mapped_files()).difference(_before)

import numpy as np  # noqa: E402

__all__ = ["np", "MAPPED", "mapped_files"]
