"""A run's memory estimate, by what holds it: :func:`~foal_pipe.protocol.run.prepare` checks the sum against the
machine before any work (:func:`~foal_pipe.memory.check_memory`); ``table`` and ``--order-seeds`` add what their runs
hold together to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from foal_pipe.core.gammasearch import search_grid
from foal_pipe.core.leaveoneout import LOO_BLOCK_VALUES, grid_leverages_kept
from foal_pipe.errors import param
from foal_pipe.memory import human
from foal_pipe.protocol.headruns import head_space
from foal_pipe.protocol.rowcache import READ_AHEAD, READ_THREADS, cache_bytes, in_memory, index_bytes
from foal_pipe.protocol.runstate import HeadStart, Run, row_sample


def run_parts(run: Run, n_models: int = 1, loo: bool = False, heads: Sequence[str] = (), ridge: bool = True,
              start: HeadStart | None = None, eigen: bool = False, search: int = 0) -> dict[str, int]:
    """:func:`prepare`'s estimate of one run, the activations kept for leave-one-out aside (``prepare`` decides
    those): ``table`` and ``--order-seeds`` add what their runs hold together to it."""
    parts = memory_parts(run, n_models, loo, eigen, search)
    if not ridge:
        parts = {name: size for name, size in parts.items() if name.startswith(("a block", "decoded"))}
    width = run.features_dim
    parts[f"the projection ({width:,} x {run.dim:,})"] = width * run.dim * (8 + np.dtype(run.model.dtype).itemsize)
    parts["the stream's row indices and the store's labels"] = row_arrays_bytes(run)
    parts.update(head_parts(run, heads, model_file=not ridge, start=start))
    return parts


def memory_fix(command: str, run: Run, ridge: bool = True, heads: Sequence[str] = (), fusions: Sequence[str] = (),
               parts: dict[str, int] | None = None) -> str:
    """What lowers the estimate, in ``command``'s own options: ``table`` has no --dtype, --gammas or --eval-every,
    ``learn`` no --gammas (its --gamma-grid, with --gamma auto). With the estimate's ``parts``, worded by what takes
    the most of it: a head's state (its width d: --projection-dim only where the head takes projected rows), its test
    scores (classes x test rows: no option lowers them), leave-one-out (``sweep --no-loo``)."""
    largest = max(parts, key=parts.__getitem__) if parts else ""
    if not ridge:
        leave = f"drop that head from {param('heads')}" if command == "table" else "leave that head out"
        if parts and not largest.startswith(tuple(f"{name} state" for name in heads)):
            return f"the most of it is {largest}: {leave}, or free memory"
        projected = parts and run.model.projection_dim and any(head_space(name, run.model) != "features" for name in heads)
        fewer = f"a lower {param('projection_dim')}" if projected else "features of fewer dimensions"
        return f"a head's state grows with the classes and the width d of its rows: {leave}, use {fewer}, or free memory"
    ways = [f"lower {param('projection_dim')}"]
    looped = sum(size for name, size in (parts or {}).items() if "leave-one-out" in name)
    if command == "sweep" and parts and looped >= max(parts.values()):
        ways.insert(0, f"skip leave-one-out ({param('loo', False)}), which takes {human(looped)} of it")
    if heads:  # ridge's own ways stay: its sums may be the most of it
        ways.append(f"drop from {param('heads')} a head whose per-class statistics (classes x d^2) take much of it")
    if command != "table":
        ways.append(f"use {param('dtype', 'float32')}")
    if command == "sweep":
        ways.append(f"fewer {param('gammas')}")
    if fusions:
        ways.append(f"fewer {param('fusions')}")
    if command == "learn" and run.model.gamma == "auto":
        ways.append(f"a shorter {param('gamma_grid')}")
    if run.evaluation.eval_every is not None and command != "table":
        ways.append(f"a larger {param('eval_every')}")
    if run.execution.scheduler == "dask":  # every task's D x D sums come back at once (dask_parts)
        ways.append(f"fewer {param('tasks')}, {param('scheduler', 'local')}")
    return ", ".join(ways) + ", or free memory"


def held_bytes(run: Run) -> int:
    """What a prepared run holds while another runs (``table``, ``--order-seeds``): its drawn projection and
    :func:`row_arrays_bytes`."""
    bias = run.projection.bias_
    projection = int(run.projection.components_.nbytes) + (0 if bias is None else int(bias.nbytes))
    return projection + row_arrays_bytes(run)


def row_arrays_bytes(run: Run) -> int:
    """A run's arrays of a few bytes per row, which grow with the store whatever D: its stream's row indices, every
    train row's task, and the labels of the store it opened (each run opens its own)."""
    rows = sum(int(np.asarray(r).nbytes) for r in run.stream.rows)
    labels = sum(int(np.asarray(run.store.split(s).labels).nbytes) for s in ("train", "test"))
    return rows + int(run.row_task.nbytes) + int(run.test_totals.nbytes) + labels


def head_parts(run: Run, heads: Sequence[str], model_file: bool = False,
               start: HeadStart | None = None) -> dict[str, int]:
    """The state of every head other than ridge (:data:`foal_pipe.heads.HEADS`' ``memory``: per-class statistics
    included), at the width of the rows it takes, for every class; the scorers of every boundary (and ``--eval-every``
    point), which wait for the one test pass (``kept``, from the classes each task's rows, or each point's, hold);
    with ``model_file`` (``learn --head``), what writing the one head's model file adds while they are held; with
    ``start``, the continued model's tensors."""
    from foal_pipe.heads import HEADS
    from foal_pipe.heads.state import file_bytes

    names = [name for name in heads if not HEADS[name].gram_lanes]
    if not names:
        return {}
    dims = {"features": run.features_dim, "projected": run.dim, "activations": run.dim}
    labels = np.asarray(run.store.train.labels)
    classes = np.arange(len(run.store.classes))
    if start is not None:
        labels, classes = start.merged[labels], np.union1d(start.merged, start.classes)
    seen = np.empty(0, dtype=np.int64) if start is None else np.asarray(start.classes, dtype=np.int64)
    changes = []  # (classes whose rows changed, classes seen) at each boundary and --eval-every point
    every, done = run.evaluation.eval_every, 0
    for t, rows in enumerate(run.stream.rows):
        cuts = [] if every is None else [c - done for c in range(every * (done // every + 1), done + rows.size, every)]
        for part, segment in enumerate(np.split(rows, cuts)):
            task = np.unique(labels[segment])
            changed = task.size if start is None or t or part else np.union1d(task, start.classes).size
            seen = np.union1d(seen, task)
            changes.append((changed, seen.size))
        done += rows.size
    parts = {}
    tested = min(run.block_rows, int(run.store.test.n_rows))
    for name in names:
        entry, width = HEADS[name], dims[head_space(name, run.model)]
        parts[f"{name} state ({classes.size} classes, d={width})"] = entry.memory(classes.size, width)
        parts[f"{name} scorers of every boundary"] = sum(entry.kept(c, s, width) for c, s in changes)
        extra = entry.head.score_bytes  # memory_parts' block charges the first float64 score
        if extra:
            parts[f"{name}'s test scoring ({tested:,} rows x {classes.size:,} classes)"] = tested * classes.size * extra
    if model_file:
        parts[f"{names[0]} model file"] = file_bytes(names[0], classes.size, dims[head_space(names[0], run.model)])
    if start is not None:
        parts["the --init-model's tensors"] = start.held
    return parts


def kept_bytes(run: Run) -> int:
    """What keeping the activations for leave-one-out takes: of every train row of the stream, or of the rows
    ever sampled (``--loo-sample``), rows x D in the state's dtype, for each fusion of ``sweep --fusions``."""
    sample = row_sample(run)
    rows = int(np.count_nonzero(run.row_task >= 0)) if sample is None else int(sample.kept.size)
    return rows * run.dim * np.dtype(run.model.dtype).itemsize * len(run.lanes)


def memory_parts(run: Run, n_models: int, loo: bool, eigen: bool = False, search: int = 0) -> dict[str, int]:
    """The estimated peak, by what holds it (bytes): the state at its largest phase, one block of rows, the
    decoded rows the walk caches (:mod:`foal_pipe.rowcache`: in memory up to its limit, else in a temporary file
    that costs no process memory) and their index (held either way), the boundaries' weights kept for the test
    pass; the state and the weights once per lane (``sweep --fusions``: each fusion keeps its statistics and its
    pending boundary); with a sampled leave-one-out, the sample's eigen-coordinates (float64) kept for its zoom, their
    leverages at every gamma of the refined grid (``search`` of them for ``sweep``, else ``--gamma auto``'s grid) where
    it keeps them (:meth:`SampledLeaveOneOut._grid_leverages`), and for LOO accuracy alone their float32 copy
    (:meth:`SampledLeaveOneOut._correct`).
    ``eigen``: a solver that factors every boundary whatever the gammas (``sweep``'s :class:`ManyGammas`, one gamma included).

    A block holds at most the rows of the larger split, and the read at most the split's chunks (:func:`_read_bytes`):
    a small store is not charged for rows and chunks it does not have. The test pass scores every model of a block
    of test rows at once (float64 ``rows x models x classes`` at worst, :meth:`ModelScores.argmax`), with or without
    leave-one-out."""
    D, item = run.dim, np.dtype(run.model.dtype).itemsize
    square = D * D
    eigen = eigen or run.model.gamma == "auto" or n_models > 1
    if run.model.engine == "rls":
        # R and one update's D x D product; the checking sums' G and its solve's G + gamma I (or a batch's product)
        state = 2 * square * item + 2 * square * 8
    elif eigen:  # G, its float64 copy / eigenvectors, LAPACK's 2 D^2 workspace; during LOO, V beside G and a batch Gram;
        state = 2 * square * item + 4 * square * 8  # G's copy at a boundary factored ahead (learners.gram.FactorAhead)
    else:  # G and one batch's Gram while summing; G and G + gamma I at a solve
        state = square * item + square * max(item, 8)
    n_classes = len(run.store.classes)
    lanes = len(run.lanes)
    splits = [run.fused[s] if run.fused is not None else run.store.split(s) for s in ("train", "test")]
    rows = max(1, min(run.block_rows, max(int(s.n_rows) for s in splits)))
    block = rows * (D * 8 * 3 + run.features_dim * 8)
    # with several fusions, the Gram pass's block that joins a boundary factored ahead holds the other lanes'
    # activations too: a block of one task's rows
    block += min(rows, max((int(r.size) for r in run.stream.rows), default=0)) * D * 8 * (lanes - 1)
    tested = min(rows, int(splits[1].n_rows)) * n_models * n_classes * 8
    block += max(tested, _loo_block(run, n_models, rows)) if loo else tested
    read = max(_read_bytes(run, s) for s in splits)
    per_lane = f" x {lanes} fusions" if lanes > 1 else ""
    snapshot = D * n_classes * 8 * (2 if run.model.engine == "rls" else 1)  # rls's weights carry their drift
    parts = {
        f"state at D={D}{per_lane}": state * lanes,
        "a block of rows": block + read,
        f"weights of every boundary{per_lane}": run.stream.n_tasks * snapshot * n_models * lanes,
    }
    sample = row_sample(run) if loo else None
    if sample is not None and sample.boundaries:  # SampledLeaveOneOut keeps the sample's H V for the zoom
        per_row = D * 8
        points = search or _loo_gammas(run, n_models)[0]
        if run.model.gamma == "auto" and run.model.select == "loo_accuracy":  # the float32 screen's copy, leverages
            per_row += D * 4 + points * 8
        elif grid_leverages_kept(points, D):
            per_row += points * 8
        parts[f"leave-one-out sample's eigen-coordinates{per_lane}"] = (
            max(p.size for p in sample.boundaries) * per_row * lanes)
    if loo:
        parts[f"leave-one-out's scaled weights{per_lane}"] = _loo_weights(run, n_models, sample is not None) * lanes
    if run.evaluation.eval_every is not None:  # every point's weights wait for the one test read
        n_stream = int(np.count_nonzero(run.row_task >= 0))
        parts[f"weights of every --eval-every point ({n_stream // run.evaluation.eval_every})"] = (
            n_stream // run.evaluation.eval_every * snapshot)
    for split in ("train", "test"):
        cached = rows_cache_bytes(run, split)
        if in_memory(cached, run.execution.max_memory):
            parts[f"decoded {split} rows{per_lane}"] = cached
        parts[f"decoded {split} rows' index"] = index_bytes(cached_rows(run, split), int(run.store.split(split).n_rows))
    if run.execution.scheduler == "dask":
        parts.update(dask_parts(run))
    return parts


def _loo_gammas(run: Run, n_models: int) -> tuple[int, int]:
    """The gammas a leave-one-out pass scores (``sweep``'s, or ``--gamma auto``'s refined grid) and the most of them
    one evaluation of a sampled pass asks for at once (a zoom's first: the coarse grid's points and the resolution's)."""
    if run.model.gamma != "auto":
        return n_models, n_models
    fine = int(search_grid(run.model.gamma_grid, run.model.per_decade).size)
    return fine, min(fine, len(run.model.gamma_grid) + 1)


def _loo_block(run: Run, n_models: int, rows: int) -> int:
    """A leave-one-out block's scores: :class:`LeaveOneOut` cuts a block of rows so that it holds about
    :data:`LOO_BLOCK_VALUES` values (D and 3 per gamma and class, float64), and so do a sampled pass's
    evaluations (:meth:`SampledLeaveOneOut._totals`, ``_correct``)."""
    gammas = _loo_gammas(run, n_models)[0]
    width = run.dim + 3 * gammas * len(run.store.classes)
    return min(rows, max(1, LOO_BLOCK_VALUES // max(1, width))) * width * 8


def _loo_weights(run: Run, n_models: int, sampled: bool) -> int:
    """The weights scaled by every gamma a leave-one-out pass scores, ``D x (gammas x classes)`` float64
    (:meth:`RidgeEigen.scaling`): held through the pass by :class:`LeaveOneOut`; built per evaluation by a sampled
    pass, with a float32 copy for LOO accuracy's screen."""
    gammas, at_once = _loo_gammas(run, n_models)
    per_gamma = run.dim * len(run.store.classes) * 8
    if not sampled:
        return gammas * per_gamma
    return at_once * per_gamma * (3 if run.model.select == "loo_accuracy" else 2) // 2


def dask_parts(run: Run) -> dict[str, int]:
    """What ``--scheduler dask``'s Gram pass adds (:func:`~foal_pipe.protocol.distributed.gram_pass_bytes`): every
    task's statistics received here at once and, on a LocalCluster (this machine's memory), the workers' partial sums
    (each up to every task's statistics), interpreters and blocks; an external cluster's workers have their own."""
    from foal_pipe.cluster import is_local
    from foal_pipe.protocol.distributed import gram_pass_bytes

    D, item, n_classes, tasks = run.dim, np.dtype(run.model.dtype).itemsize, len(run.store.classes), run.stream.n_tasks
    features = run.store.train.features
    partial = tasks * (D * D * item + D * n_classes * item + 2 * n_classes * 8)
    local = is_local(run.execution.dask_address)
    workers = run.execution.workers if local else 1
    client, cluster = gram_pass_bytes(int(features.shape[0]), int(features.shape[1]), features.dtype.itemsize,
                                      int(features.chunks[0]), partial, workers, run.block_rows, D * 16)
    parts = {f"the {tasks} tasks' statistics received from Dask": client}
    if local:
        parts[f"the Dask workers' partial sums ({workers} worker{'s' * (workers > 1)})"] = cluster
    return parts


def _read_bytes(run: Run, split: Any) -> int:
    """The chunks a split's read holds at once (:meth:`GroupedRows._fill`), no more than it has: stored chunks,
    ``READ_AHEAD + READ_THREADS`` of them; with fusions, ``READ_AHEAD + 1`` chunks' fused float32 rows of every
    fusion (the chunks being scattered, waiting or fusing) and each of the ``READ_THREADS`` fusing threads' blocks
    and temporaries (:attr:`FusedSplits.chunk_bytes`)."""
    chunks = -(-int(split.n_rows) // max(1, int(split.chunk_rows)))
    if run.fused is None:
        return min(READ_AHEAD + READ_THREADS, chunks) * int(split.chunk_rows) * run.store.dim * split.features.dtype.itemsize
    fused = int(split.chunk_rows) * int(split.dim) * 4 * len(run.lanes)
    return min(READ_THREADS, chunks) * int(split.chunk_bytes) + min(READ_AHEAD + 1, chunks) * fused


def rows_cache_bytes(run: Run, split: str = "train") -> int:
    """What the walk's cache of a split's decoded rows takes (:class:`GroupedRows`, in the store's dtype)."""
    item = 4 if run.fused is not None else run.store.split(split).features.dtype.itemsize
    return cache_bytes(cached_rows(run, split), run.features_dim, item, len(run.lanes))


def cached_rows(run: Run, split: str) -> int:
    """The rows of a split the walk caches: the stream's train rows, the test rows of its tasks."""
    return int(np.count_nonzero(run.row_task >= 0)) if split == "train" else int(run.test_totals.sum())


