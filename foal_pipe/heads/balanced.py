"""``balanced``: AIR's analytic re-weighting (Fang et al. 2024, "AIR: Analytic Imbalance Rectifier for Continual
Learning"), a ridge classifier on the activations in which every class weighs the same however many rows it has.

Over the activated rows ``H_c`` of each seen class ``c`` (``n_c`` rows),

    W = (sum_c w_c H_c^T H_c + gamma I)^-1 [w_c H_c^T 1]_c,   w_c = (1 / n_c) * K / sum_k (1 / n_k),

``K`` the number of seen classes (the weights have mean 1). This is ``GeneralizedARM.update`` in
ZHUANGHP/Analytic-continual-learning (``analytic/AnalyticLinear.py``, lines 202-211 at commit 0afd6bf), whose
``fit`` (lines 161-199) keeps one Gram ``A[c] = H_c^T H_c`` per class, the sums ``C = H^T Y`` and the counts. One
difference: the published weights are scaled to mean 1 over ``max label + 1`` label slots (``len(self.cnt)``),
here over the classes seen; the two agree when the labels seen are ``0 .. K-1``, and otherwise differ by one factor
on every ``w_c``, which is the same as a different gamma. The rows are ``ridge``'s activations, so the activation
is the projection's (AIR's random buffer applies a ReLU, ``RandomBuffer``'s default: choose ``relu`` to match).

The per-class Grams make the state exact for any stream, classes recurring across tasks included, at the price
of ``C x D^2`` floats (:meth:`BalancedHead.bytes_per_class`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from array_api_compat import device

from foal_pipe.core.linalg import check_gammas, float64, shifted, solve_spd
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.checks import FLOAT64, check_rows, positive


@dataclass(eq=False)
class LinearScorer:
    """Scores ``X @ W`` over ``classes`` (``W``: D x len(classes), float64)."""

    classes: np.ndarray
    W: Any

    def scores(self, X: Any) -> Any:
        return float64(X) @ self.W


class BalancedHead:
    """AIR's re-weighted ridge on the activations: exact at every boundary for any stream.

    Parameters
    ----------
    gamma : float, default=1.0
        Ridge regularisation, > 0 (as ``ridge``'s gamma).
    xp : array namespace
        Where the state lives and the rows arrive (:mod:`foal_pipe.core.backend`).
    dim : int
        Width D of the activation rows.

    Attributes
    ----------
    classes_ : ndarray of shape (C,)
        Sorted class ids seen so far (host NumPy).
    counts_ : ndarray of shape (C,)
        Rows per class.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> H = np.random.default_rng(0).random((7, 3))
    >>> head = BalancedHead(gamma=1.0, xp=xp, dim=3)
    >>> head.add(H, np.array([4, 4, 4, 4, 4, 9, 9]))
    >>> model = head.boundary()
    >>> model.classes.tolist(), model.scores(H).shape
    ([4, 9], (7, 2))
    """

    name: ClassVar[str] = "balanced"
    space: ClassVar[str] = "activations"

    def __init__(self, *, gamma: float = 1.0, xp: ModuleType, dim: int) -> None:
        self.gamma = positive("gamma", gamma)
        self.xp = xp
        self.dim = int(dim)
        self._grams: dict[int, Any] = {}  # class id -> H_c^T H_c (D x D)
        self._sums: dict[int, Any] = {}  # class id -> H_c^T 1 (D,)
        self._counts: dict[int, int] = {}

    @staticmethod
    def bytes_per_class(dim: int) -> int:
        """State bytes each seen class adds: its D x D Gram, its D-vector of sums and its count (float64)."""
        return FLOAT64 * (dim * dim + dim + 1)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """Bytes at the largest (a boundary): every class's state, plus the weighted Gram, its shifted copy and W
        with its right-hand side (``8 (C (D^2 + D + 1) + 2 D^2 + 2 D C)``)."""
        return n_classes * BalancedHead.bytes_per_class(dim) + FLOAT64 * (2 * dim * dim + 2 * dim * n_classes)

    @property
    def classes_(self) -> np.ndarray:
        return np.asarray(sorted(self._counts), dtype=np.int64)

    @property
    def counts_(self) -> np.ndarray:
        return np.asarray([self._counts[c] for c in sorted(self._counts)], dtype=np.int64)

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Add rows (any block size, any order of classes) to their classes' Grams and sums."""
        xp = self.xp
        labels = check_rows(X, labels, self.dim)
        X = float64(X)
        for cls in np.unique(labels):
            rows = np.flatnonzero(labels == cls)
            Xc = X if rows.size == labels.size else xp.take(X, xp.asarray(rows, device=device(X)), axis=0)
            key = int(cls)
            if key not in self._counts:
                self._grams[key] = xp.zeros((self.dim, self.dim), dtype=xp.float64, device=device(X))
                self._sums[key] = xp.zeros((self.dim,), dtype=xp.float64, device=device(X))
                self._counts[key] = 0
            self._grams[key] += Xc.T @ Xc
            self._sums[key] += xp.sum(Xc, axis=0)
            self._counts[key] += int(rows.size)

    def weights(self) -> np.ndarray:
        """``w_c``: 1 / n_c scaled to mean 1 over the seen classes (sorted like :attr:`classes_`)."""
        inverse = 1.0 / self.counts_.astype(np.float64)
        return inverse * (inverse.size / inverse.sum())

    def boundary(self) -> LinearScorer:
        """The re-weighted ridge over every row added so far (one float64 Cholesky solve)."""
        xp = self.xp
        classes = self.classes_
        if classes.size == 0:
            raise FoalPipeError("the balanced head has no rows yet; add rows before a task boundary")
        weights = self.weights()
        gram = xp.zeros((self.dim, self.dim), dtype=xp.float64, device=device(self._grams[int(classes[0])]))
        for cls, weight in zip(classes.tolist(), weights.tolist()):
            gram += weight * self._grams[cls]
        check_gammas(gram, self.gamma)
        sums = xp.stack([weight * self._sums[cls] for cls, weight in zip(classes.tolist(), weights.tolist())], axis=1)
        return LinearScorer(classes=classes, W=solve_spd(shifted(gram, self.gamma), sums))
