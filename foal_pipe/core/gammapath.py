"""Many gammas from one factorisation of ``G``: its eigendecomposition (:class:`RidgeEigen`) or its tridiagonal
form (:class:`RidgeTridiagonal`) give the weights, RSS, degrees of freedom and GCV at any gamma. Leave-one-out
over the rows is :mod:`foal_pipe.core.leaveoneout`; the refined search over gammas :mod:`foal_pipe.core.gammasearch`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.drift import DRIFTS, UNITS, drift_floor, drift_share
from foal_pipe.core.linalg import (
    check_positive,
    check_solved,
    factor_threads,
    float64,
    float64_way_out,
    not_positive_definite,
)
from foal_pipe.errors import FoalPipeError, param

#: :meth:`GammaPath.gcv` is reported where :meth:`GammaPath.rss_error` is at most this share of the RSS.
RSS_RESOLUTION = 1e-3


def gcv_undeterminable() -> FoalPipeError:
    """The refusal of a choice by GCV where no gamma of the search has a GCV value (:meth:`GammaPath.gcv`)."""
    return FoalPipeError(
        "GCV cannot be computed at any gamma of the search: the fit all but interpolates the rows seen (fewer rows "
        "than D), so its residual lies below float64's rounding; pass larger gammas or choose by leave-one-out "
        f"({param('select', 'loo')})")


def eigen_floor(floor: float, values: Any, top: float, dtype: str) -> float:
    """The refusal floor for gammas: the sums' resolution, ``-min(lambda)`` when rounding left a negative eigenvalue,
    and the least gamma at which the rounding of sums in ``dtype`` (``top``: their largest entry) moves the weights
    by at most :data:`~foal_pipe.core.drift.DRIFTS` (:func:`drift_floor`). ``values``: every eigenvalue, or only
    the lowest where :func:`~foal_pipe.core.linalg.cheap_drift_floor` shows the rest cannot raise the floor.

    The drift here keeps ``u max|G|`` for every entry, whatever the columns' scales (:func:`~foal_pipe.core.drift.column_scales`,
    which a single solve's check uses): the path's weights come from eigenvalues that ``eigh`` and ``dsytrd`` give to
    ``u lambda_max`` each, not to their own size, so at a gamma below it a column far smaller than the largest is
    solved by the path from eigenvalues lost in that rounding, where a Cholesky factorisation would resolve it."""
    xp = array_namespace(values)
    floor = max(floor, -float(xp.min(values)) if values.shape[0] else 0.0)
    return max(floor, drift_floor(to_numpy(values), top, dtype))


def lapack_ok(routine: str, info: int) -> None:
    if info != 0:
        raise FoalPipeError(f"LAPACK {routine} failed (info {info}) on the Gram matrix; check the features for NaN or inf")


def apply_reflectors(reflectors: np.ndarray, tau: np.ndarray, C: np.ndarray, trans: str) -> np.ndarray:
    """``U C`` (``trans="N"``) or ``U^T C`` (``"T"``) for ``dsytrd``'s lower ``U``: LAPACK's ``dormtr``, which
    SciPy does not wrap, is ``dormqr`` on the rows below the first with the reflectors below the subdiagonal."""
    from scipy.linalg import lapack

    out = np.empty(C.shape, dtype=np.float64)
    if C.shape[1] == 0:
        return out
    body = np.array(C[1:], dtype=np.float64, order="F")  # what dormqr overwrites, in the layout it needs
    work = lapack.dormqr("L", trans, reflectors, tau, body, lwork=-1)[1]
    body, _, info = lapack.dormqr("L", trans, reflectors, tau, body, lwork=max(1, int(work[0])), overwrite_c=1)
    lapack_ok("dormqr", info)
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
    dtype: str  # of the sums: --dtype float64 is a way out only from float32

    def _gammas(self, gammas: Any) -> np.ndarray:
        g = np.asarray(gammas, dtype=np.float64).ravel()
        if g.size == 0:
            raise FoalPipeError("no gammas given; pass at least one, e.g. 1e-2,1,100")
        check_positive(g)
        if self.floor and g.min() <= self.floor:
            share = drift_share(DRIFTS[self.dtype], self.dtype)
            raise FoalPipeError(
                f"gamma {g.min():g} is below the resolution of the Gram sums ({self.floor:.3g}: eps x largest "
                f"diagonal entry, the most negative eigenvalue rounding left, or the least gamma at which the "
                f"rounding of {self.dtype} sums moves the weights by at most {share}), so its solution would be noise "
                f"(off by more than {share}); "
                f"use gammas above {self.floor:.3g} ({param('gammas')}, {param('gamma_grid')}){float64_way_out(self.dtype)}"
            )
        return g

    def gcv(self, gammas: Any) -> np.ndarray:
        """Generalised cross-validation ``n RSS(g) / (n - df(g))^2``; infinite (never chosen, null in the files)
        where ``df >= n`` and where the RSS is below its rounding (:meth:`rss_error`): a fit that all but
        interpolates the rows (fewer rows than D, a tiny gamma) leaves an RSS that the Gram form computes as the
        difference of two numbers of the size of ``|Y|^2``, which float64 cannot resolve there."""
        rss, df = self.rss(gammas), self.dof(gammas)
        resolved = self.rss_error(gammas, rss) <= RSS_RESOLUTION * rss
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((df < self.n) & resolved, self.n * np.maximum(rss, 0.0) / (self.n - df) ** 2, np.inf)

    def rss_error(self, gammas: Any, rss: np.ndarray) -> np.ndarray:
        """How far ``rss`` (:meth:`rss` at ``gammas``) may lie from the exact RSS, per gamma: the rounding of ``|Y|^2 - fitted``,
        and the eigenvalues' (``u lambda_max`` each) through ``|d fitted / d lambda_k| = |B_k|^2 (lambda_k + 3g) /
        (lambda_k + g)^3 <= 3 |B_k|^2 / (lambda_k + g)^2``, whose sum is ``3 |W(g)|_F^2``: the term that dominates
        near interpolation. With a margin of 8."""
        g = self._gammas(gammas)
        fitted = self.y_norm2 - rss
        return 8.0 * UNITS["float64"] * (self.y_norm2 + np.abs(fitted) + 3.0 * self._top() * self._weights_norm2(g))

    def check_weights(self, G: Any, Q: Any, gammas: np.ndarray, W: Any) -> None:
        """Refuse :meth:`weights` ``W`` (D, M, C) of the statistics ``G``, ``Q`` this path factors where the solve's
        own rounding moved one gamma's by more than :data:`~foal_pipe.core.drift.DRIFTS`
        (:func:`~foal_pipe.core.linalg.check_solved`, measured only at gammas where it may)."""
        top = self._top()
        for m, gamma in enumerate(map(float, gammas)):
            check_solved(G, gamma, W[:, m, :], Q, partial(self.inverse, gamma), top,
                         f"use gammas above {gamma:g} ({param('gammas')}, {param('gamma_grid')})")

    @abstractmethod
    def inverse(self, gamma: float, R: Any) -> Any:
        """``(G + gamma I)^-1 R`` from the factorisation (:meth:`check_weights`' refinement step)."""

    @abstractmethod
    def _top(self) -> float:
        """An upper bound on ``lambda_max``."""

    @abstractmethod
    def _weights_norm2(self, gammas: np.ndarray) -> np.ndarray:
        """``|W(g)|_F^2`` per gamma."""

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
    """The eigendecomposition of a :class:`RidgeStatistics`' ``G``: weights and GCV for any gammas, and what
    leave-one-out needs (:class:`~foal_pipe.core.leaveoneout.LeaveOneOut`)."""

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

    def inverse(self, gamma: float, R: Any) -> Any:
        return self.vectors @ ((self.vectors.T @ R) / (self.values[:, None] + gamma))

    def rss(self, gammas: Any) -> np.ndarray:
        """``|Y|^2 - sum_k |B_k|^2 (lambda_k + 2g) / (lambda_k + g)^2``."""
        xp = array_namespace(self.values)
        inv = self.shrinkage(gammas)
        g = xp.asarray(self._gammas(gammas), device=device(self.values))
        norms = xp.sum(self.projected * self.projected, axis=1)
        fitted = xp.sum(norms[:, None] * (self.values[:, None] + 2 * g[None, :]) * inv * inv, axis=0)
        return self.y_norm2 - to_numpy(fitted)

    def _top(self) -> float:
        xp = array_namespace(self.values)
        return float(xp.max(xp.abs(self.values))) if self.values.shape[0] else 0.0

    def _weights_norm2(self, gammas: np.ndarray) -> np.ndarray:
        xp = array_namespace(self.values)
        inv = self.shrinkage(gammas)
        norms = xp.sum(self.projected * self.projected, axis=1)
        return to_numpy(xp.sum(norms[:, None] * inv * inv, axis=0))

    def fitted(self, H: Any, gammas: Any) -> tuple[Any, Any]:
        """For rows ``H`` (m x D) of the statistics: the fitted scores ``h^T W(g)`` (m, M, C) and the leverages
        ``h^T (G + g I)^-1 h`` (m, M), the two numbers leave-one-out needs of each row; ``2 m D^2`` for the
        eigenbasis, then GEMMs over the gammas."""
        return self.fitted_at(self.coordinates(H), self.scaling(gammas))

    def fitted_at(self, Z: Any, scaling: tuple[Any, Any], scratch: Scratch | None = None) -> tuple[Any, Any]:
        """:meth:`fitted` of rows given by their :meth:`coordinates` ``Z``, at the gammas of ``scaling``."""
        return fitted_from(Z, *scaling, scratch)

    def leverages(self, Z: Any, first: Any, squares: Any = None) -> Any:
        """The leverages (m, M) of rows with coordinates ``Z``; ``first``: :meth:`scaling`'s first part;
        ``squares``: ``Z * Z`` where the caller has it already."""
        return (Z * Z if squares is None else squares) @ first

    def scaling(self, gammas: Any) -> tuple[Any, Any]:
        """What turns eigen-coordinates into :meth:`fitted`'s numbers at every gamma, computed once for many
        blocks of rows: ``1 / (lambda + g)`` (D, M) and ``B`` scaled by it (D, M*C)."""
        xp = array_namespace(self.vectors)
        inv = self.shrinkage(gammas)
        D, _ = self.projected.shape
        return inv, xp.reshape(self.projected[:, None, :] * inv[:, :, None], (D, -1))

    def coordinates(self, H: Any) -> Any:
        """Rows ``H`` (m x D) in ``G``'s eigenbasis, ``H V``, in float64."""
        xp = array_namespace(self.vectors)
        return float64(xp.asarray(H)) @ self.vectors


def fitted_from(Z: Any, inv: Any, scaled: Any, scratch: Scratch | None = None) -> tuple[Any, Any]:
    """Fitted scores (m, M, C) and leverages (m, M) of rows with eigen-coordinates ``Z`` (m x D), from a path's
    :meth:`~RidgeEigen.scaling`: every gamma's in two matrix products. With ``scratch`` (NumPy), the scores and
    ``Z * Z`` are written into its buffers: the same products, without fresh pages for every block."""
    fitted = fitted_scores(Z, scaled, inv.shape[1], scratch)
    if scratch is None or not (is_numpy_array(Z) and Z.dtype == np.float64):
        return fitted, (Z * Z) @ inv
    return fitted, np.multiply(Z, Z, out=scratch("squares", Z.shape)) @ inv


def fitted_scores(Z: Any, scaled: Any, M: int, scratch: Scratch | None = None) -> Any:
    """:func:`fitted_from`'s scores alone (m, M, C), at the ``M`` gammas of ``scaled``."""
    xp = array_namespace(Z)
    m, width = Z.shape[0], scaled.shape[1]
    if scratch is None or not (is_numpy_array(Z) and Z.dtype == scaled.dtype == np.float64):
        return xp.reshape(Z @ scaled, (m, M, width // max(M, 1)))
    return np.matmul(Z, scaled, out=scratch("fitted", (m, width))).reshape(m, M, width // max(M, 1))


def tridiagonal_leverages(Z: np.ndarray, inverse: np.ndarray, below: np.ndarray) -> np.ndarray:
    """``u^T (T + g I)^-1 u`` (m, M) for rows ``u`` of ``Z`` (m x D) and each gamma's factors ``T + g I = L diag(d)
    L^T`` (``inverse``: ``1 / d``, (D, M); ``below``: ``-l``, (D - 1, M)): ``y = L^-1 u`` by ``y_1 = u_1``, ``y_j =
    u_j - l_(j-1) y_(j-1)``, and ``h = sum_j y_j^2 / d_j``, a sum of positive terms. One step per coordinate over
    every row and gamma at once; each value's bits depend on its own row and gamma only."""
    m, D = Z.shape
    M = inverse.shape[1]
    leverage = np.zeros((M, m))
    rows = Z.T  # (D, m): a coordinate of every row, side by side when Z is in Fortran order
    y = np.empty((M, m))
    term = np.empty((M, m))
    y[:] = rows[0]
    for j in range(D):
        if j:
            y *= below[j - 1][:, None]
            y += rows[j]
        np.multiply(y, y, out=term)
        term *= inverse[j][:, None]
        leverage += term
    return leverage.T


class Scratch:
    """Float64 buffers a pass reuses for its per-block temporaries (NumPy): fresh arrays of tens of MB are new
    pages at every block, and their faults cost about as much as the element-wise work on them. ``scratch(name,
    shape)`` is a C-contiguous view of the first values of the buffer ``name``, grown when too small; a view is
    valid until the next call with the same name."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.of(name, shape, np.float64)

    def of(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """As calling it, in ``dtype``."""
        size = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = self._buffers[name] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)


@dataclass(frozen=True, eq=False)
class RidgeTridiagonal(GammaPath):
    """``G = U T U^T`` (NumPy, from :meth:`RidgeStatistics.tridiagonal`): weights and GCV for any gammas.

    Each gamma factors ``T + g I = L diag(d) L^T`` (LAPACK ``dpttrf``, ``O(D)``) once. With ``b = U^T Q`` and
    ``z(g) = (T + g I)^-1 b``: ``W(g) = U z(g)``, and since ``G W = Q - g W``, ``RSS(g) = |Y|^2 - tr(b^T z) -
    g |z|^2``. ``df(g) = D - g tr((T + g I)^-1)``, and the diagonal of that inverse follows from the factors by
    ``x_D = 1 / d_D``, ``x_i = 1 / d_i + l_i^2 x_(i+1)`` (positive terms only): no eigenvalue is needed.

    A gamma's solve, RSS and ``df`` do not depend on the other gammas asked with it, so each is computed once and
    kept: the refined grid reuses the coarse grid's, and the weights reuse the solves of GCV. The RSS sums are two
    dot products of one gamma's ``z`` (no (D, M, C) copy). Solves and ``df`` stay LAPACK calls per gamma
    (``dpttrs``, ``dtbtrs``): their recurrences written as array operations over the gammas (and classes) give the
    same bits but, at D = 1000, were slower for one gamma or a few classes and at best 1.5x faster (100 classes).
    """

    diagonal: np.ndarray  # of T, (D,)
    offdiagonal: np.ndarray  # of T, (D - 1,)
    reflectors: np.ndarray  # dsytrd's Householder vectors, (D - 1, D - 1), Fortran order
    tau: np.ndarray  # their scales, (D - 1,)
    projected: np.ndarray  # b = U^T Q, (D, C), Fortran order
    _solved_at: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, init=False,
                                                                               repr=False)
    _sums: dict[float, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)  # tr(b^T z), |z|^2
    _dof: dict[float, float] = field(default_factory=dict, init=False, repr=False)

    def _at(self, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(d, l, z)`` at ``gamma``: the factors of ``T + g I`` and ``z(g)`` (Fortran order), computed once."""
        from scipy.linalg import lapack

        if gamma not in self._solved_at:
            d, e, info = lapack.dpttrf(self.diagonal + gamma, self.offdiagonal)
            if info != 0:
                raise not_positive_definite(f"at gamma {gamma:g}", self.dtype)
            z, info = lapack.dpttrs(d, e, self.projected)
            lapack_ok("dpttrs", info)
            self._solved_at[gamma] = (d, e, z)
        return self._solved_at[gamma]

    def dof(self, gammas: Any) -> np.ndarray:
        from scipy.linalg import lapack

        g = self._gammas(gammas)
        D = self.diagonal.shape[0]
        for gamma in map(float, g):
            if gamma not in self._dof:
                d, e, _ = self._at(gamma)
                recurrence = np.ones((2, D))  # unit upper bidiagonal: x_i - l_i^2 x_(i+1) = 1 / d_i
                recurrence[0, 1:] = -(e * e)
                x, info = lapack.dtbtrs(recurrence, 1.0 / d, uplo="U", trans="N", diag="U")
                lapack_ok("dtbtrs", info)
                self._dof[gamma] = D - gamma * x.sum()
        return np.array([self._dof[gamma] for gamma in map(float, g)])

    def weights(self, gammas: Any) -> np.ndarray:
        g = self._gammas(gammas)
        D, C = self.projected.shape
        z = np.empty((D, g.size, C))  # as the reflectors read it, (D, M*C): each gamma's C columns together
        for m, gamma in enumerate(g):
            z[:, m, :] = self._at(float(gamma))[2]
        # the back-transform is many rank-32 products (LAPACK dlarfb): on one thread, as the reduction, since
        # two threads gained 40% on an idle machine but lost 20-30% (and doubled the worst case) beside one other job
        with factor_threads(D):
            return apply_reflectors(self.reflectors, self.tau, z.reshape(D, -1), "N").reshape(D, g.size, C)

    def inverse(self, gamma: float, R: Any) -> np.ndarray:
        from scipy.linalg import lapack

        d, e, _ = self._at(gamma)
        with factor_threads(d.shape[0]):
            z, info = lapack.dpttrs(d, e, apply_reflectors(self.reflectors, self.tau, np.asarray(R), "T"))
            lapack_ok("dpttrs", info)
            return apply_reflectors(self.reflectors, self.tau, z, "N")

    def fitted(self, H: Any, gammas: Any) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`RidgeEigen.fitted`, in the tridiagonal form's basis: ``u = U^T h`` by the reflectors (``2 m
        D^2``), then ``u^T z(g)`` for the scores and :func:`tridiagonal_leverages` for the leverages. No
        eigenvector of ``T`` is formed: at D = 5,000, ``dstemr`` and the product with its vectors took 4.3 s of
        one thread per boundary for 1,024 rows, the recurrences 0.19 s for 13 gammas."""
        return self.fitted_at(self.coordinates(H), self.scaling(gammas))

    def fitted_at(self, Z: Any, scaling: tuple[Any, Any], scratch: Scratch | None = None) -> tuple[Any, Any]:
        """:meth:`fitted` of rows given by their :meth:`coordinates` ``Z``, at the gammas of ``scaling``."""
        factors, scaled = scaling
        m, width = Z.shape[0], scaled.shape[1]
        M = factors[0].shape[1]
        fitted = Z @ scaled if scratch is None else np.matmul(Z, scaled, out=scratch("fitted", (m, width)))
        return fitted.reshape(m, M, width // max(M, 1)), self.leverages(Z, factors)

    def leverages(self, Z: Any, first: Any, squares: Any = None) -> Any:
        """The leverages (m, M) of rows with coordinates ``Z``; ``first``: :meth:`scaling`'s first part. (The
        recurrence reads ``Z`` itself: ``squares`` is not used.)"""
        return tridiagonal_leverages(Z, *first)

    def scaling(self, gammas: Any) -> tuple[Any, Any]:
        """What turns :meth:`coordinates` into :meth:`fitted`'s numbers at every gamma, computed once for many
        blocks of rows: the factors of each ``T + g I = L diag(d) L^T`` as ``(1 / d`` (D, M), ``-l`` (D - 1, M))
        and ``z(g) = (T + g I)^-1 b`` side by side (D, M*C): a row's scores are ``u^T z(g)``."""
        solved = [self._at(float(gamma)) for gamma in self._gammas(gammas)]
        inverse = np.stack([1.0 / d for d, _, _ in solved], axis=1)
        below = np.stack([-e for _, e, _ in solved], axis=1)
        return (inverse, below), np.concatenate([z for _, _, z in solved], axis=1)

    def coordinates(self, H: Any) -> np.ndarray:
        """Rows ``H`` (m x D) in the tridiagonal form's basis, ``U^T h`` per row, by the reflectors: (m, D) with
        each coordinate's rows side by side (Fortran order), as :func:`tridiagonal_leverages` reads them."""
        with factor_threads(self.diagonal.shape[0]):
            return apply_reflectors(self.reflectors, self.tau, np.asarray(H, dtype=np.float64).T, "T").T

    def rss(self, gammas: Any) -> np.ndarray:
        g = self._gammas(gammas)
        b = self.projected.ravel(order="F")  # a view: b and every z are in Fortran order
        with factor_threads(1):  # BLAS dot products on one thread: their bits do not depend on the thread count
            for gamma in map(float, g):
                if gamma not in self._sums:
                    z = self._at(gamma)[2].ravel(order="F")
                    self._sums[gamma] = (float(np.dot(b, z)), float(np.dot(z, z)))
        fitted = np.array([self._sums[gamma][0] + gamma * self._sums[gamma][1] for gamma in map(float, g)])
        return self.y_norm2 - fitted

    def _top(self) -> float:
        """Gershgorin's bound on ``T``'s eigenvalues."""
        if self.diagonal.shape[0] == 0:
            return 0.0
        e = np.abs(self.offdiagonal)
        rows = np.abs(self.diagonal) + np.concatenate([[0.0], e]) + np.concatenate([e, [0.0]])
        return float(rows.max())

    def _weights_norm2(self, gammas: np.ndarray) -> np.ndarray:
        self.rss(gammas)  # |z|^2 beside tr(b^T z), computed once per gamma
        return np.array([self._sums[gamma][1] for gamma in map(float, gammas)])

