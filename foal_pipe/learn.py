"""``learn`` and ``sweep``: the online protocol over a feature store, evaluated after every task.

Both engines give, at each task boundary k, the ridge solution over every training row of tasks
1..k; they differ in how they get there:

* ``rls`` replays the stream batch by batch in stream order (reading each task's rows window by
  window), exactly as the paper's Algorithm 1.
* ``gram`` needs no order: one pass over the store in storage order, chunk by chunk, adds each row's
  ``h h^T`` to its task's Gram matrix. Weights at boundary k solve ``(sum_{t<=k} G_t + gamma I) W = Q``.
  ``sweep`` reuses the same pass: one eigendecomposition per boundary serves every gamma.

Test accuracy for every boundary (and every gamma) is then computed in one pass over the test split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from foal_pipe.backend import get_namespace, resolve_dtype, to_numpy
from foal_pipe.classifier import AnalyticClassifier
from foal_pipe.engines import DEFAULT_ENGINE, ENGINES
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_dir, check_output_dir, write_json
from foal_pipe.metrics import summarize
from foal_pipe.modelfile import MODEL_FILE
from foal_pipe.progress import progress_bar
from foal_pipe.projection import SmoothProjection
from foal_pipe.store import FeatureStore, open_store
from foal_pipe.stream import Stream, build_stream, read_class_order
from foal_pipe.timings import Stopwatch

#: Rows projected at once on the RLS path (bounds memory at window x (d + D) values).
RLS_WINDOW = 8192


@dataclass
class LearnConfig:
    """Settings of one run; defaults are foal-pipe's (docs/protocol.md section 3)."""

    tasks: int | None = 10
    batch_size: int = 10
    projection_dim: int = 1000
    gamma: float = 1.0
    seed: int = 0
    engine: str = DEFAULT_ENGINE
    backend: str = "auto"
    dtype: str = "float64"
    projection_init: str = "uniform"
    class_order: Path | None = None
    drop_last: bool = False
    mask_unseen: bool = True
    scheduler: str = "local"
    dask_address: str | None = None
    workers: int = 2


@dataclass
class Boundary:
    """Weights after task k for one or more models (gammas): ``W`` has shape (D, n_models, C_k)."""

    classes: np.ndarray
    W: Any


@dataclass
class Prepared:
    store: FeatureStore
    stream: Stream
    projection: SmoothProjection
    xp: ModuleType
    config: LearnConfig
    test_totals: np.ndarray  # test rows per task


def check_gamma(gamma: float) -> float:
    if not np.isfinite(gamma) or gamma <= 0:
        raise FoalPipeError(f"gamma must be a positive number, got {gamma}; try --gamma 1")
    return float(gamma)


def prepare(features: str | Path, config: LearnConfig) -> Prepared:
    """Validate everything before any work: store, settings, stream, projection."""
    check_gamma(config.gamma)
    if config.projection_dim < 1:
        raise FoalPipeError(f"--projection-dim must be at least 1, got {config.projection_dim}; the paper uses 1000")
    if config.engine not in ENGINES:
        raise FoalPipeError(f"unknown engine {config.engine!r}; choose one of {', '.join(ENGINES)}")
    resolve_dtype(config.dtype)
    xp = get_namespace(config.backend)
    store = open_store(features)
    n_classes = len(store.classes)
    order = read_class_order(config.class_order, n_classes) if config.class_order else None
    stream = build_stream(
        store.train.labels, n_classes, config.tasks, config.batch_size, config.seed, order, config.drop_last
    )
    test_totals = count_test_rows(stream, store.test.labels, n_classes)
    projection = SmoothProjection(config.projection_dim, config.projection_init, config.seed, config.dtype)
    projection.fit(np.empty((0, store.dim)))
    return Prepared(store, stream, projection, xp, config, test_totals)


def count_test_rows(stream: Stream, labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Test rows per task; refused up front when a task has none (it could not be evaluated)."""
    row_task = stream.task_of_label(n_classes)[labels]
    totals = np.bincount(row_task[row_task >= 0], minlength=stream.n_tasks)
    empty = np.flatnonzero(totals == 0)
    if empty.size:
        raise FoalPipeError(
            f"task {int(empty[0])} (classes {stream.tasks[empty[0]]}) has no test rows; every task needs test "
            "samples to be evaluated: check the store's test labels or the task split"
        )
    return totals


def task_statistics(p: Prepared) -> list[AnalyticClassifier]:
    """One gram classifier per task, from a single pass over the train split in storage order."""
    if p.config.scheduler == "dask":
        from foal_pipe.distributed import dask_task_statistics

        return dask_task_statistics(p)
    cfg, train = p.config, p.store.train
    row_task = p.stream.row_tasks(train.n_rows)
    per_task = [AnalyticClassifier(cfg.gamma, "gram", cfg.dtype, cfg.backend) for _ in p.stream.tasks]
    with progress_bar("train (gram)", train.n_rows) as advance:
        for lo, X in train.iter_chunks():
            tasks = row_task[lo : lo + X.shape[0]]
            keep = np.flatnonzero(tasks >= 0)
            if keep.size:
                H = p.projection.transform(X[keep], p.xp)
                labels, tasks = train.labels[lo + keep], tasks[keep]
                for t in np.unique(tasks):
                    sel = np.flatnonzero(tasks == t)
                    per_task[t].partial_fit(H[p.xp.asarray(sel)], labels[sel])
            advance(X.shape[0])
    return per_task


def cumulative(per_task: Sequence[AnalyticClassifier]) -> Iterator[AnalyticClassifier]:
    """Classifiers after tasks 1..k for every k: running merges of the per-task statistics.

    A generator, so only one running D x D sum is alive at a time besides the per-task ones.
    """
    running = per_task[0]
    yield running
    for clf in per_task[1:]:
        running = running.merge(clf)
        yield running


def rls_boundaries(p: Prepared) -> tuple[list[Boundary], AnalyticClassifier]:
    """Replay the stream batch by batch with the paper's recursion; snapshot W at each task end."""
    cfg, train = p.config, p.store.train
    clf = AnalyticClassifier(cfg.gamma, "rls", cfg.dtype, cfg.backend)
    boundaries = []
    total = sum(rows.size for rows in p.stream.rows)
    with progress_bar("train (rls)", total) as advance:
        for rows in p.stream.rows:
            for lo in range(0, rows.size, RLS_WINDOW):
                window = rows[lo : lo + RLS_WINDOW]
                H = p.projection.transform(train.take(window), p.xp)
                labels = train.labels[window]
                for b in range(0, window.size, cfg.batch_size):
                    clf.partial_fit(H[b : b + cfg.batch_size], labels[b : b + cfg.batch_size])
                advance(window.size)
            boundaries.append(Boundary(clf.classes_.copy(), clf._weights()[:, None, :].copy()))
    return boundaries, clf


def gram_boundaries(per_task: Sequence[AnalyticClassifier]) -> tuple[list[Boundary], AnalyticClassifier]:
    """W after each task from the per-task Gram statistics, and the final classifier."""
    boundaries = []
    for clf in cumulative(per_task):
        boundaries.append(Boundary(clf.classes_, clf._weights()[:, None, :]))
    return boundaries, clf


def sweep_boundaries(per_task: Sequence[AnalyticClassifier], gammas: Sequence[float]) -> list[Boundary]:
    """``W(gamma) = V diag(1/(lambda + gamma)) V^T Q`` for every gamma from one eigh per boundary."""
    out = []
    for clf in cumulative(per_task):
        xp, G, Q = clf._xp, clf._engine.G, clf._engine.Q
        lam, V = xp.linalg.eigh(G)
        B = V.T @ Q
        g = xp.asarray(np.asarray(gammas, dtype=G.dtype))
        scaled = B[:, None, :] / (lam[:, None, None] + g[None, :, None])  # (D, n_gammas, C)
        W = (V @ scaled.reshape(V.shape[0], -1)).reshape(scaled.shape)
        if not bool(xp.isfinite(W).all()):
            raise FoalPipeError("a swept classifier has non-finite weights; drop the smallest gammas or use --dtype float64")
        out.append(Boundary(clf.classes_, W))
    return out


def accuracy_matrices(p: Prepared, boundaries: Sequence[Boundary]) -> np.ndarray:
    """``acc[m, i, j]``: accuracy of model m after task i on task j's test rows (NaN for j > i)."""
    test, xp, n_classes = p.store.test, p.xp, len(p.store.classes)
    task_of = p.stream.task_of_label(n_classes)
    row_task = task_of[test.labels]
    T, M = len(boundaries), int(boundaries[0].W.shape[1])
    totals = p.test_totals
    correct = np.zeros((M, T, T), dtype=np.int64)
    flat = [b.W.reshape(b.W.shape[0], -1) for b in boundaries]
    with progress_bar("test", test.n_rows) as advance:
        for lo, X in test.iter_chunks():
            tasks = row_task[lo : lo + X.shape[0]]
            keep = np.flatnonzero(tasks >= 0)
            if keep.size:
                H = p.projection.transform(X[keep], xp)
                y, tasks = test.labels[lo + keep], tasks[keep]
                for k, b in enumerate(boundaries):
                    rows = np.flatnonzero(tasks <= k)
                    if rows.size == 0:
                        continue
                    scores = (H[xp.asarray(rows)] @ flat[k]).reshape(rows.size, M, -1)
                    if p.config.mask_unseen:
                        pred = b.classes[to_numpy(xp.argmax(scores, axis=2))]
                    else:  # the published code: unseen classes score 0 and can win
                        full = xp.zeros((rows.size, M, n_classes), dtype=scores.dtype)
                        full[:, :, xp.asarray(b.classes)] = scores
                        pred = to_numpy(xp.argmax(full, axis=2))
                    hit = pred == y[rows][:, None]
                    for m in range(M):
                        correct[m, k] += np.bincount(tasks[rows], weights=hit[:, m], minlength=T).astype(np.int64)
            advance(X.shape[0])
    acc = correct / totals[None, None, :]
    acc[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = np.nan
    return acc


def ragged(acc: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in acc[i, : i + 1]] for i in range(acc.shape[0])]


def _report(p: Prepared, acc: np.ndarray) -> dict[str, Any]:
    matrix = ragged(acc)
    return {**summarize(matrix), "accuracy_matrix": matrix}


def _run_info(p: Prepared) -> dict[str, Any]:
    cfg = p.config
    return {
        "tasks": p.stream.tasks,
        "n_tasks": p.stream.n_tasks,
        "dropped_classes": p.stream.dropped,
        "projection_dim": cfg.projection_dim,
        "projection_init": cfg.projection_init,
        "batch_size": cfg.batch_size,
        "drop_last": cfg.drop_last,
        "mask_unseen": cfg.mask_unseen,
        "seed": cfg.seed,
        "backend": p.xp.__name__,
        "dtype": cfg.dtype,
        "n_train_seen": int(sum(rows.size for rows in p.stream.rows)),
        "dataset": p.store.meta.dataset,
        "encoder": p.store.meta.encoder,
        "features": str(p.store.path),
    }


def run_learn(features: str | Path, out: str | Path, config: LearnConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train through the stream, evaluate after each task; ``model.safetensors``, ``metrics.json`` and
    ``timings.json`` replace ``out``'s as one unit (checked writable before any work)."""
    out = check_output_dir(out)
    clock = Stopwatch()
    p = prepare(features, config)
    clock.lap("prepare")
    _warn_dropped(p, log)
    if config.engine == "rls" and config.scheduler == "dask":
        raise FoalPipeError("--engine rls is sequential and runs in one process; use --engine gram with --scheduler dask")
    with np.errstate(all="ignore"):  # overflow is caught by the finiteness check on the weights
        if config.engine == "rls":
            boundaries, final = rls_boundaries(p)
        else:
            boundaries, final = gram_boundaries(task_statistics(p))
        clock.lap("train")
        acc = accuracy_matrices(p, boundaries)[0]
    clock.lap("test")
    metrics = {
        **_report(p, acc),
        "gamma": config.gamma,
        "engine": config.engine,
        **_run_info(p),
    }
    p.store.check_unchanged()
    with atomic_dir(out) as tmp:
        final.save(
            tmp / MODEL_FILE,
            projection=p.projection,
            dataset=p.store.meta.dataset,
            encoder=p.store.meta.encoder,
            class_names=[p.store.classes[c] for c in final.classes_],
            activation="sigmoid",
        )
        write_json(tmp / "metrics.json", metrics)
        clock.lap("write")
        clock.write(tmp)
    return metrics


def run_sweep(
    features: str | Path, out: str | Path, gammas: Sequence[float], config: LearnConfig, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Evaluate every gamma from one pass over the train split and one over the test split.

    ``sweep.json`` and ``timings.json`` replace ``out``'s as one unit (checked writable before any work).
    """
    out = check_output_dir(out)
    clock = Stopwatch()
    if not gammas:
        raise FoalPipeError("--gammas is empty; pass a comma-separated list such as 1e-3,1e-2,1e-1,1,10")
    gammas = [check_gamma(g) for g in gammas]
    p = prepare(features, config)
    clock.lap("prepare")
    _warn_dropped(p, log)
    with np.errstate(all="ignore"):  # overflow is caught by the finiteness check on the weights
        boundaries = sweep_boundaries(task_statistics(p), gammas)
        clock.lap("train")
        acc = accuracy_matrices(p, boundaries)
    clock.lap("test")
    results = [{"gamma": g, **_report(p, acc[m])} for m, g in enumerate(gammas)]
    best = max(results, key=lambda r: r["A_avg"])
    report = {
        "gammas": gammas,
        "best_gamma": best["gamma"],
        "results": results,
        **_run_info(p),
    }
    p.store.check_unchanged()
    with atomic_dir(out) as tmp:
        write_json(tmp / "sweep.json", report)
        clock.lap("write")
        clock.write(tmp)
    return report


def _warn_dropped(p: Prepared, log: Callable[[str], None]) -> None:
    if p.stream.dropped and p.config.class_order is None:
        log(
            f"warning: {len(p.store.classes)} classes do not split evenly into {p.stream.n_tasks} tasks; "
            f"dropping {len(p.stream.dropped)} classes (label ids {p.stream.dropped})"
        )

