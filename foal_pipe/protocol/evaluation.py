"""Test accuracy of every boundary's models (and every gamma, every fusion) from one read of the test split; by
class for streams whose classes recur and for the anytime points."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from foal_pipe.core.backend import default_device
from foal_pipe.core.metrics import summarize_seen
from foal_pipe.core.scoring import ModelScores, Rows
from foal_pipe.protocol.anytime import Anytime, curve_accuracy
from foal_pipe.protocol.records import accuracy_report
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary
from foal_pipe.protocol.testblocks import by_task, eval_blocks, in_cache_order


def accuracy_matrices(run: Run, boundaries: Sequence[Boundary], rows: GroupedRows | None = None) -> np.ndarray:
    """``acc[m, i, j]``: accuracy of model m after task i on task j's test rows (NaN for j > i)."""
    return lane_accuracies(run, {None: boundaries}, rows)[None]


def lane_accuracies(run: Run, boundaries: dict[str | None, Sequence[Boundary]],
                    rows: GroupedRows | None = None) -> dict[str | None, np.ndarray]:
    """:func:`accuracy_matrices` of every lane (keyed as :attr:`Run.lanes`) from one read of the test split.

    The test rows of the stream's classes are read once and sorted by task
    (:func:`~foal_pipe.protocol.testblocks.by_task`), so in each full-size block the rows of tasks 1..k are a
    prefix, which boundary k scores. ``rows`` (from :func:`~foal_pipe.protocol.walk.test_rows` with ``classes``)
    serves several class orders from one read: each takes its classes' rows in its task order.
    """
    T = len(next(iter(boundaries.values())))
    correct = {key: np.zeros((int(b[0].W.shape[1]), T, T), dtype=np.int64) for key, b in boundaries.items()}
    models = {key: [_models(run, b) for b in bs] for key, bs in boundaries.items()}
    for block in eval_blocks(run, "test (one read)", by_task, rows):
        for key in block.cached.lanes:
            _score(run, Rows.of(block.projected(key)), block.labels, block.tasks, boundaries[key], models[key],
                   correct[key])
    accuracies = {}
    for key, counts in correct.items():
        acc = counts / run.test_totals[None, None, :]
        upper = np.triu_indices(T, 1)
        acc[:, upper[0], upper[1]] = np.nan
        accuracies[key] = acc
    return accuracies


def _models(run: Run, b: Boundary) -> ModelScores:
    flat = lambda A: run.xp.reshape(run.xp.asarray(A, device=default_device(run.xp)), (A.shape[0], -1))  # noqa: E731
    W, drift = flat(b.W), None if b.drift is None else flat(b.drift)
    if run.evaluation.mask_unseen:
        return ModelScores(W, b.W.shape[1], drift=drift)
    # the published code: unseen classes score 0
    return ModelScores(W, b.W.shape[1], b.classes, len(run.store.classes), drift)


def _score(run: Run, H: Rows, y: np.ndarray, tasks: np.ndarray, boundaries: Sequence[Boundary],
           models: Sequence[ModelScores], correct: np.ndarray) -> None:
    """Add the hits of every boundary's models on the projected test rows ``H`` (sorted by task) to
    ``correct[m, k, task]``."""
    M, T = correct.shape[0], correct.shape[1]
    for k, b in enumerate(boundaries):
        n = int(np.searchsorted(tasks, k, side="right"))  # the rows of tasks 1..k
        if n == 0:
            continue
        found = models[k].argmax(H.head(n))
        pred = b.classes[found] if run.evaluation.mask_unseen else found
        hit = pred == y[:n, None]
        for m in range(M):
            correct[m, k] += np.bincount(tasks[:n], weights=hit[:, m], minlength=T).astype(np.int64)


def class_hits(run: Run, snapshots: Sequence[Boundary], seen: Sequence[np.ndarray],
               rows: GroupedRows | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, totals)``: ``hits[m, p, c]``, model m of snapshot p's correct predictions on class c's test rows,
    for the classes ``seen[p]`` (0 elsewhere); ``totals[c]``, class c's test rows. The test rows of the stream's
    classes are read once (or taken from ``rows``, :func:`~foal_pipe.protocol.walk.test_rows` with ``classes``),
    and every snapshot scores each block of them."""
    n_classes = len(run.store.classes)
    M = int(snapshots[0].W.shape[1])
    hits = np.zeros((M, len(snapshots), n_classes), dtype=np.int64)
    models = [_models(run, b) for b in snapshots]
    masks = [np.isin(np.arange(n_classes), s) for s in seen]
    totals = np.zeros(n_classes, dtype=np.int64)
    for block in eval_blocks(run, "test (one read, by class)", in_cache_order, rows):
        y, H = block.labels, Rows.of(block.projected())
        totals += np.bincount(y, minlength=n_classes)[:n_classes]
        for p, b in enumerate(snapshots):
            scored = masks[p][y]
            if not scored.any():
                continue
            found = models[p].argmax(H)
            pred = b.classes[found] if run.evaluation.mask_unseen else found
            hit = (pred == y[:, None]) & scored[:, None]
            for m in range(M):
                hits[m, p] += np.bincount(y, weights=hit[:, m], minlength=n_classes).astype(np.int64)[:n_classes]
    return hits, totals


def seen_classes(tasks: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The classes seen by the end of each task: the union of its classes and every earlier task's."""
    out, seen = [], np.empty(0, dtype=np.int64)
    for task in tasks:
        seen = np.union1d(seen, np.asarray(task, dtype=np.int64))
        out.append(seen)
    return out


def blurry_report(hits: np.ndarray, totals: np.ndarray, seen: Sequence[np.ndarray]) -> dict:
    """The :class:`~foal_pipe.protocol.schema.Accuracy` fields of a stream whose classes recur (Si-Blurry,
    docs/streams.md), from one model's task-end ``hits[t, c]`` and the classes ``seen[t]`` by task end t.

    ``a[i][j]``: accuracy after task i on the test rows of the classes seen by task end j <= i. A_t = a[t][t],
    the accuracy on every class seen so far (Moon et al. 2023); A_avg is their mean, A_last the last; F is the
    mean over the classes seen before the last task of their best earlier accuracy minus their last."""
    T = len(seen)
    matrix = [[float(hits[i, seen[j]].sum() / totals[seen[j]].sum()) for j in range(i + 1)] for i in range(T)]
    with np.errstate(all="ignore"):
        per_class = hits / totals[None, :]
    drops = [max(per_class[i, c] for i in range(T - 1) if c in seen[i]) - per_class[T - 1, c]
             for c in (seen[T - 2] if T > 1 else [])]
    return {"accuracy_matrix": matrix, **summarize_seen(matrix), "F": float(np.mean(drops)) if drops else 0.0}


def task_matrix(hits: np.ndarray, totals: np.ndarray, tasks: Sequence[Sequence[int]]) -> np.ndarray:
    """A disjoint stream's accuracy matrix (as :func:`accuracy_matrices`) from one model's task-end class hits."""
    T = len(tasks)
    acc = np.full((T, T), np.nan)
    for i in range(T):
        for j in range(i + 1):
            acc[i, j] = hits[i, tasks[j]].sum() / totals[tasks[j]].sum()
    return acc


def model_reports(run: Run, boundaries: Sequence[Boundary], rows: GroupedRows | None = None,
                  anytime: Anytime | None = None) -> tuple[list[dict], list[float] | None]:
    """Each model's :class:`~foal_pipe.protocol.schema.Accuracy` fields at the task ends, and with ``anytime``
    model 0's accuracy at its points. A disjoint stream without points keeps its per-task pass
    (:func:`accuracy_matrices`); otherwise one read scores every snapshot class by class (:func:`class_hits`)."""
    if run.stream.kind == "disjoint" and anytime is None:
        return [accuracy_report(a) for a in accuracy_matrices(run, boundaries, rows)], None
    ends = seen_classes(run.stream.tasks)
    points = anytime.snapshots if anytime is not None else []
    hits, totals = class_hits(run, [*boundaries, *points], [*ends, *(b.classes for b in points)], rows)
    T = len(boundaries)
    if run.stream.kind == "disjoint":
        reports = [accuracy_report(task_matrix(h[:T], totals, run.stream.tasks)) for h in hits]
    else:
        reports = [blurry_report(h[:T], totals, ends) for h in hits]
    return reports, None if anytime is None else curve_accuracy(hits[0, T:], totals, points)
