"""The one walk over the tasks, for every head: the train rows read once (:mod:`foal_pipe.protocol.rowcache`), then,
task by task, each :class:`Learner` adds the task's rows and closes its boundary. What differs between heads is the
learner's (:mod:`foal_pipe.protocol.learners`: ridge's Gram lanes, the rls engine's replay, the registry heads'
states); the loop, the read, the progress bar and the order of the steps are here. Also the row readers the walks
and the test passes share (:func:`train_rows`, :func:`head_train_rows`, :func:`test_rows`, :func:`shared_rows`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from foal_pipe.progress import progress_bar
from foal_pipe.protocol.internal import internal_error
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run

Advance = Callable[[int], None]


class Learner:
    """One learner's part of :func:`walk`. The walk calls :meth:`begin` (before the read), :meth:`start` with the
    cached rows, then for every task k :meth:`add_task` and :meth:`end_task`, and :meth:`finish` after the last;
    each reports its rows to ``advance``, whose total it declares in :meth:`progress_total`."""

    #: The progress bar's name for what it does.
    label: str = ""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._rows: GroupedRows | None = None

    @property
    def needs_rows(self) -> bool:
        """Whether the walk must read the train rows (ridge's Dask sums without leave-one-out do not)."""
        return True

    def read(self, advance: Advance) -> GroupedRows:
        """The one read of the train split this learner takes its rows from."""
        return train_rows(self.run, advance)

    def progress_total(self) -> int:
        """The rows it reports to ``advance``, besides the read's."""
        return n_stream(self.run)

    def begin(self, advance: Advance) -> None:
        """Work before the read (ridge's per-task sums on a cluster)."""

    def start(self, rows: GroupedRows | None) -> None:
        """The rows are read (None: none were needed nor given); kept as :attr:`cache`."""
        self._rows = rows

    @property
    def cache(self) -> GroupedRows:
        """The rows :meth:`start` was given: a learner that :attr:`needs_rows` always has them."""
        if self._rows is None:
            raise internal_error(f"the walk gave no rows to {type(self).__name__}, which needs them")
        return self._rows

    def add_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        """Task ``k``'s rows into the running state (every learner has its own)."""
        raise NotImplementedError

    def end_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        """Task ``k``'s boundary."""

    def finish(self, rows: GroupedRows | None, advance: Advance) -> None:
        """After the last task, while the rows are still at hand."""

    def close(self) -> None:
        """After the walk, whether it ended or failed: what the learner holds beyond its results is let go."""


L = TypeVar("L", bound=Learner)


def walk(run: Run, learners: Sequence[L], rows: GroupedRows | None = None) -> Sequence[L]:
    """Walk the stream's tasks once with every learner of ``learners``, in order at each step; the learners.

    The train rows are read once (the first learner's :meth:`Learner.read` that needs them), or taken from
    ``rows``, a cache several walks share (:func:`shared_rows`; sweep's ridge and heads)."""
    read = rows is None and any(learner.needs_rows for learner in learners)
    total = (n_stream(run) if read else 0) + sum(learner.progress_total() for learner in learners)
    label = "train (" + ("one read, " if read else "") + ", ".join(learner.label for learner in learners) + ")"
    with progress_bar(label, total, shown=n_stream(run)) as advance, ExitStack() as closing:
        for learner in learners:
            closing.callback(learner.close)
            learner.begin(advance)
        reader = next((learner for learner in learners if learner.needs_rows), None)
        with (reader.read(advance) if read and reader is not None else nullcontext(rows)) as cached:
            for learner in learners:
                learner.start(cached)
            for k in range(run.stream.n_tasks):
                for learner in learners:
                    learner.add_task(k, cached, advance)
                for learner in learners:
                    learner.end_task(k, cached, advance)
            for learner in learners:
                learner.finish(cached, advance)
    return learners


def n_stream(run: Run) -> int:
    """The stream's training rows."""
    return int(sum(r.size for r in run.stream.rows))


def train_rows(run: Run, on_chunk: Advance = lambda n: None, groups: np.ndarray | None = None,
               n_groups: int | None = None) -> GroupedRows:
    """The stream's train rows of every lane, each chunk decoded once, grouped by task (or by ``groups``, e.g.
    by class for several class orders; see :mod:`foal_pipe.rowcache`)."""
    with run.timed("read"):
        return GroupedRows(run.source("train"), run.lanes, run.row_task if groups is None else groups,
                           run.stream.n_tasks if n_groups is None else n_groups, run.execution.max_memory, on_chunk,
                           run.xp)


def head_train_rows(run: Run, on_chunk: Advance = lambda n: None, groups: np.ndarray | None = None,
                    n_groups: int | None = None) -> GroupedRows:
    """The stream's train rows as the heads take them, read once (:func:`train_rows`, grouped by task or by
    ``groups``); with ``--scheduler dask`` the cluster reads and decodes the chunks
    (:class:`~foal_pipe.protocol.distributed.ClusterSplit`, the same bytes), and the heads' running states take the
    rows here, in stream order, as their definitions need."""
    if run.execution.scheduler != "dask":
        return train_rows(run, on_chunk, groups, n_groups)
    groups = run.row_task if groups is None else groups
    n_groups = run.stream.n_tasks if n_groups is None else n_groups
    from foal_pipe.cluster import dask_client
    from foal_pipe.protocol.distributed import BLOCK_BYTES, ClusterSplit

    source = run.source("train")
    step, n = int(source.chunk_rows), int(source.n_rows)
    starts = [lo for lo in range(0, n, step) if (groups[lo : lo + step] >= 0).any()]
    block = max(1, BLOCK_BYTES // max(1, step * int(source.dim) * np.dtype(source.features.dtype).itemsize))
    with dask_client(run.execution.dask_address, run.execution.workers) as client, run.timed("read"):
        split = ClusterSplit(source, client, str(Path(run.store.path).resolve()), run.model.fusion,
                             run.model.fusion_norm, "train", starts, block)
        return GroupedRows(split, run.lanes, groups, n_groups, run.execution.max_memory, on_chunk, run.xp)


def test_rows(run: Run, classes: np.ndarray | None = None, on_chunk: Advance = lambda n: None) -> GroupedRows:
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
