"""`sweep --loo-sample` (issue 31): sweep's leave-one-out scores learn --gamma auto's row sample with its bound,
recorded in sweep.json; with 0 every row, stated as exact and equal to refits without each row."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import N_CLASSES, assert_clean_error, build_store, invoke, learn, read

from foal_pipe.protocol.stream import build_stream

RANGE = "1e-3,1e3"  # 49 gammas at 8 per decade
GRID = [1e-3, 1e3]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("sweeploo") / "blobs.zarr", n_train=300, noise=2.5)


@pytest.fixture(scope="module")
def projection(store, tmp_path_factory):
    return learn(store, tmp_path_factory.mktemp("proj") / "run")[1]["projection"]


def _sweep(store, out, *extra):
    result = invoke("sweep", "--features", store, "--out", out, "--gammas", RANGE, "--tasks", 4, "--projection-dim", 48,
                    "--seed", 3, "--backend", "numpy", *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "sweep.json").read_text())


def _walk(store):
    """The training rows in walk order (each task's rows in dataset order) and each boundary's end."""
    _, ytr, _, _ = read(store)
    rows = build_stream(ytr, N_CLASSES, 4, 10, 3).rows
    return np.concatenate([np.sort(r) for r in rows]), np.cumsum([r.size for r in rows])


def _refits(H, y, scored, gamma):
    """Leave-one-out by refitting ridge without each scored row: (accuracy, MSE) over the scored rows."""
    classes = np.unique(y)
    Y = (y[:, None] == classes[None, :]).astype(float)
    correct, squared = 0, 0.0
    for i in scored:
        keep = np.arange(y.size) != i
        W = np.linalg.solve(H[keep].T @ H[keep] + gamma * np.eye(H.shape[1]), H[keep].T @ Y[keep])
        score = H[i] @ W
        correct += classes[np.argmax(score)] == y[i]
        squared += np.sum((Y[i] - score) ** 2)
    return correct / len(scored), squared / (len(scored) * classes.size)


def test_sweep_scores_learns_sample_with_its_bound(tmp_path, store):
    m = 50
    report = _sweep(store, tmp_path / "sw", "--loo-sample", m)
    metrics, _ = learn(store, tmp_path / "auto", "--gamma", "auto", "--gamma-grid", RANGE, "--loo-sample", m)
    learned = metrics["gamma_search"]
    swept = next(s for s in report["selections"] if s["criterion"] == "loo_accuracy")
    for vs, vl in zip(swept["values"], learned["values"]):  # learn's zoom, alone, and sweep's, in lockstep with LOO MSE's
        np.testing.assert_allclose(vs, vl, rtol=0, atol=1e-12)
    for name in ("evaluated", "gammas_selected", "loo_sample", "sample_rows", "sample_eps", "sample_delta"):
        assert swept[name] == learned[name], name
    eps = math.sqrt(math.log(2 * 49 / 0.05) / (2 * m))  # Hoeffding over the 49 gammas searched
    assert report["leave_one_out"] == {"loo_sample": m, "exact": False, "sample_rows": [m] * 4,
                                       "sample_eps": pytest.approx([eps] * 4, rel=1e-12), "sample_delta": 0.05}


def test_sweep_sampled_figures_equal_refits_without_each_sampled_row(tmp_path, store, projection):
    m = 30
    report = _sweep(store, tmp_path / "sw", "--loo-sample", m)
    Xtr, ytr, _, _ = read(store)
    walk, ends = _walk(store)
    ranks = np.random.default_rng([3, 23]).permutation(ytr.size)  # seed 3, stream 23: a rank per train row
    for k, end in enumerate(ends):
        rows = walk[:end]
        chosen = np.sort(np.argsort(ranks[rows])[:m])  # the rows seen with the m least ranks
        H = 1 / (1 + np.exp(-(Xtr[rows].astype(np.float64) @ projection)))
        for result in report["results"]:
            accuracy, mse = _refits(H, ytr[rows], chosen, result["gamma"])
            assert result["loo_accuracy"][k] == pytest.approx(accuracy, abs=1e-12)
            assert result["loo_mse"][k] == pytest.approx(mse, rel=1e-8)


def test_sweep_loo_sample_zero_is_every_row_and_exact(tmp_path, store, projection):
    report = _sweep(store, tmp_path / "sw", "--loo-sample", 0)
    Xtr, ytr, _, _ = read(store)
    walk, ends = _walk(store)
    assert report["leave_one_out"] == {"loo_sample": 0, "exact": True, "sample_rows": ends.tolist(),
                                       "sample_eps": [0.0] * 4, "sample_delta": 0.05}
    assert all("sample_rows" not in s for s in report["selections"])
    for k, end in enumerate(ends[:2]):  # every row of the first two boundaries, refit without each
        H = 1 / (1 + np.exp(-(Xtr[walk[:end]].astype(np.float64) @ projection)))
        for result in report["results"]:
            accuracy, mse = _refits(H, ytr[walk[:end]], range(end), result["gamma"])
            assert result["loo_accuracy"][k] == pytest.approx(accuracy, abs=1e-12)
            assert result["loo_mse"][k] == pytest.approx(mse, rel=1e-8)


def test_sweep_loo_sample_same_bytes_twice_and_bad_uses_refused(tmp_path, store):
    for run in ("a", "b"):
        _sweep(store, tmp_path / run, "--loo-sample", 40)
    assert (tmp_path / "a" / "sweep.json").read_bytes() == (tmp_path / "b" / "sweep.json").read_bytes()
    common = ("sweep", "--features", store, "--tasks", 4, "--projection-dim", 48, "--backend", "numpy")
    assert_clean_error(invoke(*common, "--out", tmp_path / "x", "--loo-sample", -1), "--loo-sample counts the rows",
                       tmp_path / "x")
    assert_clean_error(invoke(*common, "--out", tmp_path / "y", "--loo-sample", 40, "--no-loo"),
                       "--loo-sample acts only with the leave-one-out pass", tmp_path / "y")
    gcv = _sweep(store, tmp_path / "gcv", "--no-loo")
    assert "leave_one_out" not in gcv
