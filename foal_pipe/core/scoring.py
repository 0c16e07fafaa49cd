"""Each model's argmax over the float64 scores ``H @ W``, with most rows decided by float32 products.

Scoring the test split costs ``rows x D x (models x classes)`` multiply-adds per boundary: with 13 gammas it is
the largest cost ``sweep`` adds to ``learn``. BLAS multiplies float32 2-3x faster than float64, and a float32
score lies within a proven bound of the exact one (rounding of the inputs and of any summation order,
``|error| <= gamma_D sum_j |h_j w_j| <= gamma_D |h| |w|``; the bound also covers float64's own rounding). Where a
model's top float32 score leads each other by more than twice the bound, the exact scores and the float64
scores have that same unique argmax. A model whose weights lie within ``delta`` of an earlier model's (a
neighbouring gamma) is not multiplied at all: its exact scores lie within ``|h| delta`` of that model's, so the
same test with the bound widened by it decides most rows. A row a model cannot decide is scored again by that
model in float64. The argmax is therefore that of the float64 product, row for row: nothing is approximated.

Only NumPy float64 products take the float32 route (cuBLAS and torch may multiply float32 in TF32, which the
bound does not cover); everything else is scored in its own namespace, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import factor_threads
from foal_pipe.errors import FoalPipeError

U32, U64 = 2.0**-24, 2.0**-53
#: An absolute allowance per multiply-add for float32 values and products that underflow (2^-126 is float32's
#: smallest normal; flushed to zero or subnormal, the error stays below it).
UNDERFLOW = 2.0**-120
#: A model follows the last leading one when its columns lie within this fraction of that model's largest column:
#: most rows are then decided by the leader's float32 scores and the product skips the follower's columns. On the
#: benchmark store (D = 1000, 90 classes) gammas 1e-3 ... 1e-1 follow 1e-4 (fractions 4e-7 ... 4e-5; their
#: undecided rows 80-121 of 4,096 against 46 as leaders); at 1, 4e-4, it would leave 386.
FOLLOW = 1e-4


def gamma_n(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error of a sum or product of ``n`` terms in unit ``u``."""
    return n * u / (1.0 - n * u)


def relative_bound(depth: int) -> float:
    """``kappa``: float32 rounding (inputs and sums of ``depth`` terms) plus float64's, per unit of ``|h| |w|``."""
    return 1.001 * (gamma_n(depth, U32) * (1.0 + U32) ** 2 + 2.0 * U32 + U32**2 + gamma_n(depth, U64))


def longest_column(W: np.ndarray, models: int) -> np.ndarray:
    """``(models,)``: the largest ``|w|`` among each model's columns of ``W`` (D x models*C, model by model)."""
    return np.sqrt(np.einsum("dk,dk->k", W, W)).reshape(models, -1).max(axis=1)


def score_bound(norms: np.ndarray, column_norm: np.ndarray, depth: int) -> np.ndarray:
    """``(rows, models)``: how far each row's float32 score with each model's columns may lie from the exact one,
    ``kappa |h| |w|`` (:func:`relative_bound`) plus the allowance for values that underflow in float32, from the
    rows' lengths ``norms``, each model's longest column ``column_norm`` and the product's ``depth``."""
    return (relative_bound(depth) * norms[:, None] * column_norm[None, :]
            + UNDERFLOW * (np.sqrt(depth) * (norms[:, None] + column_norm[None, :]) + depth))


@dataclass(frozen=True)
class Rows:
    """Rows to score: as given (for float64 products), and on the float32 route their float32 copy and norms,
    made once however many boundaries score them."""

    H: Any  # (n, D)
    low: np.ndarray | None = None  # float32 copy, NumPy only
    norms: np.ndarray | None = None  # |h_i|, float64

    @classmethod
    def of(cls, H: Any) -> Rows:
        if not is_numpy_array(H) or H.dtype not in (np.float32, np.float64) or H.shape[1] == 0:
            return cls(H)
        with np.errstate(over="ignore"):
            low = H.astype(np.float32)
        H64 = H.astype(np.float64, copy=False)
        return cls(H, low, np.sqrt(np.einsum("ij,ij->i", H64, H64)))

    def head(self, n: int) -> Rows:
        """The first ``n`` rows (views, no copies)."""
        if n == self.H.shape[0]:
            return self
        return Rows(self.H[:n, :], None if self.low is None else self.low[:n], None if self.norms is None else self.norms[:n])


def spread(scores: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """The published code's rule for the classes a model has not seen: ``scores`` (last axis: the model's
    classes) placed at ``positions`` of ``width`` columns, every other column scoring 0, so an unseen class wins
    a row where every seen class scores below 0."""
    full = np.zeros((*scores.shape[:-1], width), dtype=scores.dtype)
    full[..., positions] = scores
    return full


def among_classes(seen: np.ndarray, classes: Any) -> np.ndarray | None:
    """``classes`` (every label of the task) as ``best_of``'s ``among``: unique, refused when it lacks a seen label."""
    if classes is None:
        return None
    classes = np.unique(np.asarray(classes).ravel())
    if not np.isin(seen, classes).all():
        missing = np.setdiff1d(seen, classes)[:3].tolist()
        raise FoalPipeError(f"classes lacks the seen labels {missing}; pass every label of the task, those in "
                            "classes_ included")
    return classes


def best_of(scores: np.ndarray, classes: np.ndarray, among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's predicted label and its score, from float64 ``scores`` (n, C) whose columns are ``classes``.

    ``among=None``: the argmax over ``classes``, the classes seen (F-OAL's rule). ``among`` (every label of the
    task, a superset of ``classes``): the argmax over those labels, a class never seen scoring 0 (:func:`spread`,
    the published code's rule). Ties go to the first column, as in :class:`ModelScores`.
    """
    if among is not None:
        among = np.asarray(among)
        order = np.argsort(among, kind="stable")
        scores, classes = spread(scores, order[np.searchsorted(among, classes, sorter=order)], among.size), among
    best = np.argmax(scores, axis=1)
    return classes[best], scores[np.arange(best.size), best]


def followers(W: np.ndarray, models: int, column_norm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each model's leader and its distance ``delta`` (an upper bound on ``max_c |w_mc - w_ac|``; 0 for a leader):
    a model whose columns all lie within ``FOLLOW`` times the largest column of the last leader follows it
    (neighbouring gammas whose weights barely move), others lead. Models in ``W`` (D x models*C) in order."""
    blocks = W.reshape(W.shape[0], models, -1)
    leader, distance = np.arange(models), np.zeros(models)
    last = 0
    for m in range(1, models):
        gap = blocks[:, m] - blocks[:, last]
        # 1.001: the rounding of the differences and of the norm, far below a thousandth
        far = 1.001 * float(np.sqrt(np.einsum("dc,dc->c", gap, gap)).max(initial=0.0))
        if far <= FOLLOW * column_norm[last]:
            leader[m], distance[m] = last, far
        else:
            last = m
    return leader, distance


class ModelScores:
    """The models of one boundary, ``W`` (D x models*C, its columns model by model), and their argmax.

    With ``positions`` and ``width`` the C scores sit at those columns of ``width`` and every other column
    scores 0 (the published code's unseen classes, which can win); the argmax is then into ``width``.
    """

    def __init__(self, W: Any, models: int, positions: np.ndarray | None = None, width: int | None = None) -> None:
        self.W, self.models = W, models
        self.positions = None if positions is None else np.asarray(positions)
        self.width = width if width is not None else 0  # used with positions only, which come with their width
        unseen = (np.empty(0, dtype=np.intp) if self.positions is None
                  else np.flatnonzero(~np.isin(np.arange(self.width), self.positions)))
        self._first_unseen = int(unseen[0]) if len(unseen) else -1
        self.low: np.ndarray | None = None
        if is_numpy_array(W) and W.dtype == np.float64 and W.size:
            with np.errstate(over="ignore"):
                low = W.astype(np.float32)
            if np.isfinite(low).all():
                self.column_norm = longest_column(W, models)
                self.leader, self.distance = followers(W, models, self.column_norm)
                self.leaders = np.flatnonzero(self.leader == np.arange(models))
                self.low = low if self.leaders.size == models else np.ascontiguousarray(
                    low.reshape(W.shape[0], models, -1)[:, self.leaders].reshape(W.shape[0], -1))

    def argmax(self, rows: Rows) -> np.ndarray:
        """``(n, models)``: each model's argmax over its scores, as the float64 product ranks them.

        With ``positions``, the unseen classes' zeros act as one rival scoring 0 at the first unseen column
        (float64's argmax takes the first of equal scores), so the float32 scores are never spread to ``width``.

        Only the leaders' float32 scores are computed (:func:`followers`): a follower ``m`` of leader ``a``, whose
        columns lie within ``delta`` of ``a``'s, is decided where ``a``'s top float32 score leads every other by
        more than ``2 (bound_a + bound_m + |h| delta)``: its exact scores then differ from ``a``'s by at most
        ``|h| delta`` each, so the float64 scores of ``m`` have that same unique argmax.
        """
        if self.low is None or rows.low is None or rows.norms is None or rows.H.shape[0] == 0:
            return self._exact(rows.H)
        n, D = rows.low.shape
        scores = (rows.low @ self.low).reshape(n, self.leaders.size, -1)
        # a score whose float32 sums overflowed (to -inf too) is outside the bound: its row is scored in float64
        finite = np.isfinite(scores).all(axis=2)
        top = np.argmax(scores, axis=2)
        first = np.take_along_axis(scores, top[:, :, None], axis=2)[:, :, 0]
        np.put_along_axis(scores, top[:, :, None], -np.inf, axis=2)
        second = scores.max(axis=2)  # each leader's strongest rival among its classes (NaN if any score is)
        bound = score_bound(rows.norms, self.column_norm, D)
        slot = np.searchsorted(self.leaders, self.leader)  # each model's leader among the computed scores
        follows = self.leader != np.arange(self.models)
        allowance = bound[:, self.leader] + np.where(follows, bound + rows.norms[:, None] * self.distance, 0.0)
        top, first, second, finite = top[:, slot], first[:, slot], second[:, slot], finite[:, slot]
        best = first.astype(np.float64)
        zeros = self.positions is not None and self.width > scores.shape[2]
        if zeros:
            best = np.maximum(best, 0.0)  # NaN stays NaN, so stays undecided
        with np.errstate(invalid="ignore", over="ignore"):
            # rounded down to float32, the threshold can only admit more rivals: a stricter test, never a looser one
            threshold = np.nextafter((best - 2.0 * allowance).astype(np.float32), np.float32(-np.inf))
            decided = second < threshold
            if zeros:  # the unseen classes' 0 is one more rival; where it leads, the top class is a rival
                at_zero = best == 0.0
                decided = np.where(at_zero, first < threshold, decided & (threshold > 0))
        if self.positions is not None:
            top = self.positions[top]
            if zeros:
                top[best == 0.0] = self._first_unseen
        undecided = ~(decided & finite)
        # about 1% of the rows, a few dozen per model: products too small for a second BLAS thread, which costs
        # more to wake than it saves and, beside other jobs, made this loop 40x slower (0.05 s -> 2.3 s a sweep)
        with factor_threads(1):
            for m in np.flatnonzero(undecided.any(axis=0)):
                again = np.flatnonzero(undecided[:, m])
                top[again, m] = self._exact(rows.H[again], int(m))[:, 0]
        return top

    def _spread(self, scores: Any) -> Any:
        """Scores at their ``positions`` of ``width`` columns (0 elsewhere: :func:`spread`), or as they are."""
        return scores if self.positions is None else spread(scores, self.positions, self.width)

    def _exact(self, H: Any, model: int | None = None) -> np.ndarray:
        """The argmax of float64 scores: of every model, or (``(n, 1)``) of ``model`` alone."""
        xp = array_namespace(H)
        if H.dtype != self.W.dtype:  # float32 rows, float64 weights: torch multiplies only equal dtypes
            H = xp.astype(H, self.W.dtype)
        if model is None:
            scores = xp.reshape(H @ self.W, (H.shape[0], self.models, -1))
        else:
            width = self.W.shape[1] // self.models
            scores = (H @ self.W[:, model * width : (model + 1) * width])[:, None, :]
        if self.positions is None:
            return to_numpy(xp.argmax(scores, axis=2))
        return np.argmax(self._spread(to_numpy(scores)), axis=2)
