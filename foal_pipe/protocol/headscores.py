"""The registry heads' rows and scores (:mod:`foal_pipe.heads`; their walk is :mod:`foal_pipe.protocol.learners.heads`):
the rows of each space computed from a block of cached rows (:data:`SPACE_ROWS`), the heads' fresh running states
(:func:`build_heads`), and every boundary model scored on one read of the test split (:func:`head_reports`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
from array_api_compat import array_namespace

from foal_pipe.core.backend import as_dtype, default_device, to_numpy
from foal_pipe.core.linalg import factor_threads
from foal_pipe.heads import HEADS, Head, Scorer, make_head
from foal_pipe.heads.base import ClassColumns
from foal_pipe.protocol.anytime import curve_accuracy
from foal_pipe.protocol.evaluation import blurry_report, seen_classes, task_matrix
from foal_pipe.protocol.records import accuracy_report
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.testblocks import by_task, eval_blocks, in_cache_order


def _float64(run: Run, X: Any) -> Any:
    """Rows computed in the run's dtype, as the float64 every head's statistics, solve and scoring take: with
    ``--dtype float32`` the rows are rounded to float32 (the store's rows, the projection and the activation all
    in float32), the heads' sums stay float64 (docs/heads.md, "--dtype float32")."""
    return array_namespace(X).astype(X, run.xp.float64, copy=False)


def _features(run: Run, X: Any) -> Any:
    xp = run.xp
    return _float64(run, as_dtype(X, xp, getattr(xp, run.model.dtype), default_device(xp)))


def _projected(run: Run, X: Any) -> Any:
    xp = run.xp
    dtype = getattr(xp, run.model.dtype)
    X = as_dtype(X, xp, dtype, default_device(xp))
    if run.projection.is_identity:
        return _float64(run, X)
    return _float64(run, X @ xp.asarray(run.projection.components_, dtype=dtype, device=default_device(xp)))


def _activations(run: Run, X: Any) -> Any:
    return _float64(run, run.projection.transform(X, run.xp))  # the bits ridge's Gram sums


#: How a block of cached rows becomes the rows of each space (:data:`foal_pipe.heads.SPACES`).
SPACE_ROWS: dict[str, Callable[[Run, Any], Any]] = {
    "features": _features,
    "projected": _projected,
    "activations": _activations,
}


def space_rows(run: Run, X: Any, spaces: set[str]) -> dict[str, Any]:
    """The rows of every space of ``spaces`` from one block of cached rows ``X``, each computed once."""
    with run.timed("project"):
        return {space: SPACE_ROWS[space](run, X) for space in sorted(spaces)}


def head_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``name`` takes (from a :class:`~foal_pipe.protocol.config.ModelConfig`'s fields), None left out."""
    return {key: options[key] for key in HEADS[name].options if options.get(key) is not None}


def build_heads(run: Run, names: Sequence[str], options: Mapping[str, Any],
                spaces: Mapping[str, str] | None = None) -> dict[str, Head]:
    """A fresh running state of every head in ``names`` on the rows of its space (``spaces``: where a head takes other
    rows than its own, as ``--head-rows`` gives)."""
    dims = {"features": run.features_dim, "projected": run.dim, "activations": run.dim}
    heads = {}
    for name in names:
        space = (spaces or {}).get(name, HEADS[name].space)
        given = head_options(name, options)
        if "batch_size" in HEADS[name].head.option_names():  # a recursion over the stream's batches
            given["batch_size"] = run.stream.batch_size
        heads[name] = make_head(name, given, run.xp, dims[space])
    return heads


def head_accuracies(run: Run, boundaries: Mapping[str, Sequence[Scorer]], spaces: Mapping[str, str],
                    rows: GroupedRows | None = None, lane: str | None = None) -> dict[str, np.ndarray]:
    """``acc[i, j]`` of every head (keyed as ``boundaries``; ``spaces`` its rows): its model after task i on task j's
    test rows, predicted among the classes seen through task i (NaN for j > i), from one read of the test split
    (or ``rows``, as :func:`~foal_pipe.protocol.evaluation.lane_accuracies` takes)."""
    T = run.stream.n_tasks
    correct = {name: np.zeros((T, T), dtype=np.int64) for name in boundaries}
    for block in eval_blocks(run, "test (one read, heads)", by_task, rows):
        y, tasks = block.labels, block.tasks
        blocks = space_rows(run, block.features(lane), set(spaces.values()))
        ends = np.searchsorted(tasks, np.arange(T), side="right")  # boundary k scores the rows of tasks 1..k
        scored = np.flatnonzero(ends > 0)
        for name, scorers in boundaries.items():
            chosen = [scorers[int(k)] for k in scored]
            for k, scorer, best in zip(scored, chosen, boundary_argmax(chosen, blocks[spaces[name]], ends[scored]),
                                       strict=True):
                n = ends[k]
                hit = scorer.classes[best] == y[:n]
                correct[name][k] += np.bincount(tasks[:n], weights=hit, minlength=T).astype(np.int64)
    accuracies = {}
    upper = np.triu_indices(T, 1)
    for name, counts in correct.items():
        acc = counts / run.test_totals[None, :]
        acc[upper] = np.nan
        accuracies[name] = acc
    return accuracies


def boundary_argmax(scorers: Sequence[Scorer], X: Any, ends: Sequence[int] | np.ndarray) -> Iterator[np.ndarray]:
    """Each scorer's argmax column (host NumPy) over the first ``ends[k]`` rows of ``X`` (the scorers of one head,
    boundary by boundary), exactly that of its float64 scores.

    Scorers with class keys (:class:`~foal_pipe.heads.base.ClassColumns`) share a memo: the rows are prepared once
    and a class's column is computed for the rows it lacks only, so each (row, class) score is computed once per
    change of the class's statistics, not once per boundary. Where a scorer offers them, the memo holds cheaper
    columns with bounds (fecam: float32 products, :meth:`~foal_pipe.heads.fecam.MahalanobisScorer.bounded_column`):
    a row whose best column leads every other by more than their bounds has that argmax in float64 too; the other
    rows (a few in a thousand) are scored again in float64, every class, and take that argmax, as before."""
    memo: dict[Any, Any] = {}  # key -> the class's column over the rows computed so far
    bounds: dict[Any, np.ndarray] = {}  # key -> how far each of those values may lie from float64's (screened only)
    prepared = low = None
    for scorer, n in zip(scorers, ends, strict=True):
        keys = getattr(scorer, "keys", None)
        if keys is None:
            yield _checked_argmax(scorer, X[:n, :])
            continue
        by_class = cast(ClassColumns, scorer)  # a structural protocol: a scorer with class keys is one
        if prepared is None:
            prepared = by_class.prepare(X)
            low = by_class.prepare_low(prepared)
            xp = array_namespace(prepared)
        for k, key in enumerate(keys):
            m = memo[key].shape[0] if key in memo else 0
            if m >= n:
                continue
            cheap = None if low is None else by_class.bounded_column(k, tuple(part[m:n] for part in low))
            values, bound = cheap if cheap is not None else (by_class.column(k, prepared[m:n, :]), np.zeros(n - m))
            memo[key] = xp.concat((memo[key], values)) if m else values
            if low is not None:  # bound 0: a value computed in float64
                bounds[key] = np.concatenate((bounds[key], bound)) if m else bound
        if low is None:
            yield _argmax(xp.stack([memo[key][:n] for key in keys], axis=1))
        else:
            yield _screened_argmax(by_class, prepared[:n, :], np.stack([memo[key][:n] for key in keys], axis=1),
                                   np.stack([bounds[key][:n] for key in keys], axis=1))


def _screened_argmax(scorer: ClassColumns, prepared: Any, values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The argmax of ``scorer``'s exact columns, from ``values`` (n, C) that lie within ``bounds`` of them: the rows
    whose best value leads every other by more than both bounds, then the others from the exact columns."""
    n = values.shape[0]
    best = np.argmax(values, axis=1)
    rows = np.arange(n)
    with np.errstate(invalid="ignore", over="ignore"):
        floor = values[rows, best] - bounds[rows, best]
        ceiling = values + bounds
        ceiling[rows, best] = -np.inf
        finite = np.isfinite(values).all(axis=1) & np.isfinite(bounds).all(axis=1)  # NaN: float64 decides, as before
        decided = finite & (floor > ceiling.max(axis=1, initial=-np.inf))
    again = np.flatnonzero(~decided)
    if again.size:
        with factor_threads(1):  # a few rows: too small a product to wake a second BLAS thread (as ridge's scores)
            exact = np.stack([to_numpy(scorer.column(k, prepared[again, :])) for k in range(values.shape[1])], axis=1)
        best[again] = np.argmax(exact, axis=1)
    return best


def head_class_hits(run: Run, boundaries: Mapping[str, Sequence[Scorer]], spaces: Mapping[str, str],
                    rows: GroupedRows | None = None, lane: str | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(hits, totals)`` as :func:`~foal_pipe.protocol.evaluation.class_hits` gives ridge's: ``hits[name][p, c]``,
    boundary p of head ``name``'s correct predictions (among its classes) on class c's test rows, for its classes
    only (0 elsewhere); ``totals[c]``, class c's test rows. One read of the test split (or ``rows``); every boundary
    scores every row, a class's column computed once per change of its rows (:func:`boundary_argmax`)."""
    n_classes = len(run.store.classes)
    hits = {name: np.zeros((len(scorers), n_classes), dtype=np.int64) for name, scorers in boundaries.items()}
    masks = {name: [np.isin(np.arange(n_classes), s.classes) for s in scorers] for name, scorers in boundaries.items()}
    totals = np.zeros(n_classes, dtype=np.int64)
    for block in eval_blocks(run, "test (one read, heads by class)", in_cache_order, rows):
        y = block.labels
        totals += np.bincount(y, minlength=n_classes)[:n_classes]
        blocks = space_rows(run, block.features(lane), set(spaces.values()))
        for name, scorers in boundaries.items():
            X = blocks[spaces[name]]
            for p, best in enumerate(boundary_argmax(scorers, X, [X.shape[0]] * len(scorers))):
                hit = (scorers[p].classes[best] == y) & masks[name][p][y]
                hits[name][p] += np.bincount(y, weights=hit, minlength=n_classes).astype(np.int64)[:n_classes]
    return hits, totals


def head_reports(run: Run, boundaries: Mapping[str, Sequence[Scorer]], spaces: Mapping[str, str],
                 rows: GroupedRows | None = None, points: Mapping[str, Sequence[Scorer]] | None = None,
                 lane: str | None = None) -> dict[str, dict[str, Any]]:
    """Each head's :class:`~foal_pipe.protocol.schema.Accuracy` fields at the task ends, by ridge's definitions: a
    disjoint stream's accuracy matrix by task (:func:`head_accuracies`); a Si-Blurry stream's over the classes seen
    so far (:func:`~foal_pipe.protocol.evaluation.blurry_report`, the same function that scores ridge). With
    ``points`` (``--eval-every``), each head's ``curve`` too: the accuracy of its model at each point on the test
    rows of the classes it has seen (:func:`~foal_pipe.protocol.anytime.curve_accuracy`, as ridge's)."""
    if run.stream.kind == "disjoint" and points is None:
        return {name: accuracy_report(acc) for name, acc in head_accuracies(run, boundaries, spaces, rows, lane).items()}
    ends = seen_classes(run.stream.tasks)  # the classes each boundary predicts among
    T = run.stream.n_tasks
    scorers = {name: [*b, *(points[name] if points is not None else ())] for name, b in boundaries.items()}
    hits, totals = head_class_hits(run, scorers, spaces, rows, lane)
    reports = {}
    for name, h in hits.items():
        if run.stream.kind == "disjoint":
            reports[name] = accuracy_report(task_matrix(h[:T], totals, run.stream.tasks))
        else:
            reports[name] = blurry_report(h[:T], totals, ends)
        if points is not None:
            reports[name]["curve"] = curve_accuracy(h[T:], totals, points[name])
    return reports


def _checked_argmax(scorer: Scorer, X: Any) -> np.ndarray:
    """The argmax of ``scorer``'s scores of ``X``; a linear scorer's (one offering ``ties``) refused where their
    float64 rounding would pick it (:meth:`~foal_pipe.core.scoring.Ties.check`)."""
    scores = scorer.scores(X)
    ties = getattr(scorer, "ties", None)
    if ties is None:
        return _argmax(scores)
    columns, rows = ties(X)
    return columns.check(scores[:, None, :], rows, what="test rows")[:, 0]


def _argmax(scores: Any) -> np.ndarray:
    """The column of each row's largest score, as host NumPy."""
    return to_numpy(array_namespace(scores).argmax(scores, axis=1))
