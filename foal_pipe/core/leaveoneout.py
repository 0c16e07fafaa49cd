"""Exact leave-one-out for many gammas from one pass over the rows (:class:`LeaveOneOut`, on :class:`RidgeEigen`),
or over a sample of the rows with Hoeffding's bound (:class:`SampledLeaveOneOut`, :func:`sample_bound`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.gammapath import RidgeEigen, RidgeTridiagonal, Scratch, fitted_from
from foal_pipe.core.linalg import class_positions, float64, one_hot
from foal_pipe.errors import FoalPipeError

#: Rows handled at once in a leave-one-out block: bounds its temporaries to about this many values.
LOO_BLOCK_VALUES = 2**22


class _LeftOutTotals(ABC):
    """What a leave-one-out pass adds up, per gamma: the rows added, those whose left-out prediction is their label,
    and their squared left-out residuals; read once every expected row is in (``_check_complete``)."""

    rows: int
    gammas: np.ndarray

    @property
    @abstractmethod
    def n_classes(self) -> int: ...

    @abstractmethod
    def _check_complete(self) -> None: ...

    @abstractmethod
    def _totals(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows predicted right and the summed squared left-out residuals at ``gammas[indices]``."""

    def evaluate(self, indices: Any = None) -> dict[str, np.ndarray]:
        """LOO accuracy (``"loo_accuracy"``) and LOO MSE (``"loo"``) at ``gammas[indices]`` (None: every gamma):
        the curves a :func:`~foal_pipe.core.gammasearch.zoom` asks for, by :data:`CRITERIA` name."""
        self._check_complete()
        at = np.arange(self.gammas.size) if indices is None else np.asarray(indices, dtype=np.int64)
        correct, squared = self._totals(at)
        mse = squared / max(self.rows * self.n_classes, 1)
        return {"loo_accuracy": correct / max(self.rows, 1), "loo": np.where(np.isnan(mse), np.inf, mse)}

    def accuracy(self) -> np.ndarray:
        """Fraction of the rows added whose left-out prediction is their label, per gamma."""
        return self.evaluate()["loo_accuracy"]

    def mse(self) -> np.ndarray:
        """Mean over the rows added and the classes of the squared left-out residual, per gamma (inf where a row
        has leverage 1)."""
        return self.evaluate()["loo"]


def left_out(work: Any, leverage: Any, labels: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per gamma, the rows whose left-out prediction is their label and their summed squared left-out residuals,
    from the rows' fitted scores ``work`` (m, M, C; overwritten, to spare memory traffic) and leverages (m, M)."""
    xp = array_namespace(work)
    positions = class_positions(classes, labels)
    # NumPy: the label entries alone; adding Y's zeros leaves the others as they are (up to a zero's sign, which no
    # comparison sees). The standard has no integer-array assignment, so other namespaces add Y itself
    Y = None if is_numpy_array(work) else one_hot(labels, classes, work)[:, None, :]
    rows = np.arange(work.shape[0])
    if Y is None:
        work[rows, :, positions] -= 1.0  # minus the residual, -e_i
    else:
        work -= Y
    with np.errstate(divide="ignore", invalid="ignore"):  # leverage 1 (a row that alone fixes a direction): inf
        work /= (1.0 - leverage)[:, :, None]  # minus the left-out residual, -e_i / (1 - h_i)
    squared = to_numpy(xp.sum(xp.linalg.vecdot(work, work, axis=-1), axis=0))
    if Y is None:
        work[rows, :, positions] += 1.0  # the left-out prediction, y_i - e_i / (1 - h_i)
    else:
        work += Y
    predicted = to_numpy(xp.argmax(work, axis=2))
    return np.sum(predicted == positions[:, None], axis=0), squared


class LeaveOneOut(_LeftOutTotals):
    """Exact leave-one-out accuracy and squared error for several gammas, from one pass over the rows.

    Every row summed into the statistics must be added once (any order, any blocks); the model left
    out is that of the statistics minus the row, so no refit happens.
    """

    def __init__(self, eigen: RidgeEigen, gammas: Any) -> None:
        self.eigen = eigen
        self.gammas = eigen._gammas(gammas)
        self.inverse = eigen.shrinkage(self.gammas)  # (D, M)
        xp = array_namespace(eigen.vectors)
        D, C = eigen.projected.shape
        self._scaled = xp.reshape(eigen.projected[:, None, :] * self.inverse[:, :, None], (D, -1))  # (D, M*C)
        self.n_gammas = int(self.inverse.shape[1])
        self._scratch = Scratch()
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
        Z = float64(xp.asarray(H)) @ self.eigen.vectors  # (m, D)
        correct, squared = left_out(*fitted_from(Z, self.inverse, self._scaled, self._scratch), labels,
                                    self.eigen.classes)
        self.squared += squared
        self.correct += correct
        self.rows += H.shape[0]

    def _totals(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.correct[indices], self.squared[indices]

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
    0.24 s for 4,096 rows at D = 3,000, times 97 gammas; benchmarks/RESULTS.md.) The coordinates are kept, so the
    gammas are scored after the pass, only those a zoom asks for (:meth:`evaluate`; ``m D`` float64 values).
    ``rows``: how many rows will be added (the sample's size).
    """

    def __init__(self, path: RidgeEigen | RidgeTridiagonal, gammas: Any, rows: int) -> None:
        self.path = path
        self.gammas = path._gammas(gammas)
        self.expected = int(rows)
        self.rows = 0
        self._coordinates: list[Any] = []  # the sampled rows' H V blocks, float64 on the rows' device
        self._labels: list[np.ndarray] = []
        self._scratch = Scratch()  # the blocks' scores and squares, reused by every block of every evaluation

    def add(self, H: Any, labels: Any) -> None:
        """Keep sampled rows ``H`` (m x D)' eigen-coordinates and labels: any gammas are then scored by products
        alone (:meth:`evaluate`), a few at a time as a zoom asks (``m D`` float64 values kept)."""
        self._coordinates.append(self.path.coordinates(H))
        self._labels.append(np.asarray(labels).ravel())
        self.rows += int(H.shape[0])

    def _totals(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inv, scaled = self.path.scaling(self.gammas[indices])  # (D, k) and (D, k*C)
        correct = np.zeros(indices.size, dtype=np.int64)
        squared = np.zeros(indices.size, dtype=np.float64)
        step = max(1, LOO_BLOCK_VALUES // max(1, 3 * indices.size * self.n_classes))  # bounds the temporaries
        for Z, labels in zip(self._coordinates, self._labels):
            for lo in range(0, Z.shape[0], step):
                block = Z[lo : min(lo + step, Z.shape[0]), :]
                right, sums = left_out(*fitted_from(block, inv, scaled, self._scratch), labels[lo : lo + step],
                                       self.path.classes)
                correct += right
                squared += sums
        return correct, squared

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
