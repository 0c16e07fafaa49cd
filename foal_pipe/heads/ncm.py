"""``ncm``: nearest class mean on L2-normalised features (SimpleCIL's prototype classifier)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace

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


class NCMHead:
    """x_hat = x / ||x||; mu_c the mean x_hat of class c; predicts argmin_c ||x_hat - mu_c||."""

    name: ClassVar[str] = "ncm"
    space: ClassVar[str] = "features"

    def __init__(self, *, xp: Any, dim: int) -> None:
        self.sums = ClassSums(xp, dim)

    def add(self, X: Any, labels: np.ndarray) -> None:
        self.sums.add(unit_rows(X), labels)

    def boundary(self) -> DistanceScorer:
        return DistanceScorer(self.sums.classes.copy(), self.sums.means())
