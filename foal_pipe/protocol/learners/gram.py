"""Ridge's Gram lanes in the walk: a running :class:`~foal_pipe.core.statistics.RidgeStatistics` per lane (the store's
features, or each fusion of ``sweep --fusions``), added in full-size blocks (:class:`~foal_pipe.protocol.rowcache.
TaskBlocks`), solved at every boundary for one gamma or a gamma path, with the leave-one-out pass over the rows of
tasks 1..k (their :class:`KeptActivations`, when kept), every task's sums from Dask when asked, and the points of
``--eval-every`` (:class:`~foal_pipe.protocol.anytime.Anytime`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import default_device
from foal_pipe.core.statistics import Factored, RidgeStatistics
from foal_pipe.protocol.ahead import (
    EIGH_COST,
    REDUCTION_COST,
    FactorAhead,
    ahead_blocks,
    can_run_ahead,
    factored_copy,
    second_thread,
)
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.erasedrows import check_erased_blocks
from foal_pipe.protocol.internal import internal_error
from foal_pipe.protocol.rowcache import GroupedRows, TaskBlocks
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas, Pending, Solver
from foal_pipe.protocol.walk import Advance, Learner, n_stream

#: A lane's boundary solver: one gamma, or one that may wait for the rows (the gamma path; a continued model's).
LaneSolver: TypeAlias = FixedGamma | Solver


@dataclass
class Lane:
    """One feature set's walk (the store's features, or one fusion of ``sweep --fusions``): its running sums,
    its solved boundaries and the boundary waiting for its leave-one-out pass."""

    solver: LaneSolver
    running: RidgeStatistics
    boundaries: list[Boundary] = field(default_factory=list)
    pending: Pending | None = None

    def finish(self, run: Run) -> None:
        pending, solver = self.pending, self.solver
        if pending is not None and not isinstance(solver, FixedGamma):  # one gamma never waits for the rows
            with run.timed("loo"):
                solver.zoom(pending)
            with run.timed("solve"):
                self.boundaries.append(solver.finish(pending))
            self.pending = None

    def start(self, run: Run, k: int, statistics: RidgeStatistics | None = None, factored: Factored | None = None) -> None:
        """Boundary ``k`` of the running sums, or of ``statistics`` (their copy at the boundary) with ``factored``
        (their factorisation, computed ahead: :class:`FactorAhead`)."""
        solver, statistics = self.solver, self.running if statistics is None else statistics
        with run.timed("solve"):
            if isinstance(solver, FixedGamma):
                self.boundaries.append(solver.solve(statistics, k))
                return
            pending = solver.start(statistics, k, factored) if isinstance(solver, ManyGammas) else solver.start(statistics, k)
            if solver.needs_rows:
                self.pending = pending
            else:
                self.boundaries.append(solver.finish(pending))

    def ahead(self, k: int) -> tuple[Callable[[], Boundary | tuple[RidgeStatistics, Factored]], float]:
        """Boundary ``k``'s work that can run off the walk's thread (:class:`FactorAhead`), on a copy of the running
        sums, and its cost in flops: without leave-one-out the whole boundary (each of its steps is on one BLAS
        thread), else the factorisation (:meth:`start` takes it up)."""
        solver = self.solver
        if not isinstance(solver, ManyGammas):
            raise internal_error(f"a boundary of {type(solver).__name__} run ahead")
        statistics = self.running.copy()
        D = statistics.dim
        vectors = solver.vectors(statistics, k)
        if not solver.needs_rows and statistics.factor_is_reduction(vectors):
            columns = solver.weights_per_class * statistics.classes.size
            return partial(solver.solve, statistics, k), REDUCTION_COST * D**3 + 2.0 * D**2 * columns
        return partial(factored_copy, statistics, vectors), (EIGH_COST if vectors else REDUCTION_COST) * D**3

    def take_ahead(self, run: Run, k: int, result: Boundary | tuple[RidgeStatistics, Factored]) -> None:
        """Boundary ``k`` from what :meth:`ahead` computed."""
        if isinstance(result, Boundary):
            self.boundaries.append(result)
        else:
            self.start(run, k, *result)

    def add_loo(self, H: Any, labels: np.ndarray) -> None:
        """Rows into the pending boundary's leave-one-out pass (:meth:`start` left it, its solver needing the rows)."""
        if self.pending is None or self.pending.loo is None:
            raise internal_error("a leave-one-out pass with no pending boundary")
        self.pending.loo.add(H, labels)


class KeptActivations:
    """The activations of the stream's train rows in walk order, stored as the walk first projects them
    (``--gamma auto``, ``sweep``): the leave-one-out pass at boundary k multiplies walk rows ``[0, ends[k])``
    instead of projecting the rows again. They are the arrays the Gram pass summed, in the blocks a projection
    again would use (:class:`~foal_pipe.rowcache.TaskBlocks`), so the same bits either way. With ``keep`` (the
    walk positions of the rows a sampled leave-one-out scores, :attr:`RowSample.kept`) only those rows are stored."""

    def __init__(self, run: Run, n_rows: int, keep: np.ndarray | None = None) -> None:
        self.slot: np.ndarray | None = None
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
        if self.slot is None:
            raise internal_error("kept activations read by sample position, but every row was kept")
        xp = array_namespace(self.values)
        return xp.take(self.values, xp.asarray(self.slot[positions], device=device(self.values)), axis=0)


def _joined(parts: list[Any]) -> Any:
    """Blocks of rows, one after the other (one block: itself)."""
    return parts[0] if len(parts) == 1 else array_namespace(parts[0]).concat(parts, axis=0)


def _project(run: Run, X: Any) -> Any:
    with run.timed("project"):
        return run.projection.transform(X, run.xp)


def walk_positions(walk: TaskBlocks, n_tasks: int) -> np.ndarray:
    """The cache position of every walk position, in walk order (the blocks of every task, end to end)."""
    parts = [positions for k in range(n_tasks) for _, _, positions in walk.blocks(k)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class GramLearner(Learner):
    """Ridge's lanes (``solvers`` keyed by :attr:`Run.lanes`, all needing the rows or none): each task adds its rows
    in full-size blocks and, when the solvers need the rows, its boundary's leave-one-out pass takes the rows of
    tasks 1..k from the cache (their activations, when kept). With ``--scheduler dask`` the cluster computes every
    task's sums in one pass and the cache is read only for leave-one-out. ``on_task(k, lanes)`` is called after task
    k is added (tests check every boundary with it). ``anytime`` (``--eval-every``, one lane) records the weights at
    its points: the blocks end there (:class:`TaskBlocks`); a point inside a task is solved from the running sums,
    one at a task end is that end's boundary. :attr:`lanes` holds each lane's boundaries and final sums."""

    def __init__(self, run: Run, solvers: Mapping[str | None, LaneSolver],
                 on_task: Callable[[int, dict[str | None, Lane]], None] | None = None,
                 anytime: Anytime | None = None) -> None:
        super().__init__(run)
        xp = run.xp
        self.lanes = {key: Lane(solver, RidgeStatistics.empty(run.dim, xp, getattr(xp, run.model.dtype)))
                      for key, solver in solvers.items()}
        first = next(iter(solvers.values()))
        self.needs_loo, self.sample = first.needs_rows, first.sample
        self.on_task, self.anytime = on_task, anytime
        self.dask = run.execution.scheduler == "dask"
        self.sizes = [r.size for r in run.stream.rows]
        self.kept: dict[str | None, KeptActivations] | None = None
        self._blocks: TaskBlocks | None = None
        self._positions: np.ndarray | None = None
        self._walk_of = np.zeros(0, dtype=np.int64)  # the walk position of each store row a sample names
        self.per_task: list[RidgeStatistics] | None = None
        self.label = "gram" + (", dask" if self.dask else "")
        self.label += (" + leave-one-out" + ("" if run.keep_activations and not self.dask else ", rows projected again")
                       if self.needs_loo else "")
        self.label += f", {len(self.lanes)} fusions" if len(self.lanes) > 1 else ""
        #: Whether the boundaries' work runs ahead (:class:`FactorAhead`): gamma paths on NumPy whose factorisations
        #: run on one BLAS thread, with nothing that reads a boundary inside the next task.
        self.ahead = (all(isinstance(solver, ManyGammas) for solver in solvers.values()) and not self.dask
                      and can_run_ahead(run) and anytime is None and on_task is None)
        self._ahead: FactorAhead | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def boundaries(self) -> list[Boundary]:
        """The store's lane's boundaries (one lane)."""
        return self.lanes[None].boundaries

    @property
    def running(self) -> RidgeStatistics:
        """The store's lane's sums after the last task (one lane)."""
        return self.lanes[None].running

    @property
    def needs_rows(self) -> bool:
        return self.needs_loo or not self.dask

    @property
    def blocks(self) -> TaskBlocks:
        """The walk's blocks of the rows :meth:`start` was given."""
        if self._blocks is None:
            raise internal_error("the Gram lanes' blocks read before the walk gave them rows")
        return self._blocks

    @property
    def positions(self) -> np.ndarray:
        """The cache position of every walk position (a sampled leave-one-out's rows, by walk position)."""
        if self._positions is None:
            raise internal_error("walk positions read without a sampled leave-one-out")
        return self._positions

    def progress_total(self) -> int:
        n = n_stream(self.run)
        loo_rows = sum(np.cumsum(self.sizes)) if self.sample is None else sum(p.size for p in self.sample.boundaries)
        return (n if self.dask else 0) + n + (int(loo_rows) if self.needs_loo else 0)

    def begin(self, advance: Advance) -> None:
        if self.dask:
            self.per_task = _dask_task_statistics(self.run, advance)

    def start(self, rows: GroupedRows | None) -> None:
        super().start(rows)
        run = self.run
        points = self.anytime.points if self.anytime is not None else ()
        self._blocks = None if rows is None else TaskBlocks(rows, run.stream.rows, run.block_rows, points)
        if self.sample is not None and self.needs_loo:
            self._positions = walk_positions(self.blocks, run.stream.n_tasks)
            self._walk_of = np.full(self.cache.position.size, -1, dtype=np.int64)
            self._walk_of[self.cache.rows[self._positions]] = np.arange(self._positions.size)
        if self.needs_loo and run.keep_activations and not self.dask:  # else the cluster projected the Gram's rows
            keep = None if self.sample is None else self._walk_of[self.sample.kept]
            self.kept = {key: KeptActivations(run, n_stream(run), keep) for key in self.lanes}

    def add_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        if self.per_task is not None:
            with self.run.timed("gram"):
                self.lanes[None].running += self.per_task[k]
            advance(self.sizes[k])
        else:
            self._add_blocks(k, self.cache, advance)
        if self.on_task is not None:
            self.on_task(k, self.lanes)

    def end_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        if self.ahead and k + 1 < self.run.stream.n_tasks and self.sizes[k + 1] > 0:
            if self._executor is None:
                self._executor = second_thread()
            jobs = {key: lane.ahead(k) for key, lane in self.lanes.items()}
            self._ahead = FactorAhead(self._executor, k, {key: job for key, (job, _) in jobs.items()},
                                      ahead_blocks(self.run, sum(flops for _, flops in jobs.values())))
            return
        self._close(k, advance)

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.release()
            self._ahead = None
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def _catch_up(self, ahead: FactorAhead, advance: Advance) -> None:
        """The boundary whose work ran ahead, closed (until its jobs end, :meth:`close` waits for them on a failure)."""
        with self.run.timed("solve"):
            results = ahead.join()
        self._ahead = None
        self._close(ahead.k, advance, results)

    def _close(self, k: int, advance: Advance, ahead: dict[str | None, Any] | None = None) -> None:
        """Boundary ``k`` solved, its leave-one-out pass and zoom done (from what ran ahead, when it did)."""
        for key, lane in self.lanes.items():
            if ahead is None:
                lane.start(self.run, k)
            else:
                lane.take_ahead(self.run, k, ahead[key])
        if self.needs_loo:
            self._loo_pass(k, self.cache, advance)
            for lane in self.lanes.values():
                lane.finish(self.run)
        if self.anytime is not None and int(self.blocks.ends[k]) in self.anytime.points:
            self.anytime.gram(int(self.blocks.ends[k]), self.running, self.boundaries, True)

    def _activations(self, rows: GroupedRows, key: str | None, positions: np.ndarray) -> Any:
        """The activations of the cached rows at ``positions``, projected."""
        run = self.run
        with run.timed("read"):
            X = rows.take(key, positions, run.xp)
        return _project(run, X)

    def _add_blocks(self, k: int, rows: GroupedRows, advance: Advance) -> None:
        """Task ``k``'s rows into each lane's running sums, in full-size blocks (kept, when kept); at each block that
        ends at an evaluation point inside the task, the anytime point."""
        end = int(self.blocks.ends[k])
        for i, (start, stop, positions) in enumerate(self.blocks.blocks(k)):
            labels = rows.labels[positions]
            # the boundary before joins after the blocks projected (and all but the last summed) beside its work;
            # every lane's activations of the joining block come first, so that each lane's products run on the same
            # threads whatever the other lanes
            joining = self._ahead if self._ahead is not None and i + 1 >= self._ahead.blocks else None
            if joining is not None:
                projected = {key: self._activations(rows, key, positions) for key in self.lanes}
                self._catch_up(joining, advance)
            for key, lane in self.lanes.items():
                H = projected.pop(key) if joining is not None else self._activations(rows, key, positions)
                with self.run.timed("gram"):
                    if self.kept is not None:
                        self.kept[key].put(start, stop, H)
                    lane.running += RidgeStatistics.from_batch(H, labels)
            advance(stop - start)
            if self.anytime is not None and stop < end and stop in self.blocks.points:
                self.anytime.gram(stop, self.running, self.boundaries, False)
        if self._ahead is not None:
            self._catch_up(self._ahead, advance)

    def _loo_pass(self, k: int, rows: GroupedRows, advance: Advance) -> None:
        """Every row of tasks 1..k into each lane's pending leave-one-out accumulator, in the Gram pass's blocks; with
        a sample (:class:`~foal_pipe.protocol.loosample.RowSample`), the boundary's sampled rows only."""
        run, kept = self.run, self.kept
        if self.sample is not None:
            chosen_all = np.sort(self._walk_of[self.sample.boundaries[k]])  # in walk order
            for chosen, activations in self._sampled(k, rows, chosen_all):
                labels = rows.labels[self.positions[chosen]]
                for key, lane in self.lanes.items():
                    with run.timed("loo"):
                        lane.add_loo(activations[key], labels)
                advance(chosen.size)
            return
        for t in range(k + 1):
            for start, stop, positions in self.blocks.blocks(t):
                labels = rows.labels[positions]
                for key, lane in self.lanes.items():
                    H = kept[key].take(start, stop) if kept is not None else self._activations(rows, key, positions)
                    with run.timed("loo"):
                        lane.add_loo(H, labels)
                advance(stop - start)

    def _sampled(self, k: int, rows: GroupedRows, chosen_all: np.ndarray) -> Iterator[tuple[np.ndarray, dict[str | None, Any]]]:
        """The sampled walk positions ``chosen_all`` (sorted) of tasks 1..k in chunks of ``block_rows``, with each lane's
        activations: the kept ones, or else projected again in the Gram pass's own blocks and taken from them. BLAS
        rounds a row of a product by the shape of the block it is in, so projecting the sampled rows alone would move
        the last bits of what leave-one-out records; the whole blocks give the kept rows' bits (the same bytes on both
        routes). With Dask the Gram pass ran on the cluster, so its sampled rows are projected alone."""
        size, kept = self.run.block_rows, self.kept
        if kept is not None or self.dask:
            for lo in range(0, chosen_all.size, size):
                chosen = chosen_all[lo : lo + size]
                yield chosen, {key: kept[key].rows(chosen) if kept is not None
                               else self._activations(rows, key, self.positions[chosen]) for key in self.lanes}
            return
        parts: dict[str | None, list[Any]] = {key: [] for key in self.lanes}
        held = done = 0
        for t in range(k + 1):
            for start, stop, positions in self.blocks.blocks(t):
                a, b = (int(i) for i in np.searchsorted(chosen_all, (start, stop)))
                if a == b:
                    continue
                for key in self.lanes:
                    H = self._activations(rows, key, positions)
                    xp = array_namespace(H)
                    parts[key].append(xp.take(H, xp.asarray(chosen_all[a:b] - start, device=device(H)), axis=0))
                held += b - a
                while held >= size or (held and done + held == chosen_all.size):
                    take = min(size, held)
                    joined = {key: _joined(p) for key, p in parts.items()}
                    yield chosen_all[done : done + take], {key: H[:take] for key, H in joined.items()}
                    parts = {key: [H[take:]] if take < held else [] for key, H in joined.items()}
                    held, done = held - take, done + take


def _dask_task_statistics(run: Run, advance: Advance) -> list[RidgeStatistics]:
    """With ``--scheduler dask``: every task's statistics, computed on the cluster in one pass over the store, its
    rows checked for an activation that erases them (:func:`check_erased_blocks`)."""
    from foal_pipe.cluster import cluster_failure, dask_client, lost_or_unreachable
    from foal_pipe.protocol.distributed import dask_statistics

    path = str(Path(run.store.path).resolve())
    with dask_client(run.execution.dask_address, run.execution.workers) as client, run.timed("gram"):
        try:
            projection = client.scatter(run.projection, broadcast=True)
        except lost_or_unreachable() as exc:  # the cluster lost as the run starts
            raise cluster_failure(exc) from None
        return dask_statistics(client, path, run.row_task, run.stream.n_tasks, run.store.train.labels, projection,
                               run.block_rows, advance, shown=run.store.path,
                               erased=lambda found: check_erased_blocks(found, run.stream.rows, run.block_rows,
                                                                        run.store.train.n_rows, run.projection.activation))
