"""Array namespaces: the learner is written once against ``xp`` and runs on NumPy or CuPy.

CuPy is optional (``pip install foal-pipe[gpu]``); nothing here imports it unless asked.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError

BACKENDS = ("auto", "numpy", "cupy")
DTYPES = {"float64": np.float64, "float32": np.float32}


def _cupy() -> ModuleType | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no driver, no device
        return None


def get_namespace(backend: str = "auto") -> ModuleType:
    """``numpy`` or ``cupy``; ``auto`` picks CuPy when it is installed and sees a GPU."""
    if backend not in BACKENDS:
        raise FoalPipeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        return np
    cp = _cupy()
    if cp is None and backend == "cupy":
        raise FoalPipeError(
            "--backend cupy needs CuPy and a CUDA GPU; install it with `pip install foal-pipe[gpu]` "
            "or use --backend numpy"
        )
    return cp or np


def to_numpy(array: Any) -> np.ndarray:
    """Copy a NumPy or CuPy array to host memory as a NumPy array."""
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else np.asarray(array)


def resolve_dtype(dtype: str | type | np.dtype) -> np.dtype:
    """Validate a state dtype name (``float64`` or ``float32``)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in DTYPES:
        raise FoalPipeError(f"unsupported dtype {name!r}; use float64 (exact, default) or float32")
    return np.dtype(DTYPES[name])
