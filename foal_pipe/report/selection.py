"""Which gamma a sweep chose, by which criterion, and whether the choice sits at the edge of its grid.

``foal-pipe sweep`` chooses ``best_gamma`` by leave-one-out MSE (``selected_by: "loo"``), by GCV (``"gcv"``)
or, on request, by test A_avg (``"test"``, an oracle that peeks at the test split); it also records the
test oracle's choice as ``best_gamma_test``. Sweeps written before that have neither key and chose by test
A_avg: they are labelled as such, so a summary never passes a test-set choice off as an honest one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foal_pipe.report.readers import CRITERION_KEYS

#: ``selected_by`` -> how summary.md names the criterion.
CRITERIA = {
    "loo": "leave-one-out MSE on the training rows seen",
    "gcv": "GCV (generalised cross-validation, from the Gram statistics alone)",
    "test": "test A_avg (an oracle: it peeks at the test split)",
}
#: ``selected_by`` -> the short name in plots and tables.
SHORT = {"loo": "LOO MSE", "gcv": "GCV", "test": "test A_avg"}
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

    @property
    def criterion(self) -> str:
        """The criterion in words, for summary.md."""
        return CRITERIA[self.selected_by] if self.selected_by else OLD_SWEEP

    @property
    def short(self) -> str:
        """The criterion in a few characters, for plot legends and tables."""
        return SHORT[self.selected_by] if self.selected_by else OLD_SWEEP

    @property
    def at_edge(self) -> str | None:
        """``"smallest"`` or ``"largest"`` when the selected gamma is an end of the grid (the best may lie
        beyond it), else ``None``."""
        if len(self.grid) < 2:
            return None
        if math.isclose(self.gamma, self.grid[0], rel_tol=1e-9):
            return "smallest"
        if math.isclose(self.gamma, self.grid[-1], rel_tol=1e-9):
            return "largest"
        return None


def result_at(sweep: dict[str, Any], gamma: float) -> dict[str, Any]:
    """The sweep's result entry for ``gamma``."""
    return next(r for r in sweep["results"] if math.isclose(r["gamma"], gamma, rel_tol=1e-9))


def select(sweep: dict[str, Any]) -> Selection:
    """The :class:`Selection` of a sweep read by :func:`foal_pipe.report.readers.read_sweep`."""
    results = sweep["results"]
    best_test = max(results, key=lambda r: r["A_avg"])["gamma"]
    oracle = float(sweep.get("best_gamma_test", best_test))
    selected_by = sweep.get("selected_by")
    gamma = float(sweep.get("best_gamma", oracle)) if selected_by else oracle
    return Selection(gamma, selected_by, oracle, tuple(float(r["gamma"]) for r in results))


def has_criteria(sweep: dict[str, Any]) -> bool:
    """Whether the sweep records GCV or leave-one-out per gamma (sweeps from before them do not)."""
    return any(key in r for r in sweep["results"] for key in CRITERION_KEYS)


def last(values: list[float | None] | None) -> float | None:
    """A criterion's value at the last task boundary (what the selection judges), or ``None``."""
    if not values or values[-1] is None:
        return None
    return float(values[-1])
