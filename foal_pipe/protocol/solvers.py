"""What happens at a task boundary: one gamma solved (:class:`FixedGamma`), or one factorisation serving
many (:class:`ManyGammas`), each giving a :class:`Boundary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.core.gammapath import GammaPath, LeaveOneOut
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.classifier import AnalyticClassifier


@dataclass
class Boundary:
    """The models after task k: ``W`` (D, M, C_k) for ``gammas`` (M), with the selection criteria over the grid."""

    classes: np.ndarray
    W: Any
    gammas: np.ndarray
    gcv: np.ndarray | None = None
    loo_accuracy: np.ndarray | None = None
    loo_mse: np.ndarray | None = None
    gcv_dof_ratio: float | None = None  # df/n at GCV's choice


class FixedGamma:
    """Solve for one gamma at each boundary (``learn --gamma G``); ``classifier`` is the last boundary's."""

    needs_rows = False

    def __init__(self, gamma: float, dtype: str) -> None:
        self.gamma, self.dtype = gamma, dtype
        self.classifier: AnalyticClassifier | None = None

    def start(self, statistics: RidgeStatistics, max_task: int) -> Boundary:
        self.classifier = AnalyticClassifier.from_statistics(statistics, gamma=self.gamma, dtype=self.dtype)
        W = self.classifier.weights_  # solved once: saving the last classifier reuses it
        return Boundary(statistics.classes, W[:, None, :], np.array([self.gamma]))

    def finish(self, state: Boundary) -> Boundary:
        return state


@dataclass
class Pending:
    """A boundary waiting for its leave-one-out pass."""

    statistics_classes: np.ndarray
    path: GammaPath
    gcv: np.ndarray
    loo: LeaveOneOut | None
    max_task: int


class ManyGammas:
    """One factorisation per boundary serves every gamma of ``grid``: weights, GCV and (``loo``) LOO.

    Leave-one-out needs the eigenvectors; without it the cheaper tridiagonal form serves (see
    :meth:`RidgeStatistics.gamma_path`). ``choose`` (``loo`` or ``gcv``) keeps only the chosen gamma's
    weights (``learn --gamma auto``); None keeps all of them (``sweep``).
    """

    def __init__(self, grid: Sequence[float], loo: bool, choose: str | None) -> None:
        self.grid = np.asarray(grid, dtype=np.float64)
        self.needs_rows = loo
        self.choose = choose

    def start(self, statistics: RidgeStatistics, max_task: int) -> Pending:
        path = statistics.gamma_path(vectors=self.needs_rows)
        loo = path.loo(self.grid) if self.needs_rows else None
        return Pending(statistics.classes, path, path.gcv(self.grid), loo, max_task)

    def finish(self, pending: Pending) -> Boundary:
        path, gcv = pending.path, pending.gcv
        accuracy = pending.loo.accuracy() if pending.loo else None
        mse = pending.loo.mse() if pending.loo else None
        best_gcv = int(np.argmin(gcv))
        ratio = float(path.dof(self.grid[best_gcv : best_gcv + 1])[0]) / max(path.n, 1)
        if self.choose is None:
            gammas = self.grid
        else:
            scores = mse if self.choose == "loo" else gcv
            gammas = self.grid[[int(np.argmin(scores))]]
        return Boundary(pending.statistics_classes, path.weights(gammas), gammas, gcv, accuracy, mse, ratio)
