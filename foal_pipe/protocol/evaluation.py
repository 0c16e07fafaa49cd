"""Test accuracy of every boundary's models (and every gamma, every fusion) from one pass over the test split."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from foal_pipe.core.backend import default_device
from foal_pipe.core.scoring import ModelScores, Rows
from foal_pipe.progress import progress_bar
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary


def accuracy_matrices(run: Run, boundaries: Sequence[Boundary]) -> np.ndarray:
    """``acc[m, i, j]``: accuracy of model m after task i on task j's test rows (NaN for j > i)."""
    return lane_accuracies(run, {None: boundaries})[None]


def lane_accuracies(run: Run, boundaries: dict[str | None, Sequence[Boundary]]) -> dict[str | None, np.ndarray]:
    """:func:`accuracy_matrices` of every lane (keyed as :attr:`Run.lanes`) from one pass over the test split."""
    test, n_classes = run.store.test, len(run.store.classes)
    row_task = run.stream.task_of_label(n_classes)[test.labels]
    T = len(next(iter(boundaries.values())))
    correct = {key: np.zeros((int(b[0].W.shape[1]), T, T), dtype=np.int64) for key, b in boundaries.items()}
    models = {key: [_models(run, b) for b in bs] for key, bs in boundaries.items()}
    with progress_bar("test", test.n_rows) as advance, run.timed("test"):
        for lo, chunk in run.source("test").iter_chunks():
            views = chunk if isinstance(chunk, dict) else {None: chunk}
            n = next(iter(views.values())).shape[0]
            tasks_all = row_task[lo : lo + n]
            keep_all = np.flatnonzero(tasks_all >= 0)
            for b0 in range(0, keep_all.size, run.block_rows):
                keep = keep_all[b0 : b0 + run.block_rows]
                keep = keep[np.argsort(tasks_all[keep], kind="stable")]  # by task: each boundary scores a prefix
                y, tasks = test.labels[lo + keep], tasks_all[keep]
                for key, X in views.items():
                    H = run.projection.transform(X[keep], run.xp)
                    _score(run, Rows.of(H), y, tasks, boundaries[key], models[key], correct[key])
            advance(n)
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
