"""Array namespaces: the learner is written once against the array API and runs on NumPy or CuPy.

Namespaces are array-api-compat's wrappers (``array_api_compat.numpy``, ``array_api_compat.cupy``), so
the code in :mod:`foal_pipe.statistics` and :mod:`foal_pipe.engines` calls standard functions only. CuPy is
optional (``pip install foal-pipe[gpu]``); nothing here imports it unless asked.
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


def resolve_backend(backend: str = "auto") -> str:
    """``numpy`` or ``cupy``; ``auto`` picks CuPy when it is installed and sees a GPU."""
    if backend not in BACKENDS:
        raise FoalPipeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        return "numpy"
    if _cupy() is None:
        if backend == "cupy":
            raise FoalPipeError(
                "--backend cupy needs CuPy and a CUDA GPU; install it with `pip install foal-pipe[gpu]` "
                "or use --backend numpy"
            )
        return "numpy"
    return "cupy"


def get_namespace(backend: str = "auto") -> ModuleType:
    """The array-API namespace of a backend (see :func:`resolve_backend`)."""
    if resolve_backend(backend) == "cupy":
        import array_api_compat.cupy as xp
    else:
        import array_api_compat.numpy as xp
    return xp


def to_numpy(array: Any) -> np.ndarray:
    """Copy a NumPy, CuPy or torch array to host memory as a NumPy array."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "get"):  # CuPy
        return np.asarray(array.get())
    if hasattr(array, "cpu"):  # torch
        return np.asarray(array.cpu())
    return np.asarray(array)


def dtype_name(dtype: Any) -> str:
    """``float32`` for NumPy's and torch's float32 dtype objects alike."""
    return getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype).split(".")[-1]


def resolve_dtype(dtype: str | type | np.dtype) -> np.dtype:
    """Validate a state dtype name (``float64`` or ``float32``)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in DTYPES:
        raise FoalPipeError(f"unsupported dtype {name!r}; use float64 (exact, default) or float32")
    return np.dtype(DTYPES[name])
