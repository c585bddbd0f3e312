"""numpy as the warm stage imports it: with OpenBLAS limited to one thread. Warming does no linear
algebra, but OpenBLAS starts a thread per CPU at load that spins for a while: ~0.09 CPU-s during a
restore's entrypoint on 2 cores (a whole-machine profile). The variable is set only around the
import, so a process started later (a cold boot's vLLM) does not inherit it; numpy already loaded
is left as it is."""
import os
import sys

if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]

import numpy as np  # noqa: E402

__all__ = ["np"]
