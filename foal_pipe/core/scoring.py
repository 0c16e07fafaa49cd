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
Where even the float64 scores' own rounding, ``gamma_D sum_j |h_j| (|w_1j| + |w_2j|)`` (:class:`Ties`), covers the
top score's lead, rounding would pick the class, and the run is refused (features that vary only in their last
digits around a large value).

Only NumPy float64 products take the float32 route (cuBLAS and torch may multiply float32 in TF32, which the
bound does not cover); everything else is scored in its own namespace, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_array

from foal_pipe.core.backend import to_numpy
from foal_pipe.core.linalg import factor_threads
from foal_pipe.errors import FoalPipeError, param

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


def column_norms(W: np.ndarray) -> np.ndarray:
    """``|w|`` of each column of a NumPy ``W`` whose squares do not overflow (its float32 copy is finite)."""
    return np.sqrt(np.einsum("dk,dk->k", W, W))


def longest_column(W: np.ndarray, models: int) -> np.ndarray:
    """``(models,)``: the largest ``|w|`` among each model's columns of ``W`` (D x models*C, model by model)."""
    return column_norms(W).reshape(models, -1).max(axis=1)


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


def float64_rounding(size: np.ndarray, depth: int) -> np.ndarray:
    """How far a float64 score ``h @ w`` of ``depth`` terms may lie from the exact one, ``gamma_D size``, from
    ``size`` = ``sum_j |h_j w_j|`` or a bound on it (``|h| |w|``), plus an allowance for products below float64's
    normals (none where ``size`` is 0: every product is 0, and so is the score, exactly)."""
    return 1.001 * gamma_n(depth, U64) * size + (size > 0) * (2.0 * depth * 2.0**-1074)


def safe_rounding(size: Callable[[float], np.ndarray], depth: int) -> np.ndarray:
    """:func:`float64_rounding` of ``size(1.0)``, a sum of products; where that overflows (scores near 1e308, whose
    rounding is still about 1e292), ``size(1.001 gamma_D)``, each product scaled first: at least 1e292 there, so products
    the scaling takes below float64's normals lose under 1e-15 each, far inside the 1.001. Still inf: refused (Ties.check)."""
    with np.errstate(over="ignore", invalid="ignore"):
        plain = size(1.0)
        rounding = float64_rounding(plain, depth)
        if (over := np.isinf(plain)).any():
            rounding = np.where(over, size(1.001 * gamma_n(depth, U64)) + 2.0 * depth * 2.0**-1074, rounding)
    return rounding


def column_lengths(W: Any) -> np.ndarray:
    """``|w|`` of each column of ``W`` (any namespace), scaled by the column's largest entry first so that weights
    near float64's range do not overflow the squares."""
    xp = array_namespace(W)
    scale = xp.max(xp.abs(W), axis=0)
    safe = xp.where(scale > 0, scale, xp.ones_like(scale))
    return to_numpy(safe * xp.sqrt(xp.sum((W / safe) ** 2, axis=0))).astype(np.float64)


def top_two(xp: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The argmax over the last axis of ``scores`` (namespace ``xp``, at least two columns), the next column and
    the top score's lead over it, as NumPy arrays."""
    best = xp.argmax(scores, axis=-1)
    columns = xp.arange(scores.shape[-1], device=device(scores))
    rival = xp.where(columns == best[..., None], xp.full_like(scores, -xp.inf), scores)
    second = xp.argmax(rival, axis=-1)
    return to_numpy(best), to_numpy(second), to_numpy(xp.max(scores, axis=-1) - xp.max(rival, axis=-1))


#: Two columns of a model lying within this fraction of the longer one are taken for one class twice (classes with
#: the same training rows, whose exact weights are equal and whose solved ones differ by the solve's rounding): where
#: their scores tie within rounding, float64's pick between them stands, as it always did. Columns of distinct
#: classes differ by far more (the 1e8 + 1e-7 z store's by 4e-5 of their length).
TWIN = 1e-6
#: (row, column) pairs whose products :meth:`Ties._products` sums at a time.
PRODUCT_ROWS = 4096
#: A drift's reach on the scores, ``sum_j |h_j| |d_j|``, is widened by this factor for its own float64 rounding
#: (``gamma_D``, below 1e-3 up to 1e12 terms).
MOVED = 1.001


@dataclass(frozen=True, eq=False)
class Ties:
    """What says whether float64 scores ``H @ W`` rank a row: ``W`` (D x models*C, model by model, float64, any
    namespace), its columns' ``lengths`` (models, C), the scored models (``model_ids``, into ``W``'s) and, for each
    scored column, the column of ``W``'s model it is (``index``; -1: a column scoring exactly 0). ``drift`` (as
    ``W``, or None: none): how far the weights lie from the exact ones, as measured (the RLS recursion's departure
    from the exact solve of its sums), and its columns' lengths ``drift_lengths``. ``depth``: the terms each score's
    rounding counts (0: ``W``'s rows, one product)."""

    W: Any
    lengths: np.ndarray
    model_ids: np.ndarray
    index: np.ndarray
    drift: Any = None
    drift_lengths: np.ndarray | None = None
    depth: int = 0

    @classmethod
    def of(cls, W: Any, models: int = 1, lengths: np.ndarray | None = None, drift: Any = None, depth: int = 0) -> Ties:
        """Of ``W``, its columns' ``lengths`` (``models * C``) computed already or, by default, here, its measured
        ``drift`` (or None) and the ``depth`` of its scores' sums (0: ``W``'s rows)."""
        lengths = (column_lengths(W) if lengths is None else lengths).reshape(models, -1)
        moved = None if drift is None else column_lengths(drift).reshape(models, -1)
        return cls(W, lengths, np.arange(models), np.arange(lengths.shape[1]), drift, moved, depth)

    def columns(self, keep: Any) -> Ties:
        """Those of the scored columns ``keep`` (an index)."""
        return replace(self, index=self.index[keep])

    def model(self, model: int) -> Ties:
        """Those of ``model`` alone."""
        return replace(self, model_ids=self.model_ids[model : model + 1])

    def spread(self, positions: np.ndarray, width: int) -> Ties:
        """At ``positions`` of ``width`` columns, as :func:`spread` places scores; the others score exactly 0."""
        index = np.full(width, -1)
        index[positions] = self.index
        return replace(self, index=index)

    def check(self, scores: Any, H: Any, norms: np.ndarray | None = None, what: str = "rows") -> np.ndarray:
        """``(n, models)``: the argmax of float64 ``scores`` (n, models, C; any namespace) of the float64 rows ``H``
        (their lengths ``norms``, or computed), refused where the top score's lead over the next is within the two
        scores' rounding and their columns are not one class twice (:data:`TWIN`): rounding, not the scores, would
        pick the class there (features that vary only in their last digits around a large value). The rounding is
        ``gamma_D sum_j |h_j| (|w_1j| + |w_2j|)``, taken for the rows that ``gamma_D |h| (|w_1| + |w_2|)``
        (:func:`safe_rounding`) does not clear: 0 where every product is 0, so scores that tie exactly (a row whose
        features no training row had, classes mirrored) are a tie the first column wins, not a refusal. Scores that
        overflowed (inf, NaN), or whose rounding does, are refused as beyond float64's range. With
        a ``drift`` ``d``, ``sum_j |h_j| (|d_1j| + |d_2j|)`` (screened by ``|h| (|d_1| + |d_2|)``) joins it: the exact
        weights' scores may lie that much apart from these, so the rows within its reach are ranked by the exact
        weights too (:meth:`_check_exact`)."""
        if scores.shape[2] < 2 or scores.shape[0] == 0:
            return to_numpy(array_namespace(scores).argmax(scores, axis=2))
        norms = row_norms(H) if norms is None else norms
        xp = array_namespace(scores)
        finite = to_numpy(xp.all(xp.isfinite(scores), axis=2))  # inf or NaN: a product overflowed float64
        if (repeats := np.flatnonzero(self.index < 0)[1:]).size:  # columns scoring exactly 0 are one rival: the first
            # stands for them (float64's argmax takes it), so the next is a scored class, whose lead is checked
            mask = xp.asarray(np.isin(np.arange(self.index.size), repeats), device=device(scores))
            scores = xp.where(mask, xp.full_like(scores, -xp.inf), scores)
        with np.errstate(invalid="ignore"):  # inf - inf: refused below
            best, second, gap = top_two(xp, scores)
        scored, depth = np.arange(self.model_ids.size), self.depth or int(self.W.shape[0])

        def pair(lengths: np.ndarray, scale: float = 1.0) -> np.ndarray:
            at = np.where(self.index >= 0, lengths[:, np.maximum(self.index, 0)], 0.0)[self.model_ids]
            return (scale * norms)[:, None] * (at[scored, best] + at[scored, second])

        with np.errstate(over="ignore", invalid="ignore"):
            moved = 0.0 if self.drift_lengths is None else MOVED * pair(self.drift_lengths)
            rounding = safe_rounding(lambda scale: pair(self.lengths, scale), depth) + moved
        rows, models = np.nonzero(((gap <= rounding) & (rounding > 0)) | ~finite)
        if rows.size == 0:
            return best
        m, first, other = self.model_ids[models], self.index[best[rows, models]], self.index[second[rows, models]]
        gap = gap[rows, models]
        own = safe_rounding(lambda scale: self._products(self.W, H, rows, m, first, scale)
                            + self._products(self.W, H, rows, m, other, scale), depth)
        with np.errstate(over="ignore", invalid="ignore"):
            reach = own if self.drift is None else (
                own + MOVED * (self._products(self.drift, H, rows, m, first) + self._products(self.drift, H, rows, m, other)))
        if count := np.unique(rows[~finite[rows, models] | np.isinf(reach)]).size:
            raise FoalPipeError(
                f"the float64 scores of {count} {what} reach beyond float64's range (about 1.8e308; rows of length up to "
                f"{float(norms.max()):.3g}), so their rounding cannot be bounded and rounding, not the scores, would pick "
                "their class; scale the features down (e.g. to the range the model was trained on)"
            )
        tied = (gap <= reach) & (reach > 0) & ~self._twins(m, first, other)
        if count := np.unique(rows[tied & (gap <= own) & (own > 0)]).size:  # each row once, however many models tie
            raise FoalPipeError(
                f"the float64 scores of {count} {what} tie within their own rounding (the top two lie closer than "
                "gamma_D sum |h| (|w_1| + |w_2|)), so rounding would pick their class: the features vary only in their "
                "last digits around a large common value; subtract it (center the features) or rescale them"
            )
        if tied.any():
            self._check_exact(H, rows[tied], models[tied], best, what)
        return best

    def _check_exact(self, H: Any, rows: np.ndarray, models: np.ndarray, best: np.ndarray, what: str) -> None:
        """Refuse where the rows ``rows`` (of scored models ``models``), whose leads lie within the drift's reach,
        do not have the class ``best`` of the exact weights ``W - drift`` (ranked with their own ties check): there
        the drift picked the class."""
        xp, width = array_namespace(self.W), self.lengths.shape[1]
        W = self.W - self.drift
        exact = replace(self, W=W, lengths=column_lengths(W).reshape(self.lengths.shape), drift=None, drift_lengths=None)
        changed, tied = 0, None
        for k in np.unique(models):
            at = rows[models == k]
            model = int(self.model_ids[k])
            picked = xp.take(H, xp.asarray(at, device=device(H)), axis=0)
            scores = to_numpy(picked @ W[:, model * width : (model + 1) * width])
            placed = np.where(self.index >= 0, scores[:, np.maximum(self.index, 0)], 0.0)
            try:
                found = exact.model(int(k)).check(placed[:, None, :], picked, None, what)[:, 0]
            except FoalPipeError as error:  # the exact scores tie within their rounding: refused, after a changed class
                tied, found = error, np.argmax(placed, axis=1)
            changed += int(np.count_nonzero(found != best[at, k]))
        if tied is not None and not changed:
            raise tied
        if changed:
            fix = ("center or rescale the features: the exact solve's scores of some of them tie within their rounding "
                   "too" if tied is not None else
                   f"use {param('engine', 'gram')}, which scores the exact solve, or center or rescale the features")
            raise FoalPipeError(
                f"the RLS recursion's rounding changed the class of {changed} {what}: their argmax differs from that of "
                f"the exact solve of the same sums, from which the recursion's weights drifted (within the 1e-4 check); {fix}")

    def _products(self, matrix: Any, H: Any, rows: np.ndarray, models: np.ndarray, columns: np.ndarray,
                  scale: float = 1.0) -> np.ndarray:
        """``sum_j |h_j| scale |m_j|`` of each row ``rows`` of ``H`` with column ``columns`` of its model in ``matrix``
        (``W`` or ``drift``; 0 for a column scoring exactly 0, index -1), :data:`PRODUCT_ROWS` pairs at a time (a
        store whose every row ties would otherwise hold rows x models x D products)."""
        xp = array_namespace(matrix)
        place = lambda k: xp.asarray(k, device=device(matrix))  # noqa: E731
        picked = models * self.lengths.shape[1] + np.maximum(columns, 0)
        sums = np.zeros(rows.size)
        for lo in range(0, rows.size, PRODUCT_ROWS):
            part = slice(lo, lo + PRODUCT_ROWS)
            W = xp.take(matrix, place(picked[part]), axis=1)
            if scale != 1.0:
                W = W * scale
            sums[part] = to_numpy(xp.sum(xp.abs(xp.take(H, place(rows[part]), axis=0)) * xp.abs(W.T), axis=1))
        return np.where(columns >= 0, sums, 0.0)

    def _twins(self, models: np.ndarray, first: np.ndarray, other: np.ndarray) -> np.ndarray:
        """Whether columns ``first`` and ``other`` of each of ``models`` lie within :data:`TWIN` of each other: those
        of the exact weights, ``W - drift`` with a drift (the recursion's rounding parts a class's twin columns)."""
        pairs, where = np.unique(np.stack([models, first, other], axis=1), axis=0, return_inverse=True)
        m, a, b = pairs.T
        twins = (a >= 0) & (b >= 0)
        if twins.any():
            xp, width = array_namespace(self.W), self.lengths.shape[1]
            at = lambda k: xp.asarray(m[twins] * width + k[twins], device=device(self.W))  # noqa: E731
            apart = xp.take(self.W, at(a), axis=1) - xp.take(self.W, at(b), axis=1)
            if self.drift is not None:
                apart = apart - (xp.take(self.drift, at(a), axis=1) - xp.take(self.drift, at(b), axis=1))
            apart = column_lengths(apart)
            twins[twins] = apart <= TWIN * np.maximum(self.lengths[m[twins], a[twins]], self.lengths[m[twins], b[twins]])
        return twins[where.ravel()]


def row_norms(X: Any) -> np.ndarray:
    """``|x|`` of each row of ``X`` (any namespace), as NumPy float64; rows whose squares overflow (entries near
    1e154 and beyond) scaled first, as :func:`column_lengths` scales columns."""
    xp = array_namespace(X)
    if not X.shape[0]:
        return np.zeros(0)
    with np.errstate(over="ignore"):
        norms = to_numpy(xp.sqrt(xp.sum(X * X, axis=1))).astype(np.float64)
    if (big := np.flatnonzero(np.isinf(norms))).size:
        rows = xp.take(X, xp.asarray(big, device=device(X)), axis=0)
        norms[big] = column_lengths(xp.permute_dims(rows, (1, 0)))
    return norms


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


def best_of(scores: np.ndarray, classes: np.ndarray, among: np.ndarray | None = None,
            ties: tuple[Ties, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's predicted label and its score, from float64 ``scores`` (n, C) whose columns are ``classes``.

    ``among=None``: the argmax over ``classes``, the classes seen (F-OAL's rule). ``among`` (every label of the
    task, a superset of ``classes``): the argmax over those labels, a class never seen scoring 0 (:func:`spread`,
    the published code's rule). Ties go to the first column, as in :class:`ModelScores`. ``ties``: the columns'
    :class:`Ties` and the float64 rows scored, which refuse rows whose scores tie within their rounding
    (:meth:`Ties.check`).
    """
    if among is not None:
        among = np.asarray(among)
        order = np.argsort(among, kind="stable")
        positions = order[np.searchsorted(among, classes, sorter=order)]
        scores, classes = spread(scores, positions, among.size), among
    if ties is None:
        best = np.argmax(scores, axis=1)
    else:
        columns, rows = ties
        if among is not None:
            columns = columns.spread(positions, among.size)
        best = columns.check(scores[:, None, :], rows)[:, 0]
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
    scores 0 (the published code's unseen classes, which can win); the argmax is then into ``width``. ``drift`` (as
    ``W``): the weights' measured departure from the exact ones (the RLS recursion's), which widens every test by
    ``|h| |d|`` (:class:`Ties`).
    """

    def __init__(self, W: Any, models: int, positions: np.ndarray | None = None, width: int | None = None,
                 drift: Any = None) -> None:
        self.W, self.models, self.drift = W, models, drift
        self.positions = None if positions is None else np.asarray(positions)
        self.width = width if width is not None else 0  # used with positions only, which come with their width
        unseen = (np.empty(0, dtype=np.intp) if self.positions is None
                  else np.flatnonzero(~np.isin(np.arange(self.width), self.positions)))
        self._first_unseen = int(unseen[0]) if len(unseen) else -1
        self.low: np.ndarray | None = None
        self._lengths: np.ndarray | None = None  # every column's |w|, for the float32 bound and for :attr:`ties`
        if is_numpy_array(W) and W.dtype == np.float64 and W.size:
            with np.errstate(over="ignore"):
                low = W.astype(np.float32)
            if np.isfinite(low).all():
                self._lengths = column_norms(W)
                self.column_norm = self._lengths.reshape(models, -1).max(axis=1)
                self.leader, self.distance = followers(W, models, self.column_norm)
                # the exact weights' scores lie within |h| |d| of these: one more allowance
                self.moved = np.zeros(models) if drift is None else MOVED * longest_column(to_numpy(drift), models)
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
        allowance = (bound[:, self.leader] + np.where(follows, bound + rows.norms[:, None] * self.distance, 0.0)
                     + rows.norms[:, None] * self.moved)
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
                top[again, m] = self._exact(rows.H[again], int(m), rows.norms[again])[:, 0]
        return top

    def _spread(self, scores: Any) -> Any:
        """Scores at their ``positions`` of ``width`` columns (0 elsewhere: :func:`spread`), or as they are."""
        return scores if self.positions is None else spread(scores, self.positions, self.width)

    @cached_property
    def ties(self) -> Ties | None:
        """Float64 weights' :class:`Ties`, which refuse rows their scores' rounding would rank (made at the first
        row scored in float64)."""
        if not self.W.size or self.W.dtype != array_namespace(self.W).float64:
            return None
        return Ties.of(self.W, self.models, self._lengths, self.drift)

    def _exact(self, H: Any, model: int | None = None, norms: np.ndarray | None = None) -> np.ndarray:
        """The argmax of float64 scores: of every model, or (``(n, 1)``) of ``model`` alone; refused where rounding,
        not the scores, would pick it (:meth:`Ties.check`; the rows' lengths ``norms``, or computed)."""
        xp = array_namespace(H)
        if H.dtype != self.W.dtype:  # float32 rows, float64 weights: torch multiplies only equal dtypes
            H = xp.astype(H, self.W.dtype)
        ties = self.ties
        if model is None:
            scores = xp.reshape(H @ self.W, (H.shape[0], self.models, -1))
        else:
            width = self.W.shape[1] // self.models
            scores = (H @ self.W[:, model * width : (model + 1) * width])[:, None, :]
            ties = None if ties is None else ties.model(model)
        if self.positions is not None:
            scores = self._spread(to_numpy(scores))
            ties = None if ties is None else ties.spread(self.positions, self.width)
        if ties is None:
            return to_numpy(array_namespace(scores).argmax(scores, axis=2))
        return ties.check(scores, H, norms, "test rows")
