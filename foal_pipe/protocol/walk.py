"""The walk over the tasks: the train rows read once (:mod:`foal_pipe.protocol.rowcache`), then the gram
engine's passes over them in full-size blocks (a running :class:`~foal_pipe.core.statistics.RidgeStatistics` per
lane, :class:`KeptActivations` for leave-one-out), with every task's sums from Dask when asked, and the rls
engine's batch-by-batch replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.core.engines import RLSEngine, checked_weights, grow_classes
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.progress import progress_bar
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.config import RLS_WINDOW
from foal_pipe.protocol.loosample import RowSample
from foal_pipe.protocol.rowcache import GroupedRows, TaskBlocks
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
            with run.timed("loo"):
                self.solver.zoom(self.pending)
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
    """The activations of the stream's train rows in walk order, stored as the walk first projects them
    (``--gamma auto``, ``sweep``): the leave-one-out pass at boundary k multiplies walk rows ``[0, ends[k])``
    instead of projecting the rows again. They are the arrays the Gram pass summed, in the blocks a projection
    again would use (:class:`~foal_pipe.rowcache.TaskBlocks`), so the same bits either way. With ``keep`` (the
    walk positions a sampled leave-one-out scores, :attr:`RowSample.kept`) only those rows are stored."""

    def __init__(self, run: Run, n_rows: int, keep: np.ndarray | None = None) -> None:
        self.slot = None
        if keep is not None:  # slots in walk order, so a block's kept rows fill consecutive slots
            self.slot = np.full(n_rows, -1, dtype=np.int64)
            self.slot[np.sort(keep)] = np.arange(keep.size)
        self.values = run.xp.empty((n_rows if keep is None else keep.size, run.dim),
                                   dtype=getattr(run.xp, run.model.dtype), device=default_device(run.xp))

    def put(self, start: int, stop: int, H: Any) -> None:
        if self.slot is None:
            self.values[start:stop, :] = H
            return
        slots = self.slot[start:stop]
        inside = np.flatnonzero(slots >= 0)
        if inside.size:
            xp = array_namespace(H)
            first = int(slots[inside[0]])
            self.values[first : first + inside.size, :] = xp.take(H, xp.asarray(inside, device=device(H)), axis=0)

    def take(self, start: int, stop: int) -> Any:
        return self.values[start:stop, :]

    def rows(self, positions: np.ndarray) -> Any:
        """The kept activations of walk ``positions`` (all of them kept)."""
        xp = array_namespace(self.values)
        return xp.take(self.values, xp.asarray(self.slot[positions], device=device(self.values)), axis=0)


def train_rows(run: Run, on_chunk: Callable[[int], None] = lambda n: None, groups: np.ndarray | None = None,
               n_groups: int | None = None) -> GroupedRows:
    """The stream's train rows of every lane, each chunk decoded once, grouped by task (or by ``groups``, e.g.
    by class for several class orders; see :mod:`foal_pipe.rowcache`)."""
    with run.timed("read"):
        return GroupedRows(run.source("train"), run.lanes, run.row_task if groups is None else groups,
                           run.stream.n_tasks if n_groups is None else n_groups, run.execution.max_memory, on_chunk,
                           run.xp)


def _project(run: Run, X: Any) -> Any:
    with run.timed("project"):
        return run.projection.transform(X, run.xp)


def _activations(run: Run, rows: GroupedRows, key: str | None, positions: np.ndarray) -> Any:
    """The activations of the cached rows at ``positions``, projected."""
    with run.timed("read"):
        X = rows.take(key, positions, run.xp)
    return _project(run, X)


def _add_task(run: Run, rows: GroupedRows, walk: TaskBlocks, k: int, lanes: dict[str | None, _Lane],
              kept: dict[str | None, KeptActivations] | None, advance: Callable[[int], None],
              on_point: Callable[[int], None] | None = None) -> None:
    """Task ``k``'s rows into each lane's running sums, in full-size blocks (kept, when ``kept``);
    ``on_point(n)`` after each block that ends at an evaluation point inside the task."""
    end = int(walk.ends[k])
    for start, stop, positions in walk.blocks(k):
        labels = rows.labels[positions]
        for key, lane in lanes.items():
            H = _activations(run, rows, key, positions)
            with run.timed("gram"):
                if kept is not None:
                    kept[key].put(start, stop, H)
                lane.running += RidgeStatistics.from_batch(H, labels)
        advance(stop - start)
        if on_point is not None and stop < end and stop in walk.points:
            on_point(stop)


def _loo_pass(run: Run, rows: GroupedRows, walk: TaskBlocks, k: int, lanes: dict[str | None, _Lane],
              kept: dict[str | None, KeptActivations] | None, advance: Callable[[int], None],
              sample: tuple[RowSample, np.ndarray] | None = None) -> None:
    """Every row of tasks 1..k into each lane's pending leave-one-out accumulator, in the Gram pass's blocks; with
    ``sample`` (the sample and the cache position of every walk position), the boundary's sampled rows only."""
    if sample is not None:
        positions = sample[0].boundaries[k]
        for lo in range(0, positions.size, run.block_rows):
            chosen = positions[lo : lo + run.block_rows]
            labels = rows.labels[sample[1][chosen]]
            for key, lane in lanes.items():
                H = kept[key].rows(chosen) if kept is not None else _activations(run, rows, key, sample[1][chosen])
                with run.timed("loo"):
                    lane.pending.loo.add(H, labels)
            advance(chosen.size)
        return
    for t in range(k + 1):
        for start, stop, positions in walk.blocks(t):
            labels = rows.labels[positions]
            for key, lane in lanes.items():
                if kept is not None:
                    H = kept[key].take(start, stop)
                else:
                    H = _activations(run, rows, key, positions)
                with run.timed("loo"):
                    lane.pending.loo.add(H, labels)
            advance(stop - start)


def gram_walk(run: Run, solvers: dict[str | None, FixedGamma | ManyGammas],
              on_task: Callable[[int, dict[str | None, _Lane]], None] | None = None,
              rows: GroupedRows | None = None, anytime: Anytime | None = None) -> dict[str | None, _Lane]:
    """Walk the tasks in stream order with one running statistics object per lane (``solvers`` keyed by
    :attr:`Run.lanes`, all needing the rows or none); each lane's boundaries and final sums.

    The train rows are read once (:func:`train_rows`; or ``rows``, a cache several walks share); each task then
    adds its rows in full-size blocks and, when the solvers need the rows, its boundary's leave-one-out pass takes
    the rows of tasks 1..k from that cache (their activations, when kept). With ``--scheduler dask`` the cluster
    computes every task's sums in one pass and the cache is read only for leave-one-out. ``on_task(k, lanes)`` is
    called after task k is added. ``anytime`` (``--eval-every``, one lane) records the weights at its points: the
    blocks end there (:class:`TaskBlocks`); a point inside a task is solved from the running sums, one at a task
    end is that end's boundary.
    """
    xp = run.xp
    lanes = {key: _Lane(solver, RidgeStatistics.empty(run.dim, xp, getattr(xp, run.model.dtype)))
             for key, solver in solvers.items()}
    needs_rows = next(iter(solvers.values())).needs_rows
    row_sample = next(iter(solvers.values())).sample
    sizes = [r.size for r in run.stream.rows]
    n_stream = sum(sizes)
    loo_rows = sum(np.cumsum(sizes)) if row_sample is None else sum(p.size for p in row_sample.boundaries)
    dask = run.execution.scheduler == "dask"
    read = rows is None and (needs_rows or not dask)
    total = (n_stream if read else 0) + (n_stream if dask else 0) + n_stream + (loo_rows if needs_rows else 0)
    label = "train (" + ("one read, " if read else "") + "gram" + (", dask" if dask else "")
    label += (" + leave-one-out" + ("" if run.keep_activations and not dask else ", rows projected again")
              if needs_rows else "")
    label += ")" + (f", {len(lanes)} fusions" if len(lanes) > 1 else "")
    with progress_bar(label, total) as advance:
        per_task = _dask_task_statistics(run, advance) if dask else None
        with (train_rows(run, advance) if read else nullcontext(rows)) as cached:
            points = anytime.points if anytime is not None else ()
            walk = None if cached is None else TaskBlocks(cached, run.stream.rows, run.block_rows, points)
            on_point = None if anytime is None else lambda n: anytime.gram(n, lanes[None].running, lanes[None].boundaries, False)
            kept = ({key: KeptActivations(run, n_stream, None if row_sample is None else row_sample.kept) for key in lanes}
                    if needs_rows and run.keep_activations and not dask else None)  # the cluster projected the Gram's rows
            sample = None if row_sample is None or not needs_rows else (row_sample, walk_positions(walk, run.stream.n_tasks))
            for k in range(run.stream.n_tasks):
                if per_task is not None:
                    with run.timed("gram"):
                        lanes[None].running += per_task[k]
                    advance(sizes[k])
                else:
                    _add_task(run, cached, walk, k, lanes, kept, advance, on_point)
                if on_task is not None:
                    on_task(k, lanes)
                for lane in lanes.values():
                    lane.start(run, k)
                if needs_rows:
                    _loo_pass(run, cached, walk, k, lanes, kept, advance, sample)
                    for lane in lanes.values():
                        lane.finish(run)
                if anytime is not None and int(walk.ends[k]) in anytime.points:
                    anytime.gram(int(walk.ends[k]), lanes[None].running, lanes[None].boundaries, True)
    return lanes


def walk_positions(walk: TaskBlocks, n_tasks: int) -> np.ndarray:
    """The cache position of every walk position, in walk order (the blocks of every task, end to end)."""
    parts = [positions for k in range(n_tasks) for _, _, positions in walk.blocks(k)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def gram_boundaries(run: Run, solver: FixedGamma | ManyGammas,
                    on_task: Callable[[int, RidgeStatistics], None] | None = None,
                    rows: GroupedRows | None = None, anytime: Anytime | None = None) -> tuple[list[Boundary], RidgeStatistics]:
    """The walk with one lane (the store's features, or its ``--fusion``): the boundaries and the final sums.

    ``on_task(k, statistics)`` is called after task k is added (tests use it to check every boundary).
    """
    lanes = gram_walk(run, {None: solver}, None if on_task is None else lambda k, lanes: on_task(k, lanes[None].running),
                      rows, anytime)
    return lanes[None].boundaries, lanes[None].running


def _dask_task_statistics(run: Run, advance: Callable[[int], None]) -> list[RidgeStatistics]:
    """With ``--scheduler dask``: every task's statistics, computed on the cluster in one pass over the store."""
    from foal_pipe.cluster import dask_client
    from foal_pipe.protocol.distributed import dask_statistics

    path = str(Path(run.store.path).resolve())
    with dask_client(run.execution.dask_address, run.execution.workers) as client, run.timed("gram"):
        projection = client.scatter(run.projection, broadcast=True)
        return dask_statistics(client, path, run.row_task, run.stream.n_tasks, run.store.train.labels, projection,
                               run.block_rows, advance)


def rls_boundaries(run: Run, rows: GroupedRows | None = None,
                   anytime: Anytime | None = None) -> tuple[list[Boundary], RidgeModel]:
    """Replay the stream batch by batch with the paper's recursion; snapshot W at each task end. The rows are read
    once (:func:`train_rows`, or ``rows``); each task's are then taken in stream order, ``RLS_WINDOW`` at a time.
    ``anytime``: W is also snapshot at its points; a task's windows end there too, so a batch that would straddle
    a point is cut in two (as batches are cut at windows and task ends). Returns the boundaries and the last model."""
    batch = run.stream.batch_size
    engine = RLSEngine(run.dim, run.model.gamma, run.xp, getattr(run.xp, run.model.dtype), default_device(run.xp))
    boundaries = []
    total = sum(r.size for r in run.stream.rows)
    with progress_bar("train (" + ("one read, " if rows is None else "") + "rls)", 2 * total) as advance, \
            (train_rows(run, advance) if rows is None else nullcontext(rows)) as cached, run.timed("rls"):
        classes = np.empty(0, dtype=cached.labels.dtype)
        seen, points = 0, set(anytime.points) if anytime is not None else set()
        for task in run.stream.rows:
            cuts = sorted({*range(0, task.size, RLS_WINDOW), *(p - seen for p in points if seen < p < seen + task.size)})
            for lo, hi in zip(cuts, [*cuts[1:], task.size]):
                positions = cached.position[task[lo:hi]]
                H = run.projection.transform(cached.take(None, positions, run.xp), run.xp)
                labels = cached.labels[positions]
                for b in range(0, positions.size, batch):
                    classes = grow_classes(engine, classes, labels[b : b + batch])
                    engine.update(H[b : min(b + batch, positions.size), :], labels[b : b + batch], classes)
                advance(positions.size)
                if hi < task.size and seen + hi in points:
                    anytime.add(seen + hi, _rls_snapshot(run, engine, classes))
            seen += task.size
            boundaries.append(_rls_snapshot(run, engine, classes))
            if seen in points:
                anytime.add(seen, boundaries[-1])
    final = RidgeModel(engine.state(), boundaries[-1].W[:, 0, :], classes, float(run.model.gamma), "rls",
                       run.model.dtype, seen)
    return boundaries, final


def _rls_snapshot(run: Run, engine: RLSEngine, classes: np.ndarray) -> Boundary:
    """The recursion's weights now: a copy, since the recursion updates W in place until a new class arrives."""
    W = to_numpy(checked_weights(engine.weights())).copy()
    return Boundary(classes.copy(), W[:, None, :], np.array([float(run.model.gamma)]))


def test_rows(run: Run, classes: np.ndarray | None = None, on_chunk: Callable[[int], None] = lambda n: None) -> GroupedRows:
    """The test rows of the stream's classes, read once, grouped by task; or, with ``classes`` (the classes of
    several class orders), the rows of those classes grouped by class."""
    test, n_classes = run.store.test, len(run.store.classes)
    if classes is None:
        groups, n_groups = run.stream.task_of_label(n_classes)[test.labels], run.stream.n_tasks
    else:
        groups, n_groups = np.where(np.isin(test.labels, classes), test.labels, -1), n_classes
    return GroupedRows(run.source("test"), run.lanes, groups, n_groups, run.execution.max_memory, on_chunk, run.xp)


@dataclass
class SharedRows:
    """Rows read once for several class orders (``--order-seeds``): the train and test rows of every order's
    classes, grouped by class, from which each order's walk takes its tasks."""

    train: GroupedRows
    test: GroupedRows

    def close(self) -> None:
        self.train.close()
        self.test.close()

    def __enter__(self) -> SharedRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shared_rows(runs: Sequence[Run], read: Callable[..., GroupedRows] | None = None) -> SharedRows:
    """The train and test rows of every run's stream (the same store), each split read once, grouped by class
    (the train split by ``read``, :func:`train_rows`'s signature; default :func:`train_rows`)."""
    run = runs[0]
    n_classes = len(run.store.classes)
    labels = run.store.train.labels
    groups = np.full(labels.shape, -1, dtype=np.int64)
    for r in runs:
        stream_rows = r.row_task >= 0
        groups[stream_rows] = labels[stream_rows]
    classes = np.unique(np.concatenate([np.concatenate(r.stream.tasks) for r in runs]))
    with progress_bar("read (one read, every order)", int(np.count_nonzero(groups >= 0))) as advance:
        train = (read or train_rows)(run, advance, groups, n_classes)
    try:
        return SharedRows(train, test_rows(run, classes))
    except BaseException:
        train.close()
        raise
