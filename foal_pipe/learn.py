"""``learn`` and ``sweep``: the online protocol over a feature store, evaluated after every task.

At each task boundary k both engines give the ridge solution over every training row of tasks 1..k:

* ``rls`` replays the stream batch by batch in stream order (reading each task's rows window by
  window), exactly as the paper's Algorithm 1.
* ``gram`` walks the tasks in stream order with one running :class:`~foal_pipe.statistics.RidgeStatistics`:
  task k's rows are read chunk by chunk (each chunk decoded once per task) and added, then the boundary is
  solved. Memory does not grow with the number of tasks: the running sums, one batch's Gram matrix and one
  block of rows (a leave-one-out run may also keep the rows' activations, below).

At a boundary the gram walk either solves for a fixed gamma (``learn --gamma 1``), or decomposes ``G``
once and serves many gammas (``sweep``, ``learn --gamma auto``): their weights, their GCV, and, after one
more pass over the rows seen so far, their exact leave-one-out scores. That pass multiplies the activations
kept from the rows' first projection (:class:`KeptActivations`, rows x D values) where ``--max-memory`` and
the machine allow; otherwise it is fused with the next task's pass, which decodes each chunk once per task and
projects the rows seen so far again. Test accuracy for every boundary (and every
gamma) is computed in one pass over the test split at the end.

``sweep --fusions`` walks several fusions of a blocks store at once: each blocks chunk is decoded once and
fused every way (:class:`~foal_pipe.blockfusion.FusedSplits`), and each fusion keeps its own running
statistics (a :class:`_Lane`), so the walk is the same one with a lane per fusion.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from array_api_compat import device

from foal_pipe.backend import default_device, get_namespace, resolve_backend, resolve_dtype
from foal_pipe.blockfusion import FusedSplits, parse_fusions
from foal_pipe.classifier import AnalyticClassifier
from foal_pipe.engines import ENGINES, GCV_DOF_WARNING, check_gamma
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_dir, check_output_dir, write_json
from foal_pipe.memory import DEFAULT_MAX_MEMORY, check_memory, fits, human
from foal_pipe.metrics import summarize
from foal_pipe.modelfile import MODEL_FILE
from foal_pipe.progress import progress_bar
from foal_pipe.projection import SmoothProjection, check_activation
from foal_pipe.scoring import ModelScores, Rows
from foal_pipe.statistics import DEFAULT_GAMMA_GRID, GammaPath, LeaveOneOut, RidgeStatistics
from foal_pipe.store import FeatureStore, open_store
from foal_pipe.stream import Stream, build_stream, dropped_warning, read_class_order

#: Rows projected at once on the RLS path (bounds memory at window x (d + D) values).
RLS_WINDOW = 8192
#: Rows projected at once elsewhere: at most this many activation values (a store chunk at D = 1000).
BLOCK_VALUES = 2**22
#: The part of the memory estimate that the kept leave-one-out activations take.
KEPT_PART = "activations kept for leave-one-out"
#: How each criterion ranks gammas: the key of a sweep result and whether larger is better.
CRITERIA: dict[str, tuple[str, bool]] = {"loo": ("loo_mse", False), "gcv": ("gcv", False), "test": ("A_avg", True)}


@dataclass(frozen=True)
class StreamConfig:
    """How the stream is built (docs/protocol.md section 3; the task split: :mod:`foal_pipe.stream`)."""

    tasks: int | None = None  # None: stream.DEFAULT_TASKS, at most one task per class
    batch_size: int = 10
    seed: int = 0
    class_order: Path | None = None
    drop_last: bool = False
    order_seed: int | None = None  # the class order's and shuffles' seed; None: ``seed`` (which fixes the projection)
    drop_remainder: bool = False  # split evenly and drop the classes left over (the published code)

    @property
    def resolved_order_seed(self) -> int:
        return self.seed if self.order_seed is None else self.order_seed


@dataclass(frozen=True)
class ModelConfig:
    """The expansion and the ridge classifier on it.

    ``gamma`` is a number, or ``"auto"``: chosen at every task boundary on the training rows seen so far,
    by leave-one-out MSE (``select="loo"``) or GCV (``select="gcv"``), among ``gamma_grid``.
    ``activation=None`` means the paper's sigmoid, or identity when ``projection_dim`` is 0 (raw features).
    ``fusion`` (a :func:`~foal_pipe.blockfusion.parse_fusion` spec) fuses the store's per-block tokens at read
    time instead of using its stored features (stores made with ``extract --keep-blocks``); ``fusion_norm``
    applies the stored final norm after it.
    """

    projection_dim: int = 1000
    projection_init: str = "uniform"
    activation: str | None = None
    gamma: float | str = 1.0
    select: str = "loo"
    gamma_grid: tuple[float, ...] = DEFAULT_GAMMA_GRID
    engine: str = "gram"
    dtype: str = "float64"
    fusion: str | None = None
    fusion_norm: bool = True

    @property
    def resolved_activation(self) -> str:
        if self.activation is not None:
            return self.activation
        return "identity" if self.projection_dim == 0 else "sigmoid"


@dataclass(frozen=True)
class EvaluationConfig:
    """How the test split is scored: ``mask_unseen`` restricts the argmax to the classes seen so far."""

    mask_unseen: bool = True


@dataclass(frozen=True)
class ExecutionConfig:
    """Where the work runs: the array backend, ``dask`` for the Gram statistics on a cluster, and ``max_memory``
    (bytes), the most an optional speed-up may hold: the activations kept for leave-one-out."""

    backend: str = "auto"
    scheduler: str = "local"
    dask_address: str | None = "local"
    workers: int = 2
    max_memory: int = DEFAULT_MAX_MEMORY


@dataclass(frozen=True)
class SweepConfig:
    """Which gammas ``sweep`` scores and how it names the best: ``loo`` (LOO MSE), ``gcv`` or ``test`` (an oracle)."""

    gammas: tuple[float, ...] = DEFAULT_GAMMA_GRID  # the grid `learn --gamma auto` chooses from
    select: str | None = None  # None: loo, or gcv with loo=False
    loo: bool = True
    fusions: tuple[str, ...] = ()  # fusion specs of a blocks store, all from one walk; (): the store's features

    @property
    def resolved_select(self) -> str:
        return self.select or ("loo" if self.loo else "gcv")


@dataclass
class Boundary:
    """The models after task k: ``W`` (D, M, C_k) for ``gammas`` (M), with the selection criteria over the grid."""

    classes: np.ndarray
    W: Any
    gammas: np.ndarray
    gcv: np.ndarray | None = None
    loo_accuracy: np.ndarray | None = None
    loo_mse: np.ndarray | None = None
    gcv_dof_ratio: float | None = None  # df/n at GCV's choice


@dataclass
class Run:
    """Everything validated before any work: the store, the stream, the projection, the settings."""

    store: FeatureStore
    stream: Stream
    projection: SmoothProjection
    backend: str
    xp: Any
    model: ModelConfig
    evaluation: EvaluationConfig
    execution: ExecutionConfig
    test_totals: np.ndarray  # test rows per task
    row_task: np.ndarray  # task of every train row, -1 for rows outside the stream
    timings: dict[str, float] = field(default_factory=dict)
    keep_activations: bool = False  # leave-one-out multiplies kept activations instead of projecting rows again
    fused: dict[str, FusedSplits] | None = None  # sweep --fusions: {"train", "test"}, every fusion from one read

    @property
    def lanes(self) -> tuple[str | None, ...]:
        """What the walk keeps statistics for: every fusion of ``fused``, or the store's features (None)."""
        return self.fused["train"].specs if self.fused is not None else (None,)

    def source(self, split: str) -> Any:
        """Where a split's chunks come from: ``iter_chunks`` gives ``{fusion: X}`` with ``fused``, else ``X``."""
        return self.fused[split] if self.fused is not None else self.store.split(split)

    @property
    def dim(self) -> int:
        return int(self.projection.components_.shape[1])

    @property
    def block_rows(self) -> int:
        return max(1, BLOCK_VALUES // max(self.dim, 1))

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[step] = self.timings.get(step, 0.0) + time.perf_counter() - start


def parse_gamma(value: float | str) -> float | str:
    """A positive number, or ``"auto"``."""
    return "auto" if value == "auto" else check_gamma(value)


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
) -> Run:
    """Validate everything before any work: settings, store, stream, projection, memory.

    ``fusions`` (``sweep --fusions``) walks every fusion of the store's blocks at once (:attr:`Run.fused`).
    """
    if model.gamma != "auto":
        check_gamma(model.gamma)
    elif model.engine != "gram":
        raise FoalPipeError("--gamma auto needs --engine gram (the RLS recursion fixes gamma in R0 = I/gamma)")
    if model.select not in ("loo", "gcv"):
        raise FoalPipeError(f"unknown --select {model.select!r}; choose loo or gcv")
    for g in model.gamma_grid:
        check_gamma(g)
    if model.projection_dim < 0:
        raise FoalPipeError(f"--projection-dim must be at least 0 (0: no projection), got {model.projection_dim}; the paper uses 1000")
    check_activation(model.resolved_activation)
    if model.engine not in ENGINES:
        raise FoalPipeError(f"unknown engine {model.engine!r}; choose one of {', '.join(ENGINES)}")
    if execution.scheduler not in ("local", "dask"):
        raise FoalPipeError(f"unknown scheduler {execution.scheduler!r}; choose local or dask")
    if fusions and model.fusion is not None:
        raise FoalPipeError("pass --fusion (one fusion) or --fusions (several, one walk), not both")
    option = "--fusions" if fusions else "--fusion"
    if (fusions or model.fusion is not None) and execution.scheduler == "dask":
        raise FoalPipeError(f"{option} reads the stored blocks in this process; Dask workers read the stored features, "
                            f"so use --scheduler local with {option}")
    if model.engine == "rls" and execution.scheduler == "dask":
        raise FoalPipeError("--engine rls is sequential and runs in one process; use --engine gram with --scheduler dask")
    resolve_dtype(model.dtype)
    backend = resolve_backend(execution.backend)
    store = open_store(features, fusion=model.fusion, fusion_norm=model.fusion_norm)
    fused = store.fusions(parse_fusions(list(fusions), "--fusions"), model.fusion_norm) if fusions else None
    store.check_labelled()
    n_classes = len(store.classes)
    order = read_class_order(stream_config.class_order, n_classes) if stream_config.class_order else None
    stream = build_stream(
        store.train.labels, n_classes, stream_config.tasks, stream_config.batch_size, stream_config.resolved_order_seed, order,
        stream_config.drop_last, stream_config.drop_remainder,
    )
    test_totals = count_test_rows(stream, store.test.labels, n_classes)
    projection = SmoothProjection(
        n_components=model.projection_dim, init=model.projection_init, activation=model.resolved_activation,
        random_state=stream_config.seed, dtype=model.dtype,
    ).fit(np.zeros((1, fused["train"].dim if fused else store.dim)))  # fit reads only the feature count
    run = Run(store, stream, projection, backend, get_namespace(backend), model, evaluation, execution, test_totals,
              stream.row_tasks(store.train.n_rows), fused=fused)
    parts = memory_parts(run, n_models, loo)
    if loo:
        kept = {KEPT_PART: kept_bytes(run)}
        run.keep_activations = kept[KEPT_PART] <= execution.max_memory and fits({**parts, **kept})
        if run.keep_activations:
            parts.update(kept)
    check_memory(command, parts, "lower --projection-dim, use --dtype float32, fewer --gammas, or free memory")
    return run


def kept_bytes(run: Run) -> int:
    """What keeping the activations of every train row of the stream takes (rows x D in the state's dtype, for
    each fusion of ``sweep --fusions``)."""
    rows = int(np.count_nonzero(run.row_task >= 0))
    return rows * run.dim * np.dtype(run.model.dtype).itemsize * len(run.lanes)


def reread_note(run: Run) -> str:
    """Why a leave-one-out run projects the rows again at every boundary (the activations were not kept)."""
    need = kept_bytes(run)
    limit = (f"above --max-memory {human(run.execution.max_memory)}" if need > run.execution.max_memory
             else "more than the available memory allows")
    return (f"note: leave-one-out reads and projects the rows seen so far again at every task boundary (slower): "
            f"keeping their activations needs {human(need)}, {limit}; raise --max-memory or free memory to keep them")


def memory_parts(run: Run, n_models: int, loo: bool) -> dict[str, int]:
    """The estimated peak, by what holds it (bytes): the state at its largest phase, one block of rows, the
    boundaries' weights kept for the test pass; the state and the weights once per lane (``sweep --fusions``:
    each fusion keeps its statistics and its pending boundary through the walk)."""
    D, item = run.dim, np.dtype(run.model.dtype).itemsize
    square = D * D
    eigen = run.model.gamma == "auto" or n_models > 1
    if run.model.engine == "rls":
        state = 2 * square * item  # R and one update's D x D product
    elif eigen:  # G, its float64 copy / eigenvectors, LAPACK's 2 D^2 workspace; during LOO, V beside G and a batch Gram
        state = square * item + 4 * square * 8
    else:  # G and one batch's Gram while summing; G and G + gamma I at a solve
        state = square * item + square * max(item, 8)
    n_classes = len(run.store.classes)
    block = run.block_rows * (D * 8 * 3 + run.store.dim * 8)
    if loo:
        block += run.block_rows * (D + 3 * n_models * n_classes) * 8
    lanes = len(run.lanes)
    chunk = (run.fused["train"].chunk_bytes if run.fused is not None
             else run.store.train.chunk_rows * run.store.dim * run.store.train.features.dtype.itemsize)
    per_lane = f" x {lanes} fusions" if lanes > 1 else ""
    return {
        f"state at D={D}{per_lane}": state * lanes,
        "a block of rows": block + chunk,
        f"weights of every boundary{per_lane}": run.stream.n_tasks * D * n_models * n_classes * 8 * lanes,
    }


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


# ----------------------------------------------------------------------------------------------
# What happens at a boundary


class FixedGamma:
    """Solve for one gamma at each boundary (``learn --gamma G``); ``classifier`` is the last boundary's."""

    needs_rows = False

    def __init__(self, gamma: float, dtype: str) -> None:
        self.gamma, self.dtype = gamma, dtype
        self.classifier: AnalyticClassifier | None = None

    def start(self, statistics: RidgeStatistics, max_task: int) -> Boundary:
        self.classifier = AnalyticClassifier.from_statistics(statistics, gamma=self.gamma, dtype=self.dtype)
        W = self.classifier.weights_  # solved once: saving the last classifier reuses it
        return Boundary(statistics.classes, W[:, None, :], np.array([self.gamma]))

    def finish(self, state: Boundary) -> Boundary:
        return state


@dataclass
class _Pending:
    """A boundary waiting for its leave-one-out pass."""

    statistics_classes: np.ndarray
    path: GammaPath
    gcv: np.ndarray
    loo: LeaveOneOut | None
    max_task: int


class ManyGammas:
    """One factorisation per boundary serves every gamma of ``grid``: weights, GCV and (``loo``) LOO.

    Leave-one-out needs the eigenvectors; without it the cheaper tridiagonal form serves (see
    :meth:`RidgeStatistics.gamma_path`). ``choose`` (``loo`` or ``gcv``) keeps only the chosen gamma's
    weights (``learn --gamma auto``); None keeps all of them (``sweep``).
    """

    def __init__(self, grid: Sequence[float], loo: bool, choose: str | None) -> None:
        self.grid = np.asarray(grid, dtype=np.float64)
        self.needs_rows = loo
        self.choose = choose

    def start(self, statistics: RidgeStatistics, max_task: int) -> _Pending:
        path = statistics.gamma_path(vectors=self.needs_rows)
        loo = path.loo(self.grid) if self.needs_rows else None
        return _Pending(statistics.classes, path, path.gcv(self.grid), loo, max_task)

    def finish(self, pending: _Pending) -> Boundary:
        path, gcv = pending.path, pending.gcv
        accuracy = pending.loo.accuracy() if pending.loo else None
        mse = pending.loo.mse() if pending.loo else None
        best_gcv = int(np.argmin(gcv))
        ratio = float(path.dof(self.grid[best_gcv : best_gcv + 1])[0]) / max(path.n, 1)
        if self.choose is None:
            gammas = self.grid
        else:
            scores = mse if self.choose == "loo" else gcv
            gammas = self.grid[[int(np.argmin(scores))]]
        return Boundary(pending.statistics_classes, path.weights(gammas), gammas, gcv, accuracy, mse, ratio)


# ----------------------------------------------------------------------------------------------
# The walk over the tasks


@dataclass
class _Lane:
    """One feature set's walk (the store's features, or one fusion of ``sweep --fusions``): its running sums,
    its solved boundaries and the boundary waiting for its leave-one-out pass."""

    solver: FixedGamma | ManyGammas
    running: RidgeStatistics
    boundaries: list[Boundary] = field(default_factory=list)
    pending: _Pending | None = None

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
    from foal_pipe.distributed import dask_client, dask_statistics

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


# ----------------------------------------------------------------------------------------------
# Evaluation


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


def ragged(acc: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in acc[i, : i + 1]] for i in range(acc.shape[0])]


def _report(acc: np.ndarray) -> dict[str, Any]:
    matrix = ragged(acc)
    return {**summarize(matrix), "accuracy_matrix": matrix}


def _run_info(run: Run, stream_config: StreamConfig) -> dict[str, Any]:
    return {
        "tasks": run.stream.tasks,
        "n_tasks": run.stream.n_tasks,
        "dropped_classes": run.stream.dropped,
        "drop_remainder": stream_config.drop_remainder,
        "projection_dim": run.model.projection_dim,
        "projection_init": run.model.projection_init,
        "activation": run.model.resolved_activation,
        "batch_size": stream_config.batch_size,
        "drop_last": stream_config.drop_last,
        "mask_unseen": run.evaluation.mask_unseen,
        "seed": stream_config.seed,
        "order_seed": stream_config.resolved_order_seed,
        "backend": run.backend,
        "dtype": run.model.dtype,
        "n_train_seen": int(sum(rows.size for rows in run.stream.rows)),
        "n_test": int(run.test_totals.sum()),
        "feature_dim": int(run.store.dim),
        "dataset": run.store.meta.dataset,
        "encoder": run.store.meta.encoder,
        "features": str(run.store.path),
    }


def _finite_or_none(values: np.ndarray | None) -> list[float | None] | None:
    return None if values is None else [float(v) if np.isfinite(v) else None for v in values]


# ----------------------------------------------------------------------------------------------
# The commands


def run_learn(
    features: str | Path,
    out: str | Path,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train through the stream, evaluate after each task; write ``metrics.json``, ``model.safetensors``
    and ``timings.json`` (wall-clock seconds by step, not a pipeline output) into ``out`` as one unit."""
    start = time.perf_counter()
    check_output_dir(out)
    auto = model.gamma == "auto"
    loo = auto and model.select == "loo"
    run = prepare(features, stream, model, evaluation, execution, n_models=1, loo=loo)
    _warn_dropped(run, stream, log)
    if loo and not run.keep_activations:
        log(reread_note(run))
    with np.errstate(all="ignore"):  # overflow is caught by the finiteness checks of the solves
        if model.engine == "rls":
            boundaries, final = rls_boundaries(run)
        else:
            if auto:
                boundaries, statistics = gram_boundaries(run, ManyGammas(model.gamma_grid, loo, model.select))
                final = AnalyticClassifier.from_statistics(statistics, gamma=float(boundaries[-1].gammas[0]),
                                                           dtype=model.dtype)
            else:
                solver = FixedGamma(float(model.gamma), model.dtype)
                boundaries, _ = gram_boundaries(run, solver)
                final = solver.classifier
        acc = accuracy_matrices(run, boundaries)[0]
    metrics = learn_metrics(run, stream, acc, boundaries)
    if auto and model.select == "gcv":
        _warn_gcv(boundaries, model.gamma_grid, log)
    _warn_auto_edges(metrics, log)

    def write(tmp: Path) -> None:
        with run.timed("write"):
            save_model(final, run, tmp / MODEL_FILE)
            write_json(tmp / "metrics.json", metrics)

    metrics["timings"] = write_outputs(out, [run], start, write)
    return metrics


def run_sweep(
    features: str | Path,
    out: str | Path,
    sweep: SweepConfig,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score every gamma from one walk over the train split and one pass over the test split; write
    ``sweep.json`` (and ``timings.json``). ``model.gamma`` and ``model.engine`` are not used.

    With ``sweep.fusions``, every fusion x gamma from that one walk (each blocks chunk decoded once per task):
    ``sweep.json`` keeps the single-sweep keys for the fusion chosen overall, and adds ``fusions`` (each
    fusion's ``results``, ``best_gamma``, ``best_gamma_test``), ``best`` and the oracle ``best_test``
    (``{"fusion", "gamma"}`` over every fusion x gamma).
    """
    start = time.perf_counter()
    if not sweep.gammas:
        raise FoalPipeError("--gammas is empty; pass a comma-separated list such as 1e-3,1e-2,1e-1,1,10")
    gammas = [check_gamma(g) for g in sweep.gammas]
    select = sweep.resolved_select
    if select not in CRITERIA:
        raise FoalPipeError(f"unknown --select {select!r}; choose one of {', '.join(CRITERIA)}")
    if select == "loo" and not sweep.loo:
        raise FoalPipeError("--select loo needs the leave-one-out pass; drop --no-loo or use --select gcv")
    fusions = [f.text for f in parse_fusions(list(sweep.fusions), "--fusions")] if sweep.fusions else []
    check_output_dir(out)
    run = prepare(features, stream, replace(model, gamma=1.0, engine="gram"), evaluation, execution,
                  n_models=len(gammas), loo=sweep.loo, command="sweep", fusions=fusions)
    _warn_dropped(run, stream, log)
    if sweep.loo and not run.keep_activations:
        log(reread_note(run))
    with np.errstate(all="ignore"):
        lanes = gram_walk(run, {key: ManyGammas(gammas, sweep.loo, None) for key in run.lanes})
        accs = lane_accuracies(run, {key: lane.boundaries for key, lane in lanes.items()})
    entries = {key: _sweep_entry(gammas, lane.boundaries, accs[key], sweep.loo, select)
               for key, lane in lanes.items()}
    if fusions:
        report = _fusions_report(gammas, [{"fusion": key, **entries[key]} for key in fusions], select, model)
    else:
        report = {"gammas": gammas, **entries[None]}
    report.update(_run_info(run, stream))
    for key, lane in lanes.items():
        _warn_gcv(lane.boundaries[-1:], gammas, log if key is None else lambda text, key=key: log(f"{key}: {text}"))
    flag_grid_edge(report, log)
    report["timings"] = write_outputs(out, [run], start, lambda tmp: write_json(tmp / "sweep.json", report))
    return report


def flag_grid_edge(report: dict[str, Any], log: Callable[[str], None]) -> None:
    """Record in a sweep report whether its ``best_gamma`` is on an edge of its ``gammas``; warn when it is."""
    gamma, grid = report["best_gamma"], report["gammas"]
    edge = grid_edge(gamma, grid)
    report["best_gamma_at_grid_edge"] = edge is not None
    if edge is not None:
        log(f"warning: the best gamma by {report['selected_by']}, {gamma:g}, is the {edge} of --gammas "
            f"({min(grid):g} .. {max(grid):g}); a better gamma may lie beyond the grid: extend --gammas")


def _sweep_entry(gammas: Sequence[float], boundaries: Sequence[Boundary], acc: np.ndarray, loo: bool,
                 select: str) -> dict[str, Any]:
    """One feature set's sweep: its choices and every gamma's results (the keys of a single sweep.json)."""
    results = []
    for m, g in enumerate(gammas):
        results.append({
            "gamma": g,
            **_report(acc[m]),
            "gcv": _finite_or_none(np.array([b.gcv[m] for b in boundaries])),
            "loo_accuracy": [float(b.loo_accuracy[m]) for b in boundaries] if loo else None,
            "loo_mse": _finite_or_none(np.array([b.loo_mse[m] for b in boundaries])) if loo else None,
        })
    return {"best_gamma": choose(results, select), "best_gamma_test": choose(results, "test"), "selected_by": select,
            "results": results}


def _fusions_report(gammas: Sequence[float], entries: Sequence[dict[str, Any]], select: str,
                    model: ModelConfig) -> dict[str, Any]:
    """``sweep --fusions``: the single-sweep keys of the fusion chosen overall (readers of one sweep read it),
    with every fusion's entry, the choice over every fusion x gamma, and the test oracle's, labelled as such."""
    fusion, gamma = choose_fusion(entries, select)
    oracle_fusion, oracle_gamma = choose_fusion(entries, "test")
    chosen = next(e for e in entries if e["fusion"] == fusion)
    per_fusion = [{k: e[k] for k in ("fusion", "best_gamma", "best_gamma_test", "results")} for e in entries]
    return {"gammas": gammas, "best_gamma": gamma, "best_gamma_test": chosen["best_gamma_test"], "selected_by": select,
            "results": chosen["results"], "fusion": fusion, "fusion_norm": model.fusion_norm,
            "best": {"fusion": fusion, "gamma": gamma, "selected_by": select},
            "best_test": {"fusion": oracle_fusion, "gamma": oracle_gamma, "selected_by": "test"},
            "fusions": per_fusion}


def _best_index(results: Sequence[dict[str, Any]], criterion: str) -> int:
    """The result that ``criterion`` prefers at the last task boundary (first of equals, in the given order)."""
    key, larger = CRITERIA[criterion]

    def value(r: dict[str, Any]) -> float:
        v = r[key][-1] if isinstance(r[key], list) else r[key]
        if v is None:
            return -np.inf if larger else np.inf
        return v

    scores = np.array([value(r) for r in results], dtype=np.float64)
    return int(np.argmax(scores) if larger else np.argmin(scores))


def choose(results: Sequence[dict[str, Any]], criterion: str) -> float:
    """The gamma that ``criterion`` prefers at the last task boundary (first of equals, in the given order)."""
    return float(results[_best_index(results, criterion)]["gamma"])


def choose_fusion(entries: Sequence[dict[str, Any]], criterion: str) -> tuple[str, float]:
    """The ``(fusion, gamma)`` that ``criterion`` prefers over every fusion's results (``entries``: ``fusion``
    and ``results`` each; first of equals, fusions in the given order). LOO MSE and GCV compare across fusions:
    the same rows, the same one-hot targets, the same projection size."""
    flat = [(e["fusion"], r) for e in entries for r in e["results"]]
    fusion, result = flat[_best_index([r for _, r in flat], criterion)]
    return fusion, float(result["gamma"])


def learn_metrics(run: Run, stream: StreamConfig, acc: np.ndarray, boundaries: Sequence[Boundary]) -> dict[str, Any]:
    """``metrics.json`` of one learned stream: the accuracy report, the run's settings and, with ``--gamma auto``,
    the gamma chosen at each boundary."""
    model = run.model
    metrics: dict[str, Any] = {**_report(acc), "gamma": "auto" if model.gamma == "auto" else float(model.gamma),
                               "engine": model.engine, **_run_info(run, stream)}
    if model.gamma == "auto":
        chosen = [float(b.gammas[0]) for b in boundaries]
        metrics.update(gammas_selected=chosen, selected_by=model.select, gamma_grid=[float(g) for g in model.gamma_grid],
                       gammas_at_grid_edge=[grid_edge(g, model.gamma_grid) is not None for g in chosen])
    return metrics


def grid_edge(gamma: float, grid: Sequence[float]) -> str | None:
    """``"smallest"`` or ``"largest"`` when ``gamma`` is that end of ``grid`` (of two values or more), else None:
    a gamma chosen there may be bettered beyond the grid."""
    lo, hi = min(grid), max(grid)
    if lo == hi:
        return None
    return "smallest" if gamma == lo else "largest" if gamma == hi else None


def _warn_auto_edges(metrics: dict[str, Any], log: Callable[[str], None]) -> None:
    """``learn --gamma auto``: warn when a boundary chose a gamma on an edge of the grid."""
    edges = [k for k, flagged in enumerate(metrics.get("gammas_at_grid_edge") or []) if flagged]
    if edges:
        grid, last = metrics["gamma_grid"], metrics["gammas_selected"][edges[-1]]
        log(f"warning: --gamma auto chose {last:g}, the {grid_edge(last, grid)} of --gamma-grid ({min(grid):g} .. "
            f"{max(grid):g}), at {len(edges)} of {len(metrics['gammas_selected'])} task boundaries; a better gamma "
            "may lie beyond the grid: extend --gamma-grid")


def save_model(final: AnalyticClassifier, run: Run, path: Path) -> None:
    """The model file of a run: the classifier with the run's projection, provenance and class names."""
    final.save(path, projection=run.projection, dataset=run.store.meta.dataset, encoder=run.store.meta.encoder,
               class_names=[run.store.classes[c] for c in final.classes_], activation=run.model.resolved_activation)


def write_outputs(out: str | Path, runs: Sequence[Run], start: float, write: Callable[[Path], None]) -> dict[str, float]:
    """Write a run's files (``write`` fills the directory it is given) and ``timings.json`` (each step's seconds
    summed over ``runs``) as one unit, after checking that no store changed while it was read; the timings."""
    for run in runs:
        run.store.check_unchanged()
    with atomic_dir(out) as tmp:
        write(tmp)
        timings: dict[str, float] = {}
        for run in runs:
            for step, seconds in run.timings.items():
                timings[step] = timings.get(step, 0.0) + seconds
        timings["total"] = time.perf_counter() - start
        timings = {step: round(seconds, 3) for step, seconds in sorted(timings.items())}
        write_json(tmp / "timings.json", timings)
    return timings


def _warn_gcv(boundaries: Sequence[Boundary], grid: Sequence[float], log: Callable[[str], None]) -> None:
    flagged = [k for k, b in enumerate(boundaries) if b.gcv_dof_ratio is not None and b.gcv_dof_ratio > GCV_DOF_WARNING]
    if flagged:
        b = boundaries[flagged[-1]]
        log(
            f"warning: GCV's choice has effective degrees of freedom {100 * b.gcv_dof_ratio:.0f}% of the rows "
            f"(above {100 * GCV_DOF_WARNING:.0f}%) at {len(flagged)} task boundar{'y' if len(flagged) == 1 else 'ies'}; "
            "GCV is unreliable as D nears n: prefer --select loo"
        )


def _warn_dropped(run: Run, stream: StreamConfig, log: Callable[[str], None]) -> None:
    message = dropped_warning(run.stream, len(run.store.classes), stream.class_order is not None)
    if message:
        log(message)
