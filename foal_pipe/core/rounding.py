"""The rounding Gram sums carry from the products and additions that formed them (:class:`Rounding`), which the drift
checks take (:func:`~foal_pipe.core.drift.rounding_top`).

Two figures, as rounding comes two ways. Rows that differ round as a random walk: each product and addition rounds
every entry by up to a unit of the sum's size, independently, so their variances add (``variance``). Rows added again
and again (a batch in several epochs) round the same way at every addition of the same increment within one binade,
so their errors add linearly, which no count of additions bounds tightly; for them the additions' error is measured
exactly (TwoSum) at :data:`SAMPLED_ENTRIES` fixed entries of ``G`` (``errors``), and the drift checks take whichever
is larger. A product's own rounding is not measured: one product is what the calibration stands for. Only ``G``'s
rounding is counted: ``Q`` is held in float64 (:class:`~foal_pipe.core.statistics.RidgeStatistics`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import dtype_name, to_numpy
from foal_pipe.core.drift import PRODUCT_ROWS, UNITS
from foal_pipe.core.sumfields import top_diagonal
from foal_pipe.errors import FoalPipeError

#: How many entries of ``G`` the sums' rounding is measured at (fixed per dimension: :func:`sample_entries`).
SAMPLED_ENTRIES = 64


@dataclass(frozen=True, eq=False)
class Rounding:
    """The rounding of sums ``G``: ``variance``, the sum over the products and additions that formed them of
    ``(u max diag)^2`` after each (``u``: the unit of rounding of the dtype it happened in; a product of ``n`` rows
    counts ``n / PRODUCT_ROWS`` times), and ``errors``, the additions' exact sum minus the sums at
    :func:`sample_entries` (float64; None where not measured, as for sums given directly)."""

    variance: float
    errors: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rounding):
            return NotImplemented
        if self.errors is None or other.errors is None:
            return self.variance == other.variance and self.errors is other.errors
        return self.variance == other.variance and np.array_equal(self.errors, other.errors)

    __hash__ = None  # type: ignore[assignment]  # mutable errors: as an array, unhashable

    def __add__(self, other: Rounding) -> Rounding:
        errors = (other.errors if self.errors is None else self.errors if other.errors is None
                  else self.errors + other.errors)
        return Rounding(self.variance + other.variance, errors)

    def measured(self) -> float:
        """The root mean square of the measured ``errors`` (0 where none were measured)."""
        return 0.0 if self.errors is None or not self.errors.size else float(np.sqrt(np.mean(self.errors**2)))


def checked_rounding(value: Any, dim: int) -> Rounding:
    """``value`` (a :class:`Rounding`, or its ``variance`` alone: a number) checked: a finite variance >= 0 and, where
    given, one finite error per sampled entry of sums of dimension ``dim``."""
    variance, errors = (value.variance, value.errors) if isinstance(value, Rounding) else (value, None)
    try:
        if isinstance(variance, (bool, np.bool_, str, bytes)):
            raise TypeError
        checked = float(variance)
    except (TypeError, ValueError, OverflowError):
        checked = math.nan
    if not (math.isfinite(checked) and checked >= 0):
        raise FoalPipeError(f"rounding must be a finite number >= 0 (the variance of the sums' rounding), got "
                            f"{variance!r:.40}; leave it out (None) when unknown")
    if errors is not None:
        errors = np.asarray(errors, dtype=np.float64).ravel()
        if errors.size != sample_entries(dim)[0].size or not np.isfinite(errors).all():
            raise FoalPipeError(f"the rounding's errors must be {sample_entries(dim)[0].size} finite numbers, one per "
                                f"sampled entry of sums of dimension {dim}; leave them out when unknown")
    return Rounding(checked, errors)


@functools.lru_cache(maxsize=32)
def sample_entries(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of the entries of ``G`` (``dim`` x ``dim``) where its rounding is measured: fixed by the
    dimension, so sums of one dimension measure the same entries in any process."""
    rng = np.random.default_rng(dim)
    size = min(SAMPLED_ENTRIES, dim * dim)
    return rng.integers(0, max(dim, 1), size), rng.integers(0, max(dim, 1), size)


def sampled(G: Any) -> np.ndarray:
    """``G`` at :func:`sample_entries`, as float64 host values."""
    xp, dim = array_namespace(G), G.shape[0]
    rows, cols = sample_entries(dim)
    flat = xp.asarray(rows * dim + cols, device=device(G))
    return to_numpy(xp.take(xp.reshape(G, (-1,)), flat)).astype(np.float64)


def addition_errors(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``a + b - total`` exactly (float64 host values at the sampled entries; ``total``: the sum as rounded), by
    TwoSum: ``a + b = s + e`` exactly, ``s - total`` exact where they lie close."""
    s = a + b
    bb = s - a
    return (s - total) + ((a - (s - bb)) + (b - bb))


def unit(G: Any) -> float:
    """The unit of rounding of ``G``'s dtype (:data:`~foal_pipe.core.drift.UNITS`); sums of another dtype refused."""
    name = dtype_name(G.dtype)
    if name not in UNITS:
        raise FoalPipeError(f"sums of dtype {name} are not supported (their rounding is not bounded here); pass rows "
                            "as float32 or float64")
    return UNITS[name]


def product_rounding(H: Any, G: Any) -> Rounding:
    """The rounding of ``G = H^T H`` as formed from the rows ``H``: ``n / PRODUCT_ROWS`` additions' variance (at
    least one). Nothing is measured: one product's rounding is the calibration's (its errors read 0)."""
    return Rounding(max(1.0, H.shape[0] / PRODUCT_ROWS) * (unit(G) * top_diagonal(G)) ** 2,
                    np.zeros(sample_entries(G.shape[0])[0].size))


def addition_rounding(a: np.ndarray, b: np.ndarray, total: Any) -> Rounding:
    """The rounding of one addition of sums whose sampled entries were ``a`` and ``b`` (:func:`sampled`, taken
    before), ``total`` their sum as rounded: a unit of its largest entry, and the errors measured."""
    return Rounding((unit(total) * top_diagonal(total)) ** 2, addition_errors(a, b, sampled(total)))
