"""What happens at a task boundary: one gamma solved (:class:`FixedGamma`), or one factorisation serving
many (:class:`ManyGammas`), each giving a :class:`Boundary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from foal_pipe.core.gammapath import GammaPath, RidgeEigen, gcv_undeterminable
from foal_pipe.core.gammasearch import PER_DECADE, Rule, Search, best_point, search_grid, zoom
from foal_pipe.core.leaveoneout import LeaveOneOut, SampledLeaveOneOut, sample_needs_vectors
from foal_pipe.core.linalg import float64_way_out
from foal_pipe.core.statistics import Factored, RidgeStatistics
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.internal import internal_error
from foal_pipe.protocol.loosample import RowSample
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.runstate import row_sample

#: The leave-one-out criteria's zoom rules (:func:`~foal_pipe.core.gammasearch.zoom`): LOO accuracy's ties go
#: to the least LOO MSE.
LOO_RULES: dict[str, Rule] = {"loo": (CRITERIA["loo"].larger, None),
                              "loo_accuracy": (CRITERIA["loo_accuracy"].larger, "loo")}


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
    #: Each criterion's refined search (:func:`~foal_pipe.core.gammasearch.search_grid`), by criterion name.
    searches: dict[str, Search] | None = None
    #: With a sampled leave-one-out: the rows it scored and Hoeffding's bound on its accuracy at every gamma.
    loo_rows: int | None = None
    loo_bound: float | None = None
    #: The RLS recursion's weights: their departure from the exact solve of its sums (as ``W``), which the scores'
    #: ties check counts (:class:`~foal_pipe.core.scoring.Ties`).
    drift: Any = None
    #: ``learn --gamma auto``: the sums' resolution where the search left out the gammas at or below it (None: none).
    floor: float | None = None


class FixedGamma:
    """Solve for one gamma at each boundary (``learn --gamma G``); ``model`` is the last boundary's."""

    needs_rows = False
    sample: RowSample | None = None

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma
        self._model: RidgeModel | None = None

    @property
    def model(self) -> RidgeModel:
        """The last boundary's model (solved once: saving the last model reuses it)."""
        if self._model is None:
            raise internal_error("FixedGamma.model read before its first boundary")
        return self._model

    def start(self, statistics: RidgeStatistics, max_task: int) -> Boundary:
        self._model = model = RidgeModel.solved(statistics, self.gamma)
        return Boundary(statistics.classes, model.weights[:, None, :], np.array([self.gamma]))

    def finish(self, state: Boundary) -> Boundary:
        return state

    def solve(self, statistics: RidgeStatistics, max_task: int) -> Boundary:
        """The boundary at once (one gamma never waits for the rows)."""
        return self.finish(self.start(statistics, max_task))


@dataclass
class Pending:
    """A boundary waiting for its leave-one-out pass."""

    statistics: RidgeStatistics  # the path's: not added to until the boundary is finished
    path: GammaPath
    gcv: np.ndarray
    loo: LeaveOneOut | SampledLeaveOneOut | None
    max_task: int
    zoomed: tuple[dict[str, Rule], dict[str, np.ndarray], dict[str, np.ndarray]] | None = None  # :meth:`ManyGammas.zoom`
    cut: int = 0  # the refined grid's points at or below the sums' resolution, left out (:meth:`ManyGammas.usable`)


class Solver(Protocol):
    """A lane's solver that may wait for the rows (:class:`ManyGammas`; a continued model's wraps one or a
    :class:`FixedGamma`): :meth:`start` at a task end, then, when it :attr:`needs_rows`, the leave-one-out pass fills
    the :class:`Pending` boundary before :meth:`zoom` and :meth:`finish`."""

    @property
    def needs_rows(self) -> bool: ...

    @property
    def sample(self) -> RowSample | None: ...

    def start(self, statistics: RidgeStatistics, max_task: int) -> Pending: ...

    def zoom(self, pending: Pending) -> object: ...

    def finish(self, pending: Pending) -> Boundary: ...


class ManyGammas:
    """One factorisation per boundary serves every gamma of ``grid``: weights, GCV and (``loo``) LOO, and each
    criterion's refined search over ``per_decade`` points per decade of the grid's range.

    Leave-one-out over every row needs the eigenvectors; over ``sample``'s rows only
    (:class:`~foal_pipe.core.leaveoneout.SampledLeaveOneOut`) they serve when cheaper
    (:func:`~foal_pipe.core.leaveoneout.sample_needs_vectors`); otherwise the tridiagonal form serves (see
    :meth:`RidgeStatistics.gamma_path`). ``choose`` (a :data:`~foal_pipe.protocol.schema.CRITERIA` name of the
    training rows) keeps only the weights of its refined choice (``learn --gamma auto``); None keeps the grid's
    and, after them, those of every criterion's refined choice that the pass computes (``sweep``), in
    :attr:`criteria` order.
    """

    def __init__(self, grid: Sequence[float], loo: bool, choose: str | None, per_decade: int = PER_DECADE,
                 sample: RowSample | None = None) -> None:
        self.grid = np.asarray(grid, dtype=np.float64)
        self.sample = sample if loo else None
        self.fine = search_grid(self.grid, per_decade)
        self.needs_rows = loo
        self.choose = choose
        available = [name for name, c in CRITERIA.items() if c.name != "test" and (loo or not c.rows)]
        self.criteria = (choose,) if choose else tuple(available)
        self._at_grid = np.searchsorted(self.fine, self.grid)  # the grid's points are among the fine ones

    @classmethod
    def auto(cls, run: Run) -> ManyGammas:
        """``learn --gamma auto``'s path for ``run``: its model's grid, criterion and refined search, with the
        leave-one-out sample drawn only when the criterion scores rows (drawing ranks every train row)."""
        model = run.model
        return cls(model.gamma_grid, model.loo, model.select, model.per_decade, row_sample(run) if model.loo else None)

    @property
    def weights_per_class(self) -> int:
        """How many gammas' weights each boundary keeps: the grid's and every criterion's choice, or the one chosen."""
        return 1 if self.choose else self.grid.size + len(self.criteria)

    def vectors(self, statistics: RidgeStatistics, max_task: int) -> bool:
        """Whether boundary ``max_task``'s path needs the eigenvectors (:meth:`RidgeStatistics.gamma_path`)."""
        rows = None if self.sample is None else self.sample.boundaries[max_task].size
        return self.needs_rows and (rows is None or sample_needs_vectors(rows, statistics.dim))

    def usable(self, path: GammaPath, max_task: int) -> int:
        """How many of the refined grid's first points lie at or below the sums' resolution (``path.floor``), where
        no gamma can be solved: ``learn --gamma auto`` chooses among the rest, and says so; ``sweep``, whose grid is
        the user's list, refuses them (0 here). All of them: refused, naming the resolution the grid must reach."""
        cut = int(np.searchsorted(self.fine, path.floor, side="right")) if self.choose and path.floor else 0
        if cut == self.fine.size:
            raise FoalPipeError(
                f"every gamma of {param('gamma_grid')} (up to {self.grid[-1]:g}) lies at or below the resolution of the "
                f"{path.dtype} Gram sums at task {max_task + 1} ({path.floor:.3g}), where their solutions would be noise; "
                f"extend {param('gamma_grid')} above it (a later task's sums, over more rows, may need larger "
                f"gammas){float64_way_out(path.dtype)}")
        return cut

    def start(self, statistics: RidgeStatistics, max_task: int, factored: Factored | None = None) -> Pending:
        """The boundary's path (from ``factored``, :meth:`RidgeStatistics.factor` of :meth:`vectors`, when computed
        already), waiting for its leave-one-out pass when it has one."""
        rows = None if self.sample is None else self.sample.boundaries[max_task].size
        path = statistics.gamma_path(self.vectors(statistics, max_task), factored)
        cut = self.usable(path, max_task)
        fine = self.fine[cut:]
        loo: LeaveOneOut | SampledLeaveOneOut | None
        if not self.needs_rows:
            loo = None
        elif rows is None:
            if not isinstance(path, RidgeEigen):  # gamma_path gives the eigenvectors when asked
                raise internal_error("leave-one-out over every row without the eigenvectors")
            loo = LeaveOneOut(path, fine, statistics.counts)
        else:
            loo = SampledLeaveOneOut(path, fine, rows, statistics.counts, grid=self.fine.size)
        gcv = np.full(self.grid.size, np.inf)  # never chosen where left out
        solvable = self.grid > (path.floor if cut else 0.0)
        gcv[solvable] = path.gcv(self.grid[solvable])
        return Pending(statistics, path, gcv, loo, max_task, cut=cut)

    def zoom(self, pending: Pending) -> tuple[dict[str, Rule], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The leave-one-out criteria's zoom (:func:`~foal_pipe.core.gammasearch.zoom`) once every row is added: their
        rules, the points each visited and the curves there; computed once (the walk times it as ``loo``)."""
        if pending.zoomed is None:
            if pending.loo is None:
                raise FoalPipeError("this boundary has no leave-one-out pass to zoom over; pass loo=True")
            rules = {name: LOO_RULES[name] for name in self.criteria if name in LOO_RULES} or {"loo": LOO_RULES["loo"]}
            loo, cut = pending.loo, pending.cut
            if not cut:
                pending.zoomed = (rules, *zoom(self.fine.size, self._at_grid, loo.evaluate, rules))
                return pending.zoomed
            # from the grid's points above the resolution and the least refined point there, the end of the range
            start = np.union1d(self._at_grid[self._at_grid >= cut], [cut]) - cut
            points, curves = zoom(self.fine.size - cut, start, loo.evaluate, rules)
            pending.zoomed = (rules, {name: at + cut for name, at in points.items()},
                              {name: np.concatenate([np.full(cut, np.nan), c]) for name, c in curves.items()})
        return pending.zoomed

    def solve(self, statistics: RidgeStatistics, max_task: int) -> Boundary:
        """The boundary at once, without a leave-one-out pass (``loo=False``)."""
        return self.finish(self.start(statistics, max_task))

    def finish(self, pending: Pending) -> Boundary:
        path, gcv, cut = pending.path, pending.gcv, pending.cut
        gcv_fine = path.gcv(self.fine[cut:])
        if self.choose == "gcv" and not np.isfinite(gcv_fine).any():
            raise gcv_undeterminable()
        searches = {"gcv": Search("gcv", self.fine[cut:], gcv_fine, best_point(gcv_fine, False), self.fine if cut else None)
                    } if "gcv" in self.criteria else {}
        accuracy = mse = None
        if pending.loo:
            rules, points, curves = self.zoom(pending)
            accuracy, mse = curves["loo_accuracy"][self._at_grid], curves["loo"][self._at_grid]
            for name, (larger, tie) in rules.items():
                if name in self.criteria:
                    at = points[name]
                    index = best_point(curves[name][at], larger, None if tie is None else curves[tie][at])
                    searches[name] = Search(name, self.fine[at], curves[name][at], index,
                                            None if at.size == self.fine.size else self.fine)
        # df/n at GCV's choice: its refined search's where it ran (sweep, --select gcv), else the grid's least GCV
        chosen, finite = ((searches["gcv"].gamma, np.isfinite(gcv_fine).any()) if "gcv" in searches
                          else (self.grid[int(np.argmin(gcv))], np.isfinite(gcv).any()))
        ratio = float(path.dof(np.asarray([chosen]))[0]) / max(path.n, 1) if finite else None
        if self.choose is None:
            gammas = np.concatenate([self.grid, [searches[name].gamma for name in self.criteria]])
        else:
            gammas = np.array([searches[self.choose].gamma])
        W = path.weights(gammas)
        path.check_weights(pending.statistics.G, pending.statistics.Q, gammas, W)
        boundary = Boundary(pending.statistics.classes, W, gammas, gcv, accuracy, mse, ratio, searches,
                            floor=float(path.floor) if cut else None)
        if self.sample is not None:
            boundary.loo_rows = self.sample.boundaries[pending.max_task].size
            boundary.loo_bound = self.sample.bound(pending.max_task, path.n, self.fine.size)
        return boundary
