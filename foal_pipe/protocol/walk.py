"""The walk over the tasks: the gram engine's passes over the train chunks (a running
:class:`~foal_pipe.core.statistics.RidgeStatistics` per lane, :class:`KeptActivations` for leave-one-out), on
this machine or on Dask, and the rls engine's batch-by-batch replay."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from array_api_compat import device

from foal_pipe.core.backend import default_device
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.progress import progress_bar
from foal_pipe.protocol.config import RLS_WINDOW
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas, Pending


@dataclass
class _Lane:
    """One feature set's walk (the store's features, or one fusion of ``sweep --fusions``): its running sums,
    its solved boundaries and the boundary waiting for its leave-one-out pass."""

    solver: FixedGamma | ManyGammas
    running: RidgeStatistics
    boundaries: list[Boundary] = field(default_factory=list)
    pending: Pending | None = None

    def finish(self, run: Run) -> None:
        if self.pending is not None:
            with run.timed("solve"):
                self.boundaries.append(self.solver.finish(self.pending))
            self.pending = None

    def start(self, run: Run, k: int) -> None:
        with run.timed("solve"):
            state = self.solver.start(self.running, k)
            if self.solver.needs_rows:
                self.pending = state
            else:
                self.boundaries.append(self.solver.finish(state))


class KeptActivations:
    """The activations of the stream's train rows, stored as the walk first projects them (``--gamma auto``,
    ``sweep``: the leave-one-out pass at boundary k needs every row of tasks 1..k again, so it multiplies these
    instead of decoding and projecting the rows again). They are the arrays the Gram pass summed, and the same
    bits as the rows projected again: every pass projects a row in the same block (see :func:`_blocks`)."""

    def __init__(self, run: Run) -> None:
        self.xp = run.xp
        self.slot = np.full(run.row_task.shape, -1, dtype=np.int64)  # train row -> row of ``values``; -1: not yet
        self.size = 0
        self.values = run.xp.empty((int(np.count_nonzero(run.row_task >= 0)), run.dim),
                                   dtype=getattr(run.xp, run.model.dtype), device=default_device(run.xp))

    def has(self, rows: np.ndarray) -> np.ndarray:
        return self.slot[rows] >= 0

    def put(self, rows: np.ndarray, H: Any) -> None:
        """Append ``H``, the activations of ``rows`` (a slice, which every array namespace can assign)."""
        end = self.size + rows.size
        self.values[self.size : end, :] = H
        self.slot[rows] = np.arange(self.size, end)
        self.size = end

    def take(self, rows: np.ndarray) -> Any:
        return self.xp.take(self.values, self.xp.asarray(self.slot[rows], device=device(self.values)), axis=0)


class _Chunk:
    """The train chunk starting at row ``lo``, decoded on first use (never, when its rows are all kept); of a
    blocks store, only the rows a pass asks for are fused (a task's rows are a fraction of each chunk)."""

    def __init__(self, run: Run, lo: int) -> None:
        self.run, self.lo = run, lo
        self.source = run.source("train")
        self._raw: np.ndarray | None = None

    def rows(self, lane: str | None, sel: np.ndarray) -> np.ndarray:
        with self.run.timed("read"):
            if self._raw is None:
                self._raw = self.source.read_raw(self.lo, min(self.lo + self.source.chunk_rows, self.source.n_rows))
            return self.source.rows_of(self._raw, self.lo, sel, lane)


def _blocks(run: Run, wanted: np.ndarray) -> Iterator[tuple[_Chunk, np.ndarray]]:
    """``(chunk, sel)``: the wanted train rows ``chunk.lo + sel``, chunk by chunk in storage order and, within a
    chunk, one task's rows at a time, ``block_rows`` at a time.

    A block thus never mixes tasks, and a task's rows in a chunk are cut into the same blocks by every pass
    that asks for them: a row is always projected beside the same rows. BLAS may round a row's product
    differently beside other rows (OpenBLAS picks kernels by the product's size), so this is what makes
    kept activations equal to rows projected again, to the bit.
    """
    source = run.source("train")
    for lo in range(0, source.n_rows, source.chunk_rows):
        rows = np.flatnonzero(wanted[lo : lo + source.chunk_rows])
        if rows.size:
            chunk = _Chunk(run, lo)
            tasks = run.row_task[lo + rows]
            for task in np.unique(tasks):
                mine = rows[tasks == task]
                for b in range(0, mine.size, run.block_rows):
                    yield chunk, mine[b : b + run.block_rows]


def _project(run: Run, X: np.ndarray) -> Any:
    with run.timed("project"):
        return run.projection.transform(X, run.xp)


def _local_pass(run: Run, task: int | None, lanes: dict[str | None, _Lane], advance: Callable[[int], None],
                kept: dict[str | None, KeptActivations] | None = None) -> None:
    """One pass over the train chunks: task ``task``'s rows into each lane's running sums; rows of tasks up to
    the pending boundary's into its leave-one-out accumulator (the lanes walk in step: same boundaries). With
    ``kept``, rows are projected once (then kept) and only chunks holding rows never projected are decoded; the
    blocks, and so every sum, are the same either way."""
    rt = run.row_task
    wanted = rt == task if task is not None else np.zeros(rt.shape, dtype=bool)
    pending = next(iter(lanes.values())).pending
    if pending is not None:
        wanted |= (rt >= 0) & (rt <= pending.max_task)
    all_labels = run.source("train").labels
    for chunk, sel in _blocks(run, wanted):
        rows = chunk.lo + sel
        labels = all_labels[rows]
        new = task is not None and rt[rows[0]] == task  # a block holds one task's rows
        for key, lane in lanes.items():
            if kept is None:
                H = _project(run, chunk.rows(key, sel))
            else:
                unseen = sel[~kept[key].has(rows)]  # the whole block or nothing: blocks are the same in every pass
                if unseen.size:
                    kept[key].put(chunk.lo + unseen, _project(run, chunk.rows(key, unseen)))
                with run.timed("gram" if new else "loo"):
                    H = kept[key].take(rows)
            if new:
                with run.timed("gram"):
                    lane.running += RidgeStatistics.from_batch(H, labels)
            else:
                with run.timed("loo"):
                    lane.pending.loo.add(H, labels)
        advance(sel.size)


def gram_walk(run: Run, solvers: dict[str | None, FixedGamma | ManyGammas],
              on_task: Callable[[int, dict[str | None, _Lane]], None] | None = None) -> dict[str | None, _Lane]:
    """Walk the tasks in stream order with one running statistics object per lane (``solvers`` keyed by
    :attr:`Run.lanes`, all needing the rows or none); each lane's boundaries and final sums.

    ``on_task(k, lanes)`` is called after task k is added.
    """
    xp = run.xp
    lanes = {key: _Lane(solver, RidgeStatistics.empty(run.dim, xp, getattr(xp, run.model.dtype)))
             for key, solver in solvers.items()}
    needs_rows = next(iter(solvers.values())).needs_rows
    sizes = [rows.size for rows in run.stream.rows]
    total = sum(sizes) + (sum(np.cumsum(sizes)) if needs_rows else 0)
    dask = run.execution.scheduler == "dask"
    label = "train (gram" + (", dask" if dask else "") + (" + leave-one-out)" if needs_rows else ")")
    if len(lanes) > 1:
        label += f", {len(lanes)} fusions"
    kept = {key: KeptActivations(run) for key in lanes} if needs_rows and run.keep_activations else None
    with progress_bar(label, total) as advance, _dask_session(run) as add_task:
        for k in range(run.stream.n_tasks):
            if add_task is not None:  # one lane: prepare refuses fusions on Dask
                with run.timed("gram"):
                    lanes[None].running += add_task(k, advance)
                if lanes[None].pending is not None:
                    _local_pass(run, None, lanes, advance, kept)
            else:
                _local_pass(run, k, lanes, advance, kept)
            for lane in lanes.values():
                lane.finish(run)
            if on_task is not None:
                on_task(k, lanes)
            for lane in lanes.values():
                lane.start(run, k)
        if needs_rows:
            _local_pass(run, None, lanes, advance, kept)
            for lane in lanes.values():
                lane.finish(run)
    return lanes


def gram_boundaries(run: Run, solver: FixedGamma | ManyGammas,
                    on_task: Callable[[int, RidgeStatistics], None] | None = None) -> tuple[list[Boundary], RidgeStatistics]:
    """The walk with one lane (the store's features, or its ``--fusion``): the boundaries and the final sums.

    ``on_task(k, statistics)`` is called after task k is added (tests use it to check every boundary).
    """
    lanes = gram_walk(run, {None: solver}, None if on_task is None else lambda k, lanes: on_task(k, lanes[None].running))
    return lanes[None].boundaries, lanes[None].running


@contextmanager
def _dask_session(run: Run) -> Iterator[Callable[[int, Callable[[int], None]], RidgeStatistics] | None]:
    """With ``--scheduler dask``: ``add_task(k, advance)`` computing task k's statistics on the cluster."""
    if run.execution.scheduler != "dask":
        yield None
        return
    from foal_pipe.cluster import dask_client
    from foal_pipe.protocol.distributed import dask_statistics

    train = run.store.train
    path = str(Path(run.store.path).resolve())
    with dask_client(run.execution.dask_address, run.execution.workers) as client:
        projection = client.scatter(run.projection, broadcast=True)

        def add_task(k: int, advance: Callable[[int], None]) -> RidgeStatistics:
            return dask_statistics(client, path, run.row_task == k, train.labels, projection, run.block_rows, advance)

        yield add_task


def rls_boundaries(run: Run) -> tuple[list[Boundary], AnalyticClassifier]:
    """Replay the stream batch by batch with the paper's recursion; snapshot W at each task end."""
    train, batch = run.store.train, run.stream.batch_size
    clf = AnalyticClassifier(gamma=run.model.gamma, engine="rls", dtype=run.model.dtype, backend=run.backend)
    boundaries = []
    total = sum(rows.size for rows in run.stream.rows)
    with progress_bar("train (rls)", total) as advance, run.timed("rls"):
        for rows in run.stream.rows:
            for lo in range(0, rows.size, RLS_WINDOW):
                window = rows[lo : lo + RLS_WINDOW]
                H = run.projection.transform(train.take(window), run.xp)
                labels = train.labels[window]
                for b in range(0, window.size, batch):
                    clf.partial_fit(H[b : min(b + batch, window.size), :], labels[b : b + batch])
                advance(window.size)
            boundaries.append(Boundary(clf.classes_.copy(), clf.weights_[:, None, :], np.array([float(run.model.gamma)])))
    return boundaries, clf
