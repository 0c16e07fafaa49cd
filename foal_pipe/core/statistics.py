"""The sufficient statistics of a ridge classifier on activations, and everything computed from them.

Over ``n`` rows of activations ``H`` (n x D) with one-hot targets ``Y`` (n x C, one column per class in
sorted ``classes``), ridge regression needs only

* ``G = H^T H`` (D x D) and ``Q = H^T Y`` (D x C): sums over rows, so statistics of disjoint row sets add
  exactly, in any order, on any worker;
* the row count ``n`` and the rows per class ``counts`` (so ``|Y|_F^2`` is known without the rows).

From them :meth:`RidgeStatistics.solve` gives ``W = (G + gamma I)^-1 Q`` for one gamma, and
:meth:`RidgeStatistics.eigen` the decomposition ``G = V diag(lambda) V^T`` that serves many gammas at
once, as scikit-learn's ``_RidgeGCV`` (``_eigen_decompose_gram`` / ``_solve_eigen_gram``): with
``B = V^T Q``,

* ``W(g) = V diag(1 / (lambda + g)) B``;
* generalised cross-validation, exemplar-free: ``RSS(g) = |Y|^2 - sum_k |B_k|^2 (lambda_k + 2g) /
  (lambda_k + g)^2``, ``df(g) = sum_k lambda_k / (lambda_k + g)``, ``GCV(g) = n RSS(g) / (n - df(g))^2``;
* exact leave-one-out, in one more pass over the rows (:class:`LeaveOneOut`): the leverage
  ``h_i = sum_k (v_k^T h_i)^2 / (lambda_k + g)`` and the residual ``e_i = y_i - W^T h_i`` give the
  prediction of a model refitted without row ``i``, ``y_i - e_i / (1 - h_i)``.

Without leave-one-out, :meth:`RidgeStatistics.tridiagonal` (NumPy) stops the eigendecomposition halfway, at
``G = U T U^T``, which serves the weights and GCV for about a third of the work (:class:`RidgeTridiagonal`).

This module, with :mod:`foal_pipe.core.linalg` and :mod:`foal_pipe.core.gammapath`, is the only place where
the one-hot matrix and the Gram update are written. It is written once against the array API
(``array-api-compat``), so NumPy, CuPy and torch arrays run the same code; labels and classes stay host-side
NumPy arrays (they index, they do not compute). Solves and eigendecompositions run in float64 whatever the
state's dtype: float32 sums (``G``; ``Q`` is float64 always) halve the memory, and a gamma below their resolution,
or at which their rounding would move the weights by more than 1%, is refused rather than solved into noise.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_namespace

from foal_pipe.core.backend import default_device, dtype_name
from foal_pipe.core.drift import CALIBRATED_ROUNDING, DRIFTS, column_scales, drift, rounding_top
from foal_pipe.core.gammapath import RidgeEigen, RidgeTridiagonal, apply_reflectors, eigen_floor, lapack_ok
from foal_pipe.core.linalg import (
    PROBES,
    cheap_drift_floor,
    check_drift,
    check_gammas,
    check_solved,
    class_positions,
    drift_refusal,
    factor_threads,
    finite_resolution,
    float64,
    gamma_solver,
    largest_entry,
    probe_columns,
    target_sums,
)
from foal_pipe.core.rounding import Rounding, addition_rounding, checked_rounding, product_rounding, rounding_at, sampled, unit
from foal_pipe.core.sumfields import class_counts, joined_classes, label_kind, row_count, top_diagonal
from foal_pipe.errors import FoalPipeError

#: The default grid of ``--gamma auto``: 13 powers of ten from 1e-4 to 1e8 (12 decades).
DEFAULT_GAMMA_GRID: tuple[float, ...] = tuple(float(10.0**k) for k in range(-4, 9))


def align_columns(matrix: Any, old: np.ndarray, new: np.ndarray) -> Any:
    """``matrix`` (D x len(old)) widened to the sorted superset ``new`` of ``old``: zero columns for new classes.

    This is how a class-incremental learner grows ``classes_``: a class first seen later had a zero target
    in every earlier row, so its column is exactly zero until then.
    """
    at = np.minimum(np.searchsorted(new, old), max(new.size - 1, 0))
    found = new[at] == old if new.size else np.zeros(old.size, dtype=bool)
    if not found.all():
        raise FoalPipeError(f"cannot align columns to classes without {old[~found].tolist()}; pass a superset")
    xp = array_namespace(matrix)
    source = np.full(new.size, old.size, dtype=np.int64)  # index of the appended zero column
    source[at] = np.arange(old.size)
    zero = xp.zeros((matrix.shape[0], 1), dtype=matrix.dtype, device=device(matrix))
    return xp.take(xp.concat([matrix, zero], axis=1), xp.asarray(source, device=device(matrix)), axis=1)


@dataclass(eq=False)
class RidgeStatistics:
    """``G = H^T H``, ``Q = H^T Y``, the classes of ``Q``'s columns and the row counts: a ridge classifier's data.

    Statistics of disjoint rows add (``a + b``, or ``a += b`` in place), aligned by class: a class that
    only one side has gets a zero column on the other, which is exact because the rows of that side
    have a zero target for it. Create them from rows with :meth:`from_batch`, or :meth:`empty`. ``G`` and ``Q`` given
    directly must be real float arrays of one namespace, and ``G`` symmetric to ``sqrt(eps) max|G|`` (the keyword
    ``symmetric=True`` skips that O(D^2) check for a ``G`` built as ``H^T H`` or sums of such).

    Attributes
    ----------
    G : array of shape (D, D)
    Q : array of shape (D, C)
        Column ``k`` sums the activations of the rows labelled ``classes[k]``. Held in float64 whatever ``G``'s dtype
        (float32 rows' products with 0/1 targets are exact there): the drift checks count ``G``'s rounding only, and a
        float32 ``Q`` of a store of repeated rows, rounding alike in every block, moved the weights 0.57% unseen.
    classes : ndarray of shape (C,)
        Sorted, unique labels (host NumPy).
    n : int
        Rows summed into ``G``.
    counts : ndarray of shape (C,) or None
        Rows per class; ``counts.sum() == |Y|_F^2``, which is ``n`` unless classes were restricted away.
        None when unknown (a model file written without them): ``|Y|_F^2`` is then taken as ``n``.
    rounding : Rounding or None (keyword)
        The rounding the products and additions that formed ``G`` left (:class:`~foal_pipe.core.rounding.Rounding`:
        counted, and measured at a few entries), which grows with the additions (a stream of one-row batches, rows
        added again and again) and which the drift checks take (:attr:`rounding_top`). Kept by :meth:`from_batch`
        and the additions; given as a number, the counted variance; None when unknown (sums given directly, a model
        file written before it was recorded), taken as the calibrated one of sums formed in a few blocks.

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).random((6, 3))
    >>> s = RidgeStatistics.from_batch(H[:4], [1, 1, 2, 2]) + RidgeStatistics.from_batch(H[4:], [5, 1])
    >>> s.classes.tolist(), s.n, s.counts.tolist()
    ([1, 2, 5], 6, [3, 2, 1])
    >>> Y = np.array([1, 1, 2, 2, 5, 1])[:, None] == [1, 2, 5]
    >>> bool(np.allclose(s.solve(1.0), np.linalg.solve(H.T @ H + np.eye(3), H.T @ Y)))
    True
    """

    G: Any
    Q: Any
    classes: np.ndarray
    n: int
    counts: np.ndarray | None = None
    _: KW_ONLY
    rounding: Rounding | None = None
    symmetric: InitVar[bool] = False

    def __post_init__(self, symmetric: bool) -> None:
        try:
            xp = array_namespace(self.G, self.Q)
        except TypeError:
            raise FoalPipeError(f"G ({type(self.G).__name__}) and Q ({type(self.Q).__name__}) must be arrays of one "
                                "namespace; pass both as NumPy arrays or both as tensors of one library") from None
        if not (xp.isdtype(self.G.dtype, "real floating") and xp.isdtype(self.Q.dtype, "real floating")):
            raise FoalPipeError(f"G ({self.G.dtype}) and Q ({self.Q.dtype}) must hold real floats; pass them as float64 "
                                "(or float32) arrays")
        self.Q = float64(self.Q)
        unit(self.G)  # a dtype whose rounding is bounded: float32 or float64
        self.classes = np.asarray(self.classes).ravel()
        self.n = row_count(self.n)
        if self.counts is not None:
            self.counts = class_counts(self.counts, self.n)
        D = self.G.shape[0] if self.G.ndim == 2 else -1
        if self.G.ndim != 2 or self.G.shape[1] != D or tuple(self.Q.shape) != (D, self.classes.size):
            raise FoalPipeError(
                f"G {tuple(self.G.shape)} and Q {tuple(self.Q.shape)} do not fit {self.classes.size} classes; "
                "expected (D, D) and (D, C)"
            )
        kind = label_kind(self.classes)
        if "/" in kind:
            raise FoalPipeError(f"classes hold labels of kinds {kind}, which do not sort together; use one kind of label "
                                "(integer ids or names)")
        if self.classes.dtype.kind == "f" and not np.isfinite(self.classes).all():
            raise FoalPipeError("classes hold NaN or inf, which are no class labels; pass integer ids or names")
        if self.classes.size > 1 and np.any(self.classes[1:] <= self.classes[:-1]):
            raise FoalPipeError("classes must be sorted and unique, matching the columns of Q")
        if self.counts is not None and self.counts.shape != self.classes.shape:
            raise FoalPipeError(f"counts has {self.counts.size} entries for {self.classes.size} classes; pass one per class")
        if self.rounding is not None:
            top = top_diagonal(self.G)
            self.rounding = checked_rounding(self.rounding, D, overflowed=not math.isfinite(top), top=top)
        if not symmetric:
            self._check_gram()
            self._check_symmetric()

    def _check_gram(self) -> None:
        """Refuse given sums that no rows make: ``G`` or ``Q`` not finite, a negative diagonal entry of ``G`` (a sum of
        squares), which the solve would otherwise report as sums that overflowed or underflowed, or a ``G`` of no row."""
        xp = array_namespace(self.G)
        if not (bool(xp.all(xp.isfinite(self.G))) and bool(xp.all(xp.isfinite(self.Q)))):
            raise FoalPipeError("G or Q holds NaN or inf, so they are not sums of finite rows; pass G = H.T @ H and "
                                "Q = H.T @ Y of finite rows H")
        lowest = float(xp.min(xp.linalg.diagonal(self.G))) if self.dim else 0.0
        if lowest < 0:
            raise FoalPipeError(f"G has a negative diagonal entry ({lowest:.3g}), but the diagonal of a Gram matrix H^T H "
                                "holds sums of squares; pass G = H.T @ H")
        if self.n == 0 and bool(xp.any(self.G != 0)):
            raise FoalPipeError("G is not zero but n=0 rows were summed into it; pass n = H.shape[0]")

    def _check_symmetric(self) -> None:
        """Refuse a ``G`` that is not symmetric, so not a Gram matrix: NumPy, CuPy and torch factor its lower
        triangle, array_api_strict the whole, so the weights would depend on the backend. A product ``H^T H`` off
        NumPy is not always exactly symmetric (torch's float64 one on a CPU: about 3 units of rounding of
        ``max|G|``), so ``G`` may stand ``sqrt(eps) max|G|`` from its transpose: far above the rounding of the
        product, far below any matrix that is not one."""
        xp = array_namespace(self.G)
        if self.dim < 2 or bool(xp.all(self.G == self.G.T)):
            return
        apart, top = float(xp.max(xp.abs(self.G - self.G.T))), largest_entry(self.G)
        if np.isfinite(apart) and apart > float(xp.finfo(self.G.dtype).eps) ** 0.5 * top:  # NaN, inf: solve refuses
            raise FoalPipeError(f"G is not symmetric (it differs from its transpose by up to {apart:.3g}, its largest "
                                f"entry being {top:.3g}), so it is not a Gram matrix H^T H; pass G = H.T @ H")

    @classmethod
    def empty(cls, dim: int, xp: Any = None, dtype: Any = None, device: Any = None) -> RidgeStatistics:
        """Statistics of no rows: zeros of dimension ``dim`` in namespace ``xp`` (default NumPy)."""
        if xp is None:
            xp = array_namespace(np.empty(0))
        dtype = xp.float64 if dtype is None else dtype
        device = default_device(xp) if device is None else device
        return cls(
            xp.zeros((dim, dim), dtype=dtype, device=device),
            xp.zeros((dim, 0), dtype=xp.float64, device=device),
            np.empty(0, dtype=np.int64),
            0,
            np.empty(0, dtype=np.int64),
            symmetric=True,
        )

    @classmethod
    def from_batch(cls, H: Any, labels: Any, classes: Any = None) -> RidgeStatistics:
        """The statistics of rows ``H`` (n x D) labelled ``labels``; the one place ``H^T H`` and ``H^T Y`` are formed.

        ``classes`` (sorted, unique, holding every label) fixes the columns of ``Q``; default: the labels present.
        """
        labels = np.asarray(labels).ravel()
        if labels.shape[0] != H.shape[0]:
            raise FoalPipeError(f"H has {H.shape[0]} rows but there are {labels.shape[0]} labels; pass one label per row")
        classes = np.unique(labels) if classes is None else np.asarray(classes).ravel()
        pos = class_positions(classes, labels)
        Ht = H.T
        G = Ht @ H
        return cls(G, target_sums(H, labels, classes), classes, int(H.shape[0]), np.bincount(pos, minlength=classes.size),
                   rounding=product_rounding(H, G), symmetric=True)

    @property
    def dim(self) -> int:
        return int(self.G.shape[0])

    @property
    def dtype(self) -> Any:
        return self.G.dtype

    @property
    def rounding_top(self) -> float:
        """``max|G|`` as the drift estimates take it: raised where the products' and additions' rounding reaches
        beyond it (:func:`~foal_pipe.core.drift.rounding_top`)."""
        r, top = self.rounding, largest_entry(self.G)
        return rounding_top(top, None if r is None else r.variance, 0.0 if r is None else r.measured(self.G, top),
                            unit(self.G))

    @property
    def target_norm2(self) -> float:
        """``|Y|_F^2``: the rows whose class has a column (``n`` when the counts are unknown)."""
        return float(self.n if self.counts is None else self.counts.sum())

    def aligned(self, classes: Any) -> RidgeStatistics:
        """The same statistics with columns for ``classes``, a sorted superset of ``self.classes`` (new ones zero)."""
        classes = np.asarray(classes).ravel()
        if classes.size == self.classes.size and np.array_equal(classes, self.classes):
            return self
        counts = None
        if self.counts is not None:
            counts = np.zeros(classes.size, dtype=np.int64)
            counts[np.isin(classes, self.classes)] = self.counts
        return RidgeStatistics(self.G, align_columns(self.Q, self.classes, classes), classes, self.n, counts,
                               rounding=self.rounding, symmetric=True)

    def restrict(self, classes: Any) -> RidgeStatistics:
        """Only the columns of ``classes`` (a subset): rows of other classes stay in ``G`` with zero targets."""
        classes = np.asarray(classes).ravel()
        keep = class_positions(self.classes, classes)
        xp = array_namespace(self.Q)
        Q = xp.take(self.Q, xp.asarray(keep, device=device(self.Q)), axis=1)
        return RidgeStatistics(self.G, Q, classes, self.n, None if self.counts is None else self.counts[keep],
                               rounding=self.rounding, symmetric=True)

    def __add__(self, other: RidgeStatistics) -> RidgeStatistics:
        self._check_compatible(other)
        other = other._like(self.G)
        classes = joined_classes(self.classes, other.classes)
        a, b = self.aligned(classes), other.aligned(classes)
        parts = self._parts(other)
        G = self.G + other.G
        return RidgeStatistics(G, a.Q + b.Q, classes, self.n + other.n, _add_counts(a.counts, b.counts),
                               rounding=self._added_rounding(other, G, parts), symmetric=True)

    def __iadd__(self, other: RidgeStatistics) -> RidgeStatistics:
        """Add ``other`` into this object's arrays (``G`` is updated in place: no second D x D array)."""
        self._check_compatible(other)
        other, xp = other._like(self.G), array_namespace(self.G)
        classes = joined_classes(self.classes, other.classes)
        mine = self.aligned(classes)  # before G changes: a refusal here leaves these statistics as they were
        theirs = other.aligned(classes)
        parts = self._parts(other)  # before G changes, as is a sum too large for its rounding to be counted
        if self.dim:
            rounding_at(float(xp.max(xp.linalg.diagonal(self.G) + xp.linalg.diagonal(other.G))), self.G)
        self.G = _added(self.G, other.G)
        Q = _added(mine.Q if mine is not self else self.Q, theirs.Q)
        self.Q, self.classes, self.counts = Q, classes, _add_counts(mine.counts, theirs.counts)
        self.rounding = self._added_rounding(other, self.G, parts)
        self.n += other.n
        return self

    def _parts(self, other: RidgeStatistics) -> tuple[Rounding, np.ndarray, np.ndarray] | None:
        """Both parts' rounding and their sampled entries before they are added (None where a part is of no row:
        adding zeros is exact)."""
        if self.n == 0 or other.n == 0:
            return None
        return self.counted_rounding() + other.counted_rounding(), sampled(self.G), sampled(other.G)

    def _added_rounding(self, other: RidgeStatistics, total: Any,
                        parts: tuple[Rounding, np.ndarray, np.ndarray] | None) -> Rounding | None:
        """The :attr:`rounding` of these sums plus ``other``'s, whose sum is ``total``: both parts' (``parts``:
        :meth:`_parts`) and the addition's, which rounds every entry at ``total``'s scale, measured exactly at the
        sampled entries."""
        if parts is None:
            return other.rounding if self.n == 0 else self.rounding
        rounding, a, b = parts
        return rounding + addition_rounding(a, b, total)

    def counted_rounding(self) -> Rounding:
        """:attr:`rounding`, or where unknown the calibrated figure of these sums' size and dtype (nothing measured)."""
        if self.rounding is not None:
            return self.rounding
        return Rounding(CALIBRATED_ROUNDING * rounding_at(top_diagonal(self.G), self.G))

    def _check_compatible(self, other: RidgeStatistics) -> None:
        if not isinstance(other, RidgeStatistics):
            raise TypeError(f"cannot add {type(other).__name__} to RidgeStatistics")
        if other.dim != self.dim:
            raise FoalPipeError(f"cannot add statistics of dimension {other.dim} to dimension {self.dim}; "
                                "use the same projection")
        if self.classes.size and other.classes.size:
            kinds = label_kind(self.classes), label_kind(other.classes)
            if kinds[0] != kinds[1]:
                raise FoalPipeError(f"cannot add statistics of labels of kind {kinds[1]} to those of kind {kinds[0]}; "
                                    "use one kind of label (integer ids or names)")
            union = np.union1d(self.classes, other.classes)
            if union.size != np.unique(np.concatenate([self.classes.astype(object), other.classes.astype(object)])).size:
                raise FoalPipeError("cannot add statistics whose labels have no common exact type (integer ids beside "
                                    "fractions lose ids in float64); use integer ids on both sides")

    def _like(self, array: Any) -> RidgeStatistics:
        """These statistics in the namespace and on the device of ``array`` (host sums from Dask workers join
        a device state). A read-only NumPy array (as ``statistics_`` hands them out) is copied, not shared: torch
        warns on sharing one, and the copy keeps the source read-only."""
        xp = array_namespace(array)
        if array_namespace(self.G) is xp:
            return self
        where = device(array)

        def moved(part: Any) -> Any:
            read_only = isinstance(part, np.ndarray) and not part.flags.writeable
            return xp.asarray(part, device=where, copy=True if read_only else None)

        return RidgeStatistics(moved(self.G), moved(self.Q), self.classes, self.n, self.counts, rounding=self.rounding,
                               symmetric=True)

    def copy(self) -> RidgeStatistics:
        xp = array_namespace(self.G)
        counts = None if self.counts is None else self.counts.copy()
        return RidgeStatistics(xp.asarray(self.G, copy=True), xp.asarray(self.Q, copy=True), self.classes.copy(), self.n, counts,
                               rounding=self.rounding, symmetric=True)

    def state(self) -> dict[str, Any]:
        """``G``, ``Q`` and, when known, the rows per class ``counts`` (GCV needs their sum) and the :attr:`rounding`
        (a :class:`~foal_pipe.core.rounding.Rounding`: the drift checks of sums learned on from a file need it, and a
        stream saved and reloaded then counts what the uninterrupted stream counts): what a model keeps."""
        return ({"G": self.G, "Q": self.Q} | ({} if self.counts is None else {"counts": self.counts})
                | ({} if self.rounding is None else {"rounding": self.rounding}))

    def solve(self, gamma: float, drift_checked: bool = False) -> Any:
        """``W = (G + gamma I)^-1 Q`` (D x C), solved in float64, refused at a gamma at which the rounding of the sums
        would move ``W`` by more than :data:`~foal_pipe.core.drift.DRIFTS` (:func:`~foal_pipe.core.drift.drift`):
        for float32 sums the same factorisation also solves :data:`~foal_pipe.core.linalg.PROBES` random columns,
        whose mean squared length estimates ``|(G + gamma I)^-1|_F^2`` (Hutchinson); float64 sums are checked by
        :func:`~foal_pipe.core.linalg.check_drift` (a bound, probes only where it does not pass). ``drift_checked``:
        the gamma passed the exact form of that check already (a :meth:`gamma_path`'s floor), so no estimate is
        made that could disagree with it. Either way the solve's own rounding is measured where it may matter
        (:func:`~foal_pipe.core.linalg.check_solved`)."""
        xp = array_namespace(self.G)
        dtype = dtype_name(self.G.dtype)
        probed = not drift_checked and dtype == "float32"
        top = self.rounding_top
        if drift_checked or probed:
            check_gammas(self.G, gamma, self.Q, top)
        else:
            check_drift(self.G, gamma, self.Q, top)
        Q = float64(self.Q)
        if probed:
            scales = column_scales(self.G)[:, None]  # each column at its own scale (core/drift.py)
            Q = xp.concat([Q, scales * probe_columns(self.G)], axis=1)
        with factor_threads(self.dim):
            solver = gamma_solver(self.G, gamma, self.Q, top)
            W = solver(Q)
            C = self.Q.shape[1]
            if probed:
                moved = drift(float(xp.sum((scales * W[:, C:]) ** 2)) / PROBES, top, dtype)
                if moved > DRIFTS[dtype]:
                    raise drift_refusal(float(gamma), moved, dtype, self.G, self.Q, top)
                W = W[:, :C]
            check_solved(self.G, float(gamma), W, self.Q, solver)
        return W

    def factor(self, vectors: bool) -> Factored:
        """The LAPACK work of :meth:`gamma_path` (on one BLAS thread up to ``SINGLE_THREAD_FACTOR_DIM``), apart from
        the products that assemble the path, so that a walk can run it on another thread while the next task's rows
        are summed (:class:`~foal_pipe.protocol.learners.gram.GramLearner`): the same bits on either thread."""
        return self._reduce() if self.factor_is_reduction(vectors) else self._decompose()

    def factor_is_reduction(self, vectors: bool) -> bool:
        """Whether :meth:`factor` stops at the tridiagonal form (the eigenvectors not asked for, NumPy, D >= 2)."""
        return not vectors and is_numpy_namespace(array_namespace(self.G)) and self.dim >= 2 and self.classes.size > 0

    def gamma_path(self, vectors: bool, factored: Factored | None = None) -> RidgeEigen | RidgeTridiagonal:
        """The cheapest form that serves many gammas: :meth:`eigen` when ``vectors`` (leave-one-out needs them)
        or off NumPy, else :meth:`tridiagonal`, the same weights and GCV for about a third of the work.
        ``factored``: :meth:`factor` ``(vectors)`` of these statistics, computed already."""
        factored = factored or self.factor(vectors)
        return self.tridiagonal(factored) if factored.tridiagonal else self.eigen(factored)

    def eigen(self, factored: Factored | None = None) -> RidgeEigen:
        """``G = V diag(lambda) V^T`` (float64), with ``B = V^T Q`` cached: many gammas for one factorisation.
        ``factored``: :meth:`factor`'s eigendecomposition of these statistics, computed already."""
        factored = factored or self._decompose()
        values, vectors = factored.arrays
        return RidgeEigen(values=values, classes=self.classes, n=self.n, y_norm2=self.target_norm2,
                          floor=factored.floor, dtype=dtype_name(self.G.dtype), vectors=vectors,
                          projected=vectors.T @ float64(self.Q))

    def _decompose(self) -> Factored:
        xp = array_namespace(self.G)
        floor = finite_resolution(self.G, self.Q)
        with factor_threads(self.dim):
            values, vectors = xp.linalg.eigh(float64(self.G))
        return Factored(False, eigen_floor(floor, values, self.rounding_top, dtype_name(self.G.dtype)),
                        (values, vectors))

    def tridiagonal(self, factored: Factored | None = None) -> RidgeTridiagonal:
        """``G = U T U^T`` by Householder reflections (LAPACK ``dsytrd``; NumPy arrays of dimension >= 2 only).

        An eigendecomposition is this reduction plus the eigenvectors of ``T`` and their back-transform, which
        GCV and the weights do not need: ``T + g I`` is factored and solved directly (``O(D C)`` per gamma), and
        its factors give ``df``; only the lowest eigenvalue is computed (bisection), for the refusal floor. A
        1000 x 1000 ``G`` on one thread: 0.05 s against 0.14 s. ``factored``: :meth:`factor`'s reduction.
        """
        if factored is None and (self.dim < 2 or not is_numpy_namespace(array_namespace(self.G))):
            raise FoalPipeError(f"tridiagonal() needs NumPy statistics of dimension >= 2 (LAPACK's dsytrd), not "
                                f"{array_namespace(self.G).__name__} arrays of dimension {self.dim}; use eigen(), which "
                                "serves every namespace")
        factored = factored or self._reduce()
        diagonal, offdiagonal, reflectors, tau, projected = factored.arrays
        return RidgeTridiagonal(classes=self.classes, n=self.n, y_norm2=self.target_norm2, floor=factored.floor,
                                dtype=dtype_name(self.G.dtype), diagonal=diagonal, offdiagonal=offdiagonal,
                                reflectors=reflectors, tau=tau, projected=projected)

    def _reduce(self) -> Factored:
        from scipy.linalg import eigvalsh_tridiagonal, lapack

        floor = finite_resolution(self.G, self.Q)
        with factor_threads(self.dim):
            lwork = int(lapack.dsytrd_lwork(self.dim, lower=1)[0])
            reduced, diagonal, offdiagonal, tau, info = lapack.dsytrd(float64(self.G), lower=1, lwork=lwork)
            lapack_ok("dsytrd", info)
            top, dtype = self.rounding_top, dtype_name(self.G.dtype)
            lowest = eigvalsh_tridiagonal(diagonal, offdiagonal, check_finite=False, select="i", select_range=(0, 0))
            if cheap_drift_floor(float(lowest[0]), self.dim, top, dtype) > max(floor, -float(lowest[0])):
                # the bound from the lowest eigenvalue alone does not clear the floor: every eigenvalue decides
                lowest = eigvalsh_tridiagonal(diagonal, offdiagonal, check_finite=False)
            reflectors = np.asfortranarray(reduced[1:, :-1])
            projected = np.asfortranarray(apply_reflectors(reflectors, tau, float64(self.Q), "T"))
        return Factored(True, eigen_floor(floor, lowest, top, dtype), (diagonal, offdiagonal, reflectors, tau, projected))


@dataclass(frozen=True)
class Factored:
    """:meth:`RidgeStatistics.factor`'s result: the refusal floor for gammas, and ``eigh``'s eigenvalues and
    eigenvectors or (``tridiagonal``) ``dsytrd``'s diagonal, off-diagonal, reflectors, their scales and ``U^T Q``."""

    tridiagonal: bool
    floor: float
    arrays: tuple[Any, ...]


def _added(a: Any, b: Any) -> Any:
    """``a + b``, into ``a`` unless it is read-only (an estimator's ``statistics_``, whose state it views)."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        return a + b
    a += b
    return a


def _add_counts(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else a + b
