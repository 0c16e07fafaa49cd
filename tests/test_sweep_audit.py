"""The sweep audit's faults: leave-one-out accuracy where scores and leverages are far below 1 (a gamma far above
G's eigenvalues, features of small scale) equals brute-force refits, exact and sampled, NumPy and torch; a gamma
beyond 1e154 learns (its square overflowed a check); ``sweep`` warns of GCV's df/n at every boundary, as ``learn``
does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import build_store, invoke
from safetensors.numpy import load_file
from test_statistics import brute_force_loo

from foal_pipe.core.leaveoneout import LeaveOneOut, SampledLeaveOneOut
from foal_pipe.core.statistics import RidgeStatistics

CASES = [(1.0, [1e12, 1e16, 1e20]), (1e-6, [1e4, 1e6, 1e8])]  # (feature scale, gammas far above G's eigenvalues)


@pytest.mark.parametrize(("scale", "gammas"), CASES)
@pytest.mark.parametrize("namespace", ["numpy", "torch"])
def test_loo_accuracy_far_above_the_eigenvalues_equals_refits(scale, gammas, namespace):
    rng = np.random.default_rng(7)
    y = 2 * (1 + rng.integers(0, 4, 60))
    H = (rng.normal(size=(10, 12))[y] + 1.5 * rng.normal(size=(60, 12))) * scale  # centred: the limit still predicts
    reference = [brute_force_loo(H, y, np.unique(y), g)[0] for g in gammas]
    assert min(reference) > 0.2  # the far-regularised model still predicts: the old rounding counted every row wrong
    rows = torch.from_numpy(H) if namespace == "torch" else H
    s = RidgeStatistics.from_batch(rows, y)
    loo = LeaveOneOut(s.eigen(), gammas)
    loo.add(rows, y)
    assert loo.accuracy().tolist() == reference
    sampled = SampledLeaveOneOut(s.eigen(), gammas, 60)  # every row sampled: the sampled figure is the exact one
    sampled.add(rows, y)
    assert sampled.accuracy().tolist() == reference


def test_a_gamma_beyond_1e154_learns_as_its_closed_form(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=60, noise=0.3)
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 1, "--projection-dim", 0, "--gamma", "1e200",
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    model = load_file(out / "model.safetensors")
    G, Q = model["G"], model["Q"]
    W = np.linalg.solve(G + 1e200 * np.eye(G.shape[0]), Q)
    np.testing.assert_allclose(model["W"], W, rtol=1e-12, atol=0)


def test_sweep_warns_of_gcvs_degrees_of_freedom_at_every_boundary(tmp_path):
    small = build_store(tmp_path / "small.zarr", n_train=60, noise=0.3)
    args = ("--features", small, "--tasks", 2, "--projection-dim", 56, "--backend", "numpy")
    learned = invoke("learn", *args, "--out", tmp_path / "l", "--gamma", "auto", "--select", "gcv", "--gamma-grid",
                     "1e-6,1e-3,1,1e3", "--per-decade", 0)
    swept = invoke("sweep", *args, "--out", tmp_path / "s", "--gammas", "1e-6,1e-3,1,1e3", "--select", "gcv",
                   "--per-decade", 0)
    assert learned.exit_code == swept.exit_code == 0, swept.output
    warning = next(line for line in learned.output.splitlines() if "GCV is unreliable" in line)
    assert warning in swept.output
