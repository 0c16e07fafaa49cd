"""Choosing gamma on the training rows: `learn --gamma auto` and `sweep --select`, against independent LOO and GCV."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_clean_error, assert_same_matrix, build_store, invoke, learn, read

from foal_pipe.protocol.stream import build_stream

GRID = [1e-3, 1.0, 4.0, 8.0, 16.0, 1e3]  # the choices differ between boundaries on this store
N_CLASSES = 12


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("sel") / "blobs.zarr", n_train=300, noise=2.5)


def criteria_by_hand(store, P: np.ndarray, tasks: int, seed: int, grid: list[float]) -> list[dict[str, np.ndarray]]:
    """At each boundary: LOO MSE, LOO accuracy and GCV for every gamma, from the hat matrix of the rows seen."""
    Xtr, ytr, _, _ = read(store)
    stream = build_stream(ytr, N_CLASSES, tasks, 10, seed)
    out = []
    for k in range(tasks):
        rows = np.concatenate(stream.rows[: k + 1])
        H = 1 / (1 + np.exp(-(Xtr[rows].astype(np.float64) @ P)))
        seen = np.unique(ytr[rows])
        Y = (ytr[rows][:, None] == seen[None, :]).astype(float)
        n = len(rows)
        mse, acc, gcv = [], [], []
        for g in grid:
            hat = H @ np.linalg.solve(H.T @ H + g * np.eye(H.shape[1]), H.T)
            h = np.diag(hat)
            E = (Y - hat @ Y) / (1 - h)[:, None]
            mse.append(np.mean(E**2))
            acc.append(np.mean(seen[np.argmax(Y - E, axis=1)] == ytr[rows]))
            gcv.append(n * np.sum((Y - hat @ Y) ** 2) / (n - np.trace(hat)) ** 2)
        out.append({"loo_mse": np.array(mse), "loo_accuracy": np.array(acc), "gcv": np.array(gcv)})
    return out


@pytest.mark.parametrize("select", ["loo", "gcv"])
def test_learn_auto_chooses_by_the_criterion_and_equals_learn_at_the_chosen_gammas(tmp_path, store, select):
    grid = ",".join(map(str, GRID))
    metrics, model = learn(store, tmp_path / "auto", "--gamma", "auto", "--select", select, "--gamma-grid", grid,
                           "--per-decade", 0)  # the grid's gammas only: the refined search is tests/test_gamma_search.py
    assert metrics["gamma"] == "auto" and metrics["selected_by"] == select
    assert len(metrics["gammas_selected"]) == metrics["n_tasks"] == 4
    hand = criteria_by_hand(store, model["projection"], 4, 3, GRID)
    key = "loo_mse" if select == "loo" else "gcv"
    assert metrics["gammas_selected"] == [GRID[int(np.argmin(c[key]))] for c in hand]
    assert len(set(metrics["gammas_selected"])) > 1  # not one gamma for every boundary
    by_gamma = {}
    for k, gamma in enumerate(metrics["gammas_selected"]):
        if gamma not in by_gamma:
            by_gamma[gamma] = learn(store, tmp_path / f"g{gamma}", "--gamma", str(gamma))[0]
        assert_same_matrix([metrics["accuracy_matrix"][k]], [by_gamma[gamma]["accuracy_matrix"][k]])
    fixed = by_gamma[metrics["gammas_selected"][-1]]
    assert float(json.loads(json.dumps(fixed["gamma"]))) == metrics["gammas_selected"][-1]


def test_learn_with_a_number_keeps_todays_outputs(tmp_path, store):
    metrics, _ = learn(store, tmp_path / "run", "--gamma", "0.5")
    assert metrics["gamma"] == 0.5 and "gammas_selected" not in metrics and "selected_by" not in metrics


def test_sweep_criteria_equal_hand_computation(tmp_path, store):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--gammas", ",".join(map(str, GRID)),
                    "--tasks", 4, "--projection-dim", 48, "--seed", 3, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    _, model = learn(store, tmp_path / "run")
    hand = criteria_by_hand(store, model["projection"], 4, 3, GRID)
    for m, r in enumerate(report["results"]):
        for key in ("loo_mse", "gcv", "loo_accuracy"):
            np.testing.assert_allclose(r[key], [c[key][m] for c in hand], rtol=1e-7, err_msg=key)
    assert report["best_gamma"] == GRID[int(np.argmin(hand[-1]["loo_mse"]))]
    assert {"gammas", "best_gamma", "best_gamma_test", "selected_by", "results", "tasks", "dataset"} <= set(report)
    assert all(set(r) >= {"gamma", "A_avg", "A_last", "F", "accuracy_matrix", "gcv", "loo_accuracy", "loo_mse"}
               for r in report["results"])


def test_sweep_without_loo_and_with_the_test_oracle(tmp_path, store):
    base = ["--features", store, "--gammas", ",".join(map(str, GRID)), "--tasks", 4, "--projection-dim", 48,
            "--seed", 3, "--backend", "numpy"]
    result = invoke("sweep", *base, "--out", tmp_path / "gcv", "--no-loo")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "gcv" / "sweep.json").read_text())
    assert report["selected_by"] == "gcv"
    assert all(r["loo_accuracy"] is None and r["loo_mse"] is None for r in report["results"])
    assert report["best_gamma"] == GRID[int(np.argmin([r["gcv"][-1] for r in report["results"]]))]
    result = invoke("sweep", *base, "--out", tmp_path / "test", "--no-loo", "--select", "test")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "test" / "sweep.json").read_text())
    assert report["selected_by"] == "test" and report["best_gamma"] == report["best_gamma_test"]
    assert_clean_error(invoke("sweep", *base, "--out", tmp_path / "x", "--no-loo", "--select", "loo"),
                       "--select loo needs the leave-one-out pass", tmp_path / "x")
    refused = invoke("sweep", *base, "--out", tmp_path / "x", "--select", "best")  # outside --help's fixed set
    assert refused.exit_code == 2 and "Invalid value for '--select'" in refused.output, refused.output
    assert not (tmp_path / "x").exists()


def test_gcv_warns_when_dof_near_n(tmp_path):
    """60 rows in D = 56: GCV picks the smallest gamma, where df/n is near 1, and says it is unreliable."""
    small = build_store(tmp_path / "small.zarr", n_train=60, noise=0.3)
    result = invoke("learn", "--features", small, "--out", tmp_path / "run", "--tasks", 2, "--projection-dim", 56,
                    "--gamma", "auto", "--select", "gcv", "--gamma-grid", "1e-6,1e-3,1,1e3", "--per-decade", 0,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "GCV is unreliable as D nears n" in result.output


@pytest.mark.parametrize("command", ["sweep", "learn"])
def test_kept_activations_give_the_same_results_as_projecting_again(tmp_path, store, monkeypatch, command):
    """Leave-one-out from the activations kept in memory, and from the cached rows projected again at every
    boundary (forced by a --max-memory below the activations' size), write the same bytes: every pass cuts a
    task's rows into the same blocks. Blocks of 20 rows; 5 tasks of 12 classes with --drop-remainder drop 2
    classes, so some rows are outside the stream. The decoded rows held in a temporary file instead of memory give
    the same bytes too."""
    import foal_pipe.protocol.learners.gram as gram
    import foal_pipe.protocol.rowcache as rowcache

    monkeypatch.setattr(rowcache, "BLOCK_ROWS", 20)
    projected = []
    project = gram._project
    monkeypatch.setattr(gram, "_project", lambda run, X: projected.append(X.shape[0]) or project(run, X))
    args = ["--features", store, "--tasks", 5, "--drop-remainder", "--projection-dim", 48, "--seed", 3, "--backend",
            "numpy"]
    args += ["--gammas", ",".join(map(str, GRID))] if command == "sweep" else ["--gamma", "auto", "--gamma-grid", "1,16,1e3"]
    files = ["sweep.json"] if command == "sweep" else ["metrics.json", "model.safetensors"]
    written, rows = {}, {}
    for budget, ram in (("8GiB", rowcache.RAM_BYTES), ("1KiB", rowcache.RAM_BYTES), ("8GiB", 0)):
        monkeypatch.setattr(rowcache, "RAM_BYTES", ram)
        projected.clear()
        out = tmp_path / f"{budget}-{ram}"
        result = invoke(command, *args, "--max-memory", budget, "--out", out)
        assert result.exit_code == 0, result.output
        assert ("projects the rows seen so far again" in result.output) == (budget == "1KiB"), result.output
        written[budget, ram] = {name: (out / name).read_bytes() for name in files}
        rows[budget] = sum(projected)
    assert len({tuple(w.values()) for w in written.values()}) == 1
    kept = json.loads(written["8GiB", 0][files[0]])
    assert kept["n_tasks"] == 5 and len(kept["dropped_classes"]) == 2
    seen = np.cumsum([rows.size for rows in build_stream(read(store)[1], N_CLASSES, 5, 10, 3, drop_remainder=True).rows])
    assert rows["8GiB"] == seen[-1] == kept["n_train_seen"]  # every row of the stream projected once, then kept
    assert rows["1KiB"] == seen.sum() + seen[-1]  # the rows of tasks 1..k again after boundary k


def test_one_default_grid_for_sweep_and_gamma_auto(tmp_path, store):
    """`sweep` without --gammas and `learn --gamma auto` without --gamma-grid score the same grid, so every gamma
    the sweep can pick, --gamma auto can too."""
    from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
    from foal_pipe.protocol import ModelConfig, SweepConfig

    assert SweepConfig().gammas == ModelConfig().gamma_grid == DEFAULT_GAMMA_GRID
    assert tuple(10.0**k for k in range(-4, 9)) == DEFAULT_GAMMA_GRID
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--tasks", 2, "--projection-dim", 16)
    assert result.exit_code == 0, result.output
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    auto, _ = learn(store, tmp_path / "auto", "--gamma", "auto", D=16, tasks=2)
    assert sweep["gammas"] == auto["gamma_grid"] == list(DEFAULT_GAMMA_GRID)


def test_a_choice_on_the_grids_edge_is_warned_about_and_recorded(tmp_path, store):
    base = ["--features", store, "--tasks", 4, "--projection-dim", 48, "--seed", 3, "--backend", "numpy"]
    inside = invoke("sweep", *base, "--out", tmp_path / "inside", "--gammas", ",".join(map(str, GRID)))
    assert inside.exit_code == 0 and "warning" not in inside.output, inside.output
    report = json.loads((tmp_path / "inside" / "sweep.json").read_text())
    assert GRID[0] < report["best_gamma"] < GRID[-1] and report["best_gamma_at_grid_edge"] is False
    high = invoke("sweep", *base, "--out", tmp_path / "high", "--gammas", "1e3,1e4,1e5")
    assert high.exit_code == 0, high.output
    report = json.loads((tmp_path / "high" / "sweep.json").read_text())
    assert report["best_gamma"] == 1e3 and report["best_gamma_at_grid_edge"] is True
    assert ("warning: the best gamma by loo, 1000, is the smallest of --gammas (1000 .. 100000); a better gamma may "
            "lie beyond the grid: extend --gammas") in " ".join(high.output.split())
    metrics, _ = learn(store, tmp_path / "auto", "--gamma", "auto", "--select", "loo", "--gamma-grid", "1e-4,1e-3,1e-2")
    assert metrics["gammas_at_grid_edge"] == [True] * 4 and metrics["gammas_selected"] == [1e-2] * 4
    result = invoke("learn", *base, "--out", tmp_path / "auto2", "--gamma", "auto", "--select", "loo", "--gamma-grid",
                    "1e-4,1e-3,1e-2")
    assert ("warning: --gamma auto chose 0.01, the largest of --gamma-grid (0.0001 .. 0.01), at 4 of 4 task "
            "boundaries; a better gamma may lie beyond the grid: extend --gamma-grid") in " ".join(result.output.split())
    inner, _ = learn(store, tmp_path / "auto3", "--gamma", "auto", "--select", "loo", "--gamma-grid",
                     ",".join(map(str, GRID)))
    assert not any(inner["gammas_at_grid_edge"])
