"""``cosine``: SimpleCIL's prototype classifier (Zhou et al., "Revisiting Class-Incremental Learning with
Pre-Trained Models: Generalizability and Adaptivity are All You Need", IJCV 2024): each class's prototype is the
mean of its raw features, and a row goes to the prototype of the largest cosine similarity.

Not ``ncm``: ncm averages the L2-normalised rows and takes the nearest mean in Euclidean distance; here the
prototypes average the rows as they are (SimpleCIL's ``replace_fc``) and both rows and prototypes are normalised
only in the cosine (its ``CosineLinear``, whose learnable scale ``sigma`` does not move the argmax).
"""

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
from foal_pipe.heads.ncm import RESOLUTION, score_rounding, unresolved_separation


def check_separated(prototypes: Any) -> None:
    """Refuse prototypes whose directions lie so close that the rounding of the cosines (of unit vectors) is not far
    below ``1 - cos`` between two of them (half their unit rows' squared separation): features far from the origin
    that vary little, whose cosines all round to 1. Directions that coincide to float64's precision (parallel
    prototypes, zero ones) are a tie and pass."""
    rounding = score_rounding(prototypes.shape[1], 1.0)
    gap = unresolved_separation(unit_rows(prototypes), 2 * rounding / RESOLUTION) / 2
    if gap < math.inf:
        raise FoalPipeError(f"cosine: two class prototypes have 1 - cos = {gap:.3g}, too close for float64 cosines "
                            f"(their rounding, about {rounding:.2g}, must stay below {RESOLUTION:g} of it): the "
                            "features sit far from the origin and vary little, or two classes are alike",
                            "centre the features (subtract their mean) or use another head")


class CosineScorer:
    """Scores ``cos(x, p_c) = x^T p_c / (||x|| ||p_c||)`` over ``classes`` (a zero row or prototype scores 0)."""

    def __init__(self, classes: np.ndarray, prototypes: Any) -> None:
        self.classes, self.prototypes = classes, prototypes
        self._unit = unit_rows(prototypes)

    def scores(self, X: Any) -> Any:
        xp = array_namespace(X)
        return unit_rows(xp.astype(X, xp.float64, copy=False)) @ self._unit.T


class CosineHead(HeadBase):
    """p_c the mean raw feature row of class c; predicts argmax_c cos(x, p_c)."""

    name: ClassVar[str] = "cosine"
    space: ClassVar[str] = "features"
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"prototypes": ("C", "d")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = ClassSums.TENSORS

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options = NoOptions(**options)
        self.sums = ClassSums(xp, dim)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """The class sums, a boundary's prototypes and their unit copies, and the separation check's unit rows,
        centred copy and block of gaps (:func:`~foal_pipe.heads.ncm.unresolved_separation`): ``6 C d`` floats."""
        return FLOAT64 * 6 * n_classes * dim

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        """A scorer's prototypes and their unit copies."""
        return FLOAT64 * 2 * seen * dim

    def add(self, X: Any, labels: np.ndarray) -> None:
        self.sums.add(X, check_rows(X, labels, self.sums.dim))  # checked before anything is written

    def boundary(self) -> CosineScorer:
        means = self.sums.means()
        if not bool(self.sums.xp.all(self.sums.xp.isfinite(means))):
            raise FoalPipeError("cosine: a class's sum of rows overflows float64 (features near 1e308); scale the "
                                "features down (a positive scale moves no cosine)")
        check_separated(means)  # loo_hits, after the last boundary, scores the same cosines (one prototype moved)
        return CosineScorer(self.sums.classes.copy(), means)

    def state_dict(self, scorer: CosineScorer) -> dict[str, Any]:
        return {"prototypes": scorer.prototypes, **self.sums.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.sums.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> CosineScorer:
        check_separated(tensors["prototypes"])
        return CosineScorer(classes, tensors["prototypes"])

    def loo_hits(self, X: Any, labels: np.ndarray) -> int:
        """Exact leave-one-out: without row i its class's prototype becomes ``(n p - x_i) / (n - 1)``, whose cosine to
        ``x_i`` is that of ``n p - x_i`` (a positive scale moves no cosine); the other prototypes are unchanged. A
        class of one row has no prototype without it: that row counts as wrong. Where ``n p - x_i`` overflows (rows
        near float64's largest number), ``p / 2 - x_i / (2 n)``, the same direction, is taken instead."""
        xp = array_namespace(X)
        sums = self.sums
        own = class_positions(sums.classes, labels)
        prototypes = sums.means()
        scores = CosineScorer(sums.classes, prototypes).scores(X)
        where = device(scores)
        at = xp.asarray(own, device=where)
        n = xp.asarray(sums.counts[own].astype(np.float64), device=where)[:, None]
        mine = xp.take(prototypes, at, axis=0)
        with np.errstate(over="ignore", invalid="ignore"):  # such rows take the halved form
            rest = n * mine - X
        finite = xp.all(xp.isfinite(rest), axis=1, keepdims=True)
        if not bool(xp.all(finite)):
            rest = xp.where(finite, rest, 0.5 * mine - X * (0.5 / n))
        left_out = xp.sum(unit_rows(X) * unit_rows(rest), axis=1)
        left_out = xp.where(n[:, 0] > 1, left_out, -xp.inf)
        is_own = at[:, None] == xp.arange(sums.classes.size, device=where)[None, :]
        scores = xp.where(is_own, left_out[:, None], scores)
        return int(np.count_nonzero(to_numpy(xp.argmax(scores, axis=1)) == own))
