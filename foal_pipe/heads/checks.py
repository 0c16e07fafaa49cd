"""Checks shared by the heads on projected rows: their options and the rows they are given, refused in one line."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from foal_pipe.core.engines import NOT_NUMBERS
from foal_pipe.errors import FoalPipeError, param

#: Bytes of one float64 (the heads' state is float64 whatever the store's dtype).
FLOAT64 = 8


def _number(name: str, value: Any, example: Any) -> float:
    try:
        if isinstance(value, NOT_NUMBERS):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise FoalPipeError(f"{param(name)} must be a number, got {value!r}", f"try {param(name, example)}") from None
    if not math.isfinite(number):
        raise FoalPipeError(f"{param(name)} must be a finite number, got {value!r}", f"try {param(name, example)}")
    return number


def positive(name: str, value: Any) -> float:
    """``value`` as a positive finite float (a ridge gamma), else a one-line refusal naming ``name``."""
    number = _number(name, value, 1)
    if number <= 0:
        raise FoalPipeError(f"{param(name)} must be a positive number, got {value!r}", f"try {param(name, 1)}")
    return number


def finite(name: str, value: Any) -> float:
    """``value`` as a finite float, else a one-line refusal naming ``name``."""
    return _number(name, value, 1)


def at_least_one(name: str, value: Any, example: int) -> int:
    """``value`` as an integer >= 1, else a one-line refusal naming ``name``."""
    number = _number(name, value, example)
    if isinstance(value, bool) or not number.is_integer() or number < 1:
        raise FoalPipeError(f"{param(name)} must be a whole number of at least 1, got {value!r}",
                            f"try {param(name, example)}")
    return int(number)


def check_rows(X: Any, labels: Any, dim: int) -> np.ndarray:
    """The labels as a host vector, refused unless ``X`` is ``(len(labels), dim)``."""
    labels = np.asarray(labels).ravel()
    if X.ndim != 2 or X.shape[1] != dim:
        raise FoalPipeError(f"rows have shape {tuple(X.shape)} but the head was built for dim={dim}; "
                            "build the head with the rows' width")
    if X.shape[0] != labels.size:
        raise FoalPipeError(f"{X.shape[0]} rows but {labels.size} labels; pass one label per row")
    return labels
