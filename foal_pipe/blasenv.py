"""How long OpenBLAS's idle threads spin, set before anything loads OpenBLAS (NumPy's and SciPy's).

Importing ``foal_pipe`` calls :func:`blas_environment` first thing, beside :func:`~foal_pipe.cupyenv.cupy_environment`:
OpenBLAS reads the variable once, when the library loads.
"""

from __future__ import annotations

import os
import sys

#: OpenBLAS's idle threads spin this many cycles, as a power of two, before they sleep (its default: 2^28, about
#: 0.1 s). A thread that spins after a product holds a core that other work could use: the factorisation foal-pipe
#: runs on a second thread beside the walk (:class:`~foal_pipe.protocol.ahead.FactorAhead`) started after a
#: two-thread product lost its core to the spinning thread for about 0.05 s of its 0.11 s (``eigh`` at D = 1,000
#: beside a block's projection on the 2-core machine: 0.167 s for the pair, 0.117 s with 2^4). Waking a sleeping
#: thread costs microseconds, against products of milliseconds. Only scheduling changes, not a bit of any result.
OPENBLAS_THREAD_TIMEOUT = "4"
#: The variables OpenBLAS reads for it; one set by the user is kept.
TIMEOUT_VARIABLES = ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")


def blas_environment() -> None:
    """Set :data:`OPENBLAS_THREAD_TIMEOUT` where the environment sets neither of :data:`TIMEOUT_VARIABLES`, unless
    NumPy or SciPy is already imported (their OpenBLAS has read the environment: the process keeps its setting)."""
    if "numpy" in sys.modules or "scipy" in sys.modules or any(name in os.environ for name in TIMEOUT_VARIABLES):
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
