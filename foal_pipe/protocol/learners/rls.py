"""The rls engine in the walk (``learn --engine rls``): the stream replayed batch by batch with the paper's
recursion, W snapshot at every task end (and at the points of ``--eval-every``)."""

from __future__ import annotations

import numpy as np

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.core.engines import RLSEngine, checked_weights, grow_classes
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.config import RLS_WINDOW
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary
from foal_pipe.protocol.walk import Advance, Learner


class RLSLearner(Learner):
    """Each task's rows taken from the cache in stream order, ``RLS_WINDOW`` at a time, projected, and fed to the
    recursion in the stream's mini-batches. ``anytime``: W is also snapshot at its points; a task's windows end there
    too, so a batch that would straddle a point is cut in two (as batches are cut at windows and task ends).
    :attr:`boundaries` holds the task ends' weights, :attr:`final` the last model."""

    label = "rls"

    def __init__(self, run: Run, anytime: Anytime | None = None) -> None:
        super().__init__(run)
        self.anytime = anytime
        self.points = set(anytime.points) if anytime is not None else set()
        self.engine = RLSEngine(run.dim, run.model.gamma, run.xp, getattr(run.xp, run.model.dtype),
                                default_device(run.xp))
        self.boundaries: list[Boundary] = []
        self.classes: np.ndarray = np.empty(0, dtype=np.int64)
        self.seen = 0

    def start(self, rows: GroupedRows | None) -> None:
        super().start(rows)
        self.classes = np.empty(0, dtype=self.cache.labels.dtype)

    def add_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        run, task, seen, batch, rows = self.run, self.run.stream.rows[k], self.seen, self.run.stream.batch_size, self.cache
        cuts = sorted({*range(0, task.size, RLS_WINDOW), *(p - seen for p in self.points if seen < p < seen + task.size)})
        with run.timed("rls"):
            for lo, hi in zip(cuts, [*cuts[1:], task.size]):
                positions = rows.position[task[lo:hi]]
                H = run.projection.transform(rows.take(None, positions, run.xp), run.xp)
                labels = rows.labels[positions]
                for b in range(0, positions.size, batch):
                    self.classes = grow_classes(self.engine, self.classes, labels[b : b + batch])
                    self.engine.update(H[b : min(b + batch, positions.size), :], labels[b : b + batch], self.classes)
                advance(positions.size)
                if hi < task.size and seen + hi in self.points and self.anytime is not None:
                    self.anytime.add(seen + hi, self._snapshot())
        self.seen += task.size

    def end_task(self, k: int, rows: GroupedRows | None, advance: Advance) -> None:
        with self.run.timed("rls"):
            self.boundaries.append(self._snapshot())
        if self.seen in self.points and self.anytime is not None:
            self.anytime.add(self.seen, self.boundaries[-1])

    @property
    def final(self) -> RidgeModel:
        """The model after the last task."""
        return RidgeModel(self.engine.state(), self.boundaries[-1].W[:, 0, :], self.classes,
                          float(self.run.model.gamma), "rls", self.run.model.dtype, self.seen)

    def _snapshot(self) -> Boundary:
        """The recursion's weights now, and their drift from the exact solve: copies, since the recursion updates W
        in place until a new class arrives."""
        W = to_numpy(checked_weights(self.engine.weights())).copy()
        drift = to_numpy(self.engine.drift).copy()
        return Boundary(self.classes.copy(), W[:, None, :], np.array([float(self.run.model.gamma)]),
                        drift=drift[:, None, :])
