"""What `learn` and `sweep` say of GCV's choices: the degrees of freedom of the worst boundary flagged, and a choice
bounded by gammas where GCV has no value (its residual below float64's rounding), which no edge warning names."""

from __future__ import annotations

import numpy as np
from helpers import invoke

from foal_pipe.core.gammasearch import Search
from foal_pipe.protocol.learnkinds import warn_gcv
from foal_pipe.protocol.solvers import Boundary
from foal_pipe.store import write_store

GRID = np.array([1e-3, 1e-2, 1e-1, 1.0])


def _boundary(ratio: float | None = None, values: list[float] | None = None, index: int = 0) -> Boundary:
    searches = None if values is None else {"gcv": Search("gcv", GRID, np.array(values), index)}
    return Boundary(np.arange(2), np.zeros((3, 1, 2)), np.array([1.0]), gcv_dof_ratio=ratio, searches=searches)


def _said(boundaries: list[Boundary]) -> list[str]:
    lines: list[str] = []
    warn_gcv(boundaries, GRID, lines.append)
    return lines


def test_the_degrees_of_freedom_warning_quotes_the_worst_boundary():
    lines = _said([_boundary(0.99), _boundary(0.5), _boundary(0.97), _boundary(0.93)])
    assert len(lines) == 1 and "effective degrees of freedom up to 99% of the rows" in lines[0], lines
    assert "at 3 task boundaries" in lines[0]
    (line,) = _said([_boundary(0.5), _boundary(0.93)])
    assert "degrees of freedom 93% of the rows (above 90%) at 1 task boundary;" in line


def test_a_choice_at_the_least_gamma_gcv_resolves_is_named():
    inf = float("inf")
    lines = _said([_boundary(values=[inf, inf, 2.0, 3.0], index=2), _boundary(values=[1.0, 2.0, 3.0, 4.0], index=0),
                   _boundary(values=[inf, 3.0, 2.0, 4.0], index=2), _boundary(values=[inf, 2.0, 3.0, 4.0], index=1)])
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: GCV chose the least gamma at which it has a value at task boundaries 1, 4:")
    assert "prefer --select loo" in lines[0]
    assert _said([_boundary(values=[1.0, 2.0, 3.0, 4.0], index=0)]) == []  # on the grid's edge: the edge warning's


def test_sweep_names_the_boundary_whose_gcv_choice_is_bounded_by_unresolved_gammas(tmp_path):
    """Fewer rows than D: GCV has no value at the smallest gammas of the first boundary, and chose the least it has."""
    rng = np.random.default_rng(2)
    centers = rng.normal(0, 1.0, (3, 8))
    y, y_test = rng.integers(0, 3, 40), rng.integers(0, 3, 60)
    X, X_test = centers[y] + rng.normal(0, 1.5, (40, 8)), centers[y_test] + rng.normal(0, 1.5, (60, 8))
    store = write_store(tmp_path / "s.zarr", (X.astype(np.float32), y), (X_test.astype(np.float32), y_test),
                        ["c0", "c1", "c2"], chunk_rows=64)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 3, "--projection-dim", 150,
                    "--gammas", "1e-6,1e-5,1e-4,1e-3", "--loo-sample", 0)
    assert result.exit_code == 0, result.output
    assert "GCV chose the least gamma at which it has a value at task boundary 1:" in result.output
    assert "effective degrees of freedom up to " in result.output
