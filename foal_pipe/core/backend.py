"""Array namespaces: the learner is written once against the array API and runs on NumPy, CuPy or torch.

Namespaces are array-api-compat's wrappers (``array_api_compat.numpy``, ``.cupy``, ``.torch``), so the code
in :mod:`foal_pipe.core.statistics`, :mod:`foal_pipe.core.engines`, :mod:`foal_pipe.model.projection` and the evaluation
of :mod:`foal_pipe.protocol` calls standard functions only. CuPy (``pip install -e '.[gpu]'``) and torch
(``pip install -e '.[extract]'``) are optional: nothing here imports them unless asked, and ``auto``
imports torch only where an NVIDIA driver is present. ``array_api_strict``, the standard's reference
namespace, is accepted too (the CLI help does not list it): the tests run the whole learner on it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from array_api_compat import (
    array_namespace,
    is_array_api_obj,
    is_array_api_strict_namespace,
    is_cupy_namespace,
    is_numpy_array,
    is_numpy_namespace,
    is_torch_array,
    is_torch_namespace,
)

from foal_pipe.errors import FoalPipeError, param

BACKENDS = ("auto", "numpy", "cupy", "torch")
DTYPES = {"float64": np.float64, "float32": np.float32}
#: Present when an NVIDIA driver is loaded: ``auto`` looks for torch's CUDA only then (importing torch is slow).
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def _cupy() -> ModuleType | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no driver, no device
        return None


def _torch_cuda() -> bool:
    """torch is installed and sees a CUDA GPU (torch is imported only where a driver is loaded)."""
    if not NVIDIA_DRIVER.exists():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _numpy_namespace() -> ModuleType:
    import array_api_compat.numpy as xp

    return xp


def _cupy_namespace() -> ModuleType:
    if _cupy() is None:
        raise FoalPipeError(
            f"{param('backend', 'cupy')} needs CuPy and a CUDA GPU; install it in the foal-pipe clone with "
            f"`pip install -e '.[gpu]'` or use {param('backend', 'numpy')}"
        )
    import array_api_compat.cupy as xp

    return xp


def _torch_namespace() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise FoalPipeError(
            f"{param('backend', 'torch')} needs PyTorch; install it in the foal-pipe clone with `pip install -e '.[extract]'` "
            f"(or `pip install torch`) or use {param('backend', 'numpy')}"
        ) from None
    import array_api_compat.torch as xp

    if torch.cuda.is_available():
        torch.cuda.init()  # the CUDA context now, in the backend's start-up, rather than in the first step's seconds
    return xp


def _strict_namespace() -> ModuleType:
    try:
        import array_api_strict as xp
    except ImportError:
        raise FoalPipeError("backend array_api_strict needs `pip install array-api-strict` (the dev extra)") from None
    return xp


#: Namespace loaders by backend name; each raises a one-line FoalPipeError when its library is missing.
NAMESPACES: dict[str, Callable[[], ModuleType]] = {
    "numpy": _numpy_namespace,
    "cupy": _cupy_namespace,
    "torch": _torch_namespace,
    "array_api_strict": _strict_namespace,
}


#: How to recognise each backend's namespace (:func:`backend_of`).
IS_NAMESPACE: dict[str, Callable[[ModuleType], bool]] = {
    "numpy": is_numpy_namespace,
    "cupy": is_cupy_namespace,
    "torch": is_torch_namespace,
    "array_api_strict": is_array_api_strict_namespace,
}


def linalg_errors() -> tuple[type[Exception], ...]:
    """What a backend's ``linalg`` raises on a singular or indefinite matrix: NumPy's LinAlgError (CuPy's too, under
    ``cupyx.errstate(linalg="raise")``), torch's ``torch.linalg.LinAlgError`` once torch is imported (no torch
    array exists before). Not RuntimeError at large: torch's out-of-memory and CUDA errors are RuntimeErrors, and
    they say nothing about the matrix."""
    torch = sys.modules.get("torch")
    linalg = getattr(torch, "linalg", None)
    return (np.linalg.LinAlgError,) if linalg is None else (np.linalg.LinAlgError, linalg.LinAlgError)


def resolve_backend(backend: str = "auto") -> str:
    """A key of :data:`NAMESPACES`; ``auto``: CuPy if it sees a GPU, else torch on CUDA if available, else NumPy."""
    if not isinstance(backend, str) or (backend not in BACKENDS and backend not in NAMESPACES):
        raise FoalPipeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if _cupy() is not None:
        return "cupy"
    return "torch" if _torch_cuda() else "numpy"


def get_namespace(backend: str = "auto") -> ModuleType:
    """The array-API namespace of a backend (see :func:`resolve_backend`)."""
    return NAMESPACES[resolve_backend(backend)]()


def backend_of(array: Any) -> str:
    """The backend name of an array (``torch`` for a torch tensor, and so on)."""
    xp = array_namespace(array)
    for name, is_namespace in IS_NAMESPACE.items():
        if is_namespace(xp):
            return name
    raise FoalPipeError(f"arrays of {xp.__name__} are not supported; use NumPy, CuPy or torch arrays")


def _torch_device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


#: Where each backend makes arrays from host data (absent: the namespace's default device).
DEFAULT_DEVICES: dict[str, Callable[[], Any]] = {"torch": _torch_device}


def default_device(xp: ModuleType) -> Any:
    """Where a namespace's arrays are made from host data: torch's CUDA device when it has one, else the default."""
    for name, is_namespace in IS_NAMESPACE.items():
        if is_namespace(xp):
            return DEFAULT_DEVICES[name]() if name in DEFAULT_DEVICES else None
    return None


def _cupy_sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _torch_sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


#: How to wait for the work a backend has queued on its device (absent: it computes on the host, synchronously).
SYNCHRONIZE: dict[str, Callable[[], None]] = {"cupy": _cupy_sync, "torch": _torch_sync}


def synchronize(xp: ModuleType) -> None:
    """Wait until the device of namespace ``xp`` has finished what was queued on it, so that a step's seconds
    count the device work the step queued, on a GPU as on the CPU (a no-op on NumPy)."""
    for name, wait in SYNCHRONIZE.items():
        if IS_NAMESPACE[name](xp):
            wait()
            return


def _strict_to_host(array: Any) -> np.ndarray:
    import array_api_strict

    return np.from_dlpack(array.to_device(array_api_strict.Device("CPU_DEVICE")))


#: How each backend copies an array to host memory.
TO_HOST: dict[str, Callable[[Any], np.ndarray]] = {
    "numpy": np.asarray,
    "cupy": lambda array: array.get(),
    "torch": lambda array: array.detach().cpu().numpy(),
    "array_api_strict": _strict_to_host,
}


def to_numpy(array: Any) -> np.ndarray:
    """Copy a NumPy, CuPy, torch or array_api_strict array to host memory as a NumPy array."""
    if isinstance(array, np.ndarray):
        return array
    if isinstance(array, np.generic) or not is_array_api_obj(array):
        return np.asarray(array)
    return TO_HOST[backend_of(array)](array)


def plain_values(array: Any, what: str = "X") -> Any:
    """A torch tensor as values that every namespace reads alike (anything else as given): detached (no gradient
    flows through a closed-form solve), bfloat16 widened to float32 (exact; NumPy has no bfloat16); refused in a
    sparse layout, as scikit-learn refuses SciPy's sparse matrices, or on the ``meta`` device, which holds no values.
    A NumPy masked array with masked entries is refused: every reader would take the values behind the mask."""
    if isinstance(array, np.ma.MaskedArray) and np.ma.is_masked(array):
        raise FoalPipeError(f"{what} has masked (missing) entries, which would be read as the values behind the mask; "
                            f"fill them ({what}.filled(value)) or drop their rows")
    if not is_torch_array(array):
        return array
    import torch

    if array.layout != torch.strided:
        raise FoalPipeError(f"{what} is a sparse torch tensor ({array.layout}), but dense data is required; pass "
                            f"{what}.to_dense()")
    if array.is_meta:
        raise FoalPipeError(f"{what} is a torch tensor on the 'meta' device, which holds no values; pass a tensor with "
                            "its data (on the CPU or a GPU)")
    array = array.detach()
    return array.float() if array.dtype == torch.bfloat16 else array


def host_values(array: Any, what: str = "X") -> Any:
    """An array of any namespace as a NumPy array (:func:`plain_values` first); anything else (a list) as given."""
    return to_numpy(plain_values(array, what)) if is_array_api_obj(array) else array


def readable_by(X: Any, xp: ModuleType) -> Any:
    """``X`` as namespace ``xp`` can take it: torch refuses a NumPy view with a negative stride (reversed) or in
    non-native byte order, so such a view is copied for a namespace other than NumPy (NumPy's own path copies
    nothing); array_api_strict has no float16, so a float16 array (a torch tensor's) is widened to float32 (exact)."""
    if is_array_api_strict_namespace(xp) and dtype_name(getattr(X, "dtype", None)) == "float16":
        source = array_namespace(X)
        return source.astype(X, source.float32)
    if is_numpy_array(X) and not is_numpy_namespace(xp) and (not X.dtype.isnative or min(X.strides, default=0) < 0):
        return np.ascontiguousarray(X, dtype=X.dtype.newbyteorder("="))
    return X


def dtype_name(dtype: Any) -> str:
    """``float32`` for NumPy's and torch's float32 dtype objects alike."""
    return getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype).split(".")[-1]


def resolve_dtype(dtype: str | type | np.dtype) -> np.dtype:
    """Validate a state dtype name (``float64`` or ``float32``)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in DTYPES:
        raise FoalPipeError(f"unsupported dtype {name!r}; use float64 (exact, default) or float32")
    return np.dtype(DTYPES[name])


#: float32's largest value, and the least row maximum whose entries that matter (above float32's precision times
#: the maximum) stay normal in float32: below it a row's entries round coarsely or flush to zero.
FLOAT32_MAX, FLOAT32_ROW_FLOOR = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny / np.finfo(np.float32).eps)


def as_dtype(X: Any, xp: ModuleType, dtype: Any, where: Any) -> Any:
    """``X`` (rows) in ``xp``'s ``dtype`` on ``where``; float64 rows narrowed to float32 are refused where they leave
    its range (a row of magnitude 1e-150 became zeros, one of 1e140 inf: chance-level scores or a wrong refusal)."""
    if dtype_name(getattr(X, "dtype", None)) == "float64" and dtype_name(dtype) == "float32" and X.shape[0] * X.shape[1]:
        source = array_namespace(X)
        top = source.max(source.abs(X), axis=1)
        positive = top[top > 0]
        largest = float(source.max(top))
        smallest = float(source.min(positive)) if positive.shape[0] else FLOAT32_ROW_FLOOR
        if largest > FLOAT32_MAX or smallest < FLOAT32_ROW_FLOOR:
            beyond = f"{largest:.3g}, beyond" if largest > FLOAT32_MAX else f"{smallest:.3g}, below"
            raise FoalPipeError(f"the rows hold values of magnitude {beyond} float32's range, which {param('dtype', 'float32')} "
                                f"would turn into inf or zeros; use {param('dtype', 'float64')} or scale the features")
    return xp.asarray(readable_by(X, xp), dtype=dtype, device=where)
