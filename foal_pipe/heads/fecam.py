"""``fecam``: FeCAM (Goswami et al., NeurIPS 2023, its ViT scripts): per-class Mahalanobis distance to the class
mean of L2-normalised features, with shrunk, unit-diagonal class covariances."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.drift import DRIFTS, UNITS
from foal_pipe.core.engines import NOT_NUMBERS
from foal_pipe.core.linalg import cholesky_or_none, factor_threads
from foal_pipe.core.scoring import U32, U64, UNDERFLOW, gamma_n, relative_bound
from foal_pipe.errors import ClassRefused, FoalPipeError, param
from foal_pipe.heads.base import HeadBase
from foal_pipe.heads.checks import FLOAT64, check_rows
from foal_pipe.heads.moments import PerClassMoments, symmetric_pinv, unit_rows

#: FeCAM's ``alpha1`` and ``alpha2`` as its ViT scripts set them when off-diagonal shrinkage is off.
FECAM_SHRINKAGE, FECAM_OFFDIAG = 1.0, 0.0


def check_alpha(value: Any, name: str, default: float) -> float:
    """fecam's ``a1`` or ``a2``: a finite number >= 0 (``oas``, slda's estimate, named as slda's)."""
    try:
        if isinstance(value, NOT_NUMBERS):
            raise TypeError
        a = float(value)
    except (TypeError, ValueError):
        whose = "oas is slda's estimate, not fecam's: " if isinstance(value, str) and value == "oas" else ""
        raise FoalPipeError(f"fecam's {param(name)} must be a number >= 0, got {value!r}",
                            f"{whose}try {param(name, default)}") from None
    if not (np.isfinite(a) and a >= 0):
        raise FoalPipeError(f"fecam's {param(name)} must be a number >= 0, got {a:g}", f"try {param(name, default)}")
    return a


def shrunk_normalised(S: Any, a1: float, a2: float) -> Any:
    """``S + a1 mean(diag S) I + a2 mean(offdiag S) (1 - I)``, divided by ``sd sd^T`` (unit diagonal)."""
    xp = array_namespace(S)
    d = S.shape[0]
    diagonal = xp.linalg.diagonal(S)
    diag_mean = float(xp.mean(diagonal))
    off_mean = float(xp.sum(S) - xp.sum(diagonal)) / (d * d - d) if d > 1 else 0.0
    eye = xp.eye(d, dtype=S.dtype, device=device(S))
    S = S + a1 * diag_mean * eye + a2 * off_mean * (1 - eye)
    sd = xp.sqrt(xp.linalg.diagonal(S))
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero variance gives NaN, refused by the caller
        return S / (sd[:, None] * sd[None, :])


#: Column blocks of the triangular product in :func:`quadratic_forms`: 4 skips 3/8 of the dense product's work
#: (measured: 0.078 s against 0.118 s for 4,000 rows at d = 784, one BLAS thread); more blocks gain nothing more.
TRIANGLE_BLOCKS = 4


def quadratic_forms(R: Any, precision: Any, factor: Any = None) -> Any:
    """``r^T Lambda r`` for every row ``r`` of ``R``; with ``factor`` C (lower triangular, ``Lambda = C C^T``) as
    ``||r C||^2``, each column block of ``R C`` taking only C's rows below the diagonal block."""
    xp = array_namespace(R)
    if factor is None:
        return xp.sum((R @ precision) * R, axis=1)
    total = 0
    for lo, hi in triangle_blocks(factor.shape[0]):
        Q = R[:, lo:] @ factor[lo:, lo:hi]
        total = total + xp.sum(Q * Q, axis=1)
    return total


def triangle_blocks(d: int) -> list[tuple[int, int]]:
    """The column blocks ``[lo, hi)`` of the triangular product: the rows below each diagonal block suffice."""
    edges = [d * j // TRIANGLE_BLOCKS for j in range(TRIANGLE_BLOCKS + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def low_quadratic_forms(R: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """:func:`quadratic_forms` of float32 rows ``R`` with a float32 lower factor, by the same column blocks: each
    block's sum of squares in float32, the blocks' sums in float64 (:func:`quadratic_bound` bounds the error)."""
    total = np.zeros(R.shape[0])
    for lo, hi in triangle_blocks(factor.shape[0]):
        Q = R[:, lo:] @ factor[lo:, lo:hi]
        total += np.einsum("ij,ij->i", Q, Q)
    return total


def quadratic_bound(low: np.ndarray, row_norm: np.ndarray, frobenius: float, longest: float, d: int,
                    moved: Any = 0.0) -> np.ndarray:
    """How far :func:`low_quadratic_forms`' values ``low`` may lie from the float64 :func:`quadratic_forms` of rows
    ``r``: ``row_norm`` bounds the length of the rows the float32 product took (before their rounding to float32),
    ``moved`` how far those lie from ``r`` (the float32 subtraction that made them); the factor ``C`` has Frobenius
    norm ``frobenius`` and longest column ``longest``.

    Each float32 entry ``Q~_j`` lies within ``e_j = (kappa |r~| + moved) |C_j|`` of the exact ``(r C)_j`` (the test
    scores' bound, :func:`~foal_pipe.core.scoring.relative_bound`, with room for the rounding of the lengths; plus
    float32's underflow allowance), so ``|Q~ - Q| <= E = (kappa |r~| + moved) |C|_F`` over the row, and the sums of
    squares differ by at most ``2 E |Q~| + E^2``; the float32 sums add ``gamma_(d+2) |Q~|^2``; the float64
    product's own rounding adds the same terms in ``u = 2^-53``. Every term is an upper bound, so the float64 value
    lies within the result of ``low``."""
    kappa = relative_bound(d) + 4.0 * U32
    row_norm = row_norm * (1.0 + 4.0 * U32)
    E = ((kappa * row_norm + moved) * frobenius
         + d * UNDERFLOW * (np.sqrt(d) * (row_norm + moved + longest) + d))
    g32 = gamma_n(d + 2, U32)
    squares = np.maximum(low, 0.0) / (1.0 - g32)  # |Q~|^2, the float32 entries' exact squares
    exact = squares + 2.0 * E * np.sqrt(squares) + E * E  # an upper bound on the exact form
    E64 = 2.0 * gamma_n(d + 2, U64) * (row_norm + moved) * frobenius
    own = 2.0 * E64 * np.sqrt(exact) + E64 * E64 + gamma_n(d + 4, U64) * (exact + 2.0 * E64 * np.sqrt(exact) + E64 * E64)
    return 1.01 * (g32 * squares + 2.0 * E * np.sqrt(squares) + E * E + own) + 8.0 * U64 * np.abs(low) + d * UNDERFLOW


def cholesky_factor(precision: Any) -> Any:
    """``C`` lower triangular with ``C C^T = precision`` when it is positive definite, else None (the dense form)."""
    with factor_threads(precision.shape[0]):  # as symmetric_pinv: one BLAS thread
        return cholesky_or_none(array_namespace(precision), precision)


def eigenvalue_floor(C: Any, a1: float, a2: float) -> float:
    """A lower bound on the eigenvalues of ``shrunk_normalised(C, a1, a2)`` for a covariance ``C`` (positive
    semi-definite): Weyl's inequality gives ``a1 mean(diag C) + min(a2 m (d - 1), -a2 m)`` (``m`` the off-diagonal
    mean; ``1 1^T - I`` has eigenvalues ``d - 1`` and ``-1``) before the unit-diagonal scaling, which divides it by at
    most the largest diagonal entry."""
    xp = array_namespace(C)
    d = C.shape[0]
    diagonal = xp.linalg.diagonal(C)
    diag_mean = float(xp.mean(diagonal))
    off = a2 * float(xp.sum(C) - xp.sum(diagonal)) / (d * d - d) if d > 1 else 0.0
    top = float(xp.max(diagonal)) + a1 * diag_mean
    return (a1 * diag_mean + min(off * (d - 1), -off)) / top if top > 0 else 0.0


def precision_drift(C: Any, mean: Any, S: Any, precision: Any, a1: float) -> float:
    """About how far float64's rounding may move a class's distances ``r^T P r`` (relative), ``P`` the precision of
    ``S = shrunk_normalised(C, a1, a2)``, ``mean`` the class's mean unit row: ``dP = -P dS P`` moves a distance by at
    most ``|dS|_F |P|_F`` of itself. ``dS``: the solve's backward error, ``u |S|_F``, plus the unit rows' own rounding
    (``u |x_hat_i|`` per entry, ``|x_hat_i| <= |mu_i| + sigma_i``), which moves ``C_ij`` by about ``u (|x_i| sigma_j +
    |x_j| sigma_i)`` and the unit-diagonal scaling divides by ``sd_i sd_j``: large where a class varies little about a
    point far from the origin. Against a 60-digit reference (d 3 to 10, 4 to 20 rows per class, ``a1`` 0 to 1, rows 1e3
    from the origin varying by 1e-4 to 1e-11 of it, correlated features) it was 2.5x to 470x the largest change of the
    distances (relative to the largest) wherever it passed, and above 1e-4 wherever a prediction moved (at ``a1``
    1e-13 and 1e-14: 1 and 2 of 150 rows)."""
    xp = array_namespace(C)
    variance = xp.linalg.diagonal(C)
    sigma = xp.sqrt(xp.where(variance > 0, variance, xp.zeros_like(variance)))
    sd = xp.sqrt(variance + a1 * xp.mean(variance))  # S's scaling (shrunk_normalised): positive, S being finite
    spread = float(xp.linalg.vector_norm(S)) + 2.0 * float(xp.linalg.vector_norm((xp.abs(mean) + sigma) / sd)) * float(
        xp.linalg.vector_norm(sigma / sd))
    return UNITS["float64"] * spread * float(xp.linalg.vector_norm(precision))


class MahalanobisScorer:
    """Scores ``-(x_hat - mu_c)^T Lambda_c (x_hat - mu_c)`` over ``classes`` (argmax: the nearest class); ``keys``
    (optional) name each class's statistics (:class:`~foal_pipe.heads.base.ClassColumns`): a walk then computes a
    class's distances once per change of its rows, not at every boundary. ``factors``: each precision's Cholesky
    factor or None, for the cheaper triangular product; computed here when not given, so that a scorer built from
    saved means and precisions scores with the same factors, the same bits, as the run's own."""

    def __init__(self, classes: np.ndarray, means: list[Any], precisions: list[Any],
                 keys: Sequence[Hashable] | None = None, factors: Sequence[Any] | None = None) -> None:
        self.classes, self.means, self.precisions, self.keys = classes, means, precisions, keys
        self.factors = list(factors) if factors is not None else [cholesky_factor(p) for p in precisions]

    def prepare(self, X: Any) -> Any:
        return unit_rows(X)

    def column(self, k: int, prepared: Any) -> Any:
        return -quadratic_forms(prepared - self.means[k][None, :], self.precisions[k], self.factors[k])

    def prepare_low(self, prepared: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """The prepared rows' float32 copy and float64 lengths, for :meth:`bounded_column` (NumPy float64 rows
        only: cuBLAS and torch may multiply float32 in TF32, which the bound does not cover)."""
        if not (is_numpy_array(prepared) and prepared.dtype == np.float64 and prepared.shape[1] > 0):
            return None
        return prepared.astype(np.float32), np.sqrt(np.einsum("ij,ij->i", prepared, prepared))

    def bounded_column(self, k: int, low: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
        """Column ``k`` from a float32 product (:func:`low_quadratic_forms`) and how far each value may lie from
        :meth:`column`'s float64 one (:func:`quadratic_bound`); None where the class has no Cholesky factor or its
        mean or factor leaves float32's range (then :meth:`column` scores it)."""
        held = self._low_class(k)  # d^2 values cast: little beside the product, and no copy kept per boundary
        if held is None:
            return None
        mean, factor, mean_norm, frobenius, longest = held
        rows, norms = low
        R = rows - mean[None, :]
        d = factor.shape[0]
        # the float32 rows' lengths (their squares summed within gamma_(d+1) of theirs), and how far the roundings
        # of x_hat, mu and their difference moved them from r: at most 2.0001 u (|x_hat| + |mu|)
        length = np.sqrt(np.einsum("ij,ij->i", R, R).astype(np.float64) / (1.0 - gamma_n(d + 1, U32)))
        values = low_quadratic_forms(R, factor)
        bound = quadratic_bound(values, length, frobenius, longest, d, 2.0001 * U32 * (norms + mean_norm))
        return -values, bound

    def _low_class(self, k: int) -> tuple[np.ndarray, np.ndarray, float, float, float] | None:
        mean, factor = self.means[k], self.factors[k]
        if factor is None or not (is_numpy_array(factor) and factor.dtype == np.float64 and is_numpy_array(mean)):
            return None
        with np.errstate(over="ignore"):
            low_mean, low_factor = mean.astype(np.float32), factor.astype(np.float32)
        if not (np.isfinite(low_mean).all() and np.isfinite(low_factor).all()):
            return None
        columns = np.sqrt(np.einsum("ij,ij->j", factor, factor)) * (1.0 + 1e-12)
        return (low_mean, low_factor, float(np.sqrt(mean @ mean)) * (1.0 + 1e-12),
                float(np.sqrt(np.sum(columns * columns))) * (1.0 + 1e-12), float(columns.max(initial=0.0)))

    def scores(self, X: Any) -> Any:
        Xh = self.prepare(X)
        return array_namespace(X).stack([self.column(k, Xh) for k in range(self.classes.size)], axis=1)


@dataclass(frozen=True)
class FeCAMOptions:
    """``shrinkage`` (a1) and ``shrinkage_offdiag`` (a2), each a number >= 0."""

    shrinkage: float = FECAM_SHRINKAGE
    shrinkage_offdiag: float = FECAM_OFFDIAG

    def __post_init__(self) -> None:
        object.__setattr__(self, "shrinkage", check_alpha(self.shrinkage, "shrinkage", FECAM_SHRINKAGE))
        object.__setattr__(self, "shrinkage_offdiag",
                           check_alpha(self.shrinkage_offdiag, "shrinkage_offdiag", FECAM_OFFDIAG))


class FeCAMHead(HeadBase):
    """x_hat = x / ||x||; per class the mean and unbiased covariance S_c of x_hat, shrunk (``shrinkage`` a1,
    ``shrinkage_offdiag`` a2) and normalised to unit diagonal; predicts argmin_c (x_hat - mu_c)^T pinv(S_c)
    (x_hat - mu_c)."""

    name: ClassVar[str] = "fecam"
    space: ClassVar[str] = "features"
    score_bytes: ClassVar[int] = 34  # the memo of columns and bounds, their stacked copies and the screen's ceiling
    Options: ClassVar[type] = FeCAMOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"means": ("C", "d"), "precisions": ("C", "d", "d")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = PerClassMoments.TENSORS

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.xp = xp
        self.options = FeCAMOptions(**options)
        self.shrinkage, self.shrinkage_offdiag = self.options.shrinkage, self.options.shrinkage_offdiag
        self.moments = PerClassMoments(xp, dim)
        self._solved: dict[int, tuple[int, Any, Any, Any]] = {}  # class -> (rows, mean, precision, its factor)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """Bytes of the running state at its largest: every class's Gram, sums and shift, plus a boundary's solve
        (the covariance, its shrunk copy and the pseudo-inverse's eigenvectors and product: 4 d^2, measured with
        tracemalloc). The precisions live in the boundaries' scorers (:meth:`kept`)."""
        return FLOAT64 * (n_classes * (dim * dim + 2 * dim) + 4 * dim * dim)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        """Bytes a boundary's scorer holds anew: a precision, its Cholesky factor and a mean per class whose rows
        changed; the other classes' are the earlier scorers' own."""
        return FLOAT64 * changed * (2 * dim * dim + dim)

    def state_dict(self, scorer: MahalanobisScorer) -> dict[str, Any]:
        return {"means": np.stack([to_numpy(m) for m in scorer.means]),
                "precisions": np.stack([to_numpy(p) for p in scorer.precisions]), **self.moments.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.moments.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> MahalanobisScorer:
        return MahalanobisScorer(classes, list(tensors["means"]), list(tensors["precisions"]))

    def add(self, X: Any, labels: np.ndarray) -> None:
        labels = check_rows(X, labels, self.moments.dim)  # before anything is written: a refused add changes nothing
        self.moments.add(unit_rows(X), labels)

    @classmethod
    def check_counts(cls, classes: Sequence[Any], counts: Sequence[int]) -> None:
        """A class's covariance needs two rows: a class of one is refused."""
        single = [c for c, n in zip(classes, counts, strict=True) if n == 1]
        if single:
            raise FoalPipeError(f"fecam needs at least 2 training rows per class for a covariance; class {single[0]!r} "
                                "has 1 by its task's end: use another head or more rows per class")

    def _check_drift(self, c: int, moved: float) -> None:
        """Refuse class ``c`` where float64's rounding may move its distances by more than ridge's 1e-4 (relative):
        a covariance too ill-conditioned for its shrinkage, or rows that vary little far from the origin
        (:func:`precision_drift`)."""
        if not moved <= DRIFTS["float64"]:
            raise ClassRefused(c, lambda name: f"fecam: the shrunk covariance of class {name} is too ill-conditioned "
                               f"for float64 at {param('shrinkage', self.shrinkage)}: its rounding may move the distances by "
                               f"about {moved:.2g} (more than {DRIFTS['float64']:g}); pass a larger {param('shrinkage')} "
                               f"(default {FECAM_SHRINKAGE:g}), or centre the features (subtract their mean) where they "
                               "vary little far from the origin")

    def boundary(self) -> MahalanobisScorer:
        xp, m = self.xp, self.moments
        self.check_counts([int(c) for c in m.classes], m.counts)
        for k, c in enumerate(m.classes.tolist()):
            if c in self._solved and self._solved[c][0] == m.counts[k]:
                continue  # no row of this class since its last solve: the same inputs, the same bits
            C = m.covariance(k)
            S = shrunk_normalised(C, self.shrinkage, self.shrinkage_offdiag)
            if not bool(xp.all(xp.isfinite(S))):
                if self.shrinkage > 0:  # shrinkage adds a share of the mean variance, which is zero here
                    raise ClassRefused(c, lambda name: f"fecam: class {name} has no variance in any dimension (its "
                                       "training rows, L2-normalised as fecam takes them, are all the same: rows that "
                                       "differ only in length, positive multiples of one row), so no shrinkage gives "
                                       f"it a covariance; use another head (e.g. {param('head', 'slda')}) or rows "
                                       "that vary in direction")
                raise ClassRefused(c, lambda name: f"fecam: class {name} has a dimension of zero variance, which "
                                   f"normalising divides by; use {param('shrinkage', FECAM_SHRINKAGE)} (> 0)")
            precision = symmetric_pinv(S, eigenvalue_floor(C, self.shrinkage, self.shrinkage_offdiag))
            mean = m.mean(k)
            self._check_drift(c, precision_drift(C, mean, S, precision, self.shrinkage))
            self._solved[c] = (m.counts[k], mean, precision, cholesky_factor(precision))
        solved = [self._solved[c] for c in m.classes.tolist()]
        keys = [(c, s[0]) for c, s in zip(m.classes.tolist(), solved, strict=True)]  # a class's rows only grow
        return MahalanobisScorer(m.classes.copy(), [s[1] for s in solved], [s[2] for s in solved], keys,
                                 [s[3] for s in solved])
