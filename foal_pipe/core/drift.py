"""The estimates behind the gamma checks (:mod:`foal_pipe.core.linalg` runs the solves that feed them): how far the
rounding of the Gram sums may move the weights, and the least gamma the sums resolve.

Float rounding of a sum of products is relative to that entry's own terms: ``|dG_ij| <= c u sum_k |h_ki h_kj| <= c u
sqrt(G_ii G_jj)`` (Cauchy-Schwarz), not ``c u max|G|``. So each column is measured at its own scale
(:func:`column_scales`), as a Cholesky solve of ``G + gamma I`` is accurate to the symmetrically equilibrated
system's condition, whatever the columns' scales (van der Sluis): a column 1e12 times the others neither rounds
them away nor needs a gamma of its own size. Where the columns' scales lie within :data:`SCALE_SPREAD` of one
another (features of one kind: a projection's activations, normalised embeddings) every figure is the one of
``u max|G|`` for every entry, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from array_api_compat import array_namespace

#: How far the rounding of the Gram sums' entries may move the weights, relative (Frobenius, each row of ``W`` times
#: its column's scale: :func:`column_scales`), estimated by :func:`drift`, by the dtype of the sums: a gamma at which
#: it would move them more is refused, as one below their resolution is. float32 sums are solved in float64, so a
#: percent is their price; float64 sums promise exactness, so their bound is far below any accuracy's resolution
#: (where ``G + gamma I`` is well conditioned the rounding leaves about 1e-13).
DRIFTS = {"float32": 1e-2, "float64": 1e-4}
#: The unit of rounding of each dtype of the sums.
UNITS = {"float32": 2.0**-24, "float64": 2.0**-53}
#: An entry of float32 Gram sums lies within about this many units of rounding (2^-24) of its exact value, per unit
#: of the largest entry, in standard deviations: one rounding's ``1 / sqrt(3)`` doubled for the block products' and
#: the running sums' roundings. On digits and a 20,000-row store (sigmoid and ReLU, D = 200 to 2,000, gammas 1e-2 to
#: 10) :func:`drift` at one rounding gave 0.90-1.16x the measured change of the weights (sigmoid), 0.1-0.23x (ReLU).
ROUNDING_SPREAD = 2.0 / np.sqrt(3.0)
#: The :class:`~foal_pipe.core.rounding.Rounding` variance that :data:`ROUNDING_SPREAD` stands for, per ``(u max|G|)^2``
#: (``3 ROUNDING_SPREAD^2``: one addition's rounding has standard deviation ``u / sqrt(3)``); sums whose rounding is
#: unknown are taken to have it.
CALIBRATED_ROUNDING = 4.0
#: One product ``H^T H`` of ``n`` rows rounds inside the BLAS's own accumulation too: one float32 product (OpenBLAS,
#: sigmoid activations, D = 200) left its entries 0.8-0.95 units of the largest from the float64 sums up to 30,000
#: rows, 1.47 at 100,000 and 2.63 at 300,000 rows, as about ``n / 14,000`` additions would; a product counts as
#: ``n / PRODUCT_ROWS`` additions (at least one), which stays within the calibration for ``learn``'s blocks.
PRODUCT_ROWS = 8192
#: The measured rounding (:meth:`~foal_pipe.core.rounding.Rounding.measured`) times this stands for the entries'
#: standard deviation in :func:`drift`: the calibration's own ratio, as ``ROUNDING_SPREAD u max|G|`` stands for sums
#: whose sampled entries' rounding measured 0.83-0.95 units of the largest (one float32 product of up to 30,000
#: sigmoid rows at D = 200; the benchmarks' 50,000 x 768 store in 20 blocks at D = 1000): 1.2-1.4x, the lower taken,
#: so that sums formed as ``learn`` forms them keep the calibrated figure. Rows added again and again round more
#: than the walk counts (alike at every addition), and this sees it.
MEASURED_MARGIN = 1.2
#: The estimate's margin per dtype. float32 sums' rounding dominates their solve's and was calibrated above (it
#: overestimates). For float64 sums the sums' and the solve's own rounding are alike: against iteratively refined
#: solutions (761 random cases, n 10-5,000, D 10-1,000) the bare estimate fell to 0.35x the true change (sigmoid
#: features, whose entries all lie near ``max|G|``), and the tridiagonal path's weights err up to 2.5x a Cholesky
#: solve's: a margin of 8 keeps the estimate above both.
DRIFT_MARGINS = {"float32": 1.0, "float64": 8.0}
#: A column is measured at its own scale ``sqrt(G_ii)`` times this, capped at the largest diagonal's
#: (:func:`column_scales`): the estimates keep ``u max|G|`` (loose by at most this squared, which the calibrations
#: above include) wherever the columns' scales lie within this factor of the largest, as a random projection's
#: units, or a store's normalised features, do; a column further below is measured against this times its own.
SCALE_SPREAD = 16.0
#: The share of :data:`DRIFTS` at the gamma a refusal names (``linalg.larger_gamma``): ``learn``'s float32 check
#: estimates the drift from 32 random columns (about 12% apart from the exact figure), so one named at the limit
#: itself could be refused again.
NAMED_SHARE = 0.25


def column_scales(G: Any) -> Any:
    """``r`` (D, float64, in ``G``'s namespace): each column's scale relative to the largest diagonal entry's,
    ``min(1, SCALE_SPREAD sqrt(G_ii / max diag G))``; exactly ones where the columns' scales lie within
    :data:`SCALE_SPREAD` of the largest. ``max|G| r_i r_j >= sqrt(G_ii G_jj)``, the reach of entry ``ij``'s rounding,
    so :func:`drift` measures ``R W``: each row of the weights times its column's scale, the share of the scores that
    column gives, which a change is compared with. A column of zeros has scale 0: its sums are exact, as its
    weights (0) are."""
    xp = array_namespace(G)
    diagonal = xp.astype(xp.linalg.diagonal(G), xp.float64)
    if G.shape[0] == 0:
        return diagonal
    top = float(xp.max(diagonal))
    if not top > 0:  # every column zero (or the sums not finite: refused by the resolution's check)
        return xp.ones_like(diagonal)
    return xp.minimum(xp.ones_like(diagonal), SCALE_SPREAD * xp.sqrt(xp.maximum(diagonal, 0.0) / top))


def resolution(G: Any) -> float:
    """The least gamma the state can represent: ``eps(dtype)`` times the least diagonal entry at the scale the
    drift estimates measure it by (:func:`column_scales`), ``min(max diag G, SCALE_SPREAD^2 G_ii)``: ``eps * max
    diag(G)`` where the columns' scales lie within :data:`SCALE_SPREAD` of one another.

    A smaller gamma underflows when added to every diagonal entry so measured: its effect is below the rounding of
    the sums themselves in every column, so the solution is not the one of that gamma. A column far smaller than
    the largest is regularised at its own scale, where the largest needs no gamma beside its own size."""
    xp = array_namespace(G)
    if G.shape[0] == 0:
        return 0.0
    return diagonal_resolution(xp.reshape(G, (-1,))[:: G.shape[0] + 1])


def diagonal_resolution(diagonal: Any) -> float:
    """:func:`resolution` of sums whose diagonal is ``diagonal`` (non-empty), in its dtype."""
    xp = array_namespace(diagonal)
    top, least = float(xp.max(diagonal)), float(xp.min(diagonal))
    return float(xp.finfo(diagonal.dtype).eps) * max(min(top, SCALE_SPREAD**2 * least), 0.0)


def rounding_top(top: float, variance: float | None, measured: float, unit: float) -> float:
    """The ``top`` :func:`drift` takes for sums of largest entry ``top`` and unit of rounding ``unit`` whose
    :class:`~foal_pipe.core.rounding.Rounding` has ``variance`` (None: unknown, the calibration's) and measured
    root-mean-square error ``measured``.

    Rows that differ round as a random walk, whose standard deviation is ``sqrt(variance / 3)``:
    :data:`ROUNDING_SPREAD` was calibrated on sums of about ten blocks, where this is at most
    ``ROUNDING_SPREAD u top``; beyond, the walk's figure is taken (3,000 one-row additions: 16x that of ten blocks,
    whose entries' measured rounding grew 11x). Rows added again and again round alike at every addition, linearly:
    the error measured at the sampled entries, times :data:`MEASURED_MARGIN`, is taken where it is larger still."""
    if variance is None:
        return top
    return max(top, math.sqrt(variance / CALIBRATED_ROUNDING) / unit, MEASURED_MARGIN * measured / (ROUNDING_SPREAD * unit))


def drift(inverse_frobenius2: float, top: float, dtype: str = "float32") -> float:
    """The relative (Frobenius) change of ``R W`` (``W = (G + gamma I)^-1 Q``, ``R``: :func:`column_scales`) that
    rounding of ``G``'s entries in ``dtype`` may cause: a symmetric perturbation ``E = R F R``, ``F`` of independent
    entries of standard deviation ``s = ROUNDING_SPREAD u max|G|``, moves ``R W`` by ``R (G + gamma I)^-1 R F (R W)``,
    about ``sqrt(2) s |R (G + gamma I)^-1 R|_F |R W|_F``. ``inverse_frobenius2``: ``|R (G + gamma I)^-1 R|_F^2``
    (with ``R = I``, the sum of ``1 / (lambda + gamma)^2``, which bounds it for every ``R``); ``top``: ``max|G|``.
    Times :data:`DRIFT_MARGINS` for the dtype."""
    return float(np.sqrt(2.0 * inverse_frobenius2) * ROUNDING_SPREAD * UNITS[dtype] * top * DRIFT_MARGINS[dtype])


def drift_share(moved: float, dtype: str, digits: int = 1) -> str:
    """A drift as the refusals print it: a percent for float32, a relative number for float64, to ``digits``
    significant digits."""
    if DRIFTS[dtype] < 1e-3:
        return f"{moved:.{digits}g}"
    return np.format_float_positional(100 * moved, precision=digits, unique=True, fractional=False, trim="-") + "%"


def drift_beyond(moved: float, dtype: str) -> str:
    """A drift above :data:`DRIFTS` printed with the digits that show it above (1.004% is not "about 1%")."""
    limit = drift_share(DRIFTS[dtype], dtype)
    return next((shown for digits in range(1, 8) if (shown := drift_share(moved, dtype, digits)) != limit),
                drift_share(moved, dtype, 8))


def least_gamma(moved: Callable[[float], float], limit: float, low: float, high: float, tolerance: float = 1e-6) -> float:
    """The least gamma above ``low`` at which ``moved`` (a drift, falling as gamma grows) is at most ``limit``, by
    bisection in log space to a relative ``tolerance``, given ``high``, a gamma at which it is (or the most to name)."""
    start = max(high * 1e-30, np.nextafter(low, np.inf)) if low else high * 1e-30
    a, b = np.log(start), np.log(high)
    if moved(start) <= limit:
        return 0.0
    while b - a > tolerance:
        mid = 0.5 * (a + b)
        a, b = (a, mid) if moved(float(np.exp(mid))) <= limit else (mid, b)
    return float(np.exp(b))


def drift_floor(values: np.ndarray, top: float, dtype: str = "float32", limit: float | None = None) -> float:
    """The least gamma at which sums in ``dtype`` with eigenvalues ``values`` and largest entry ``top`` move the
    weights by at most ``limit`` (default :data:`DRIFTS`; :func:`drift` with ``R = I``, which bounds every ``R``),
    to a relative 1e-6 (:func:`least_gamma`)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or top == 0:
        return 0.0
    limit = DRIFTS[dtype] if limit is None else limit
    low = max(0.0, -float(values.min()))
    high = low + drift(float(values.size), top, dtype) / limit  # sum (lambda + high)^-2 <= D / (high - low)^2
    return least_gamma(lambda gamma: drift(float(np.sum((values + gamma) ** -2.0)), top, dtype), limit, low, high)


def rounded_up(value: float) -> str:
    """``value`` to 3 significant digits, rounded up: a gamma that still passes where ``value`` is the least one."""
    step = 10.0 ** (math.floor(math.log10(value)) - 2)
    digits = math.ceil(value / step)
    while float(f"{digits * step:.3g}") < value:  # float rounding of the product or of its text
        digits += 1
    return f"{digits * step:.3g}"
