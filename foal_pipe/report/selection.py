"""Which gamma a sweep chose, by which criterion, and whether the choice sits at the edge of its grid.

``foal-pipe sweep`` chooses ``best_gamma`` by leave-one-out MSE (``selected_by: "loo"``), by GCV (``"gcv"``)
or, on request, by test A_avg (``"test"``, an oracle that peeks at the test split); it also records the
test oracle's choice as ``best_gamma_test``. Sweeps written before that have neither key and chose by test
A_avg: they are labelled as such, so a summary never passes a test-set choice off as an honest one.
"""

from __future__ import annotations

from dataclasses import dataclass

from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.schema import SweepReport, same_gamma
from foal_pipe.protocol.sweepparts import CRITERION_KEYS, FusionSweep, SweepResult

OLD_SWEEP = "test A_avg (old sweep)"


@dataclass(frozen=True)
class Selection:
    """A sweep's choice of gamma: the selected one, the test oracle's, and how they were made."""

    gamma: float
    #: ``"loo"``, ``"gcv"`` or ``"test"``; ``None`` for a sweep written before the criteria existed.
    selected_by: str | None
    #: The gamma with the best test A_avg (for reference: choosing by it is leakage).
    oracle_gamma: float
    #: The gammas tried, ascending.
    grid: tuple[float, ...]
    #: The rows a sampled leave-one-out scored at the last boundary, where the choice rests on it (:func:`sampled_rows`).
    sampled_rows: int | None = None

    @property
    def criterion(self) -> str:
        """The criterion in words, for summary.md."""
        return criterion_text(self.selected_by, self.sampled_rows) if self.selected_by else OLD_SWEEP

    @property
    def short(self) -> str:
        """The criterion in a few characters, for plot legends and tables."""
        if not self.selected_by:
            return OLD_SWEEP
        return ("sampled " if self.sampled_rows is not None else "") + CRITERIA[self.selected_by].short

    @property
    def at_edge(self) -> str | None:
        """``"smallest"`` or ``"largest"`` when the selected gamma is an end of the grid (the best may lie
        beyond it), else ``None``."""
        if len(self.grid) < 2:
            return None
        if same_gamma(self.gamma, self.grid[0]):
            return "smallest"
        if same_gamma(self.gamma, self.grid[-1]):
            return "largest"
        return None


def result_at(sweep: SweepReport | FusionSweep, gamma: float) -> SweepResult:
    """The sweep's result for ``gamma``."""
    return next(r for r in sweep.results if same_gamma(r.gamma, gamma))


def sampled_rows(sweep: SweepReport) -> int | None:
    """The rows scored at the last boundary (the one the criteria judge) where the sweep's choice rests on a sampled
    leave-one-out (``leave_one_out.exact`` false: ``--loo-sample`` below the rows seen), else None: "on the training
    rows seen" alone would pass a sample off as every row."""
    loo = sweep.leave_one_out
    rows = sweep.selected_by in CRITERIA and CRITERIA[sweep.selected_by].rows
    return loo.sample_rows[-1] if rows and loo is not None and not loo.exact and loo.sample_rows else None


def criterion_text(selected_by: str, sampled: int | None) -> str:
    """A criterion in words, marked ``sampled`` where its leave-one-out scored a sample of the rows seen."""
    return ("sampled " if sampled is not None else "") + CRITERIA[selected_by].description


def select(sweep: SweepReport) -> Selection:
    """The :class:`Selection` of a sweep read by :func:`foal_pipe.report.readers.read_sweep`."""
    results = sweep.results
    best_test = max(results, key=lambda r: r.A_avg).gamma
    oracle = float(best_test if sweep.best_gamma_test is None else sweep.best_gamma_test)
    selected_by = sweep.selected_by
    gamma = float(oracle if sweep.best_gamma is None else sweep.best_gamma) if selected_by else oracle
    return Selection(gamma, selected_by, oracle, tuple(float(r.gamma) for r in results), sampled_rows(sweep))


def has_criteria(sweep: SweepReport) -> bool:
    """Whether the sweep records GCV or leave-one-out per gamma (sweeps from before them do not)."""
    return any(getattr(r, key) is not None for r in sweep.results for key in CRITERION_KEYS)


def last(values: list[float | None] | None) -> float | None:
    """A criterion's value at the last task boundary (what the selection judges), or ``None``."""
    if not values or values[-1] is None:
        return None
    return float(values[-1])
