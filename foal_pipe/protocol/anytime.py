"""Anytime evaluation (``learn --eval-every N``, docs/streams.md): the weights after every N training rows of
the stream, and the accuracy curve and ``A_auc`` scored from them (Koh et al., ICLR 2022).

Every point is exact: the gram engine solves closed-form ridge on the running sums of the rows seen so far
(the walk's blocks end at each point, :class:`~foal_pipe.protocol.rowcache.TaskBlocks`), the rls engine takes
its recursion's own weights. Between task ends the gamma is the one chosen at the previous task end
(``--gamma auto``), the fixed gamma otherwise; before the first task end :data:`FIRST_GAMMA` under
``--gamma auto``. A point at a task end is that end's boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.solvers import Boundary

if TYPE_CHECKING:
    from foal_pipe.heads import Scorer
    from foal_pipe.protocol.run import Run

#: ``--gamma auto`` at points before the first task end, where no gamma has been chosen yet (learn's default).
FIRST_GAMMA = 1.0


@dataclass
class Anytime:
    """The evaluation points of one walk (rows seen: ``every``, ``2 every``, ... up to the stream's rows) and the
    weights recorded at each, in order."""

    run: Run
    every: int
    points: list[int] = field(init=False)
    samples: list[int] = field(default_factory=list)
    snapshots: list[Boundary] = field(default_factory=list)

    def __post_init__(self) -> None:
        total = int(sum(r.size for r in self.run.stream.rows))
        self.points = list(range(self.every, total + 1, self.every))

    @property
    def first_gamma(self) -> float:
        gamma = self.run.model.gamma
        return FIRST_GAMMA if gamma == "auto" else float(gamma)

    def add(self, samples: int, snapshot: Boundary) -> None:
        self.samples.append(samples)
        self.snapshots.append(snapshot)

    def gram(self, samples: int, running: RidgeStatistics, boundaries: list[Boundary], at_task_end: bool) -> None:
        """Record the gram walk at a point: its last boundary at a task end, else a solve on its ``running`` sums
        with the gamma of its last boundary (or :attr:`first_gamma`)."""
        if at_task_end:
            self.add(samples, boundaries[-1])
            return
        gamma = float(boundaries[-1].gammas[0]) if boundaries else self.first_gamma
        with self.run.timed("anytime solve"):
            W = RidgeModel.solved(running, gamma).weights
            self.add(samples, Boundary(running.classes, W[:, None, :], np.array([gamma])))


def curve_accuracy(hits: np.ndarray, class_totals: np.ndarray,
                   snapshots: Sequence[Boundary | Scorer]) -> list[float]:
    """The accuracy at each snapshot on the test rows of its classes (those seen so far), from ``hits[p, c]``:
    correct predictions of snapshot p on class c's test rows, ``class_totals[c]`` test rows of class c."""
    return [float(hits[p, b.classes].sum() / class_totals[b.classes].sum()) for p, b in enumerate(snapshots)]
