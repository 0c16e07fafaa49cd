"""The rounding Gram sums carry from the products and additions that formed them (:class:`Rounding`), which the drift
checks take (:func:`~foal_pipe.core.drift.rounding_top`).

Two figures, as rounding comes two ways. Rows that differ round as a random walk: each product and addition rounds
every entry by up to a unit of the sum's size, independently, so their variances add (``variance``). Rows added again
and again (a batch in several epochs) round the same way at every addition of the same increment within one binade,
so their errors add linearly, which no count of additions bounds tightly; for them the additions' error is measured
exactly (TwoSum) at :data:`SAMPLED_ENTRIES` fixed entries of ``G`` (``errors``), and the drift checks take whichever
is larger. A float32 product's own rounding is measured there too (:func:`product_errors`): rows repeated inside one
product round alike as well. Both are measured on the whole diagonal too (``diagonal``), whose relative errors
stand for every entry's (:func:`diagonal_estimate`): the sampled entries of a ReLU store of repeated rows read 0.84
units where every entry's errors were 2.4. Only ``G``'s rounding is counted: ``Q`` is held in float64
(:class:`~foal_pipe.core.statistics.RidgeStatistics`).
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

#: Errors below float32's least normal number are never refused as beyond the sums: sums that underflowed to 0
#: err by the values they flushed (:func:`checked_rounding`).
SUBNORMAL_ROUNDING = float(np.finfo(np.float32).smallest_normal)

#: Rows taken at a time where a whole ``G`` or block is read (:func:`product_errors`, :func:`diagonal_estimate`).
DIAGONAL_ROWS = 256


@dataclass(frozen=True, eq=False)
class Rounding:
    """The rounding of sums ``G``: ``variance``, the sum over the products and additions that formed them of
    ``(u max diag)^2`` after each (``u``: the unit of rounding of the dtype it happened in; a product of ``n`` rows
    counts ``n / PRODUCT_ROWS`` times), and ``errors``, the exact sums (of float32 products, and of the additions)
    minus the sums at :func:`sample_entries` (float64; None where not measured, as for sums given directly), and
    ``diagonal``, the same on ``G``'s diagonal (None where not measured: also sums read from a model file written
    before it was kept)."""

    variance: float
    errors: np.ndarray | None = None
    diagonal: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rounding):
            return NotImplemented
        return self.variance == other.variance and _same(self.errors, other.errors) and _same(self.diagonal,
                                                                                               other.diagonal)

    __hash__ = None  # type: ignore[assignment]  # mutable errors: as an array, unhashable

    def __add__(self, other: Rounding) -> Rounding:
        return Rounding(self.variance + other.variance, _plus(self.errors, other.errors),
                        _plus(self.diagonal, other.diagonal))

    def measured(self, G: Any = None, top: float | None = None) -> float:
        """The root mean square of the measured ``errors``, or where larger that of every entry of the sums ``G`` as
        their ``diagonal``'s errors estimate it (:func:`diagonal_estimate`; ``top``: ``max|G|`` where the caller has
        it); 0 where none were measured."""
        return max(_rms(self.errors), diagonal_estimate(self.diagonal, G, top))


def diagonal_estimate(diagonal: np.ndarray | None, G: Any, top: float | None = None) -> float:
    """The root mean square rounding of every entry of sums ``G`` whose diagonal errs by ``diagonal``: each entry
    taken to err by the diagonal's relative error times the entry's size, as sums of like terms round in proportion
    to their size; the relative error is the diagonal's ``|errors| / |sizes|`` (2-norms), so that tiny entries (a
    subnormal's relative error is ~1e-4) weigh as little as they err. Over float32 products of sigmoid and ReLU
    activations, of distinct and of repeated rows, in one block or many, this stood at 0.93-1.39x the root mean
    square over every entry, where 64 sampled entries read 0.25-1.31x of it (a sparse ReLU column's products are
    often exactly 0). Everything is scaled by ``max|G|`` (``top``; None: computed here) first: nothing overflows."""
    if diagonal is None or G is None or not diagonal.size:
        return 0.0
    xp, dim = array_namespace(G), G.shape[0]
    top = float(xp.max(xp.abs(G))) if top is None else top
    if not (math.isfinite(top) and top > 0):
        return 0.0
    sizes = to_numpy(xp.linalg.diagonal(G)).astype(np.float64) / top
    weight = float(np.sum(sizes * sizes))
    if weight == 0:
        return 0.0
    relative2 = float(np.sum((diagonal / top) ** 2)) / weight  # |errors|^2 / |sizes|^2 of the diagonal
    squares = 0.0
    for lo in range(0, dim, DIAGONAL_ROWS):  # G's mean square, scaled by its largest entry: no copy of G
        part = G[lo : min(lo + DIAGONAL_ROWS, dim), ...] / top
        squares += float(xp.sum(part * part))
    return math.sqrt(relative2 * squares) * top / dim


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is b if a is None or b is None else bool(np.array_equal(a, b))


def _plus(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """Measured errors of two parts added: where one part's were not measured, the other's."""
    return b if a is None else a if b is None else a + b


def _rms(errors: np.ndarray | None) -> float:
    return 0.0 if errors is None or not errors.size else float(np.sqrt(np.mean(errors**2)))


def checked_rounding(value: Any, dim: int, overflowed: bool = False, top: float | None = None) -> Rounding:
    """``value`` (a :class:`Rounding`, or its ``variance`` alone: a number) checked: a finite variance >= 0 and, where
    given, one finite error per sampled entry, and per diagonal entry, of sums of dimension ``dim``; with ``top``
    (the sums' largest entry), none beyond it: no rounding of sums errs by as much as the sums themselves (an edited
    model file). Of sums that ``overflowed`` (a diagonal entry not finite), the rounding of their products and
    additions (:func:`one_rounding`) is kept as it is: the solve refuses the sums, naming the overflow."""
    if overflowed and isinstance(value, Rounding):
        return value
    variance, errors, diagonal = ((value.variance, value.errors, value.diagonal) if isinstance(value, Rounding)
                                  else (value, None, None))
    try:
        if isinstance(variance, (bool, np.bool_, str, bytes)):
            raise TypeError
        checked = float(variance)
    except (TypeError, ValueError, OverflowError):
        checked = math.nan
    if not (math.isfinite(checked) and checked >= 0):
        raise FoalPipeError(f"rounding must be a finite number >= 0 (the variance of the sums' rounding), got "
                            f"{variance!r:.40}; leave it out (None) when unknown")
    size = sample_entries(dim)[0].size
    errors = _numbers(errors, size, f"the rounding's errors must be {size} finite numbers, one per sampled entry of "
                                    f"sums of dimension {dim}")
    diagonal = _numbers(diagonal, dim, f"the rounding's diagonal errors must be {dim} finite numbers, one per "
                                       f"diagonal entry of sums of dimension {dim}")
    if top is not None and math.isfinite(top):
        largest = max(math.sqrt(checked), *(float(np.max(np.abs(e), initial=0.0)) for e in (errors, diagonal)
                                            if e is not None))
        if largest > max(top, SUBNORMAL_ROUNDING):  # sums that underflowed err by what they flushed
            raise FoalPipeError(f"the rounding given errs by up to {largest:.3g}, more than the sums' largest entry "
                                f"({top:.3g}), which no rounding of them reaches; pass the rounding these sums were "
                                "formed with (a model file edited so: train it again)")
    return Rounding(checked, errors, diagonal)


def _numbers(values: Any, size: int, what: str) -> np.ndarray | None:
    """``values`` as ``size`` finite float64 numbers (None stays None), else one line: ``what``."""
    if values is None:
        return None
    try:
        out = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError, OverflowError):
        out = np.full(1, np.nan)
    if out.size != size or not np.isfinite(out).all():
        raise FoalPipeError(f"{what}; leave them out when unknown")
    return out


@functools.lru_cache(maxsize=32)
def sample_entries(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of the entries of ``G`` (``dim`` x ``dim``) where its rounding is measured: fixed by the
    dimension, so sums of one dimension measure the same entries in any process."""
    rng = np.random.default_rng(dim)
    size = min(SAMPLED_ENTRIES, dim * dim)
    return rng.integers(0, max(dim, 1), size), rng.integers(0, max(dim, 1), size)


def sampled(G: Any) -> np.ndarray:
    """``G`` at :func:`sample_entries`, then its diagonal, as float64 host values (:func:`split` parts them)."""
    xp, dim = array_namespace(G), G.shape[0]
    rows, cols = sample_entries(dim)
    flat = xp.asarray(np.concatenate([rows * dim + cols, np.arange(dim) * (dim + 1)]), device=device(G))
    return to_numpy(xp.take(xp.reshape(G, (-1,)), flat)).astype(np.float64)


def split(values: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sampled`'s values (or errors there) parted into the sampled entries' and the diagonal's."""
    size = sample_entries(dim)[0].size
    return values[:size], values[size:]


def addition_errors(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``a + b - total`` exactly (float64 host values at the sampled entries; ``total``: the sum as rounded), by
    TwoSum: ``a + b = s + e`` exactly, ``s - total`` exact where they lie close."""
    with np.errstate(over="ignore", invalid="ignore"):  # sums that overflowed: the solve refuses them, naming it
        s = a + b
        bb = s - a
        return (s - total) + ((a - (s - bb)) + (b - bb))


def one_rounding(G: Any) -> float:
    """``(u max diag G)^2``, the variance one rounding at the sums' scale stands for (:func:`rounding_at`)."""
    return rounding_at(top_diagonal(G), G)


def rounding_at(top: float, G: Any) -> float:
    """``(u top)^2`` for sums of ``G``'s dtype whose largest diagonal entry is ``top``: inf where they overflowed (the
    solve refuses them, naming it: :func:`~foal_pipe.core.linalg.finite_resolution`); refused where finite sums are
    too large for it to be counted in float64 (a largest entry past 1e170 in float64)."""
    scale = unit(G) * top
    if math.isfinite(top) and not math.isfinite(scale * scale):
        raise FoalPipeError(f"the {dtype_name(G.dtype)} Gram sums reach {top:.3g}, too large for their rounding to be "
                            "counted (its variance passes float64's range); rescale the features to about unit scale")
    return scale * scale


def unit(G: Any) -> float:
    """The unit of rounding of ``G``'s dtype (:data:`~foal_pipe.core.drift.UNITS`); sums of another dtype refused."""
    name = dtype_name(G.dtype)
    if name not in UNITS:
        raise FoalPipeError(f"sums of dtype {name} are not supported (their rounding is not bounded here); pass rows "
                            "as float32 or float64")
    return UNITS[name]


def product_rounding(H: Any, G: Any) -> Rounding:
    """The rounding of ``G = H^T H`` as formed from the rows ``H``: ``n / PRODUCT_ROWS`` additions' variance (at
    least one), and, for float32 sums, the product's error measured at the sampled entries (:func:`product_errors`):
    rows repeated inside one product round alike at each of its additions (16 rows 512 times each: 20 units of the
    largest entry, where the calibration stands for about one). float64 sums' errors read 0 (nothing finer to
    measure them with)."""
    variance = max(1.0, H.shape[0] / PRODUCT_ROWS) * one_rounding(G)
    dim = G.shape[0]
    if unit(G) <= UNITS["float64"]:
        return Rounding(variance, np.zeros(sample_entries(dim)[0].size), np.zeros(dim))
    return Rounding(variance, *split(product_errors(H, G), dim))


def product_errors(H: Any, G: Any) -> np.ndarray:
    """``H^T H - G`` at :func:`sampled`'s entries, the diagonal among them (float64 host values): the products of
    float32 rows are exact in float64, whose sums of ``n`` of them err by at most ``n 2^-53`` of their sizes, 2^-16 of
    a float32 unit at 8,192 rows: the float32 product's own rounding there, to float64's precision."""
    xp = array_namespace(H)
    rows, cols = (xp.asarray(index, device=device(H)) for index in sample_entries(G.shape[0]))
    entries = xp.sum(xp.astype(xp.take(H, rows, axis=1), xp.float64) * xp.astype(xp.take(H, cols, axis=1), xp.float64),
                     axis=0)
    squares = xp.zeros(H.shape[1], dtype=xp.float64, device=device(H))
    for lo in range(0, H.shape[0], DIAGONAL_ROWS):  # a few rows at a time: no float64 copy of a wide block
        wide = xp.astype(H[lo : min(lo + DIAGONAL_ROWS, H.shape[0]), ...], xp.float64)  # in bounds: array API
        squares = squares + xp.sum(wide * wide, axis=0)
    return np.concatenate([to_numpy(entries), to_numpy(squares)]).astype(np.float64) - sampled(G)


def addition_rounding(a: np.ndarray, b: np.ndarray, total: Any) -> Rounding:
    """The rounding of one addition of sums whose sampled entries were ``a`` and ``b`` (:func:`sampled`, taken
    before), ``total`` their sum as rounded: a unit of its largest entry, and the errors measured."""
    return Rounding(one_rounding(total), *split(addition_errors(a, b, sampled(total)), total.shape[0]))
