"""Running class statistics the feature-space heads share: counts, class sums and second moments of shifted rows.

Sums of ``z = x - c`` for a fixed shift ``c`` (a row of the stream, fixed when first seen) give the same
means and scatter as sums of ``x`` in exact arithmetic, and keep the ``G - s s^T / n`` cancellation small in
float64 when the features sit far from the origin (pixels in 0..255).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_namespace

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.core.linalg import class_positions, factor_threads, one_hot
from foal_pipe.core.statistics import align_columns


def on_device(xp: Any, a: Any) -> Any:
    """A stored tensor as float64 in namespace ``xp``, on its default device."""
    return xp.asarray(np.asarray(a, dtype=np.float64), device=default_device(xp))


def unit_rows(X: Any) -> Any:
    """``x / ||x||`` per row; a row of zero norm stays zero (as ``torch.nn.functional.normalize``). A row whose norm
    overflows or whose squares underflow (``|x|`` near 1e154 or below 1e-146 in float64) is divided by its largest
    entry first, so that it still becomes a unit row rather than zeros or NaN."""
    xp = array_namespace(X)
    with np.errstate(over="ignore", under="ignore"):  # such rows take the scaled path below
        norms = xp.linalg.vector_norm(X, axis=1, keepdims=True)
    info = xp.finfo(X.dtype)
    ordinary = (norms >= (info.smallest_normal / info.eps) ** 0.5) & (norms <= info.max)
    if X.shape[1] == 0 or bool(xp.all(ordinary)):
        return X / norms
    top = xp.max(xp.abs(X), axis=1, keepdims=True)
    scaled = X / xp.where(top > 0, top, xp.ones_like(top))
    scaled_norms = xp.linalg.vector_norm(scaled, axis=1, keepdims=True)
    return xp.where(ordinary, X / xp.where(ordinary, norms, xp.ones_like(norms)),
                    scaled / xp.where(scaled_norms > 0, scaled_norms, xp.ones_like(scaled_norms)))


def row_major(a: Any) -> Any:
    """A row-major (C-ordered) copy of the 2-d ``a``, the layout a model file's tensors load in: NumPy sums along a
    row in another order for a column-major array, so scores and checks of a model solved here would otherwise differ
    in their last bits from those of the same model saved and loaded."""
    xp = array_namespace(a)
    out = xp.empty(a.shape, dtype=a.dtype, device=device(a))
    out[...] = a
    return out


class ClassSums:
    """Counts and sums of shifted rows per class (columns in sorted ``classes``), and, with ``pooled``, the
    Gram of every shifted row: a running state that any block size adds to exactly."""

    def __init__(self, xp: Any, dim: int, pooled: bool = False) -> None:
        self.xp, self.dim = xp, dim
        self.classes = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        where = default_device(xp)
        self.sums = xp.zeros((dim, 0), dtype=xp.float64, device=where)  # column k: sum of z over class k
        self.shift: Any = None  # c, the first row added
        self.gram = xp.zeros((dim, dim), dtype=xp.float64, device=where) if pooled else None
        self.n = 0

    def add(self, X: Any, labels: np.ndarray) -> None:
        labels = np.asarray(labels).ravel()
        if labels.size == 0:
            return
        xp = self.xp
        if self.shift is None:
            self.shift = xp.asarray(X[0:1, :], copy=True)
        grown = np.union1d(self.classes, labels)
        if grown.size > self.classes.size:
            self.sums = align_columns(self.sums, self.classes, grown)
            self.counts = np.bincount(np.searchsorted(grown, self.classes), weights=self.counts,
                                      minlength=grown.size).astype(np.int64)
            self.classes = grown
        Z = X - self.shift
        self.sums += Z.T @ one_hot(labels, self.classes, Z)
        self.counts += np.bincount(class_positions(self.classes, labels), minlength=self.classes.size)
        if self.gram is not None:
            self.gram += Z.T @ Z
        self.n += labels.size

    #: The model-file tensors of the state (and ``gram``, ``("d", "d")``, when pooled).
    TENSORS = {"counts": ("C",), "sums": ("d", "C"), "shift": ("d",)}

    def state_dict(self) -> dict[str, Any]:
        """The state as :attr:`TENSORS` name it (``classes`` apart)."""
        state = {"counts": self.counts.copy(), "sums": self.sums, "shift": self.shift[0, :]}
        return state if self.gram is None else {**state, "gram": self.gram}

    def load_state_dict(self, t: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s tensors and ``classes``."""
        xp = self.xp
        self.classes = np.asarray(t["classes"], dtype=np.int64).copy()
        self.counts = np.asarray(t["counts"], dtype=np.int64).copy()
        self.sums, self.shift = on_device(xp, t["sums"]), on_device(xp, t["shift"])[None, :]
        self.n = int(self.counts.sum())
        if self.gram is not None:
            self.gram = on_device(xp, t["gram"])

    def means(self) -> Any:
        """``(C, d)``: the mean row of every class, laid out by rows as a model file's means load
        (:func:`row_major`)."""
        xp = self.xp
        counts = xp.asarray(self.counts.astype(np.float64), device=default_device(xp))
        return row_major((self.sums / counts[None, :]).T + self.shift)

    def scatter(self) -> Any:
        """``sum_i (x_i - mu_{y_i})(x_i - mu_{y_i})^T`` over every row (``pooled`` only): the within-class scatter."""
        xp = self.xp
        counts = xp.asarray(self.counts.astype(np.float64), device=default_device(xp))
        return self.gram - (self.sums / counts[None, :]) @ self.sums.T


class PerClassMoments:
    """Per class: count, sum and Gram of the class's rows shifted by its first row (``C x d^2`` values)."""

    def __init__(self, xp: Any, dim: int) -> None:
        self.xp, self.dim = xp, dim
        self.classes = np.empty(0, dtype=np.int64)
        self.counts: list[int] = []
        self.shifts: list[Any] = []
        self.sums: list[Any] = []
        self.grams: list[Any] = []

    def add(self, X: Any, labels: np.ndarray) -> None:
        xp = self.xp
        labels = np.asarray(labels).ravel()
        where = default_device(xp)
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            Xc = xp.take(X, xp.asarray(rows, device=where), axis=0)
            k = int(np.searchsorted(self.classes, c))
            if k == self.classes.size or self.classes[k] != c:
                self.classes = np.insert(self.classes, k, c)
                self.counts.insert(k, 0)
                self.shifts.insert(k, xp.asarray(Xc[0, :], copy=True))
                self.sums.insert(k, xp.zeros((self.dim,), dtype=xp.float64, device=where))
                self.grams.insert(k, xp.zeros((self.dim, self.dim), dtype=xp.float64, device=where))
            Z = Xc - self.shifts[k][None, :]
            self.counts[k] += rows.size
            self.sums[k] = self.sums[k] + xp.sum(Z, axis=0)
            self.grams[k] = self.grams[k] + Z.T @ Z

    #: The model-file tensors of the state.
    TENSORS = {"counts": ("C",), "shifts": ("C", "d"), "sums": ("C", "d"), "grams": ("C", "d", "d")}

    def state_dict(self) -> dict[str, Any]:
        """The state as :attr:`TENSORS` name it, each list stacked on the host (``classes`` apart)."""
        return {"counts": np.asarray(self.counts, dtype=np.int64),
                **{key: np.stack([to_numpy(a) for a in getattr(self, key)]) for key in ("shifts", "sums", "grams")}}

    def load_state_dict(self, t: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s tensors and ``classes``."""
        xp = self.xp
        self.classes = np.asarray(t["classes"], dtype=np.int64).copy()
        self.counts = [int(n) for n in t["counts"]]
        self.shifts = [on_device(xp, row) for row in t["shifts"]]
        self.sums = [on_device(xp, row) for row in t["sums"]]
        self.grams = [on_device(xp, gram) for gram in t["grams"]]

    def mean(self, k: int) -> Any:
        return self.sums[k] / self.counts[k] + self.shifts[k]

    def covariance(self, k: int) -> Any:
        """The unbiased covariance of class ``k``'s rows (``n_k >= 2``)."""
        s = self.sums[k]
        return (self.grams[k] - s[:, None] * s[None, :] / self.counts[k]) / (self.counts[k] - 1)


#: How far inside pinv's cutoff (``1 / (d eps)``) a certified condition number must lie for :func:`symmetric_pinv` to
#: invert directly: a margin for the rounding of the matrix the bound was derived for.
CUTOFF_MARGIN = 1e-3


def certified_definite(S: Any, floor: float) -> bool:
    """Whether symmetric ``S``, whose eigenvalues are known to be at least ``floor`` from how it was built, has a
    condition number (at most its largest absolute row sum, Gershgorin, over ``floor``) well inside pinv's cutoff:
    then no singular value is dropped and ``pinv(S) = inv(S)``."""
    xp = array_namespace(S)
    if not floor > 0:
        return False
    top = float(xp.max(xp.sum(xp.abs(S), axis=1)))
    return top / floor < CUTOFF_MARGIN / (S.shape[0] * float(xp.finfo(S.dtype).eps))


def symmetric_pinv(S: Any, floor: float = 0.0) -> Any:
    """``pinv(S)`` of a symmetric ``S`` by the array API's definition (singular values ``|w|`` at most
    ``max(d) eps max|w|`` dropped), from ``eigh``, a few times cheaper than the SVD ``pinv`` runs; ``floor`` (a lower
    bound on ``S``'s eigenvalues, 0: none known): when it certifies that nothing is dropped
    (:func:`certified_definite`), ``inv(S)``, the same matrix, a few times cheaper again (:func:`definite_inverse`)."""
    xp = array_namespace(S)
    with factor_threads(S.shape[0]):  # one BLAS thread: two are many times slower on a busy machine
        if certified_definite(S, floor):
            return definite_inverse(S)
        w, V = xp.linalg.eigh(S)
    magnitude = xp.abs(w)
    kept = magnitude > S.shape[0] * xp.finfo(S.dtype).eps * xp.max(magnitude)
    inverse = xp.where(kept, 1 / xp.where(kept, w, xp.ones_like(w)), xp.zeros_like(w))
    return (V * inverse[None, :]) @ V.T


def definite_inverse(S: Any) -> Any:
    """``inv(S)`` of a symmetric ``S`` certified positive definite (:func:`certified_definite`). NumPy: from its
    Cholesky factor (LAPACK ``dpotrf`` and ``dpotri``, half of ``inv``'s LU time: 25 against 49 ms at d = 784 on
    one thread), mirrored from one triangle, so exactly symmetric; where rounding leaves the factorisation
    unfinished, ``inv``. Other namespaces: ``inv``."""
    xp = array_namespace(S)
    if not (is_numpy_namespace(xp) and S.dtype == np.float64):
        return xp.linalg.inv(S)
    from scipy.linalg.lapack import dpotrf, dpotri

    factor, info = dpotrf(S, lower=True, clean=False)
    if info == 0:
        inverse, info = dpotri(factor, lower=True)
        if info == 0:
            lower = np.tril(inverse)
            return row_major(lower + np.tril(lower, -1).T)
    return xp.linalg.inv(S)


def shift_diagonal(S: Any, value: float) -> Any:
    """``S + value I``."""
    xp = array_namespace(S)
    return S + value * xp.eye(S.shape[0], dtype=S.dtype, device=device(S))
