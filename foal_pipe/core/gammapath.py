"""Many gammas from one factorisation of ``G`` (:class:`RidgeEigen`, :class:`RidgeTridiagonal`), exact
leave-one-out from one more pass over the rows (:class:`LeaveOneOut`), or over a sample of the rows, with
Hoeffding's bound (:class:`SampledLeaveOneOut`, :func:`sample_bound`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import (
    check_positive,
    class_positions,
    factor_threads,
    float64,
    float64_way_out,
    not_positive_definite,
    one_hot,
)
from foal_pipe.errors import FoalPipeError, param

#: Rows handled at once in a leave-one-out block: bounds its temporaries to about this many values.
LOO_BLOCK_VALUES = 2**22


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
    if out.shape[1] == 0:
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

    def fitted(self, H: Any, gammas: Any) -> tuple[Any, Any]:
        """For rows ``H`` (m x D) of the statistics: the fitted scores ``h^T W(g)`` (m, M, C) and the leverages
        ``h^T (G + g I)^-1 h`` (m, M), the two numbers leave-one-out needs of each row; ``2 m D^2`` for the
        eigenbasis, then GEMMs over the gammas."""
        xp = array_namespace(self.vectors)
        inv = self.shrinkage(gammas)
        D, C = self.projected.shape
        Z = float64(xp.asarray(H)) @ self.vectors
        scaled = xp.reshape(self.projected[:, None, :] * inv[:, :, None], (D, -1))
        return xp.reshape(Z @ scaled, (Z.shape[0], inv.shape[1], C)), (Z * Z) @ inv


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
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def _at(self, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(d, l, z)`` at ``gamma``: the factors of ``T + g I`` and ``z(g)``, computed once per gamma."""
        from scipy.linalg import lapack

        if gamma not in self._solved_at:
            d, e, info = lapack.dpttrf(self.diagonal + gamma, self.offdiagonal)
            if info != 0:
                raise not_positive_definite(f"at gamma {gamma:g}")
            z, info = lapack.dpttrs(d, e, self.projected)
            lapack_ok("dpttrs", info)
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
            lapack_ok("dtbtrs", info)
            df[m] = D - gamma * x.sum()
        return df

    def weights(self, gammas: Any) -> np.ndarray:
        z = self._solved(gammas)
        D, M, C = z.shape
        # the back-transform is many rank-32 products (LAPACK dlarfb): on one thread, as the reduction, since
        # two threads gained 40% on an idle machine but lost 20-30% (and doubled the worst case) beside one other job
        with factor_threads(D):
            return apply_reflectors(self.reflectors, self.tau, z.reshape(D, M * C), "N").reshape(D, M, C)

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
        values, S = self.spectrum()
        g = self._gammas(gammas)
        D, C = self.projected.shape
        inv = 1.0 / (values[:, None] + g[None, :])
        with factor_threads(D):
            Z = (S.T @ apply_reflectors(self.reflectors, self.tau, np.asarray(H, dtype=np.float64).T, "T")).T
        scaled = ((S.T @ self.projected)[:, None, :] * inv[:, :, None]).reshape(D, -1)
        return (Z @ scaled).reshape(Z.shape[0], g.size, C), (Z * Z) @ inv

    def rss(self, gammas: Any) -> np.ndarray:
        g = self._gammas(gammas)
        z = self._solved(g)
        fitted = np.einsum("dc,dmc->m", self.projected, z) + g * np.einsum("dmc,dmc->m", z, z)
        return self.y_norm2 - fitted


class _LeftOutTotals(ABC):
    """What a leave-one-out pass adds up, per gamma: the rows added, those whose left-out prediction is their label,
    and their squared left-out residuals; read once every expected row is in (``_check_complete``)."""

    rows: int
    correct: np.ndarray
    squared: np.ndarray

    @property
    @abstractmethod
    def n_classes(self) -> int: ...

    @abstractmethod
    def _check_complete(self) -> None: ...

    def accuracy(self) -> np.ndarray:
        """Fraction of the rows added whose left-out prediction is their label, per gamma."""
        self._check_complete()
        return self.correct / max(self.rows, 1)

    def mse(self) -> np.ndarray:
        """Mean over the rows added and the classes of the squared left-out residual, per gamma (inf where a row
        has leverage 1)."""
        self._check_complete()
        mse = self.squared / max(self.rows * self.n_classes, 1)
        return np.where(np.isnan(mse), np.inf, mse)


class LeaveOneOut(_LeftOutTotals):
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
        Z = float64(xp.asarray(H)) @ self.eigen.vectors  # (m, D)
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

    @property
    def n_classes(self) -> int:
        return int(self.eigen.classes.size)

    def _check_complete(self) -> None:
        if self.rows != self.eigen.n:
            raise FoalPipeError(f"leave-one-out saw {self.rows} rows but the statistics hold {self.eigen.n}; add every row once")



class SampledLeaveOneOut(_LeftOutTotals):
    """Leave-one-out accuracy and squared error over a sample of the rows of the statistics, for several gammas.

    Each sampled row is left out of *all* the rows summed (exactly, by Sherman-Morrison: its left-out score is
    ``(s - lev y) / (1 - lev)``), so the sampled accuracy is an unbiased estimate of the exact leave-one-out
    accuracy, within :func:`sample_bound` of it at every gamma with the stated probability. Each row's
    coordinates in an eigenbasis serve every gamma by matrix products: from ``G``'s eigenvectors
    (:meth:`RidgeEigen.fitted`) or, for few rows, from the tridiagonal form (:meth:`RidgeTridiagonal.fitted`;
    :func:`sample_needs_vectors` chooses). (A tridiagonal solve per gamma instead is a latency-bound recurrence:
    0.24 s for 4,096 rows at D = 3,000, times 97 gammas; benchmarks/RESULTS.md.) ``rows``: how many rows will be
    added (the sample's size).
    """

    def __init__(self, path: RidgeEigen | RidgeTridiagonal, gammas: Any, rows: int) -> None:
        self.path = path
        self.gammas = path._gammas(gammas)
        self.expected = int(rows)
        self.rows = 0
        self.correct = np.zeros(self.gammas.size, dtype=np.int64)
        self.squared = np.zeros(self.gammas.size, dtype=np.float64)

    def add(self, H: Any, labels: Any) -> None:
        """Score sampled rows ``H`` (m x D) with their labels, in blocks that bound the temporaries."""
        labels = np.asarray(labels).ravel()
        D = int(H.shape[1])
        step = max(1, LOO_BLOCK_VALUES // max(1, 2 * D + 3 * self.gammas.size * self.path.classes.size))
        n = H.shape[0]
        for lo in range(0, n, step):
            self._add_block(H[lo : min(lo + step, n), :], labels[lo : lo + step])

    def _add_block(self, H: Any, labels: np.ndarray) -> None:
        scores, leverage = self.path.fitted(H, self.gammas)
        xp = array_namespace(scores)
        Y = one_hot(labels, self.path.classes, scores)[:, None, :]
        work = scores - Y  # minus the residual, -e_i
        with np.errstate(divide="ignore", invalid="ignore"):  # leverage 1: inf
            work /= (1.0 - leverage)[:, :, None]  # minus the left-out residual
        self.squared += to_numpy(xp.sum(xp.linalg.vecdot(work, work, axis=-1), axis=0))
        work += Y  # the left-out prediction
        predicted = to_numpy(xp.argmax(work, axis=2))
        self.correct += np.sum(predicted == class_positions(self.path.classes, labels)[:, None], axis=0)
        self.rows += int(H.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.path.classes.size)

    def _check_complete(self) -> None:
        if self.rows != self.expected:
            raise FoalPipeError(f"sampled leave-one-out saw {self.rows} rows but the sample holds {self.expected}")



def sample_needs_vectors(rows: int, dim: int) -> bool:
    """Whether leave-one-out on ``rows`` sampled rows is cheaper with ``G``'s eigenvectors (their back-transform,
    ``2 D^3``, then ``2 m D^2`` at GEMM speed) than with the tridiagonal form (:meth:`RidgeTridiagonal.fitted`:
    ``T``'s eigenvectors, then reflectors and a product, ``4 m D^2``). Measured on one thread at D = 3,000, m =
    4,096: eigenvectors 2.05 s more than the reduction, ``H V`` 1.34 s; ``dstemr`` 0.77 s, reflectors 2.74 s:
    the tridiagonal form is cheaper while ``m < 1.03 D - 1,160``, taken as ``m < D - 1,100``."""
    return rows >= dim - 1100


#: The failure probability of :func:`sample_bound` recorded with a sampled search.
SAMPLE_DELTA = 0.05


def sample_bound(m: int, n_gammas: int, delta: float = SAMPLE_DELTA) -> float:
    """Hoeffding's bound with a union over ``n_gammas``: with probability >= ``1 - delta`` the leave-one-out
    accuracy of ``m`` rows drawn uniformly without replacement is within ``sqrt(ln(2 K / delta) / (2 m))`` of
    that of all rows, at every gamma at once (Hoeffding's inequality holds for sampling without replacement;
    Serfling's is tighter). So the gamma chosen on the sample has all-rows leave-one-out accuracy within twice
    that of the best searched gamma's."""
    return float(np.sqrt(np.log(2 * n_gammas / delta) / (2 * m)))


#: Points per decade of the refined search: neighbours differ by 10^(1/8) = 1.33x (benchmarks/RESULTS.md,
#: "Continuous gamma": test accuracy moves by hundredths of a point over that step).
PER_DECADE = 8


def search_grid(grid: Any, per_decade: int = PER_DECADE) -> np.ndarray:
    """The gammas a refined search evaluates, ascending: the points of ``grid`` and ``per_decade`` log-spaced
    points per decade from its least to its greatest (0: the grid's points only).

    A fine grid, not a bracketing search: leave-one-out scores every gamma in its one pass over the rows, so
    its gammas must be fixed before the rows are read; GCV then costs ``O(D C)`` per point.
    """
    g = np.unique(np.asarray(grid, dtype=np.float64).ravel())
    check_positive(g)
    if not isinstance(per_decade, (int, np.integer)) or isinstance(per_decade, bool) or per_decade < 0:
        raise FoalPipeError(f"{param('per_decade')} must be an integer >= 0, got {per_decade!r}; e.g. "
                            f"{param('per_decade', PER_DECADE)} (0: the grid's gammas only)")
    lo, hi = np.log10(g[0]), np.log10(g[-1])
    if per_decade == 0 or lo == hi:
        return g
    steps = int(np.ceil(round(float(hi - lo) * per_decade, 6)))
    fine = 10.0 ** (lo + (hi - lo) * np.arange(1, steps) / steps)
    near = np.isclose(fine[:, None], g[None, :], rtol=1e-9, atol=0.0).any(axis=1)  # a grid point's rounded twin
    return np.union1d(g, fine[~near])


def best_point(values: np.ndarray, larger: bool, tie: np.ndarray | None = None) -> int:
    """The index of the best of ``values`` (NaN never best). Among equals (LOO accuracy is piecewise constant
    in gamma: it has plateaus) the least ``tie`` wins (LOO MSE), then the first (the smallest gamma)."""
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), -np.inf if larger else np.inf, v)
    candidates = np.flatnonzero(v == (v.max() if larger else v.min()))
    if tie is not None and candidates.size > 1:
        t = np.where(np.isnan(tie[candidates]), np.inf, tie[candidates])
        candidates = candidates[t == t.min()]
    return int(candidates[0])


@dataclass(frozen=True)
class Search:
    """One criterion's refined search at one task boundary: its value at every point of ``gammas`` and the
    index chosen; ``edge`` is ``"smallest"``/``"largest"`` when that is an end of the range (the best may lie
    beyond it)."""

    criterion: str
    gammas: np.ndarray
    values: np.ndarray
    index: int

    @property
    def gamma(self) -> float:
        return float(self.gammas[self.index])

    @property
    def edge(self) -> str | None:
        if self.gammas.size < 2:
            return None
        return "smallest" if self.index == 0 else "largest" if self.index == self.gammas.size - 1 else None
