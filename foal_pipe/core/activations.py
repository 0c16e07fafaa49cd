"""The activations of the smooth projection and its initialisations, by name: registries light enough for the
command line's choices (no scikit-learn)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_array

from foal_pipe.errors import FoalPipeError

INITS = ("uniform", "normal")


def sigmoid(z: Any) -> Any:
    """Overflow-free logistic function, in place: 0.5 * (1 + tanh(z / 2)). On NumPy ``tanh`` writes into ``z``: a
    fresh array for it, a block's worth of new pages, cost as much as the arithmetic (the same bits either way)."""
    xp = array_namespace(z)
    z *= 0.5
    out = np.tanh(z, out=z) if is_numpy_array(z) else xp.tanh(z)
    out += 1.0
    out *= 0.5
    return out


def relu(z: Any) -> Any:
    """``max(z, 0)``, in place: a negative entry becomes +0, every other (-0 and NaN included) stays as it is. On
    NumPy by ``maximum`` (vectorised, about 9x the masked write) when no entry is zero, as ``maximum`` would turn -0
    into +0; otherwise by the mask."""
    if is_numpy_array(z) and not np.any(z == 0):
        return np.maximum(z, 0, out=z)
    z[z < 0] = 0
    return z


def identity(z: Any) -> Any:
    return z


def cos(z: Any) -> Any:
    """Random Fourier features (Rahimi & Recht 2007), as KLDA draws them: ``sqrt(2 / D) cos(z)`` of the projection
    plus its bias (``z = x W + b``, ``b`` uniform in [0, 2 pi): :data:`BIASED`), so that ``phi(x)^T phi(y)``
    approximates a shift-invariant kernel of ``x - y`` (Gaussian for a Gaussian ``W``)."""
    xp = array_namespace(z)
    out = xp.cos(z)
    out *= (2.0 / z.shape[1]) ** 0.5
    return out


#: Activation functions by name; each may overwrite its argument.
ACTIVATIONS: dict[str, Callable[[Any], Any]] = {"sigmoid": sigmoid, "relu": relu, "identity": identity, "cos": cos}
#: The activations whose projection adds a bias drawn uniformly from [0, 2 pi), one per column, after the matrix.
BIASED = ("cos",)
#: The activations that round every small enough input to their value at 0 (``relu`` and ``identity`` return it exactly):
#: :meth:`~foal_pipe.core.expansion.Expansion.apply` refuses rows that differ but all land there.
ROUNDED_AT_ZERO = ("sigmoid", "cos")


def check_activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise FoalPipeError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")
    return name
