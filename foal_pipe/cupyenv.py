"""The settings CuPy compiles its kernels with, made before anything imports CuPy.

Importing ``foal_pipe`` calls :func:`cupy_environment` first thing: CuPy reads these variables when it is
imported, and zarr imports CuPy (for its GPU buffers) wherever CuPy is installed, so by the time a command picks
its array backend CuPy has long been imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys

CUPY_COMPILE_DEFAULTS = {"CUPY_ACCELERATORS": "", "CUPY_NVRTC_USE_PCH": "1"}
"""CuPy's compile settings foal-pipe starts CuPy with where the environment does not set them. A first call
compiles each kernel it uses (cached on disk after): CuPy's default CUB reductions compile through CUB's headers
(3.8 s for the one ``all`` of a Cholesky check on an H200), its own reduction kernels in a fraction of that, and
NVRTC's precompiled headers (CUDA 12.8 or later; CuPy leaves the option out before) share the common header work
between kernels. On an H200, ``learn``'s first call on an empty kernel cache took 6.5 s in-process with CuPy's
defaults and 2.4 s with these; warm calls are alike (0.97 and 0.80 s). docs/gpu.md has the measurements."""


def cupy_environment() -> None:
    """Set :data:`CUPY_COMPILE_DEFAULTS` that the environment leaves unset, unless CuPy is missing or already
    imported (a process that imported CuPy or zarr before foal_pipe keeps the settings CuPy started with)."""
    if "cupy" in sys.modules or importlib.util.find_spec("cupy") is None:
        return
    for name, value in CUPY_COMPILE_DEFAULTS.items():
        os.environ.setdefault(name, value)
