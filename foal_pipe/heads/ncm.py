"""``ncm``: nearest class mean on L2-normalised features, in Euclidean distance (SimpleCIL's cosine to raw class
means is another head, ``cosine``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import class_positions
from foal_pipe.heads.base import HeadBase, NoOptions
from foal_pipe.heads.checks import FLOAT64, check_rows
from foal_pipe.heads.moments import ClassSums, unit_rows


class DistanceScorer:
    """Scores ``-||x_hat - mu_c||^2`` (argmax: the nearest mean) over ``classes``; ``normalise`` maps x to x_hat."""

    def __init__(self, classes: np.ndarray, means: Any, normalise: bool = True) -> None:
        self.classes, self.means, self.normalise = classes, means, normalise

    def scores(self, X: Any) -> Any:
        xp = array_namespace(X)
        Xh = unit_rows(X) if self.normalise else X
        M = self.means
        return 2 * (Xh @ M.T) - xp.sum(Xh * Xh, axis=1)[:, None] - xp.sum(M * M, axis=1)[None, :]


class NCMHead(HeadBase):
    """x_hat = x / ||x||; mu_c the mean x_hat of class c; predicts argmin_c ||x_hat - mu_c||."""

    name: ClassVar[str] = "ncm"
    space: ClassVar[str] = "features"
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"means": ("C", "d")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = ClassSums.TENSORS

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options = NoOptions(**options)
        self.sums = ClassSums(xp, dim)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """The class sums and a boundary's means: ``2 C d`` floats."""
        return FLOAT64 * 2 * n_classes * dim

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * seen * dim

    def state_dict(self, scorer: DistanceScorer) -> dict[str, Any]:
        return {"means": scorer.means, **self.sums.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.sums.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> DistanceScorer:
        return DistanceScorer(classes, tensors["means"])

    def add(self, X: Any, labels: np.ndarray) -> None:
        labels = check_rows(X, labels, self.sums.dim)  # before anything is written: a refused add changes nothing
        self.sums.add(unit_rows(X), labels)

    def boundary(self) -> DistanceScorer:
        return DistanceScorer(self.sums.classes.copy(), self.sums.means())

    def loo_hits(self, X: Any, labels: np.ndarray) -> int:
        """Exact leave-one-out: without row i its class mean moves to ``(n mu - x_hat_i) / (n - 1)``, so the squared
        distance from x_hat_i to it is ``(n / (n - 1))^2`` times that to ``mu``, the other means unchanged. A class
        of one row has no mean without it: that row counts as wrong."""
        xp = array_namespace(X)
        sums = self.sums
        own = class_positions(sums.classes, labels)
        n = sums.counts[own].astype(np.float64)
        scale = np.where(n > 1, (n / np.maximum(n - 1, 1)) ** 2, np.inf)
        distances = -DistanceScorer(sums.classes, sums.means()).scores(X)  # squared distances
        where = device(distances)
        is_own = xp.asarray(own, device=where)[:, None] == xp.arange(sums.classes.size, device=where)[None, :]
        left_out = xp.where(xp.asarray(np.isinf(scale), device=where)[:, None], xp.inf,
                            distances * xp.asarray(np.where(np.isinf(scale), 1.0, scale), device=where)[:, None])
        distances = xp.where(is_own, left_out, distances)
        return int(np.count_nonzero(to_numpy(xp.argmin(distances, axis=1)) == own))
