"""``ridge``: F-OAL's analytic ridge on the activations, ``W = (G + gamma I)^-1 Q`` over the sums ``G = H^T H`` and
``Q = H^T Y`` (:class:`~foal_pipe.core.statistics.RidgeStatistics`), as a head like any other: built by the registry,
its file layout the ridge model file's own (``G``, ``Q``, ``counts``, ``W``: :mod:`foal_pipe.model.ridgemodel`).

The CLI runs ridge in the one walk with its own learner, the Gram lanes (:mod:`foal_pipe.protocol.learners.gram`),
which add what this head does not hold: the gamma path (GCV, leave-one-out), the RLS engine, float32 sums, fusion
lanes and Dask per-task sums.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.engines import GramEngine, check_gamma, checked_weights, grow_classes
from foal_pipe.core.scoring import Ties
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.base import HeadBase
from foal_pipe.heads.checks import FLOAT64, check_rows


@dataclass(frozen=True)
class RidgeOptions:
    """``gamma``: a positive number, or ``auto`` (the least GCV over 1e-4 ... 1e8, as
    :class:`~foal_pipe.model.classifier.AnalyticClassifier` chooses it)."""

    gamma: float | str = 1.0

    def __post_init__(self) -> None:
        if self.gamma != "auto":
            check_gamma(self.gamma)


class RidgeScorer:
    """Scores ``X W`` over ``classes``, ``W`` solved at ``gamma`` (float64)."""

    def __init__(self, classes: np.ndarray, W: Any, gamma: float) -> None:
        self.classes, self.W, self.gamma = classes, W, gamma

    def scores(self, X: Any) -> Any:
        xp = array_namespace(X)
        return xp.astype(X, xp.float64, copy=False) @ self.W

    def ties(self, X: Any) -> tuple[Ties, np.ndarray]:
        """What refuses rows whose :meth:`scores` tie within their float64 rounding (:meth:`Ties.check`)."""
        xp = array_namespace(X)
        return Ties.of(self.W), xp.astype(X, xp.float64, copy=False)


class RidgeHead(HeadBase):
    """The gram sums of every row added; at a boundary the weights solved at ``gamma`` (core's solver, as the walk's
    ``FixedGamma`` solves them), refused when not finite."""

    name: ClassVar[str] = "ridge"
    space: ClassVar[str] = "activations"
    Options: ClassVar[type] = RidgeOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"W": ("D", "C")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"G": ("D", "D"), "Q": ("D", "C"), "counts": ("C",)}
    weight_tensor: ClassVar[str | None] = "W"
    probabilities: ClassVar[str | None] = "shares"

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options = RidgeOptions(**options)
        self.dim = int(dim)
        self.engine = GramEngine(dim, self.options.gamma, xp, xp.float64, grid=DEFAULT_GAMMA_GRID)
        self.classes = np.empty(0, dtype=np.int64)

    @property
    def gamma(self) -> float | str:
        return self.options.gamma

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """The Gram and ``H^T Y``."""
        return FLOAT64 * dim * (dim + n_classes)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        """A boundary's weights."""
        return FLOAT64 * dim * seen

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Add the rows' sums; a refused batch (rows of another width, products that overflow) changes nothing."""
        labels = np.asarray(check_rows(X, labels, self.dim), dtype=np.int64)
        grown = grow_classes(self.engine, self.classes, labels)
        try:
            self.engine.update(X, labels, grown)
        except FoalPipeError:  # refused before the sums took the batch: its new classes' columns go again
            if grown is not self.classes:
                self.engine.restore_classes(self.classes, grown)
            raise
        self.classes = grown

    def boundary(self) -> RidgeScorer:
        gamma, W = self.engine.solution()
        return RidgeScorer(self.classes.copy(), checked_weights(W), gamma)

    def state_dict(self, scorer: RidgeScorer) -> dict[str, Any]:
        statistics = self.engine.statistics
        return {"W": scorer.W, "G": statistics.G, "Q": statistics.Q, "counts": statistics.counts}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.classes = np.asarray(tensors["classes"], dtype=np.int64)
        counts = np.asarray(tensors["counts"], dtype=np.int64)
        self.engine.load_state(dict(tensors), self.classes, int(counts.sum()))

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> RidgeScorer:
        W = tensors["W"]
        xp = array_namespace(W)
        gamma = options["gamma"] if isinstance(options, Mapping) else options.gamma
        return RidgeScorer(classes, xp.asarray(W, dtype=xp.float64, device=device(W)), gamma)
