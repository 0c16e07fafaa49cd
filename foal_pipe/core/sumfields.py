"""The fields of :class:`~foal_pipe.core.statistics.RidgeStatistics` as given, checked: the rows summed, the rows
per class and the kind of the class labels; and the largest diagonal entry, which the sums' rounding is counted in."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from foal_pipe.errors import FoalPipeError, clipped


def row_count(n: Any) -> int:
    """``n`` as the number of rows: a whole number >= 0 (a boolean or a fraction refused rather than truncated)."""
    if isinstance(n, (float, np.floating)) and float(n).is_integer():
        n = int(n)
    try:
        if isinstance(n, (bool, np.bool_)):
            raise TypeError
        count = operator.index(n)
    except TypeError:
        raise FoalPipeError(f"n (the rows summed) must be a whole number, got {n!r:.40}; pass H.shape[0]") from None
    if count < 0:
        raise FoalPipeError(f"n (the rows summed) is {count}, below 0; pass H.shape[0]")
    return count


def class_counts(counts: Any, n: int) -> np.ndarray:
    """``counts`` as int64 rows per class: whole numbers >= 0 that sum to at most ``n`` (fewer: classes restricted
    away), as the model file holds them."""
    given = np.asarray(counts).ravel()
    if given.dtype.kind not in "iuf" or (given.dtype.kind == "f" and not np.all(np.mod(given, 1) == 0)):
        raise FoalPipeError(f"counts must hold whole numbers of rows per class, got {clipped(str(given.tolist()))}; "
                            "pass np.bincount of the rows' class positions")
    checked = given.astype(np.int64)
    if checked.size and int(checked.min()) < 0:
        raise FoalPipeError(f"counts holds {int(checked.min())}, but a class has at least 0 rows; pass the rows per class")
    if int(checked.sum()) > n:
        raise FoalPipeError(f"counts sum to {int(checked.sum())} rows, more than n={n}, the rows summed; pass "
                            "n = H.shape[0] and the rows per class")
    return checked


def label_kind(classes: np.ndarray) -> str:
    """``number`` (bools, integers and floats sort together), ``str`` or ``bytes``; for an object array holding
    several of them, those kinds joined by ``/``."""
    kinds = {"b": "number", "i": "number", "u": "number", "f": "number", "U": "str", "S": "bytes"}
    if classes.dtype.kind != "O":
        return kinds.get(classes.dtype.kind, classes.dtype.name)
    found = {"str" if isinstance(v, str) else "bytes" if isinstance(v, bytes)
             else "number" if isinstance(v, numbers.Real) else type(v).__name__ for v in classes.ravel().tolist()}
    return "/".join(sorted(found)) or "number"


def joined_classes(classes: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``classes`` with ``other``'s new ones, sorted: ``classes`` itself (its dtype kept) where ``other`` brings none,
    as a learner that saw both streams keeps the classes it had (float labels after int ids leave the ids int)."""
    new = np.setdiff1d(other, classes)
    return classes if new.size == 0 else np.union1d(classes, new)


def top_diagonal(G: Any) -> float:
    """The largest diagonal entry of sums ``G`` (their largest entry: ``|G_ij| <= sqrt(G_ii G_jj)``), 0 when empty."""
    xp = array_namespace(G)
    return max(float(xp.max(xp.linalg.diagonal(G))), 0.0) if G.shape[0] else 0.0
