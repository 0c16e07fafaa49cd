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

Exact leave-one-out (:meth:`BalancedHead.loo_hits`, ``sweep --heads``' criterion on training data): without row
``i`` of class ``c``, ``n_c`` drops by one, so every weight moves (the mean-1 scaling) and the refit is
``M_c - w'_c h_i h_i^T`` with ``M_c = sum_k w'_k H_k^T H_k + gamma I``, ``w'`` the weights with ``n_c - 1``: one
matrix per class, and Sherman-Morrison per row. With ``lev = h_i^T M_c^-1 h_i`` the refitted scores are
``(h_i^T M_c^-1 B'_c - w'_c lev e_c) / (1 - w'_c lev)``, ``B'_c`` the weighted sums with the row still in; the
positive denominator does not move the argmax. A class of one row has no model without it: that row counts as
wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from array_api_compat import device

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import check_drift, check_solved, class_positions, float64, shifted, solve_spd, spd_solver
from foal_pipe.core.scoring import Ties
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.base import HeadBase, check_gram_room, largest_square, magnitude
from foal_pipe.heads.checks import FLOAT64, check_rows, positive
from foal_pipe.heads.moments import on_device, row_major


@dataclass(eq=False)
class LinearScorer:
    """Scores ``X @ W`` over ``classes`` (``W``: D x len(classes), float64)."""

    classes: np.ndarray
    W: Any

    def scores(self, X: Any) -> Any:
        return float64(X) @ self.W

    def ties(self, X: Any) -> tuple[Ties, np.ndarray]:
        """What refuses rows whose :meth:`scores` tie within their float64 rounding (:meth:`Ties.check`)."""
        return Ties.of(self.W), float64(X)


@dataclass(frozen=True)
class BalancedOptions:
    """``gamma``: the ridge regularisation, > 0."""

    gamma: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gamma", positive("gamma", self.gamma))


class BalancedHead(HeadBase):
    """AIR's re-weighted ridge on the activations: exact at every boundary for any stream.

    Parameters
    ----------
    xp : array namespace
        Where the state lives and the rows arrive (:mod:`foal_pipe.core.backend`).
    dim : int
        Width D of the activation rows.
    **options
        :class:`BalancedOptions`: ``gamma`` (float, default 1.0), the ridge regularisation, > 0 (as ``ridge``'s
        gamma).

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
    Options: ClassVar[type] = BalancedOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"W": ("D", "C")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"counts": ("C",), "sums": ("C", "D"),
                                                               "grams": ("C", "D", "D")}
    weight_tensor: ClassVar[str | None] = "W"
    probabilities: ClassVar[str | None] = "shares"  # a least-squares fit to one-hot targets, as ridge's

    def __init__(self, *, xp: ModuleType, dim: int, **options: Any) -> None:
        self.options = BalancedOptions(**options)
        self.gamma = self.options.gamma
        self.xp = xp
        self.dim = int(dim)
        self._grams: dict[int, Any] = {}  # class id -> H_c^T H_c (D x D)
        self._sums: dict[int, Any] = {}  # class id -> H_c^T 1 (D,)
        self._counts: dict[int, int] = {}
        self._loo: dict[int, tuple[Any, Any, float] | None] | None = None  # class id -> (M_c^-1, M_c^-1 B'_c, w'_c)

    @staticmethod
    def bytes_per_class(dim: int) -> int:
        """State bytes each seen class adds: its D x D Gram, its D-vector of sums and its count (float64)."""
        return FLOAT64 * (dim * dim + dim + 1)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """Bytes at the largest: every class's state, plus either a boundary's weighted Gram, its shifted copy and W
        with its right-hand side, or the leave-one-out pass's (each class's Gram replaced by its ``M_c^-1``, plus its
        D x C weights, and the solve's 5 D x D): ``8 (C (D^2 + D + 1) + C^2 D + 5 D^2 + 2 D C)``."""
        C, D = n_classes, dim
        return C * BalancedHead.bytes_per_class(D) + FLOAT64 * (C * C * D + 5 * D * D + 2 * D * C)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * seen * dim

    def state_dict(self, scorer: LinearScorer) -> dict[str, Any]:
        return {"W": scorer.W, "counts": self.counts_,
                **{key: np.stack([to_numpy(part[c]) for c in self.classes_.tolist()])
                   for key, part in (("sums", self._sums), ("grams", self._grams))}}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        for k, c in enumerate(np.asarray(tensors["classes"]).tolist()):
            self._grams[c], self._sums[c] = on_device(self.xp, tensors["grams"][k]), on_device(self.xp, tensors["sums"][k])
            self._counts[c] = int(tensors["counts"][k])

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> LinearScorer:
        return LinearScorer(classes, tensors["W"])

    @property
    def classes_(self) -> np.ndarray:
        return np.asarray(sorted(self._counts), dtype=np.int64)

    @property
    def counts_(self) -> np.ndarray:
        return np.asarray([self._counts[c] for c in sorted(self._counts)], dtype=np.int64)

    def _check_open(self) -> None:
        if self._loo is not None:
            raise FoalPipeError("the balanced head's leave-one-out pass has used its per-class Grams; "
                                "build a new head to add rows or solve again")

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Add rows (any block size, any order of classes) to their classes' Grams and sums; a refused batch (rows of
        another width, products that overflow) changes nothing."""
        self._check_open()
        xp = self.xp
        labels = check_rows(X, labels, self.dim)
        X = float64(X)
        top = magnitude(X)
        for cls, rows in zip(*np.unique(labels, return_counts=True)):  # every class checked before any is written
            gram = self._grams.get(int(cls))
            check_gram_room(self.name, top, int(rows), 0.0 if gram is None else largest_square(gram))
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
        self._check_open()
        xp = self.xp
        classes = self.classes_
        if classes.size == 0:
            raise FoalPipeError("the balanced head has no rows yet; add rows before a task boundary")
        weights = self.weights()
        gram = xp.zeros((self.dim, self.dim), dtype=xp.float64, device=device(self._grams[int(classes[0])]))
        for cls, weight in zip(classes.tolist(), weights.tolist()):
            gram += weight * self._grams[cls]
        check_drift(gram, self.gamma)
        sums = xp.stack([weight * self._sums[cls] for cls, weight in zip(classes.tolist(), weights.tolist())], axis=1)
        solver = spd_solver(shifted(gram, self.gamma), "float64")
        W = row_major(solver(sums))  # as the model file's W loads: its ties' column lengths sum alike
        check_solved(gram, self.gamma, W, sums, solver)
        return LinearScorer(classes=classes, W=W)

    def _prepare_loo(self) -> dict[int, tuple[Any, Any, float] | None]:
        """Each class's ``M_c^-1`` and ``M_c^-1 B'_c`` (one float64 solve per class), each replacing that class's Gram."""
        xp, D = self.xp, self.dim
        classes, counts = self.classes_, self.counts_.astype(np.float64)
        K, inverse = classes.size, 1.0 / counts
        where = device(self._grams[int(classes[0])])
        base = xp.zeros((D, D), dtype=xp.float64, device=where)  # sum_k A_k / n_k
        for cls, w in zip(classes.tolist(), inverse.tolist()):
            base += w * self._grams[cls]
        sums = xp.stack([w * self._sums[cls] for cls, w in zip(classes.tolist(), inverse.tolist())], axis=1)
        eye = xp.eye(D, dtype=xp.float64, device=where)
        loo: dict[int, tuple[Any, Any, float] | None] = {}
        for j, cls in enumerate(classes.tolist()):
            gram = self._grams.pop(cls)
            if counts[j] == 1:
                loo[cls] = None
                continue
            n = float(counts[j])  # Python floats: a NumPy scalar times a device array would copy it to the host
            delta = 1.0 / (n - 1) - 1.0 / n  # w'_k = scale / n_k, w'_c = scale / (n_c - 1)
            scale = K / (float(inverse.sum()) + delta)
            own = xp.asarray((np.arange(K) == j).astype(np.float64), device=where)
            rhs = scale * (sums + delta * self._sums[cls][:, None] * own[None, :])
            M = scale * (base + delta * gram)
            check_drift(M, self.gamma)
            both = solve_spd(shifted(M, self.gamma), xp.concat([rhs, eye], axis=1), "float64")
            loo[cls] = (xp.asarray(both[:, K:], copy=True), xp.asarray(both[:, :K], copy=True), scale / (n - 1))
        return loo

    def loo_hits(self, X: Any, labels: np.ndarray) -> int:
        """How many of the rows ``X`` (each added before, and no rows added after) the model refitted without that row
        predicts right (see the module docstring). The first call turns the per-class Grams into ``M_c^-1``: the head
        takes no more rows and solves no more boundaries."""
        xp = self.xp
        labels = check_rows(X, labels, self.dim)
        if self._loo is None:
            if not self._counts:
                raise FoalPipeError("the balanced head has no rows yet; add rows before a leave-one-out pass")
            self._loo = self._prepare_loo()
        classes = self.classes_
        own = class_positions(classes, labels)
        X = float64(X)
        hits = 0
        for j in np.unique(own).tolist():
            entry = self._loo[int(classes[j])]
            if entry is None:
                continue
            inverse, W, w = entry
            rows = np.flatnonzero(own == j)
            Xc = X if rows.size == labels.size else xp.take(X, xp.asarray(rows, device=device(X)), axis=0)
            leverage = xp.sum((Xc @ inverse) * Xc, axis=1)
            mark = xp.asarray((np.arange(classes.size) == j).astype(np.float64), device=device(X))
            scores = Xc @ W - (w * leverage)[:, None] * mark[None, :]
            hits += int(np.count_nonzero(to_numpy(xp.argmax(scores, axis=1)) == j))
        return hits
