"""``slda``: deep streaming LDA (Hayes & Kanan 2020) on the exact pooled covariance, scored as Avalanche's
``StreamingLDA.predict``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.core.drift import DRIFTS, UNITS
from foal_pipe.core.engines import NOT_NUMBERS
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.base import HeadBase, check_gram_room, largest_square, magnitude
from foal_pipe.heads.checks import FLOAT64, check_rows
from foal_pipe.heads.moments import ClassSums, certified_definite, shift_diagonal, symmetric_pinv

#: ``--shrinkage`` of slda: Avalanche's default.
SLDA_SHRINKAGE = 1e-4
#: The pooled scatter ``G - s s^T / n`` (:meth:`ClassSums.scatter`) cancels: its entries err by about ``u max diag(G)
#: / N`` (``G`` the Gram of the rows less the shift: ``u`` times their largest mean square), taken as ridge's ``drift``
#: takes ``max|G|``, times this margin. Against a long-double reference (identical rows per class and random rows,
#: N 24-200,000, D 20-768, scales 1-1e6, eps 1e-8 to 0 and OAS) the bare estimate gave 0.01-1.08x the measured
#: change of ``W`` (1.05x with identical rows at scale 1e5; random rows 0.1-0.8x).
SCATTER_SPREAD = 2.0
#: A score ``x^T W_c + b_c`` at a class mean rounds by about ``u sqrt(D) max_c |mu_c| max_c |W_c|`` (2-norms), times
#: this margin: on the same cases, and rows 1e6 from the origin that vary by 1e-2 to 1e-8 of it, the largest error of a
#: difference of two scores on the training rows measured 0.04-1.7x the bare estimate.
SCORE_SPREAD = 4.0


def oas_covariance(S: Any, n: int) -> tuple[Any, float]:
    """The OAS estimate (Chen et al. 2010, as scikit-learn's ``OAS``) from the empirical covariance ``S`` of
    ``n`` centred rows: ``(1 - rho) S + rho mu I`` with ``mu = tr(S)/d`` and
    ``rho = min((mean(S^2) + mu^2) / ((n + 1)(mean(S^2) - mu^2 / d)), 1)``; and ``rho mu``, a lower bound on its
    eigenvalues (``S`` is positive semi-definite)."""
    xp = array_namespace(S)
    d = S.shape[0]
    alpha = float(xp.sum(S * S)) / d**2
    mu = float(xp.sum(xp.linalg.diagonal(S))) / d
    den = (n + 1) * (alpha - mu**2 / d)
    rho = 1.0 if den == 0 else min((alpha + mu**2) / den, 1.0)
    return shift_diagonal((1.0 - rho) * S, rho * mu), rho * mu


def check_shrinkage(value: float | str) -> float | str:
    """slda's ``--shrinkage``: a number in [0, 1], or ``oas``."""
    if value == "oas":
        return value
    try:
        if isinstance(value, NOT_NUMBERS):
            raise TypeError
        eps = float(value)
    except (TypeError, ValueError):
        raise FoalPipeError(f"slda's {param('shrinkage')} must be a number in [0, 1] or 'oas', got {value!r}",
                            f"try {param('shrinkage', SLDA_SHRINKAGE)}") from None
    if not 0 <= eps <= 1:
        raise FoalPipeError(f"slda's {param('shrinkage')} must lie in [0, 1], got {eps:g}",
                            f"try {param('shrinkage', SLDA_SHRINKAGE)}")
    return eps


def check_covariance(sums: ClassSums, floor: float, inverse: Any, shrinkage: float | str) -> None:
    """Refuse where the scatter's rounding (:data:`SCATTER_SPREAD`) may move ``W = Lambda M^T`` by more than
    ridge's 1e-4 (relative, Frobenius): entries of ``S`` off by about ``s`` (at most ``s`` again in the shrunk
    matrix) move ``W`` by about ``sqrt(2) s |Lambda|_F |W|_F``, as ridge's ``drift``; ``|Lambda|_F <= sqrt(d) / floor``
    spares the norm where that already passes."""
    xp = array_namespace(inverse)
    square = largest_square(sums.gram) / sums.n  # the mean square of the shifted rows' largest column
    spread = np.sqrt(2.0) * SCATTER_SPREAD * UNITS["float64"] * square
    if floor > 0 and spread * np.sqrt(sums.dim) / floor <= DRIFTS["float64"]:
        return
    moved = spread * float(xp.linalg.vector_norm(inverse))
    if moved > DRIFTS["float64"]:
        raise FoalPipeError(f"slda: features this far from the stream's first row (root mean square {np.sqrt(square):.3g}) "
                            f"leave the pooled covariance's float64 rounding able to move the weights by about {moved:.2g} "
                            f"(more than {DRIFTS['float64']:g}): shrinkage {shrinkage} resolves too little of it; centre "
                            f"or scale the features down, or pass a larger {param('shrinkage')}")


def least_separation(sums: ClassSums, A: Any, floor: float, inverse: Any, needed: float) -> float:
    """The least squared Mahalanobis distance ``(mu_c - mu_k)^T Lambda (mu_c - mu_k)`` between two classes of distinct
    means (inf where there are none), or, where it certainly exceeds ``needed``, a lower bound above it: the squared
    Euclidean distance over ``lambda_max(A)`` (at most ``A``'s largest absolute row sum) where ``Lambda`` is ``A``'s
    inverse. The means' differences come from the shifted sums, free of the features' offset."""
    xp = array_namespace(A)
    counts = xp.asarray(sums.counts.astype(np.float64), device=default_device(xp))
    P = (sums.sums / counts[None, :]).T
    P = P - P[0:1, :]
    same = np.unique(to_numpy(P), axis=0, return_inverse=True)[1].ravel()  # equal means tie exactly: left out
    distinct = xp.asarray(same[:, None] != same[None, :], device=default_device(xp))
    if not bool(xp.any(distinct)):
        return float("inf")
    squares = xp.sum(P * P, axis=1)
    apart = squares[:, None] + squares[None, :] - 2 * (P @ P.T)  # one product: C^2 d at BLAS speed
    if certified_definite(A, floor):
        bound = float(xp.min(apart[distinct])) / float(xp.max(xp.sum(xp.abs(A), axis=1)))
        if bound > needed:
            return bound
    G = (P @ inverse) @ P.T
    g = xp.linalg.diagonal(G)
    return float(xp.min((g[:, None] + g[None, :] - 2 * G)[distinct]))


def check_resolved(sums: ClassSums, M: Any, W: Any, A: Any, floor: float, inverse: Any) -> None:
    """Refuse scores ``x^T W + b`` whose rounding at the class means (:data:`SCORE_SPREAD`) is not far below the least
    gap between two classes' scores there (half their means' squared Mahalanobis distance): the argmax would follow
    the rounding, as on features far from the origin that vary little."""
    xp = array_namespace(W)
    if M.shape[0] < 2:
        return
    top = float(xp.max(xp.linalg.vector_norm(M, axis=1))) * float(xp.max(xp.linalg.vector_norm(W, axis=0)))
    rounding = SCORE_SPREAD * UNITS["float64"] * np.sqrt(M.shape[1]) * top
    gap = least_separation(sums, A, floor, inverse, 2 * rounding / DRIFTS["float64"]) / 2
    if rounding > DRIFTS["float64"] * gap:
        raise FoalPipeError(f"slda: the scores x^T W + b (up to about {top:.2g} at the class means) round by about "
                            f"{rounding:.2g} in float64, more than {DRIFTS['float64']:g} times the least gap between two "
                            f"classes' scores there ({gap:.2g}), so they cannot tell the classes apart; centre the features "
                            "(subtract their mean) so that the scores shrink")


class LinearScorer:
    """Scores ``X W + b`` over ``classes``."""

    def __init__(self, classes: np.ndarray, W: Any, b: Any) -> None:
        self.classes, self.W, self.b = classes, W, b

    def scores(self, X: Any) -> Any:
        return X @ self.W + self.b[None, :]


@dataclass(frozen=True)
class SLDAOptions:
    """``shrinkage``: eps in [0, 1], or ``oas``."""

    shrinkage: float | str = SLDA_SHRINKAGE

    def __post_init__(self) -> None:
        object.__setattr__(self, "shrinkage", check_shrinkage(self.shrinkage))


class SLDAHead(HeadBase):
    """mu_c class means; S the pooled within-class covariance (1/N) sum (x - mu_y)(x - mu_y)^T;
    Lambda = pinv((1 - eps) S + eps I) (or of the OAS estimate); score_c = x^T Lambda mu_c - mu_c^T Lambda mu_c / 2.
    Its scores are the Gaussian log-likelihoods up to a term shared by the classes: their softmax is the posterior."""

    name: ClassVar[str] = "slda"
    space: ClassVar[str] = "features"
    score_bytes: ClassVar[int] = 8  # the distances' temporary
    Options: ClassVar[type] = SLDAOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"W": ("d", "C"), "b": ("C",)}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {**ClassSums.TENSORS, "gram": ("d", "d")}
    weight_tensor: ClassVar[str | None] = "W"
    probabilities: ClassVar[str | None] = "softmax"

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.xp = xp
        self.options = SLDAOptions(**options)
        self.shrinkage = self.options.shrinkage
        self.sums = ClassSums(xp, dim, pooled=True)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """The pooled Gram, a boundary's covariance and its inverse; the class sums and means."""
        return FLOAT64 * (3 * dim * dim + 2 * n_classes * dim)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * seen * (dim + 1)

    def state_dict(self, scorer: LinearScorer) -> dict[str, Any]:
        return {"W": scorer.W, "b": scorer.b, **self.sums.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.sums.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> LinearScorer:
        return LinearScorer(classes, tensors["W"], tensors["b"])

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Add the rows' sums; a refused batch (rows of another width, products that overflow) changes nothing."""
        labels = check_rows(X, labels, self.sums.dim)  # checked before anything is written
        sums, top = self.sums, magnitude(X)
        shift = magnitude(X[0:1, :] if sums.shift is None else sums.shift)  # summed less the first row added (ClassSums)
        check_gram_room(self.name, top, labels.size, largest_square(sums.gram), shift)
        sums.add(X, labels)

    def boundary(self) -> LinearScorer:
        xp, sums = self.xp, self.sums
        S = sums.scatter() / sums.n
        if not bool(xp.all(xp.isfinite(S))):
            raise FoalPipeError("slda: the features' squares overflow float64 (rows beyond about 1e154), so no "
                                "covariance can be formed; scale the features down (e.g. divide by their largest value)")
        if self.shrinkage == "oas":
            A, floor = oas_covariance(S, sums.n)
        else:
            eps = float(self.shrinkage)
            A, floor = shift_diagonal((1.0 - eps) * S, eps), eps
        inverse = symmetric_pinv(A, floor)
        check_covariance(sums, floor, inverse, self.shrinkage)
        M = sums.means()  # (C, d)
        W = inverse @ M.T  # Lambda mu_c per column
        check_resolved(sums, M, W, A, floor, inverse)
        return LinearScorer(sums.classes.copy(), W, -0.5 * xp.sum(M.T * W, axis=0))
