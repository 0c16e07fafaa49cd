"""Test accuracy of every boundary's models (and every gamma, every fusion) from one read of the test split."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np

from foal_pipe.core.backend import default_device
from foal_pipe.core.scoring import ModelScores, Rows
from foal_pipe.progress import progress_bar
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary
from foal_pipe.protocol.walk import test_rows


def accuracy_matrices(run: Run, boundaries: Sequence[Boundary], rows: GroupedRows | None = None) -> np.ndarray:
    """``acc[m, i, j]``: accuracy of model m after task i on task j's test rows (NaN for j > i)."""
    return lane_accuracies(run, {None: boundaries}, rows)[None]


def lane_accuracies(run: Run, boundaries: dict[str | None, Sequence[Boundary]],
                    rows: GroupedRows | None = None) -> dict[str | None, np.ndarray]:
    """:func:`accuracy_matrices` of every lane (keyed as :attr:`Run.lanes`) from one read of the test split.

    The test rows of the stream's classes are read once and grouped by task (:class:`GroupedRows`), so in
    each full-size block the rows of tasks 1..k are a prefix, which boundary k scores. ``rows`` (from
    :func:`test_rows` with ``classes``) serves several class orders from one read: each takes its classes' rows
    in its task order.
    """
    T = len(next(iter(boundaries.values())))
    correct = {key: np.zeros((int(b[0].W.shape[1]), T, T), dtype=np.int64) for key, b in boundaries.items()}
    models = {key: [_models(run, b) for b in bs] for key, bs in boundaries.items()}
    n_rows = int(run.test_totals.sum())
    with progress_bar("test (one read)", n_rows * (1 if rows else 2)) as advance, run.timed("test"), \
            (nullcontext(rows) if rows else test_rows(run, on_chunk=advance)) as cached:
        task_of = run.stream.task_of_label(len(run.store.classes))[cached.labels]
        order = np.argsort(task_of, kind="stable")[-n_rows:]  # rows outside the stream (-1) sort first
        for start in range(0, n_rows, run.block_rows):
            positions = order[start : start + run.block_rows]
            y, tasks = cached.labels[positions], task_of[positions]
            for key in cached.lanes:
                H = run.projection.transform(cached.take(key, positions, run.xp), run.xp)
                _score(run, Rows.of(H), y, tasks, boundaries[key], models[key], correct[key])
            advance(positions.size)
    accuracies = {}
    for key, counts in correct.items():
        acc = counts / run.test_totals[None, None, :]
        upper = np.triu_indices(T, 1)
        acc[:, upper[0], upper[1]] = np.nan
        accuracies[key] = acc
    return accuracies


def _models(run: Run, b: Boundary) -> ModelScores:
    W = run.xp.reshape(run.xp.asarray(b.W, device=default_device(run.xp)), (b.W.shape[0], -1))
    if run.evaluation.mask_unseen:
        return ModelScores(W, b.W.shape[1])
    return ModelScores(W, b.W.shape[1], b.classes, len(run.store.classes))  # the published code: unseen classes score 0


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
