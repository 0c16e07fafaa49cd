"""``ncm``: nearest class mean on L2-normalised features, in Euclidean distance (SimpleCIL's cosine to raw class
means is another head, ``cosine``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import class_positions
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.base import HeadBase, NoOptions
from foal_pipe.heads.checks import FLOAT64, check_rows
from foal_pipe.heads.moments import ClassSums, unit_rows

#: ncm's and cosine's float64 scores lie within about ``(ROUNDING_BASE + sqrt(d)) u (|x|^2 + |mu|^2)`` of their exact
#: values (``u = 2^-53``; ncm's expanded ``2 x.mu - |x|^2 - |mu|^2`` on unit rows, cosine's ``x_hat . p_hat`` with
#: ``|x_hat| |p_hat| <= 1`` in place of the sum). Against long-double references of the definitions (d 10 to 10,000,
#: 3 to 50 classes, 30 to 500 rows, class signals 1e-8 to 1e3 about offsets 0 to 1e6 from the origin) the largest
#: error was 6.4 units at d = 10, 11 at d = 100, 22 at d = 768, 23 at d = 2,000 and 39 at d = 10,000: at most 0.6x
#: the bound. Predictions moved once the least squared separation of the means fell below about 60 units.
ROUNDING_BASE = 8.0
#: The share of the least separation of the means (ncm: squared distance; cosine: ``1 - cos``) the scores' rounding
#: may reach: ridge's promise, 1e-4 relative. Digits' pixels (all positive) give separations 3e9 times the least it
#: allows (ncm and cosine alike); Gaussian classes 1e10 times centred, 2e4 times 1e3 of their spreads from the origin.
RESOLUTION = 1e-4


def score_rounding(dim: int, size: float) -> float:
    """About how far float64 scores of rows of width ``dim`` against means lie from their exact values, where
    ``size`` bounds ``|x|^2 + |mu|^2`` (:data:`ROUNDING_BASE`). Squared at ``size = 1``, it is also how far apart two
    float64 unit vectors of one direction may lie: means that close coincide to float64's precision (a tie)."""
    return (ROUNDING_BASE + math.sqrt(dim)) * 2.0**-53 * size


def unresolved_separation(M: Any, near: float) -> float:
    """The least ``|M_a - M_b|^2`` below ``near`` over pairs of rows (of norm at most 1) that do not coincide (farther
    apart than ``score_rounding(d, 1)^2``), inf where there is none. The Gram of the rows centred on their mean (whose rounding
    follows their spread, not their distance from the origin; ``d`` rows at a time, no ``C x C`` matrix held) finds
    the pairs that may lie within ``near``, and their differences give their separations. ``C^2 d`` products: scoring
    ``C`` rows, fewer than a test split holds."""
    xp = array_namespace(M)
    count, width, where = M.shape[0], M.shape[1], device(M)
    ties, least = score_rounding(width, 1.0) ** 2, math.inf
    if count < 2:
        return least
    Z = M - xp.mean(M, axis=0, keepdims=True)
    squares = xp.sum(Z * Z, axis=1)
    columns = xp.arange(count, device=where)
    for start in range(0, count, max(1, width)):
        stop = min(count, start + max(1, width))
        gaps = squares[start:stop, None] + squares[None, :] - 2 * (Z[start:stop, :] @ Z.T)
        later = xp.arange(start, stop, device=where)[:, None] < columns[None, :]  # each pair once
        close = to_numpy(later & (gaps < 2 * near))  # twice near: far above the Gram's rounding
        if not close.any():
            continue
        rows, cols = np.nonzero(close)
        for lo in range(0, rows.size, count):  # ``count`` pairs at a time: a ``C x d`` difference held
            a, b = (xp.asarray(k[lo:lo + count] + shift, device=where) for k, shift in ((rows, start), (cols, 0)))
            apart = to_numpy(xp.sum((xp.take(M, a, axis=0) - xp.take(M, b, axis=0)) ** 2, axis=1))
            apart = apart[apart > ties]
            least = min(least, float(apart.min())) if apart.size else least
    return least if least < near else math.inf


def check_separated(means: Any) -> None:
    """Refuse ncm's means when the rounding of the expanded distances (unit rows: ``|x|^2 + |mu|^2 <= 2``) is not far
    below the squared separation of two of them: features far from the origin that vary little (all on one spot of
    the sphere), or two classes alike, whose order float64's distances would leave to rounding. Means that coincide
    to float64's precision are a tie (identical means: every row's distances to them alike) and pass."""
    rounding = score_rounding(means.shape[1], 2.0)
    gap = unresolved_separation(means, rounding / RESOLUTION)
    if gap < math.inf:
        raise FoalPipeError(f"ncm: two class means lie {gap:.3g} apart (squared, on the unit sphere), too close for "
                            f"float64 distances (their rounding, about {rounding:.2g}, must stay below {RESOLUTION:g} "
                            "of it): the features sit far from the origin and vary little, or two classes are alike",
                            "centre the features (subtract their mean) or use another head")


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
    score_bytes: ClassVar[int] = 8  # the distances' temporary
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"means": ("C", "d")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = ClassSums.TENSORS

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options = NoOptions(**options)
        self.sums = ClassSums(xp, dim)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """The class sums and a boundary's means, and its separation check's centred copy and block of gaps
        (:func:`unresolved_separation`): ``4 C d`` floats."""
        return FLOAT64 * 4 * n_classes * dim

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * seen * dim

    def state_dict(self, scorer: DistanceScorer) -> dict[str, Any]:
        return {"means": scorer.means, **self.sums.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.sums.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> DistanceScorer:
        check_separated(tensors["means"])
        return DistanceScorer(classes, tensors["means"])

    def add(self, X: Any, labels: np.ndarray) -> None:
        labels = check_rows(X, labels, self.sums.dim)  # before anything is written: a refused add changes nothing
        self.sums.add(unit_rows(X), labels)

    def boundary(self) -> DistanceScorer:
        """Refused where float64's distances cannot order the means (:func:`check_separated`); :meth:`loo_hits`, after
        the last boundary, scales the same distances by at most 4: well inside :data:`RESOLUTION`'s margin."""
        means = self.sums.means()
        check_separated(means)
        return DistanceScorer(self.sums.classes.copy(), means)

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
