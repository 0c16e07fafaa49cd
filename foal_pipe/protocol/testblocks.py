"""The one walk of the test split that every scorer shares (ridge's lanes, the analytic heads; by task or by
class): the stream's test rows read once (or taken from a cache several class orders share), put in the order the
scorer needs, and handed out in full-size blocks, each block's rows fetched only in the form its scorer asks for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.progress import progress_bar
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.walk import test_rows


def by_task(task_of: np.ndarray) -> np.ndarray:
    """The stream's rows sorted by task (stable: cache order within a task), so that in each full-size block the
    rows of tasks 1..k are a prefix, which boundary k scores."""
    return np.argsort(task_of, kind="stable")[np.count_nonzero(task_of < 0):]  # rows outside the stream (-1) sort first


def in_cache_order(task_of: np.ndarray) -> np.ndarray:
    """The stream's rows as cached: every snapshot scores every row, so no order is needed."""
    return np.flatnonzero(task_of >= 0)


@dataclass(frozen=True)
class EvalBlock:
    """One full-size block of test rows: ``labels`` and ``tasks`` (the task each row's class is first seen in) of
    the rows at cache ``positions``; their features are taken only when a scorer asks, in the form it scores."""

    run: Run
    cached: GroupedRows
    positions: np.ndarray
    labels: np.ndarray
    tasks: np.ndarray

    def features(self, lane: str | None = None) -> Any:
        """The rows of ``lane`` (:attr:`Run.lanes`) as cached, on the run's namespace (the heads' spaces start here)."""
        return self.cached.take(lane, self.positions, self.run.xp)

    def projected(self, lane: str | None = None) -> Any:
        """The rows of ``lane`` through the run's projection, as ridge's models score them."""
        return self.run.projection.transform(self.features(lane), self.run.xp)


def eval_blocks(run: Run, label: str, order: Callable[[np.ndarray], np.ndarray],
                rows: GroupedRows | None = None) -> Iterator[EvalBlock]:
    """The stream's test rows in ``order`` (:func:`by_task`, :func:`in_cache_order`; given the task of each cached
    row, -1 outside the stream), :attr:`Run.block_rows` at a time, from one read of the test split (or ``rows``,
    :func:`~foal_pipe.protocol.walk.test_rows` with ``classes``, a read several class orders share). The read and
    the scoring of every block count as the run's "test" time, under one progress bar ``label``."""
    n_test = int(run.test_totals.sum())
    with progress_bar(label, n_test * (1 if rows else 2), shown=n_test) as advance, run.timed("test"), \
            (nullcontext(rows) if rows else test_rows(run, on_chunk=advance)) as cached:
        task_of = run.stream.task_of_label(len(run.store.classes))[cached.labels]
        ordered = order(task_of)
        for start in range(0, ordered.size, run.block_rows):
            positions = ordered[start : start + run.block_rows]
            yield EvalBlock(run, cached, positions, cached.labels[positions], task_of[positions])
            advance(positions.size)
