"""Audit s31: the eigen path's leverages of every gamma of the grid, formed once a boundary
(``SampledLeaveOneOut._grid_leverages`` / ``_block_leverages``), and the memory estimate that now charges them.
Each test failed on the change as first written; its docstring says what was wrong and what is right."""

from __future__ import annotations

import json

import array_api_strict
import numpy as np
import pytest
from helpers import build_store, invoke, memory_checks

from foal_pipe.core.leaveoneout import SampledLeaveOneOut
from foal_pipe.core.statistics import RidgeStatistics

GAMMAS = np.array([1e-2, 0.3, 1.0, 20.0, 500.0])


def _rows(seed: int = 0, n: int = 70, D: int = 9):
    rng = np.random.default_rng(seed)
    labels = rng.choice([0, 3, 4], size=n)
    H = rng.normal(size=(n, D)) + 0.4 * labels[:, None]
    return H, labels


def _evaluated(loo: SampledLeaveOneOut) -> dict[str, np.ndarray]:
    """Every gamma, a few at a time and out of order, as a zoom asks; then the accuracy alone."""
    got = {"loo_accuracy": np.full(GAMMAS.size, np.nan), "loo": np.full(GAMMAS.size, np.nan)}
    for indices in ([3, 0], [4], [2, 1]):
        for name, values in loo.evaluate(np.array(indices)).items():
            got[name][indices] = values
    got["accuracy_alone"] = loo.evaluate(None, ("loo_accuracy",))["loo_accuracy"]
    return got


def test_array_api_strict_sampled_leave_one_out_scores_as_numpy():
    """The generic-namespace path: ``_block_leverages`` slices its coordinates as ``Z[lo : hi]``, one index on a 2-D
    array, which the array API standard does not define (array_api_strict raises IndexError "the multi-axes index
    only specifies 1 dimensions"), so ``evaluate`` fails on any namespace that keeps to the standard; before the
    change ``_totals`` sliced ``Z[lo:hi, :]`` ("in-bounds slices of both axes: the standard specifies nothing else")
    and this worked. Right: the strict namespace gives NumPy's counts and (to rounding) its MSE."""
    H, labels = _rows()
    pick = np.array([0, 4, 9, 13, 21, 30, 44, 52, 61, 69])
    expected = {}
    for name, xp in (("numpy", np), ("strict", array_api_strict)):
        stats = RidgeStatistics.from_batch(xp.asarray(H), labels)
        loo = SampledLeaveOneOut(stats.eigen(), GAMMAS, pick.size, stats.counts)
        loo.add(xp.asarray(H[pick[:4]]), labels[pick[:4]])
        loo.add(xp.asarray(H[pick[4:]]), labels[pick[4:]])
        expected[name] = _evaluated(loo)
    np.testing.assert_array_equal(expected["strict"]["loo_accuracy"], expected["numpy"]["loo_accuracy"])
    np.testing.assert_array_equal(expected["strict"]["accuracy_alone"], expected["numpy"]["accuracy_alone"])
    np.testing.assert_allclose(expected["strict"]["loo"], expected["numpy"]["loo"], rtol=1e-12, atol=0)


@pytest.mark.parametrize("namespace", ["numpy", "torch"])
def test_an_empty_block_of_sampled_rows_adds_nothing(namespace):
    """``add`` of a block of 0 rows (m x D with m = 0) kept an empty block of coordinates that every evaluation
    skipped; now ``_block_leverages`` finds no slice in it and ``xp.concat([])`` raises (NumPy: "need at least one
    array to concatenate"; torch: "torch.cat(): expected a non-empty list of Tensors") at the first ``evaluate``.
    Right: an empty block contributes nothing; the curves equal those without it (as before the change)."""
    xp = pytest.importorskip(namespace)
    H, labels = _rows(1)
    pick = np.arange(0, 60, 5)
    curves = []
    for blocks in ((pick,), (pick[:0], pick, pick[:0])):
        stats = RidgeStatistics.from_batch(xp.asarray(H), labels)
        loo = SampledLeaveOneOut(stats.eigen(), GAMMAS, pick.size, stats.counts)
        for rows in blocks:
            loo.add(xp.asarray(H[rows]), labels[rows])
        curves.append(_evaluated(loo))
    for name in curves[0]:
        np.testing.assert_array_equal(curves[1][name], curves[0][name])


def test_sweep_over_a_narrow_range_at_a_fine_per_decade_is_not_refused(tmp_path):
    """``memory_parts`` now calls ``search_grid(run.model.gamma_grid, run.model.per_decade)`` for every sampled
    leave-one-out, sweep's included; sweep's ``run.model.gamma_grid`` is learn's default grid (1e-4 .. 1e8, 12
    decades), not sweep's ``--gammas``. So ``sweep --gammas 1,10 --per-decade 10000`` (10,001 refined gammas, within
    the 100,000 a search allows) is refused before any work with "--per-decade 10000 asks for 120,000 gammas over the
    grid's 12 decades", a grid the sweep never searches; before the change it ran. Right: the sweep runs (the
    estimate sizes the grid sweep searches, ``search_grid(--gammas, --per-decade)``)."""
    store = build_store(tmp_path / "store", n_train=300)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "out", "--gammas", "1,10", "--per-decade", 10000,
                    "--tasks", 2, "--projection-dim", 8, "--seed", 3, "--backend", "numpy", "--loo-sample", 50)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())


@pytest.mark.parametrize(("gammas", "per_decade", "dim", "kept"), [
    ("1e-10,1e10", 100, 8, False),  # 2,001 gammas at D = 8: each evaluation forms its own leverages
    ("1e-2,1e2", 8, 40, True),  # 33 gammas at D = 40: every gamma's leverages held a boundary
])
def test_sweep_memory_estimate_covers_the_grid_leverages_it_holds(tmp_path, monkeypatch, gammas, per_decade, dim, kept):
    """Each boundary's SampledLeaveOneOut may hold its sample's leverages at every gamma of the refined grid (rows x
    gammas float64) beside the coordinates (rows x D); the estimate charged learn's default 12-decade grid, not
    sweep's ``--gammas`` (a sweep over 1e-10 .. 1e10 at 100 a decade held 1.6 MB at D = 8 and 100 sampled rows against
    an estimate of 0.97 MB). Right: a grid of more gammas than D is not held, and the estimate's "leave-one-out
    sample's eigen-coordinates" part is at least the coordinates and leverages a boundary holds."""
    calls = memory_checks(monkeypatch)
    held: list[int] = []
    real = SampledLeaveOneOut._grid_leverages

    def recorded(self, screen=False):
        grid = real(self, screen)
        held.append(sum(int(Z.nbytes) for Z in self._coordinates) + sum(int(lev.nbytes) for lev, _ in grid or ()))
        return grid

    monkeypatch.setattr(SampledLeaveOneOut, "_grid_leverages", recorded)
    store = build_store(tmp_path / "store", n_train=600)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "out", "--gammas", gammas, "--per-decade",
                    per_decade, "--tasks", 2, "--projection-dim", dim, "--seed", 3, "--backend", "numpy",
                    "--loo-sample", 100)
    assert result.exit_code == 0, result.output
    coordinates = 100 * dim * 8
    assert held and (max(held) > coordinates) is kept
    charged = max(parts.get("leave-one-out sample's eigen-coordinates", 0) for parts in calls)
    assert charged >= max(held), f"estimate {charged:,} bytes, held {max(held):,} bytes"
