"""A run prepared: the store, the stream, the projection and the settings validated, memory included, before any
work (:func:`prepare`); the :class:`~foal_pipe.protocol.runstate.Run` it gives lives in :mod:`~foal_pipe.protocol.runstate`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.activations import check_activation
from foal_pipe.core.backend import get_namespace, resolve_backend, resolve_dtype
from foal_pipe.core.engines import ENGINES, check_engine_dtype, check_gamma
from foal_pipe.core.expansion import Expansion
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.memory import check_memory, fits, human
from foal_pipe.protocol.config import KEPT_PART, SCHEDULERS, EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.criteria import TRAINING_CRITERIA
from foal_pipe.protocol.loosample import LOO_SAMPLE
from foal_pipe.protocol.runstate import HeadStart, Run
from foal_pipe.protocol.stream import OrderError, Stream, listed_classes, listed_order, make_stream, resolve_class_order
from foal_pipe.store import open_store
from foal_pipe.store.blockfusion import parse_fusions

#: The largest ``--projection-dim`` planned: its Gram matrix alone would be 8 EiB, and the plan's shapes (rows x D)
#: overflow 64-bit sizes not far beyond; anything near it is refused by the memory check anyway.
MAX_PROJECTION_DIM = 2**30


def prepare(
    features: str | Path,
    stream_config: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    n_models: int = 1,
    loo: bool = False,
    command: str = "learn",
    fusions: Sequence[str] = (),
    heads: Sequence[str] = (),
    ridge: bool = True,
    start: HeadStart | None = None,
    search: int = 0,
) -> Run:
    """Validate everything before any work: settings, store, stream, projection, memory.

    ``fusions`` (``sweep --fusions``) walks every fusion of the store's blocks at once (:attr:`Run.fused`);
    ``heads`` (other than ridge) add their state to the memory estimate; ``ridge=False`` (``learn --head``) leaves
    out ridge's state and weights; ``start`` (a continued head) adds the model's classes and tensors; ``search``
    (``sweep``): the gammas of its refined search (:attr:`SweepConfig.search_points`).
    """
    check_settings(model, execution, fusions)
    started = time.perf_counter()  # the backend's start-up: `auto` may import CuPy or torch to look for a GPU
    backend = resolve_backend(execution.backend)
    starting = time.perf_counter() - started
    store = open_store(features, fusion=model.fusion, fusion_norm=model.fusion_norm)
    fused = store.fusions(parse_fusions(list(fusions), param("fusions")), model.fusion_norm) if fusions else None
    store.check_labelled()
    n_classes = len(store.classes)
    given = stream_config.class_order
    order = (resolve_class_order(given, n_classes, stream_config.tasks, stream_config.drop_remainder)
             if given is not None else None)
    stream = make_stream(
        stream_config.stream, store.train.labels, n_classes, stream_config.tasks, stream_config.batch_size,
        stream_config.resolved_order_seed, order, stream_config.drop_last, stream_config.drop_remainder,
        stream_config.disjoint_ratio, stream_config.blurry_ratio, store.test.labels,
        named=given is not None and not listed_order(given),
    )
    if evaluation.eval_every is not None and execution.scheduler == "dask":
        raise FoalPipeError(f"{param('eval_every')} solves inside the tasks, which {param('scheduler', 'dask')} sums whole; "
                            f"use {param('scheduler', 'local')} with {param('eval_every')}")
    test_totals = count_test_rows(stream, store.test.labels, n_classes, evaluation.eval_every is not None,
                                  store.train.labels)
    width = fused["train"].dim if fused else store.dim
    started = time.perf_counter()  # importing the backend's library (torch: seconds) and starting its device
    xp = get_namespace(backend)
    run = Run(store, stream, _planned(width, model), backend, xp, model, evaluation, execution, test_totals,
              stream.row_tasks(store.train.n_rows), stream_config.seed, fused=fused,
              timings={"backend": starting + time.perf_counter() - started})
    check_class_rows(run, heads, start)
    from foal_pipe.protocol.memoryparts import kept_bytes, memory_fix, run_parts  # it reads a Run

    parts = run_parts(run, n_models, loo, heads, ridge, start, eigen=command == "sweep", search=search)
    if loo:
        kept = {KEPT_PART: kept_bytes(run)}
        run.keep_activations = kept[KEPT_PART] <= execution.max_memory and fits({**parts, **kept})
        if run.keep_activations:
            parts.update(kept)
    run.parts = parts
    check_memory(command, parts, memory_fix(command, run, ridge, heads, fusions, parts))
    run.projection = Expansion.draw(width, model.projection_dim, model.projection_init, model.resolved_activation,
                                    stream_config.seed, model.dtype)
    return run


def check_settings(model: ModelConfig, execution: ExecutionConfig, fusions: Sequence[str] = ()) -> None:
    """:func:`prepare`'s checks of the model's settings alone, before any store is opened (``table`` runs them once,
    so a refusal of a setting does not name a store; :class:`StreamConfig` checks its own fields)."""
    if model.gamma != "auto":
        check_gamma(model.gamma)
    elif model.engine != "gram":
        raise FoalPipeError(f"{param('gamma', 'auto')} needs {param('engine', 'gram')} (the RLS recursion fixes gamma in "
                            "R0 = I/gamma)")
    if model.select not in TRAINING_CRITERIA:
        raise FoalPipeError(f"unknown {param('select')} {model.select!r}; choose {' or '.join(TRAINING_CRITERIA)}")
    for g in model.gamma_grid:
        check_gamma(g)
    check_loo_sample(model.loo_sample)
    if model.projection_dim < 0:
        raise FoalPipeError(f"{param('projection_dim')} must be at least 0 (0: no projection), got {model.projection_dim}; "
                            "the paper uses 1000")
    if model.projection_dim > MAX_PROJECTION_DIM:  # beyond it even the plan's shapes overflow 64-bit sizes
        raise FoalPipeError(f"{param('projection_dim')} {model.projection_dim} is too large: its D x D Gram matrix alone "
                            "would need more than 8 EiB; the paper uses 1000")
    check_activation(model.resolved_activation)
    if model.engine not in ENGINES:
        raise FoalPipeError(f"unknown engine {model.engine!r}; choose one of {', '.join(ENGINES)}")
    if execution.scheduler not in SCHEDULERS:
        raise FoalPipeError(f"unknown scheduler {execution.scheduler!r}; choose {' or '.join(SCHEDULERS)}")
    if fusions and model.fusion is not None:
        raise FoalPipeError(f"pass {param('fusion')} (one fusion) or {param('fusions')} (several, one walk), not both")
    if fusions and execution.scheduler == "dask":
        raise FoalPipeError(f"{param('fusions')} reads the stored blocks in this process; Dask workers read the stored "
                            f"features, so use {param('scheduler', 'local')} with {param('fusions')}")
    if model.fusion is not None and execution.scheduler == "dask":  # typed, or the fusion of an --init-model
        raise FoalPipeError(f"read-time fusion {model.fusion!r} ({param('fusion')}, or the {param('init_model')}'s) reads "
                            "the stored blocks in this process; Dask workers read the stored features, so use "
                            f"{param('scheduler', 'local')} with {param('fusion')} or with a model learned with one")
    if model.engine == "rls" and execution.scheduler == "dask":
        raise FoalPipeError(f"{param('engine', 'rls')} is sequential and runs in one process; use {param('engine', 'gram')} "
                            f"with {param('scheduler', 'dask')}")
    check_engine_dtype(model.engine, resolve_dtype(model.dtype).name)


class ClassRowsError(FoalPipeError):
    """A head's refusal of a class's rows at a task's end, the class named as the store names it; ``head``: that head."""

    def __init__(self, message: str, head: str) -> None:
        super().__init__(message)
        self.head = head


def check_class_rows(run: Run, heads: Sequence[str], start: HeadStart | None = None) -> None:
    """Each head's refusal of its rows per class at a task's end (:meth:`~foal_pipe.heads.base.HeadBase.check_counts`:
    fecam's class of one row), made from the stream before any row is read (:class:`ClassRowsError`). A continued
    model's classes (``start``) are left out: their rows only grow from counts the model was built with."""
    from foal_pipe.heads import HEADS

    labels = np.asarray(run.store.train.labels)
    counts = np.zeros(len(run.store.classes), dtype=np.int64)
    new = np.ones(counts.size, dtype=bool) if start is None else ~np.isin(start.merged, start.classes)
    names = [name for name, is_new in zip(run.store.classes, new, strict=True) if is_new]
    for rows in run.stream.rows if heads else ():
        counts += np.bincount(labels[rows], minlength=counts.size)
        for name in heads:
            try:
                HEADS[name].head.check_counts(names, counts[new].tolist())
            except FoalPipeError as exc:
                raise ClassRowsError(exc.template, name) from None


def _planned(width: int, model: ModelConfig) -> Expansion:
    """A stand-in of the projection with its shape and no memory (one broadcast value): the memory estimate
    needs its width before the matrix is drawn, so a huge ``projection_dim`` is refused, not allocated."""
    dim = int(model.projection_dim) or width
    return Expansion(np.broadcast_to(np.zeros((), dtype=model.dtype), (width, dim)), model.resolved_activation)


def projection_dim(projection: Any) -> int:
    """A saved model's ``projection_dim``: 0 where its matrix is the identity (learned without a projection, which a
    model file still stores as a matrix), else its width D."""
    P = np.asarray(projection.components_)
    plain = projection.bias_ is None and P.shape[0] == P.shape[1] and np.array_equal(P, np.eye(P.shape[0]))
    return 0 if plain else int(P.shape[1])


def check_loo_sample(value: object) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise FoalPipeError(f"{param('loo_sample')} counts the rows leave-one-out scores at each boundary and must be "
                            f"an integer >= 0 (0: every row), got {value!r}; e.g. {param('loo_sample', LOO_SAMPLE)}")


def reread_note(run: Run) -> str:
    """Why a leave-one-out run projects the rows again at every boundary (the activations were not kept); the
    rows come from the walk's cache, not from the store."""
    from foal_pipe.protocol.memoryparts import kept_bytes  # it reads a Run

    need = kept_bytes(run)
    limit = (f"above --max-memory {human(run.execution.max_memory)}" if need > run.execution.max_memory
             else "more than the available memory allows")
    return (f"note: leave-one-out projects the rows seen so far again at every task boundary (slower): "
            f"keeping their activations needs {human(need)}, {limit}; raise --max-memory or free memory to keep them")


def count_test_rows(stream: Stream, labels: np.ndarray, n_classes: int, by_class: bool = False,
                    train_labels: np.ndarray | None = None) -> np.ndarray:
    """Test rows per task (of the classes first seen there); refused up front when a task has none (it could not
    be evaluated). A Si-Blurry stream, or anytime evaluation (``by_class``), scores the classes seen so far and
    needs test rows for every class the stream trains on (those of its rows, ``train_labels``; a class a task
    lists without rows is never seen) instead."""
    row_task = stream.task_of_label(n_classes)[labels]
    totals = np.bincount(row_task[row_task >= 0], minlength=stream.n_tasks)
    if by_class or stream.kind != "disjoint":
        streamed = (np.unique(np.asarray(train_labels)[np.concatenate(stream.rows)]) if train_labels is not None else
                    np.unique(np.concatenate([np.asarray(t, dtype=np.int64) for t in stream.tasks])))
        missing = np.setdiff1d(streamed, labels)
        if missing.size:
            drop = f", or drop {param('eval_every')}" if by_class and stream.kind == "disjoint" else ""
            raise OrderError(f"class {int(missing[0])} is trained on but has no test rows; scoring the classes seen "
                             f"so far needs test rows for every class: check the store's test labels{drop}")
        return totals
    empty = np.flatnonzero(totals == 0)
    if empty.size:
        raise OrderError(f"task {int(empty[0]) + 1} (classes {listed_classes(stream.tasks[empty[0]])}) has no test rows; "
                         "every task needs test samples to be evaluated: check the store's test labels or the task split")
    return totals
