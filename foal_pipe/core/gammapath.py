"""Many gammas from one factorisation of ``G``: its eigendecomposition (:class:`RidgeEigen`) or its tridiagonal
form (:class:`RidgeTridiagonal`) give the weights, RSS, degrees of freedom and GCV at any gamma. Leave-one-out
over the rows is :mod:`foal_pipe.core.leaveoneout`; the refined search over gammas :mod:`foal_pipe.core.gammasearch`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import (
    check_positive,
    factor_threads,
    float64,
    float64_way_out,
    not_positive_definite,
)
from foal_pipe.errors import FoalPipeError, param


def eigen_floor(floor: float, values: Any) -> float:
    """The refusal floor for gammas: the sums' resolution, or ``-min(lambda)`` when rounding left a negative eigenvalue."""
    xp = array_namespace(values)
    return max(floor, -float(xp.min(values)) if values.shape[0] else 0.0)


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
            raise FoalPipeError(
                f"gamma {g.min():g} is below the resolution of the Gram sums ({self.floor:.3g}: eps x largest "
                f"diagonal entry, or the most negative eigenvalue rounding left), so its solution would be noise; "
                f"use gammas above {self.floor:.3g} ({param('gammas')}, {param('gamma_grid')}){float64_way_out(self.dtype)}"
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

    def rss(self, gammas: Any) -> np.ndarray:
        """``|Y|^2 - sum_k |B_k|^2 (lambda_k + 2g) / (lambda_k + g)^2``."""
        xp = array_namespace(self.values)
        inv = self.shrinkage(gammas)
        g = xp.asarray(self._gammas(gammas), device=device(self.values))
        norms = xp.sum(self.projected * self.projected, axis=1)
        fitted = xp.sum(norms[:, None] * (self.values[:, None] + 2 * g[None, :]) * inv * inv, axis=0)
        return self.y_norm2 - to_numpy(fitted)

    def fitted(self, H: Any, gammas: Any) -> tuple[Any, Any]:
        """For rows ``H`` (m x D) of the statistics: the fitted scores ``h^T W(g)`` (m, M, C) and the leverages
        ``h^T (G + g I)^-1 h`` (m, M), the two numbers leave-one-out needs of each row; ``2 m D^2`` for the
        eigenbasis, then GEMMs over the gammas."""
        return fitted_from(self.coordinates(H), *self.scaling(gammas))

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
    xp = array_namespace(Z)
    M = inv.shape[1]
    m, width = Z.shape[0], scaled.shape[1]
    if scratch is None or not (is_numpy_array(Z) and Z.dtype == scaled.dtype == np.float64):
        return xp.reshape(Z @ scaled, (m, M, width // max(M, 1))), (Z * Z) @ inv
    fitted = np.matmul(Z, scaled, out=scratch("fitted", (m, width)))
    return fitted.reshape(m, M, width // max(M, 1)), np.multiply(Z, Z, out=scratch("squares", Z.shape)) @ inv


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
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def _at(self, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(d, l, z)`` at ``gamma``: the factors of ``T + g I`` and ``z(g)`` (Fortran order), computed once."""
        from scipy.linalg import lapack

        if gamma not in self._solved_at:
            d, e, info = lapack.dpttrf(self.diagonal + gamma, self.offdiagonal)
            if info != 0:
                raise not_positive_definite(f"at gamma {gamma:g}")
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

    def spectrum(self) -> tuple[np.ndarray, np.ndarray]:
        """``T = S diag(lambda) S^T`` (LAPACK ``dstemr``, ``O(D^2)``), computed once: the eigenvalues of ``G`` and
        its eigenvectors ``U S`` without forming them (the back-transform is ``2 D^3``)."""
        from scipy.linalg import eigh_tridiagonal

        if "spectrum" not in self._cache:
            self._cache["spectrum"] = eigh_tridiagonal(self.diagonal, self.offdiagonal, check_finite=False)
        return self._cache["spectrum"]

    def fitted(self, H: Any, gammas: Any) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`RidgeEigen.fitted`, with ``h``'s eigen-coordinates ``S^T (U^T h)``: the reflectors and one
        product with ``S`` (``4 m D^2``) instead of forming ``U S`` (``2 D^3``); cheaper for few rows."""
        return fitted_from(self.coordinates(H), *self.scaling(gammas))

    def shrinkage(self, gammas: Any) -> np.ndarray:
        """As :meth:`RidgeEigen.shrinkage`, over ``T``'s eigenvalues (those of ``G``)."""
        return 1.0 / (self.spectrum()[0][:, None] + self._gammas(gammas)[None, :])

    def scaling(self, gammas: Any) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`RidgeEigen.scaling`, in ``T``'s eigenbasis (``B = S^T b``)."""
        _, S = self.spectrum()
        D, _ = self.projected.shape
        inv = self.shrinkage(gammas)
        return inv, ((S.T @ self.projected)[:, None, :] * inv[:, :, None]).reshape(D, -1)

    def coordinates(self, H: Any) -> np.ndarray:
        """Rows ``H`` (m x D) in ``G``'s eigenbasis, ``S^T U^T h`` per row, without forming ``U S``."""
        _, S = self.spectrum()
        with factor_threads(self.diagonal.shape[0]):
            return (S.T @ apply_reflectors(self.reflectors, self.tau, np.asarray(H, dtype=np.float64).T, "T")).T

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

