"""Exact leave-one-out for many gammas from one pass over the rows (:class:`LeaveOneOut`, on :class:`RidgeEigen`),
or over a sample of the rows with Hoeffding's bound (:class:`SampledLeaveOneOut`, :func:`sample_bound`); a sample's
accuracy alone is counted from float32 products screened as the test scores are (:func:`screened_correct`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.gammapath import RidgeEigen, RidgeTridiagonal, Scratch, fitted_from, fitted_scores
from foal_pipe.core.linalg import blas_threads, class_positions, factor_threads, float64, one_hot
from foal_pipe.core.scoring import U64, longest_column, score_bound
from foal_pipe.errors import FoalPipeError

#: Rows handled at once in a leave-one-out block: bounds its temporaries to about this many values.
LOO_BLOCK_VALUES = 2**22
#: The curves a leave-one-out pass gives, by :data:`~foal_pipe.protocol.schema.CRITERIA` name.
LOO_CURVES = ("loo_accuracy", "loo")
#: A leverage above this leaves a row to the float64 pipeline: its left-out residual's scale ``1 / (1 - h)``
#: is then large enough that the screen's allowance, stated for ``h`` well below 1, is not claimed.
SCREEN_MAX_LEVERAGE = 1.0 - 2.0**-20


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

    def _correct(self, indices: np.ndarray) -> np.ndarray | None:
        """The rows predicted right at ``gammas[indices]`` by a cheaper route than :meth:`_totals`, or None."""
        return None

    def evaluate(self, indices: Any = None, names: Any = LOO_CURVES) -> dict[str, np.ndarray]:
        """LOO accuracy (``"loo_accuracy"``) and LOO MSE (``"loo"``) at ``gammas[indices]`` (None: every gamma):
        the curves a :func:`~foal_pipe.core.gammasearch.zoom` asks for, by :data:`CRITERIA` name. Asked for the
        accuracy alone (``names``), a pass that can count it without the squared residuals does
        (:meth:`SampledLeaveOneOut._correct`); the counts are the same."""
        self._check_complete()
        at = np.arange(self.gammas.size) if indices is None else np.asarray(indices, dtype=np.int64)
        if "loo" not in names:
            right = self._correct(at)
            if right is not None:
                return {"loo_accuracy": right / max(self.rows, 1)}
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


def lonely_classes(counts: Any, classes: np.ndarray) -> np.ndarray | None:
    """Which of ``classes`` hold one row of the statistics (``counts``: rows per class; None: unknown). Left out,
    such a row leaves its class without rows: its left-out weight column, and so its own-class left-out score, is
    exactly 0, where ``(s - h) / (1 - h)`` gives the rounding of ``s - h`` (equal in exact arithmetic), whose sign
    decided ties. None where no class is lonely (the common case: nothing to mend)."""
    if counts is None:
        return None
    lonely = np.asarray(counts).ravel() == 1
    if lonely.shape != classes.shape:
        raise FoalPipeError(f"counts has {lonely.size} entries for {classes.size} classes; pass one per class")
    return lonely if lonely.any() else None


def _alone(lonely: np.ndarray | None, positions: np.ndarray) -> np.ndarray | None:
    """The rows (by their classes' ``positions``) that are their class's only row; None where there are none."""
    if lonely is None:
        return None
    alone = lonely[positions]
    return alone if alone.any() else None


def left_out(work: Any, leverage: Any, labels: np.ndarray, classes: np.ndarray,
             lonely: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per gamma, the rows whose left-out prediction is their label and their summed squared left-out residuals,
    from the rows' fitted scores ``work`` (m, M, C; overwritten, to spare memory traffic) and leverages (m, M).
    A row of a class that ``lonely`` (:func:`lonely_classes`) marks has own-class left-out score exactly 0 and
    residual exactly 1.

    The left-out prediction is compared as ``(s - h y) / (1 - h)``, not ``y - (y - s) / (1 - h)``: where the scores
    and leverages are far below 1 (a gamma far above G's eigenvalues, features of small scale) the latter's label
    entry is a difference of numbers near 1, whose rounding outweighed the scores it is compared with (every row
    counted wrong at gamma 1e20). The residual ``(y - s) / (1 - h)`` is formed from ``s - y`` as before."""
    xp = array_namespace(work)
    positions = class_positions(classes, labels)
    alone = _alone(lonely, positions)
    with np.errstate(divide="ignore", invalid="ignore"):  # leverage 1 (a row that alone fixes a direction): inf
        if is_numpy_array(work):  # the label entries alone: the standard has no integer-array assignment
            rows = np.arange(work.shape[0])
            own = work[rows, :, positions]
            work /= (1.0 - leverage)[:, :, None]  # the other classes' left-out scores
            label = (own - leverage) / (1.0 - leverage)
            residual = (own - 1.0) / (1.0 - leverage)  # minus the left-out residual, -e_i / (1 - h_i)
            if alone is not None:
                label[alone], residual[alone] = 0.0, -1.0
            work[rows, :, positions] = label
            predicted = np.argmax(work, axis=2)
            work[rows, :, positions] = residual
        else:
            Y = one_hot(labels, classes, work)[:, None, :]
            scale = (1.0 - leverage)[:, :, None]
            taken = leverage  # what the label entry loses: h, or a lonely row's own score s (leaving exactly 0)
            if alone is not None:
                lone = xp.asarray(alone, device=device(work))[:, None]
                taken = xp.where(lone, xp.sum(work * Y, axis=2), leverage)
            predicted = to_numpy(xp.argmax((work - Y * taken[:, :, None]) / scale, axis=2))
            work -= Y
            work /= scale
            if alone is not None:
                work = xp.where((Y > 0) & lone[:, :, None], xp.asarray(-1.0, dtype=work.dtype, device=device(work)), work)
    squared = to_numpy(xp.sum(xp.linalg.vecdot(work, work, axis=-1), axis=0))
    return np.sum(predicted == positions[:, None], axis=0), squared


def screened_correct(Z: np.ndarray, low: np.ndarray, norms: np.ndarray, leverage: np.ndarray, scaled: np.ndarray,
                     scaled_low: np.ndarray, column_norm: np.ndarray, labels: np.ndarray, classes: np.ndarray,
                     scratch: Scratch, lonely: np.ndarray | None = None) -> np.ndarray:
    """Per gamma, the rows of ``Z`` (float64 eigen-coordinates; ``low`` their float32 copy, ``norms`` their
    lengths, ``leverage`` theirs at each gamma) whose left-out prediction is their label: what :func:`left_out`
    counts, row for row, from a float32 product with ``scaled`` (:meth:`RidgeEigen.scaling`; ``scaled_low`` its
    float32 copy, ``column_norm`` each gamma's longest column).

    The left-out prediction ``y - e / (1 - h)`` is the label exactly when ``m = s_label - h - max_(c != label)
    s_c > 0`` (``1 - h > 0``). Each float32 score lies within ``b = kappa |z| |B_c|`` of the exact one (the
    test scores' bound, :func:`~foal_pipe.core.scoring.score_bound`, which also covers float64's rounding),
    so where ``|m|`` computed from them exceeds ``2 b`` plus the rounding of float64's subtraction and division,
    the float64 pipeline of :func:`left_out` decides the row the same way. The other rows (a few in a thousand)
    go through that pipeline in float64, each row's scores a product of its own: where float64's rounding
    decides (a tie to the last bits), its decision is that product's. A row of a class ``lonely`` marks has
    ``s_label - h`` exactly 0 (:func:`lonely_classes`): its margin is ``-max_(c != label) s_c``.
    """
    m, D = Z.shape
    k = leverage.shape[1]
    C = scaled.shape[1] // max(k, 1)
    positions = class_positions(classes, labels)
    rows = np.arange(m)
    scores = np.matmul(low, scaled_low, out=scratch.of("screen", (m, k * C), np.float32)).reshape(m, k, C)
    own = scores[rows, :, positions].astype(np.float64)  # (m, k)
    alone = _alone(lonely, positions)
    if alone is not None:
        own[alone] = leverage[alone]  # s_label - h is exactly 0: the margin is the rival's alone
    scores[rows, :, positions] = -np.inf
    rival = scores.max(axis=2).astype(np.float64)
    bound = 2.0 * score_bound(norms, column_norm, D)  # the label's score and its rival's
    with np.errstate(invalid="ignore", over="ignore"):
        margin = own - leverage - rival
        # float64's own steps: the subtractions, the division by 1 - h (both predictions share it) and h's sum
        allowance = 1.001 * (bound + 16.0 * U64 * (np.abs(own) + np.abs(rival) + 2.0) + 2.0 * D * U64 * leverage)
        right = margin > allowance
        undecided = ~(right | (margin < -allowance)) | ~(leverage < SCREEN_MAX_LEVERAGE)
    correct = np.sum(right & ~undecided, axis=0)
    with factor_threads(1):  # a few rows a gamma: too small a product to wake a second thread (see scoring)
        for g in np.flatnonzero(undecided.any(axis=0)):
            again = np.flatnonzero(undecided[:, g])
            exact = Z[again] @ scaled[:, g * C : (g + 1) * C]
            correct[g] += left_out(exact[:, None, :], leverage[again, g][:, None], labels[again], classes, lonely)[0][0]
    return correct


class LeaveOneOut(_LeftOutTotals):
    """Exact leave-one-out accuracy and squared error for several gammas, from one pass over the rows.

    Every row summed into the statistics must be added once (any order, any blocks); the model left
    out is that of the statistics minus the row, so no refit happens. ``counts``: the statistics' rows per class
    (:attr:`RidgeStatistics.counts`), which make a lonely class's left-out score exact (:func:`lonely_classes`).
    """

    def __init__(self, eigen: RidgeEigen, gammas: Any, counts: Any = None) -> None:
        self.eigen = eigen
        self._lonely = lonely_classes(counts, eigen.classes)
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
                                    self.eigen.classes, self._lonely)
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
    coordinates serve every gamma: in ``G``'s eigenbasis (:meth:`RidgeEigen.fitted`: matrix products) or, for
    few rows, in the tridiagonal form's (:meth:`RidgeTridiagonal.fitted`: products for the scores, a recurrence
    per gamma for the leverages); :func:`sample_needs_vectors` chooses. The coordinates are
    kept, so the gammas are scored after the pass, only those a zoom asks for (:meth:`evaluate`; ``m D`` float64
    values).
    ``rows``: how many rows will be added (the sample's size); ``counts``: as :class:`LeaveOneOut`'s; ``grid``: the
    refined grid's size, of which ``gammas`` may be the points above the sums' resolution (None: ``gammas``' own),
    which decides whether every gamma's leverages are kept (:meth:`_grid_leverages`) as the memory estimate does.
    """

    def __init__(self, path: RidgeEigen | RidgeTridiagonal, gammas: Any, rows: int, counts: Any = None,
                 grid: int | None = None) -> None:
        self.path = path
        self._lonely = lonely_classes(counts, path.classes)
        self.gammas = path._gammas(gammas)
        self.expected = int(rows)
        self.rows = 0
        self._coordinates: list[Any] = []  # the sampled rows' H V blocks, float64 on the rows' device
        self._labels: list[np.ndarray] = []
        self._scratch = Scratch()  # the blocks' scores and squares, reused by every block of every evaluation
        self._screen: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] | None = None  # :meth:`_screened_rows`
        self._grid: list[tuple[Any, Any]] | None = None  # :meth:`_grid_leverages`
        self._grid_size = self.gammas.size if grid is None else int(grid)

    def add(self, H: Any, labels: Any) -> None:
        """Keep sampled rows ``H`` (m x D)' eigen-coordinates and labels: any gammas are then scored by products
        alone (:meth:`evaluate`), a few at a time as a zoom asks (``m D`` float64 values kept)."""
        self._coordinates.append(self.path.coordinates(H))
        self._labels.append(np.asarray(labels).ravel())
        self.rows += int(H.shape[0])

    def _totals(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scaling = self.path.scaling(self.gammas[indices])
        correct = np.zeros(indices.size, dtype=np.int64)
        squared = np.zeros(indices.size, dtype=np.float64)
        step = max(1, LOO_BLOCK_VALUES // max(1, 3 * indices.size * self.n_classes))  # bounds the temporaries
        grid = self._grid_leverages()
        for i, (Z, labels) in enumerate(zip(self._coordinates, self._labels)):
            if grid is not None:  # the eigen path: the leverages, of every gamma, are at hand
                xp = array_namespace(Z)
                leverages = xp.take(grid[i][0], xp.asarray(indices, device=device(Z)), axis=1)
            for lo in range(0, Z.shape[0], step):
                hi = min(lo + step, Z.shape[0])
                block = Z[lo:hi, :]
                if grid is None:
                    fitted = self.path.fitted_at(block, scaling, self._scratch)
                else:  # the scores' product alone
                    fitted = fitted_scores(block, scaling[1], indices.size, self._scratch), leverages[lo:hi, :]
                right, sums = left_out(*fitted, labels[lo:hi], self.path.classes, self._lonely)
                correct += right
                squared += sums
        return correct, squared

    def _grid_leverages(self, screen: bool = False) -> list[tuple[Any, Any]] | None:
        """On the eigen path, per block of coordinates, every sampled row's leverage at every gamma of the grid (m, K),
        one product ``(Z * Z) @ (1 / (lambda + g))`` for all of them, and the rows' lengths: computed once, then read by
        every evaluation of a zoom (each stage formed ``Z * Z`` and its leverages again: about half a small stage's
        time) and by the float32 screen (``screen``: which needs them whatever the grid's size). Without the screen,
        only for refined grids of at most ``D`` gammas (``grid``, as given), whose leverages cost no more than the
        coordinates' own product and memory (:func:`~foal_pipe.protocol.memoryparts.memory_parts` counts them so); a
        finer grid's evaluations form their own. None on the tridiagonal path, whose leverages are a recurrence per
        gamma."""
        if not isinstance(self.path, RidgeEigen):
            return None
        if self._grid is None and (screen or grid_leverages_kept(self._grid_size, self.path.values.shape[0])):
            shrinkage = self.path.shrinkage(self.gammas)
            self._grid = [self._block_leverages(Z, shrinkage) for Z in self._coordinates]
        return self._grid

    def _block_leverages(self, Z: Any, shrinkage: Any) -> tuple[Any, Any]:
        """:meth:`_grid_leverages` of one block of coordinates, ``Z * Z`` a slice at a time (bounded scratch): the
        leverages at the gammas of ``shrinkage`` (None: not formed, for the screen's lengths alone) and the lengths."""
        xp = array_namespace(Z)
        leverage, norms = [], []
        step = max(1, LOO_BLOCK_VALUES // max(1, Z.shape[1]))
        for lo in range(0, max(Z.shape[0], 1), step):  # an empty block: one empty slice, (0, K) leverages
            block = Z[lo : min(lo + step, Z.shape[0]), :]  # in-bounds slices of both axes: the standard's only kind
            squares = (np.multiply(block, block, out=self._scratch("squares", block.shape)) if is_numpy_array(block)
                       else block * block)
            norms.append(xp.sqrt(xp.sum(squares, axis=1)))
            if shrinkage is not None:
                leverage.append(self.path.leverages(block, shrinkage, squares))
        if len(norms) == 1:
            return (leverage or [None])[0], norms[0]
        return (xp.concat(leverage, axis=0) if leverage else None), xp.concat(norms, axis=0)

    def _correct(self, indices: np.ndarray) -> np.ndarray | None:
        """The rows predicted right, by :func:`screened_correct` (NumPy float64 coordinates of two classes or
        more, finite in float32; None otherwise)."""
        if self._screen is None:
            self._screen = self._screened_rows()
        if not self._screen:
            return None
        first, scaled = self.path.scaling(self.gammas[indices])
        with np.errstate(over="ignore"):
            scaled_low = scaled.astype(np.float32)
        if not np.isfinite(scaled_low).all():
            return None
        column_norm = longest_column(scaled, indices.size)
        correct = np.zeros(indices.size, dtype=np.int64)
        step = max(1, LOO_BLOCK_VALUES // max(1, 2 * indices.size * self.n_classes))  # bounds the temporaries
        for Z, (low, norms, leverage), labels in zip(self._coordinates, self._screen, self._labels):
            for lo in range(0, Z.shape[0], step):
                hi = min(lo + step, Z.shape[0])
                at = self.path.leverages(Z[lo:hi], first) if leverage is None else leverage[lo:hi, indices]
                correct += screened_correct(Z[lo:hi], low[lo:hi], norms[lo:hi], at, scaled, scaled_low, column_norm,
                                            labels[lo:hi], self.path.classes, self._scratch, self._lonely)
        return correct

    def _screened_rows(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """Per block of coordinates: their float32 copy, their lengths and, where one product gives them (the eigen
        path: ``(Z * Z) @ (1 / (lambda + g))``, from the shrinkage alone), their leverages at every gamma (``m D M``:
        less than ``Z * Z`` again at each evaluation; None, on the tridiagonal path, whose leverages are a recurrence
        per gamma: each evaluation computes its gammas'). Empty where the screen does not
        serve: other namespaces (cuBLAS may multiply float32 in TF32, which the bound does not cover), fewer than
        two classes, coordinates beyond float32's range."""
        if self.n_classes < 2 or not all(is_numpy_array(Z) and Z.dtype == np.float64 for Z in self._coordinates):
            return []
        lows = []
        for Z in self._coordinates:
            with np.errstate(over="ignore"):
                lows.append(Z.astype(np.float32))
            if not np.isfinite(lows[-1]).all():
                return []
        grid = self._grid_leverages(screen=True)
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        for i, (Z, low) in enumerate(zip(self._coordinates, lows)):
            leverage, norms = grid[i] if grid is not None else self._block_leverages(Z, None)
            rows.append((low, norms, leverage))
        return rows

    @property
    def n_classes(self) -> int:
        return int(self.path.classes.size)

    def _check_complete(self) -> None:
        if self.rows != self.expected:
            raise FoalPipeError(f"sampled leave-one-out saw {self.rows} rows but the sample holds {self.expected}")



def grid_leverages_kept(n_gammas: int, dim: int) -> bool:
    """Whether a sampled pass on the eigen path keeps its rows' leverages at every gamma of a grid of ``n_gammas``
    without the float32 screen (:meth:`SampledLeaveOneOut._grid_leverages`): at most ``dim`` of them."""
    return n_gammas <= dim


def sample_needs_vectors(rows: int, dim: int, threads: int | None = None) -> bool:
    """Whether leave-one-out on ``rows`` sampled rows is cheaper with ``G``'s eigenvectors (``eigh``: the
    reduction, ``T``'s eigenvectors and their back-transform; then ``H V`` at GEMM speed) than with the tridiagonal
    form (:meth:`RidgeTridiagonal.fitted`: the reduction alone, then the reflectors, ``2 m D^2``, and a recurrence
    per gamma for the leverages), on ``threads`` BLAS threads (default: those in force, :func:`blas_threads`).

    On two or more, ``m >= D - 1,100``: the reflectors gain nothing from a second core, the eigenvectors' products
    do; `learn --gamma auto` at D = 3,000 (20,000 x 256, ten boundaries of 4,096 rows) took 66.4 s by the
    tridiagonal form (reflectors about 36 s) against 62.5 s by the eigenvectors (``H V`` about 12 s), medians of
    three. On one, ``m >= 2 D``: one boundary (``benchmarks/loo_route_bench.py``, AVX-512 EPYC, 2026-11-29) took
    3.0 / 3.5 s by the tridiagonal form / the eigenvectors at D = 2,500 and m = 4,096 (`learn --gamma auto`'s zoom),
    2.9 / 4.9 s at D = 3,000 and m = 2,048, 0.68 / 1.23 s at D = 2,000 and m = 1,024, and within 10% either way near
    ``m = 2 D`` (D = 2,000 and m = 4,096: 1.72 / 2.10 s, `sweep`'s zoom 2.10 / 1.96 s); at D = 5,000 and m = 4,096,
    28.1 against 38.8 s (2026-11-28)."""
    if threads is None:
        threads = blas_threads()
    return rows >= (2 * dim if threads <= 1 else dim - 1100)


#: The failure probability of :func:`sample_bound` recorded with a sampled search.
SAMPLE_DELTA = 0.05


def sample_bound(m: int, n_gammas: int, delta: float = SAMPLE_DELTA) -> float:
    """Hoeffding's bound with a union over ``n_gammas``: with probability >= ``1 - delta`` the leave-one-out
    accuracy of ``m`` rows drawn uniformly without replacement is within ``sqrt(ln(2 K / delta) / (2 m))`` of
    that of all rows, at every gamma at once (Hoeffding's inequality holds for sampling without replacement;
    Serfling's is tighter). So the gamma chosen on the sample has all-rows leave-one-out accuracy within twice
    that of the best searched gamma's."""
    return float(np.sqrt(np.log(2 * n_gammas / delta) / (2 * m)))
