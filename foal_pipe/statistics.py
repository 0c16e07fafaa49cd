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

This module is the only place where the one-hot matrix and the Gram update are written. It is written
once against the array API (``array-api-compat``), so NumPy, CuPy and torch arrays run the same code;
labels and classes stay host-side NumPy arrays (they index, they do not compute). Solves and
eigendecompositions run in float64 whatever the state's dtype: float32 sums halve the memory, and a
gamma below their resolution is refused rather than solved into noise.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_namespace
from threadpoolctl import threadpool_limits

from foal_pipe.backend import LINALG_ERRORS, default_device, dtype_name, to_numpy
from foal_pipe.errors import FoalPipeError

#: Rows handled at once in a leave-one-out block: bounds its temporaries to about this many values.
LOO_BLOCK_VALUES = 2**22
#: Factorisations up to this dimension run on one BLAS thread: measured on a shared 2-core machine, a
#: 1000 x 1000 ``eigh`` took 0.18-0.35 s on one thread and 0.6-1.5 s on two under load (solve: 0.05 vs
#: 0.2-2.7 s); small factorisations gain little from threads and lose much when cores are busy.
SINGLE_THREAD_FACTOR_DIM = 2048
#: The default grid of ``--gamma auto``: 13 decades from 1e-4 to 1e8.
DEFAULT_GAMMA_GRID: tuple[float, ...] = tuple(float(10.0**k) for k in range(-4, 9))


def class_positions(classes: np.ndarray, labels: Any) -> np.ndarray:
    """Column of each label in sorted ``classes``; every label must be one of them."""
    labels = np.asarray(labels).ravel()
    pos = np.searchsorted(classes, labels)
    known = pos < classes.size
    known[known] = classes[pos[known]] == labels[known]
    if not known.all():
        raise FoalPipeError(f"label {labels[np.flatnonzero(~known)[0]]!r} is not among the classes; pass the classes of every label")
    return pos


def one_hot(labels: Any, classes: np.ndarray, like: Any) -> Any:
    """``Y`` (n x C): ``Y[i, k] = 1`` where ``labels[i] == classes[k]``, in the namespace, device and dtype of ``like``."""
    xp = array_namespace(like)
    pos = xp.asarray(class_positions(classes, labels), device=device(like))
    columns = xp.arange(classes.size, device=device(like))
    return xp.astype(pos[:, None] == columns[None, :], like.dtype)


def align_columns(matrix: Any, old: np.ndarray, new: np.ndarray) -> Any:
    """``matrix`` (D x len(old)) widened to the sorted superset ``new`` of ``old``: zero columns for new classes.

    This is how a class-incremental learner grows ``classes_``: a class first seen later had a zero target
    in every earlier row, so its column is exactly zero until then.
    """
    missing = np.setdiff1d(old, new)
    if missing.size:
        raise FoalPipeError(f"cannot align columns to classes without {missing.tolist()}; pass a superset")
    xp = array_namespace(matrix)
    have = np.isin(new, old)
    source = np.full(new.size, old.size, dtype=np.int64)  # index of the appended zero column
    source[have] = np.searchsorted(old, new[have])
    zero = xp.zeros((matrix.shape[0], 1), dtype=matrix.dtype, device=device(matrix))
    return xp.take(xp.concat([matrix, zero], axis=1), xp.asarray(source, device=device(matrix)), axis=1)


def shifted(G: Any, gamma: float) -> Any:
    """``G + gamma I`` as one new float64 array (no identity matrix is built)."""
    xp = array_namespace(G)
    flat = xp.reshape(xp.astype(G, xp.float64, copy=True), (-1,))
    flat[:: G.shape[0] + 1] += gamma  # a view of the copy for NumPy, CuPy and torch; the reshape below is exact either way
    return xp.reshape(flat, G.shape)


def resolution(G: Any) -> float:
    """The smallest gamma the state can represent: ``eps(dtype) * max diag(G)``.

    A smaller gamma underflows when added to the diagonal of ``G`` in the state's dtype: its effect is
    below the rounding of the sums themselves, so the solution would be noise.
    """
    xp = array_namespace(G)
    if G.shape[0] == 0:
        return 0.0
    top = float(xp.max(xp.reshape(G, (-1,))[:: G.shape[0] + 1]))
    return float(xp.finfo(G.dtype).eps) * max(top, 0.0)


def finite_resolution(G: Any) -> float:
    """:func:`resolution`, refused when the sums overflowed (a non-finite diagonal)."""
    floor = resolution(G)
    if not np.isfinite(floor):
        raise FoalPipeError(
            f"the {dtype_name(G.dtype)} Gram sums overflowed (the features are too large for this dtype); "
            "use --dtype float64 or rescale the features"
        )
    return floor


def _check_positive(gammas: np.ndarray) -> None:
    """Refuse the first gamma that is not a positive finite number."""
    bad = gammas[~(np.isfinite(gammas) & (gammas > 0))]
    if bad.size:
        raise FoalPipeError(f"gamma must be a positive number, got {bad[0]:g}; try --gamma 1")


def _not_positive_definite(where: str) -> FoalPipeError:
    """The refusal of a ``G + gamma I`` that rounding left indefinite (``where``: which gamma)."""
    return FoalPipeError(
        f"G + gamma I is not positive definite {where}: rounding in the Gram sums outweighs gamma, so the solve "
        "would be noise; use a larger gamma or --dtype float64"
    )


def check_gammas(G: Any, gammas: Any) -> None:
    """Refuse gammas that are not positive or that underflow in the dtype of ``G`` (see :func:`resolution`)."""
    low = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
    _check_positive(low)
    floor = finite_resolution(G)
    if floor and low.min() < floor:
        raise FoalPipeError(
            f"gamma {low.min():g} is below the resolution of the {dtype_name(G.dtype)} Gram sums "
            f"({floor:.3g} = eps x largest diagonal entry), so the solve would be noise; use a gamma of at least "
            f"{floor:.3g} or --dtype float64"
        )


def _factor_threads(dim: int) -> threadpool_limits:
    """A BLAS thread limit for one factorisation of dimension ``dim`` (see ``SINGLE_THREAD_FACTOR_DIM``)."""
    return threadpool_limits(limits=1 if dim <= SINGLE_THREAD_FACTOR_DIM else None, user_api="blas")


def _float64(a: Any) -> Any:
    xp = array_namespace(a)
    return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)


def _solve_spd(A: Any, Q: Any) -> Any:
    """``A^-1 Q`` for a symmetric ``A`` that may be overwritten, refused unless numerically positive definite.

    ``G + gamma I`` is positive definite in exact arithmetic; when rounding in the sums (float32) outweighs
    gamma in some direction it is not, and any solution would be noise: the Cholesky factorisation
    notices. NumPy arrays use LAPACK's Cholesky solver in place (half an LU's time, no copy of ``A``);
    other namespaces check with ``linalg.cholesky`` (CuPy returns NaN instead of raising), then
    :func:`checked_solve`: the same error on every backend.
    """
    xp = array_namespace(A)
    fail = _not_positive_definite("at this gamma")
    if is_numpy_namespace(xp):
        from scipy.linalg import LinAlgError, LinAlgWarning, solve

        with warnings.catch_warnings():  # near the resolution LAPACK warns of a small rcond; the floor is checked
            warnings.simplefilter("ignore", LinAlgWarning)
            try:  # A is symmetric, so A.T is the same matrix in the Fortran order LAPACK overwrites in place
                return solve(A.T, Q, assume_a="pos", overwrite_a=True, check_finite=False)
            except LinAlgError:
                raise fail from None
    try:
        factor_ok = bool(xp.all(xp.isfinite(xp.linalg.cholesky(A))))
    except LINALG_ERRORS:
        raise fail from None
    if not factor_ok:
        raise fail
    return checked_solve(A, Q, fail)


def checked_solve(A: Any, B: Any, fail: FoalPipeError) -> Any:
    """``linalg.solve(A, B)``, with ``fail`` raised alike on every backend when ``A`` is singular: NumPy and
    torch raise their own errors, CuPy returns NaN (so the solution's finiteness is checked)."""
    xp = array_namespace(A)
    try:
        X = xp.linalg.solve(A, B)
    except LINALG_ERRORS:
        raise fail from None
    if not bool(xp.all(xp.isfinite(X))):
        raise fail
    return X


@dataclass(eq=False)
class RidgeStatistics:
    """``G = H^T H``, ``Q = H^T Y``, the classes of ``Q``'s columns and the row counts: a ridge classifier's data.

    Statistics of disjoint rows add (``a + b``, or ``a += b`` in place), aligned by class: a class that
    only one side has gets a zero column on the other, which is exact because the rows of that side
    have a zero target for it. Create them from rows with :meth:`from_batch`, or :meth:`empty`.

    Attributes
    ----------
    G : array of shape (D, D)
    Q : array of shape (D, C)
        Column ``k`` sums the activations of the rows labelled ``classes[k]``.
    classes : ndarray of shape (C,)
        Sorted, unique labels (host NumPy).
    n : int
        Rows summed into ``G``.
    counts : ndarray of shape (C,) or None
        Rows per class; ``counts.sum() == |Y|_F^2``, which is ``n`` unless classes were restricted away.
        None when unknown (a model file written without them): ``|Y|_F^2`` is then taken as ``n``.

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).random((6, 3))
    >>> s = RidgeStatistics.from_batch(H[:4], [1, 1, 2, 2]) + RidgeStatistics.from_batch(H[4:], [5, 1])
    >>> s.classes.tolist(), s.n, s.counts.tolist()
    ([1, 2, 5], 6, [3, 2, 1])
    >>> bool(np.allclose(s.solve(1.0), np.linalg.solve(H.T @ H + np.eye(3), H.T @ (np.array([1, 1, 2, 2, 5, 1])[:, None] == [1, 2, 5]))))
    True
    """

    G: Any
    Q: Any
    classes: np.ndarray
    n: int
    counts: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.classes = np.asarray(self.classes).ravel()
        self.n = int(self.n)
        if self.counts is not None:
            self.counts = np.asarray(self.counts, dtype=np.int64).ravel()
        D = self.G.shape[0] if self.G.ndim == 2 else -1
        if self.G.ndim != 2 or self.G.shape[1] != D or tuple(self.Q.shape) != (D, self.classes.size):
            raise FoalPipeError(
                f"G {tuple(self.G.shape)} and Q {tuple(self.Q.shape)} do not fit {self.classes.size} classes; "
                "expected (D, D) and (D, C)"
            )
        if self.classes.size > 1 and np.any(self.classes[1:] <= self.classes[:-1]):
            raise FoalPipeError("classes must be sorted and unique, matching the columns of Q")
        if self.counts is not None and self.counts.shape != self.classes.shape:
            raise FoalPipeError(f"counts has {self.counts.size} entries for {self.classes.size} classes; pass one per class")

    @classmethod
    def empty(cls, dim: int, xp: Any = None, dtype: Any = None, device: Any = None) -> RidgeStatistics:
        """Statistics of no rows: zeros of dimension ``dim`` in namespace ``xp`` (default NumPy)."""
        if xp is None:
            xp = array_namespace(np.empty(0))
        dtype = xp.float64 if dtype is None else dtype
        device = default_device(xp) if device is None else device
        return cls(
            xp.zeros((dim, dim), dtype=dtype, device=device),
            xp.zeros((dim, 0), dtype=dtype, device=device),
            np.empty(0, dtype=np.int64),
            0,
            np.empty(0, dtype=np.int64),
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
        Y = one_hot(labels, classes, H)
        Ht = H.T
        return cls(Ht @ H, Ht @ Y, classes, int(H.shape[0]), np.bincount(pos, minlength=classes.size))

    @property
    def dim(self) -> int:
        return int(self.G.shape[0])

    @property
    def dtype(self) -> Any:
        return self.G.dtype

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
        return RidgeStatistics(self.G, align_columns(self.Q, self.classes, classes), classes, self.n, counts)

    def restrict(self, classes: Any) -> RidgeStatistics:
        """Only the columns of ``classes`` (a subset): rows of other classes stay in ``G`` with zero targets."""
        classes = np.asarray(classes).ravel()
        keep = class_positions(self.classes, classes)
        xp = array_namespace(self.Q)
        Q = xp.take(self.Q, xp.asarray(keep, device=device(self.Q)), axis=1)
        return RidgeStatistics(self.G, Q, classes, self.n, None if self.counts is None else self.counts[keep])

    def __add__(self, other: RidgeStatistics) -> RidgeStatistics:
        self._check_compatible(other)
        other = other._like(self.G)
        classes = np.union1d(self.classes, other.classes)
        a, b = self.aligned(classes), other.aligned(classes)
        return RidgeStatistics(self.G + other.G, a.Q + b.Q, classes, self.n + other.n, _add_counts(a.counts, b.counts))

    def __iadd__(self, other: RidgeStatistics) -> RidgeStatistics:
        """Add ``other`` into this object's arrays (``G`` is updated in place: no second D x D array)."""
        self._check_compatible(other)
        other = other._like(self.G)
        self.G += other.G
        classes = np.union1d(self.classes, other.classes)
        mine = self.aligned(classes)
        theirs = other.aligned(classes)
        Q = mine.Q if mine is not self else self.Q
        Q += theirs.Q
        self.Q, self.classes, self.counts = Q, classes, _add_counts(mine.counts, theirs.counts)
        self.n += other.n
        return self

    def _check_compatible(self, other: RidgeStatistics) -> None:
        if not isinstance(other, RidgeStatistics):
            raise TypeError(f"cannot add {type(other).__name__} to RidgeStatistics")
        if other.dim != self.dim:
            raise FoalPipeError(f"cannot add statistics of dimension {other.dim} to dimension {self.dim}; use the same projection")

    def _like(self, array: Any) -> RidgeStatistics:
        """These statistics in the namespace and on the device of ``array`` (host sums from Dask workers join
        a device state)."""
        xp = array_namespace(array)
        if array_namespace(self.G) is xp:
            return self
        where = device(array)
        return RidgeStatistics(xp.asarray(self.G, device=where), xp.asarray(self.Q, device=where), self.classes, self.n,
                               self.counts)

    def copy(self) -> RidgeStatistics:
        xp = array_namespace(self.G)
        counts = None if self.counts is None else self.counts.copy()
        return RidgeStatistics(xp.asarray(self.G, copy=True), xp.asarray(self.Q, copy=True), self.classes.copy(), self.n, counts)

    def solve(self, gamma: float) -> Any:
        """``W = (G + gamma I)^-1 Q`` (D x C), solved in float64."""
        check_gammas(self.G, gamma)
        with _factor_threads(self.dim):
            return _solve_spd(shifted(self.G, float(gamma)), _float64(self.Q))

    def eigen(self) -> RidgeEigen:
        """``G = V diag(lambda) V^T`` (float64), with ``B = V^T Q`` cached: many gammas for one factorisation."""
        xp = array_namespace(self.G)
        floor = finite_resolution(self.G)
        with _factor_threads(self.dim):
            values, vectors = xp.linalg.eigh(_float64(self.G))
        return RidgeEigen(values=values, classes=self.classes, n=self.n, y_norm2=self.target_norm2,
                          floor=_eigen_floor(floor, values), vectors=vectors, projected=vectors.T @ _float64(self.Q))

    def gamma_path(self, vectors: bool) -> RidgeEigen | RidgeTridiagonal:
        """The cheapest form that serves many gammas: :meth:`eigen` when ``vectors`` (leave-one-out needs them)
        or off NumPy, else :meth:`tridiagonal`, the same weights and GCV for about a third of the work."""
        if vectors or not is_numpy_namespace(array_namespace(self.G)) or self.dim < 2 or self.classes.size == 0:
            return self.eigen()
        return self.tridiagonal()

    def tridiagonal(self) -> RidgeTridiagonal:
        """``G = U T U^T`` by Householder reflections (LAPACK ``dsytrd``; NumPy arrays of dimension >= 2 only).

        An eigendecomposition is this reduction plus the eigenvectors of ``T`` and their back-transform, which
        GCV and the weights do not need: ``T + g I`` is factored and solved directly (``O(D C)`` per gamma), and
        its factors give ``df``; only the lowest eigenvalue is computed (bisection), for the refusal floor. A
        1000 x 1000 ``G`` on one thread: 0.05 s against 0.14 s.
        """
        from scipy.linalg import eigvalsh_tridiagonal, lapack

        floor = finite_resolution(self.G)
        with _factor_threads(self.dim):
            lwork = int(lapack.dsytrd_lwork(self.dim, lower=1)[0])
            reduced, diagonal, offdiagonal, tau, info = lapack.dsytrd(_float64(self.G), lower=1, lwork=lwork)
            _lapack_ok("dsytrd", info)
            lowest = eigvalsh_tridiagonal(diagonal, offdiagonal, select="i", select_range=(0, 0), check_finite=False)
            reflectors = np.asfortranarray(reduced[1:, :-1])
            projected = np.asfortranarray(_apply_reflectors(reflectors, tau, _float64(self.Q), "T"))
        return RidgeTridiagonal(classes=self.classes, n=self.n, y_norm2=self.target_norm2,
                                floor=_eigen_floor(floor, lowest), diagonal=diagonal, offdiagonal=offdiagonal,
                                reflectors=reflectors, tau=tau, projected=projected)


def _eigen_floor(floor: float, values: Any) -> float:
    """The refusal floor for gammas: the sums' resolution, or ``-min(lambda)`` when rounding left a negative eigenvalue."""
    xp = array_namespace(values)
    return max(floor, -float(xp.min(values)) if values.shape[0] else 0.0)


def _lapack_ok(routine: str, info: int) -> None:
    if info != 0:
        raise FoalPipeError(f"LAPACK {routine} failed (info {info}) on the Gram matrix; check the features for NaN or inf")


def _apply_reflectors(reflectors: np.ndarray, tau: np.ndarray, C: np.ndarray, trans: str) -> np.ndarray:
    """``U C`` (``trans="N"``) or ``U^T C`` (``"T"``) for ``dsytrd``'s lower ``U``: LAPACK's ``dormtr``, which
    SciPy does not wrap, is ``dormqr`` on the rows below the first with the reflectors below the subdiagonal."""
    from scipy.linalg import lapack

    out = np.empty(C.shape, dtype=np.float64)
    if out.shape[1] == 0:
        return out
    body = np.array(C[1:], dtype=np.float64, order="F")  # what dormqr overwrites, in the layout it needs
    work = lapack.dormqr("L", trans, reflectors, tau, body, lwork=-1)[1]
    body, _, info = lapack.dormqr("L", trans, reflectors, tau, body, lwork=max(1, int(work[0])), overwrite_c=1)
    _lapack_ok("dormqr", info)
    out[0], out[1:] = C[0], body
    return out


@dataclass(frozen=True, eq=False)
class GammaPath(ABC):
    """What serves many gammas from one factorisation of ``G``: weights, RSS and ``df``, and GCV from them.

    ``gammas`` arguments are 1-D sequences; results have one entry (or one slice) per gamma.
    """

    classes: np.ndarray
    n: int
    y_norm2: float  # |Y|_F^2
    floor: float  # gammas at or below it are refused: the sums' resolution, or -min(lambda) if larger

    def _gammas(self, gammas: Any) -> np.ndarray:
        g = np.asarray(gammas, dtype=np.float64).ravel()
        if g.size == 0:
            raise FoalPipeError("no gammas given; pass at least one, e.g. 1e-2,1,100")
        _check_positive(g)
        if self.floor and g.min() <= self.floor:
            raise FoalPipeError(
                f"gamma {g.min():g} is below the resolution of the Gram sums ({self.floor:.3g}: eps x largest "
                f"diagonal entry, or the most negative eigenvalue rounding left), so its solution would be noise; "
                f"use gammas above {self.floor:.3g} (--gammas, --gamma-grid) or --dtype float64"
            )
        return g

    def gcv(self, gammas: Any) -> np.ndarray:
        """Generalised cross-validation ``n RSS(g) / (n - df(g))^2`` (infinite where ``df >= n``)."""
        rss, df = self.rss(gammas), self.dof(gammas)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(df < self.n, self.n * np.maximum(rss, 0.0) / (self.n - df) ** 2, np.inf)

    @abstractmethod
    def dof(self, gammas: Any) -> np.ndarray:
        """Effective degrees of freedom ``df(g) = tr(G (G + g I)^-1) = sum_k lambda_k / (lambda_k + g)``."""

    @abstractmethod
    def weights(self, gammas: Any) -> Any:
        """``W(g)`` for every gamma, shape (D, M, C)."""

    @abstractmethod
    def rss(self, gammas: Any) -> np.ndarray:
        """The training residual sum of squares ``|Y - H W(g)|^2``, per gamma."""


@dataclass(frozen=True, eq=False)
class RidgeEigen(GammaPath):
    """The eigendecomposition of a :class:`RidgeStatistics`' ``G``: weights, GCV and leave-one-out for any gammas."""

    values: Any  # lambda, (D,)
    vectors: Any  # V, (D, D)
    projected: Any  # B = V^T Q, (D, C)

    def shrinkage(self, gammas: Any) -> Any:
        """``1 / (lambda_k + g)``, shape (D, M): how much each eigendirection is kept at each gamma."""
        xp = array_namespace(self.values)
        g = xp.asarray(self._gammas(gammas), device=device(self.values))
        return 1.0 / (self.values[:, None] + g[None, :])

    def dof(self, gammas: Any) -> np.ndarray:
        xp = array_namespace(self.values)
        return to_numpy(xp.sum(self.values[:, None] * self.shrinkage(gammas), axis=0))

    def weights(self, gammas: Any) -> Any:
        inv = self.shrinkage(gammas)
        xp = array_namespace(self.vectors)
        D, C = self.projected.shape
        scaled = self.projected[:, None, :] * inv[:, :, None]
        return xp.reshape(self.vectors @ xp.reshape(scaled, (D, -1)), (D, inv.shape[1], C))

    def rss(self, gammas: Any) -> np.ndarray:
        """``|Y|^2 - sum_k |B_k|^2 (lambda_k + 2g) / (lambda_k + g)^2``."""
        xp = array_namespace(self.values)
        inv = self.shrinkage(gammas)
        g = xp.asarray(self._gammas(gammas), device=device(self.values))
        norms = xp.sum(self.projected * self.projected, axis=1)
        fitted = xp.sum(norms[:, None] * (self.values[:, None] + 2 * g[None, :]) * inv * inv, axis=0)
        return self.y_norm2 - to_numpy(fitted)

    def loo(self, gammas: Any) -> LeaveOneOut:
        """An accumulator of exact leave-one-out scores: feed it every row with :meth:`LeaveOneOut.add`."""
        return LeaveOneOut(self, gammas)


@dataclass(frozen=True, eq=False)
class RidgeTridiagonal(GammaPath):
    """``G = U T U^T`` (NumPy, from :meth:`RidgeStatistics.tridiagonal`): weights and GCV for any gammas.

    Each gamma factors ``T + g I = L diag(d) L^T`` (LAPACK ``dpttrf``, ``O(D)``) once. With ``b = U^T Q`` and
    ``z(g) = (T + g I)^-1 b``: ``W(g) = U z(g)``, and since ``G W = Q - g W``, ``RSS(g) = |Y|^2 - tr(b^T z) -
    g |z|^2``. ``df(g) = D - g tr((T + g I)^-1)``, and the diagonal of that inverse follows from the factors by
    ``x_D = 1 / d_D``, ``x_i = 1 / d_i + l_i^2 x_(i+1)`` (positive terms only): no eigenvalue is needed.
    """

    diagonal: np.ndarray  # of T, (D,)
    offdiagonal: np.ndarray  # of T, (D - 1,)
    reflectors: np.ndarray  # dsytrd's Householder vectors, (D - 1, D - 1), Fortran order
    tau: np.ndarray  # their scales, (D - 1,)
    projected: np.ndarray  # b = U^T Q, (D, C), Fortran order
    _solved_at: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, init=False,
                                                                               repr=False)

    def _at(self, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(d, l, z)`` at ``gamma``: the factors of ``T + g I`` and ``z(g)``, computed once per gamma."""
        from scipy.linalg import lapack

        if gamma not in self._solved_at:
            d, e, info = lapack.dpttrf(self.diagonal + gamma, self.offdiagonal)
            if info != 0:
                raise _not_positive_definite(f"at gamma {gamma:g}")
            z, info = lapack.dpttrs(d, e, self.projected)
            _lapack_ok("dpttrs", info)
            self._solved_at[gamma] = (d, e, z)
        return self._solved_at[gamma]

    def _solved(self, gammas: Any) -> np.ndarray:
        """``z(g)`` for every gamma, shape (D, M, C)."""
        return np.stack([self._at(float(g))[2] for g in self._gammas(gammas)], axis=1)

    def dof(self, gammas: Any) -> np.ndarray:
        from scipy.linalg import lapack

        g = self._gammas(gammas)
        D = self.diagonal.shape[0]
        df = np.empty(g.size)
        for m, gamma in enumerate(g):
            d, e, _ = self._at(float(gamma))
            recurrence = np.ones((2, D))  # unit upper bidiagonal: x_i - l_i^2 x_(i+1) = 1 / d_i
            recurrence[0, 1:] = -(e * e)
            x, info = lapack.dtbtrs(recurrence, 1.0 / d, uplo="U", trans="N", diag="U")
            _lapack_ok("dtbtrs", info)
            df[m] = D - gamma * x.sum()
        return df

    def weights(self, gammas: Any) -> np.ndarray:
        z = self._solved(gammas)
        D, M, C = z.shape
        # the back-transform is many rank-32 products (LAPACK dlarfb): on one thread, as the reduction, since
        # two threads gained 40% on an idle machine but lost 20-30% (and doubled the worst case) beside one other job
        with _factor_threads(D):
            return _apply_reflectors(self.reflectors, self.tau, z.reshape(D, M * C), "N").reshape(D, M, C)

    def rss(self, gammas: Any) -> np.ndarray:
        g = self._gammas(gammas)
        z = self._solved(g)
        fitted = np.einsum("dc,dmc->m", self.projected, z) + g * np.einsum("dmc,dmc->m", z, z)
        return self.y_norm2 - fitted


class LeaveOneOut:
    """Exact leave-one-out accuracy and squared error for several gammas, from one pass over the rows.

    Every row summed into the statistics must be added once (any order, any blocks); the model left
    out is that of the statistics minus the row, so no refit happens.
    """

    def __init__(self, eigen: RidgeEigen, gammas: Any) -> None:
        self.eigen = eigen
        self.inverse = eigen.shrinkage(gammas)  # (D, M)
        xp = array_namespace(eigen.vectors)
        D, C = eigen.projected.shape
        self._scaled = xp.reshape(eigen.projected[:, None, :] * self.inverse[:, :, None], (D, -1))  # (D, M*C)
        self.n_gammas = int(self.inverse.shape[1])
        self.rows = 0
        self.correct = np.zeros(self.n_gammas, dtype=np.int64)
        self.squared = np.zeros(self.n_gammas, dtype=np.float64)

    def add(self, H: Any, labels: Any) -> None:
        """Score rows ``H`` (n x D) with their labels; rows are cut into blocks to bound memory."""
        labels = np.asarray(labels).ravel()
        D, C = self.eigen.projected.shape
        step = max(1, LOO_BLOCK_VALUES // max(1, D + 3 * self.n_gammas * C))
        n = H.shape[0]
        for lo in range(0, n, step):  # in-bounds slices of both axes: the standard specifies nothing else
            self._add_block(H[lo : min(lo + step, n), :], labels[lo : lo + step])

    def _add_block(self, H: Any, labels: np.ndarray) -> None:
        xp = array_namespace(self.eigen.vectors)
        m, M = H.shape[0], self.n_gammas
        C = self.eigen.classes.size
        Z = _float64(xp.asarray(H)) @ self.eigen.vectors  # (m, D)
        leverage = (Z * Z) @ self.inverse  # (m, M)
        Y = one_hot(labels, self.eigen.classes, Z)[:, None, :]
        work = xp.reshape(Z @ self._scaled, (m, M, C))  # the fitted scores; then, in place, to spare memory traffic:
        work -= Y  # minus the residual, -e_i
        with np.errstate(divide="ignore", invalid="ignore"):  # leverage 1 (a row that alone fixes a direction): inf
            work /= (1.0 - leverage)[:, :, None]  # minus the left-out residual, -e_i / (1 - h_i)
        self.squared += to_numpy(xp.sum(xp.linalg.vecdot(work, work, axis=-1), axis=0))
        work += Y  # the left-out prediction, y_i - e_i / (1 - h_i)
        predicted = to_numpy(xp.argmax(work, axis=2))
        self.correct += np.sum(predicted == class_positions(self.eigen.classes, labels)[:, None], axis=0)
        self.rows += m

    def _check_complete(self) -> None:
        if self.rows != self.eigen.n:
            raise FoalPipeError(f"leave-one-out saw {self.rows} rows but the statistics hold {self.eigen.n}; add every row once")

    def accuracy(self) -> np.ndarray:
        """Fraction of rows whose left-out prediction is their label, per gamma."""
        self._check_complete()
        return self.correct / max(self.rows, 1)

    def mse(self) -> np.ndarray:
        """Mean over rows and classes of the squared left-out residual, per gamma (inf where a row has leverage 1)."""
        self._check_complete()
        mse = self.squared / max(self.rows * self.eigen.classes.size, 1)
        return np.where(np.isnan(mse), np.inf, mse)


def _add_counts(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else a + b
