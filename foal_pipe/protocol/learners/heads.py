"""The registry heads in the walk (:mod:`foal_pipe.heads`): each task's rows, in stream order and full-size blocks,
into every head's running state (a head may depend on the order: dual's recursion); a boundary model per head at
every task end and at the points of ``--eval-every``; and, at the end, the heads' exact leave-one-out hits from one
more pass over the cached rows. The rows each head takes (its space) are computed once per block, whatever the
number of heads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from foal_pipe.errors import ClassRefused
from foal_pipe.heads import HEADS, Head, Scorer
from foal_pipe.protocol.headscores import build_heads, head_reports, space_rows
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.walk import Advance, Learner, head_train_rows, walk


def in_stream_order(rows: GroupedRows, task: np.ndarray, size: int, cuts: Sequence[int] = ()) -> Iterator[np.ndarray]:
    """The cache positions of a task's rows in stream order, ``size`` at a time; a block also ends at each of
    ``cuts`` (offsets inside the task: ``--eval-every``'s points)."""
    starts = sorted({*range(0, task.size, size), *(c for c in cuts if 0 < c < task.size)})
    for lo, hi in zip(starts, [*starts[1:], task.size]):
        for first in range(lo, hi, size):
            yield rows.position[task[first : min(first + size, hi)]]


class HeadsLearner(Learner):
    """Every head of ``heads`` fed task k's rows in stream order, in blocks; :attr:`boundaries` holds each head's model
    at every task end and, with ``loo``, :attr:`loo_accuracy` the exact leave-one-out accuracy at the last boundary of
    each head that has one (:class:`~foal_pipe.heads.base.LeaveOneOut`). ``points`` (``--eval-every``: each head's
    list, filled here): the model of every head at each of ``run.evaluation.eval_every``'s points, the rows seen so
    far (the blocks end there; a task end's is its boundary). ``lane``: the fusion whose rows the heads take (``sweep
    --fusions``; None: the store's features). ``spaces``: the rows of a head that takes other rows than its own
    (``--head-rows``)."""

    def __init__(self, run: Run, heads: Mapping[str, Head], loo: bool = False,
                 points: Mapping[str, list[Scorer]] | None = None, lane: str | None = None,
                 spaces: Mapping[str, str] | None = None) -> None:
        super().__init__(run)
        self.heads, self.loo, self.lane = heads, loo, lane
        self.points: Mapping[str, list[Scorer]] = points if points is not None else {}
        self.every = run.evaluation.eval_every if points is not None else None
        self.space_of = {name: (spaces or {}).get(name, type(head).space) for name, head in heads.items()}
        self.boundaries: dict[str, list[Scorer]] = {name: [] for name in heads}
        self.loo_accuracy: dict[str, float] = {}
        self.seen = 0
        self.label = ", ".join(heads)

    def read(self, advance: Advance) -> GroupedRows:
        return head_train_rows(self.run, advance)

    def _boundary(self, head: Head) -> Scorer:
        """The head's model of the rows so far; a class it refuses is named as the store names it."""
        try:
            return head.boundary()
        except ClassRefused as exc:
            raise exc.named(dict(enumerate(self.run.store.classes))) from None

    def _blocks(self, rows: GroupedRows, positions: np.ndarray, spaces: set[str]) -> dict[str, Any]:
        with self.run.timed("read"):
            X = rows.take(self.lane, positions, self.run.xp)
        return space_rows(self.run, X, spaces)

    def add_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        run, every, task, rows = self.run, self.every, self.run.stream.rows[k], self.cache
        cuts = range(every - self.seen % every, task.size + 1, every) if every else ()
        done = 0
        for positions in in_stream_order(rows, task, run.block_rows, cuts):
            labels = rows.labels[positions]
            blocks = self._blocks(rows, positions, set(self.space_of.values()))
            for name, head in self.heads.items():
                with run.timed(f"head {name}"):
                    head.add(blocks[self.space_of[name]], labels)
            advance(positions.size)
            done += positions.size
            if every and done < task.size and (self.seen + done) % every == 0:
                for name, head in self.heads.items():
                    with run.timed(f"head {name}"):
                        self.points[name].append(self._boundary(head))
        self.seen += task.size

    def end_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        for name, head in self.heads.items():
            with self.run.timed(f"head {name}"):
                self.boundaries[name].append(self._boundary(head))
                if self.every and self.seen % self.every == 0:
                    self.points[name].append(self.boundaries[name][-1])

    def finish(self, rows: GroupedRows | None, advance: Advance) -> None:
        rows = self.cache
        loo_heads = {name: head for name, head in self.heads.items() if self.loo and hasattr(head, "loo_hits")}
        hits = dict.fromkeys(loo_heads, 0)
        for task in self.run.stream.rows if loo_heads else ():
            for positions in in_stream_order(rows, task, self.run.block_rows):
                blocks = self._blocks(rows, positions, {self.space_of[name] for name in loo_heads})
                for name, head in loo_heads.items():
                    with self.run.timed("loo"):
                        hits[name] += head.loo_hits(blocks[self.space_of[name]], rows.labels[positions])
        self.loo_accuracy = {name: count / self.seen for name, count in hits.items()}


def learn_heads(run: Run, names: Sequence[str], options: Mapping[str, Any], train: GroupedRows | None = None,
                test: GroupedRows | None = None, loo: bool = False,
                lane: str | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Every head of ``names`` through the stream and scored (on ``lane``'s rows: a fusion of ``sweep --fusions``):
    its accuracy fields (:func:`~foal_pipe.protocol.headscores.head_reports`) and, with ``loo``, the exact leave-one-out
    accuracy at the last boundary of the heads that have one."""
    learner = walk(run, [HeadsLearner(run, build_heads(run, names, options), loo, lane=lane)], train)[0]
    reports = head_reports(run, learner.boundaries, {name: HEADS[name].space for name in names}, test, lane=lane)
    return reports, learner.loo_accuracy
