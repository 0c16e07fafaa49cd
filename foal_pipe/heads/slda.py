"""``slda``: deep streaming LDA (Hayes & Kanan 2020) on the exact pooled covariance, scored as Avalanche's
``StreamingLDA.predict``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.base import HeadBase, check_gram_room, largest_square, magnitude
from foal_pipe.heads.checks import FLOAT64, check_rows
from foal_pipe.heads.moments import ClassSums, shift_diagonal, symmetric_pinv

#: ``--shrinkage`` of slda: Avalanche's default.
SLDA_SHRINKAGE = 1e-4


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
        eps = float(value)
    except (TypeError, ValueError):
        raise FoalPipeError(f"slda's {param('shrinkage')} must be a number in [0, 1] or 'oas', got {value!r}",
                            f"try {param('shrinkage', SLDA_SHRINKAGE)}") from None
    if not 0 <= eps <= 1:
        raise FoalPipeError(f"slda's {param('shrinkage')} must lie in [0, 1], got {eps:g}",
                            f"try {param('shrinkage', SLDA_SHRINKAGE)}")
    return eps


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
            S, floor = oas_covariance(S, sums.n)
        else:
            eps = float(self.shrinkage)
            S, floor = shift_diagonal((1.0 - eps) * S, eps), eps
        M = sums.means()  # (C, d)
        W = symmetric_pinv(S, floor) @ M.T  # Lambda mu_c per column
        return LinearScorer(sums.classes.copy(), W, -0.5 * xp.sum(M.T * W, axis=0))
