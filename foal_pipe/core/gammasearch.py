"""The refined search over gammas: the grid a criterion is evaluated on (:func:`search_grid`), the best point
(:func:`best_point`), the zoom that evaluates few of its points (:func:`zoom`) and one criterion's search at a
boundary (:class:`Search`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.core.linalg import check_positive
from foal_pipe.errors import FoalPipeError, param

#: Points per decade of the refined search: neighbours differ by 10^(1/8) = 1.33x (benchmarks/RESULTS.md,
#: "Continuous gamma": test accuracy moves by hundredths of a point over that step).
PER_DECADE = 8
#: The most gammas a refined search evaluates (the default grid at PER_DECADE: about 100); beyond, a huge
#: ``per_decade`` would exhaust the memory.
MAX_SEARCH_POINTS = 100_000


def check_grid(grid: Any) -> np.ndarray:
    """The distinct gammas of ``grid``, ascending; an empty grid (nothing to choose from) is refused."""
    g = np.unique(np.asarray(grid, dtype=np.float64).ravel())
    if g.size == 0:
        raise FoalPipeError(f"{param('gamma_grid')} is empty; pass some gammas, e.g. 1e-3,1e-2,1e-1,1,10")
    check_positive(g)
    return g


def search_grid(grid: Any, per_decade: int = PER_DECADE) -> np.ndarray:
    """The gammas a refined search evaluates, ascending: the points of ``grid`` and ``per_decade`` log-spaced
    points per decade from its least to its greatest (0: the grid's points only).

    GCV costs ``O(D C)`` per point and evaluates them all; leave-one-out visits some by :func:`zoom` (the exact
    pass scores them all while it reads the rows, then selects by the same zoom).
    """
    g = check_grid(grid)
    if not isinstance(per_decade, (int, np.integer)) or isinstance(per_decade, bool) or per_decade < 0:
        raise FoalPipeError(f"{param('per_decade')} must be an integer >= 0, got {per_decade!r}; e.g. "
                            f"{param('per_decade', PER_DECADE)} (0: the grid's gammas only)")
    lo, hi = np.log10(g[0]), np.log10(g[-1])
    if per_decade == 0 or lo == hi:
        return g
    steps = int(np.ceil(round(float(hi - lo) * per_decade, 6)))
    if steps > MAX_SEARCH_POINTS:
        raise FoalPipeError(f"{param('per_decade', int(per_decade))} asks for {steps:,} gammas over the grid's "
                            f"{float(hi - lo):g} decades, more than the {MAX_SEARCH_POINTS:,} a search evaluates; "
                            f"e.g. {param('per_decade', PER_DECADE)}")
    fine = 10.0 ** (lo + (hi - lo) * np.arange(1, steps) / steps)
    near = np.isclose(fine[:, None], g[None, :], rtol=1e-9, atol=0.0).any(axis=1)  # a grid point's rounded twin
    return np.union1d(g, fine[~near])


def tied(values: np.ndarray, larger: bool) -> np.ndarray:
    """The indices of the best of ``values`` (NaN never best): :func:`best_point`'s candidates before its tie-break."""
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), -np.inf if larger else np.inf, v)
    return np.flatnonzero(v == (v.max() if larger else v.min()))


def best_point(values: np.ndarray, larger: bool, tie: np.ndarray | None = None) -> int:
    """The index of the best of ``values`` (NaN never best). Among equals (LOO accuracy is piecewise constant
    in gamma: it has plateaus) the least ``tie`` wins (LOO MSE), then the first (the smallest gamma)."""
    candidates = tied(values, larger)
    if tie is not None and candidates.size > 1:
        t = np.where(np.isnan(tie[candidates]), np.inf, tie[candidates])
        candidates = candidates[t == t.min()]
    return int(candidates[0])


#: A zoom's rule per criterion: whether larger is better, and the criterion whose least value breaks its ties.
Rule = tuple[bool, str | None]


def zoom(size: int, start: Any, evaluate: Callable[[np.ndarray, tuple[str, ...]], Mapping[str, np.ndarray]],
         rules: Mapping[str, Rule]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each criterion's zoom over a refined grid of ``size`` gammas: the indices of its points (ascending), and
    every curve ``evaluate`` returns over the grid (NaN where no zoom asked).

    ``start`` (the coarse grid's indices, the ends among them) is evaluated first; then each criterion of ``rules``
    takes its best so far (:func:`best_point` over its own points) and its nearest neighbours among them ``lo <
    best < hi``, and adds the index midpoints ``(lo + best) // 2`` and ``(best + hi) // 2``, until its best's
    immediate neighbours are among its points (or it is an end). The criteria run in lockstep, each stage
    evaluating the union of what they ask for, each choosing among its own points only: its choice does not
    depend on which other criteria ran (``sweep`` chooses as ``learn --gamma auto`` does). The rule assumes no
    better isolated spike away from the best coarse point's neighbourhood: about 6 points instead of every one of
    the two coarse intervals beside it (docs/gamma.md, "The refined search").

    ``evaluate(indices, names)`` gives at least the curves ``names`` (all it gives is kept). A tie-breaking curve
    that is not itself a rule's criterion is asked for only where it decides: at the points tied for a criterion's
    best (NaN elsewhere), so a pass that can give a criterion alone more cheaply does.
    """
    first = np.unique(np.asarray(start, dtype=np.int64))
    own = {name: np.zeros(size, dtype=bool) for name in rules}
    names = tuple(rules)
    curves = {name: np.full(size, np.nan) for name in {*names, *(tie for _, tie in rules.values() if tie)}}
    known = {name: np.zeros(size, dtype=bool) for name in curves}

    def fill(indices: np.ndarray, wanted: tuple[str, ...]) -> None:
        for name, got in evaluate(indices, wanted).items():  # what it gives beyond ``wanted`` is kept too
            curves.setdefault(name, np.full(size, np.nan))[indices] = got
            known.setdefault(name, np.zeros(size, dtype=bool))[indices] = True

    asked = {name: first for name in rules}
    while any(a.size for a in asked.values()):
        todo = np.unique(np.concatenate(list(asked.values())))
        todo = todo[~np.logical_and.reduce([known[name][todo] for name in names])]  # each criterion's points once
        if todo.size:
            fill(todo, names)
        for name, (larger, tie) in rules.items():
            own[name][asked[name]] = True
            at = np.flatnonzero(own[name])
            if tie is not None:
                candidates = at[tied(curves[name][at], larger)]
                missing = candidates[~known[tie][candidates]] if candidates.size > 1 else candidates[:0]
                if missing.size:
                    fill(missing, (tie,))
            i = best_point(curves[name][at], larger, None if tie is None else curves[tie][at])
            best, lo, hi = at[i], at[max(i - 1, 0)], at[min(i + 1, at.size - 1)]
            wanted = [c for c in {(lo + best) // 2, (best + hi) // 2} if not own[name][c]]
            asked[name] = np.array(sorted(wanted), dtype=np.int64)
    return {name: np.flatnonzero(mask) for name, mask in own.items()}, curves


@dataclass(frozen=True)
class Search:
    """One criterion's refined search at one task boundary: its value at every point of ``gammas`` evaluated
    (ascending) and the index chosen among them; ``refined`` is the grid searched when the search evaluated part of
    it (:func:`zoom`; None: all of it). ``edge`` is ``"smallest"``/``"largest"`` when that is an end of the range
    (the best may lie beyond it)."""

    criterion: str
    gammas: np.ndarray
    values: np.ndarray
    index: int
    refined: np.ndarray | None = None

    @property
    def gamma(self) -> float:
        return float(self.gammas[self.index])

    @property
    def grid(self) -> np.ndarray:
        """The refined grid the search was over."""
        return self.gammas if self.refined is None else self.refined

    @property
    def edge(self) -> str | None:
        if self.gammas.size < 2:
            return None
        return "smallest" if self.index == 0 else "largest" if self.index == self.gammas.size - 1 else None
