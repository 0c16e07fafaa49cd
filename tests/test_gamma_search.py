"""The refined search of gamma (`--per-decade`): against the criteria recomputed by hand over the same and a
dense grid, the records of metrics.json and sweep.json, the edge warning and determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_clean_error, assert_same_matrix, build_store, invoke, learn, read
from test_selection import criteria_by_hand
from test_zoom import RULES, best_by_hand, zoom_by_hand

from foal_pipe.model.classifier import AnalyticClassifier

RANGE = "1e-3,1e3"  # 6 decades: 8 points per decade -> 49 gammas
POINTS = 10.0 ** np.linspace(-3, 3, 49)  # what the search must evaluate, written independently


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("search") / "blobs.zarr", n_train=300, noise=2.5)


@pytest.fixture(scope="module")
def hand(store, tmp_path_factory):
    """Every criterion by hand at every boundary over ``POINTS`` (the projection from a `learn` of the same seed)."""
    _, model = learn(store, tmp_path_factory.mktemp("proj") / "run")
    return criteria_by_hand(store, model["projection"], 4, 3, list(POINTS)), model["projection"]


CURVE = {"loo": "loo_mse", "gcv": "gcv", "loo_accuracy": "loo_accuracy"}
GRID_AT = [0, 48]  # RANGE, the --gamma-grid, among the 49 points


def search_by_hand(c: dict[str, np.ndarray], select: str) -> tuple[list[int], int]:
    """The points evaluated and the choice: GCV over all 49 (least value); leave-one-out by its zoom (greatest LOO
    accuracy, among equals the least LOO MSE, then the smallest gamma; or least LOO MSE)."""
    if select == "gcv":
        return list(range(POINTS.size)), int(np.argmin(c["gcv"]))
    curves = {"loo": c["loo_mse"], "loo_accuracy": c["loo_accuracy"]}
    points = zoom_by_hand(GRID_AT, curves, select, *RULES[select])
    return points, best_by_hand(points, curves, select, *RULES[select])


@pytest.mark.parametrize("select", ["loo", "gcv", "loo_accuracy"])
def test_refined_choice_and_curve_equal_the_criterion_by_hand(tmp_path, store, hand, select):
    metrics, _ = learn(store, tmp_path / "auto", "--gamma", "auto", "--select", select, "--gamma-grid", RANGE)
    search = metrics["gamma_search"]
    assert search["criterion"] == select and search["per_decade"] == 8
    np.testing.assert_allclose(search["gammas"], POINTS, rtol=1e-12)
    expected = []
    for k, c in enumerate(hand[0]):
        points, best = search_by_hand(c, select)
        assert search.get("evaluated", [list(range(POINTS.size))] * 4)[k] == points
        np.testing.assert_allclose(search["values"][k], c[CURVE[select]][points], rtol=1e-7, err_msg=f"boundary {k}")
        expected.append(float(POINTS[best]))
    assert ("evaluated" in search) == (select != "gcv")  # GCV keeps its full refined grid
    np.testing.assert_allclose(metrics["gammas_selected"], expected, rtol=1e-12)
    assert search["gammas_selected"] == metrics["gammas_selected"]
    assert metrics["gammas_at_grid_edge"] == search["at_edge"] == [False] * 4
    assert any(g not in (1e-3, 1e-2, 0.1, 1, 10, 100, 1e3) for g in expected)  # the search left the decades
    fixed, _ = learn(store, tmp_path / "fixed", "--gamma", repr(metrics["gammas_selected"][-1]))
    assert_same_matrix(metrics["accuracy_matrix"][-1:], fixed["accuracy_matrix"][-1:])


@pytest.mark.parametrize("select", ["loo", "gcv"])
def test_refined_choice_is_within_the_step_of_a_dense_grid_minimum(tmp_path, store, hand, select):
    """A brute-force minimum over 1,201 gammas (200 a decade), by hand: the search's choice is one of its
    neighbours on the search grid, within 1/8 decade."""
    dense = 10.0 ** np.linspace(-3, 3, 1201)
    by_hand = criteria_by_hand(store, hand[1], 4, 3, list(dense))
    metrics, _ = learn(store, tmp_path / "auto", "--gamma", "auto", "--select", select, "--gamma-grid", RANGE)
    key = "loo_mse" if select == "loo" else "gcv"
    for k, c in enumerate(by_hand):
        best = dense[int(np.argmin(c[key]))]
        assert abs(np.log10(metrics["gammas_selected"][k]) - np.log10(best)) <= 1 / 8 + 1e-9, (k, best)


def test_sweep_records_every_selector_and_its_test_accuracy(tmp_path, store, hand):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--gammas", "1e-3,1,1e3", "--tasks", 4,
                    "--projection-dim", 48, "--seed", 3, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["gamma"] for r in report["results"]] == [1e-3, 1, 1e3]  # the decade outputs stay
    selections = {s["criterion"]: s for s in report["selections"]}
    assert set(selections) == {"loo", "gcv", "loo_accuracy"}
    for select, s in selections.items():
        np.testing.assert_allclose(s["gammas"], POINTS, rtol=1e-12)
        expected = [float(POINTS[search_by_hand(c, select)[1]]) for c in hand[0]]  # each as learn's, alone
        np.testing.assert_allclose(s["gammas_selected"], expected, rtol=1e-12)
        for k, gamma in enumerate(s["gammas_selected"]):  # each boundary's model is learn's at that gamma
            fixed, _ = learn(store, tmp_path / f"{select}{k}", "--gamma", repr(gamma))
            assert_same_matrix([s["accuracy_matrix"][k]], [fixed["accuracy_matrix"][k]])
    no_loo = invoke("sweep", "--features", store, "--out", tmp_path / "gcv", "--gammas", "1e-3,1,1e3", "--tasks", 4,
                    "--projection-dim", 48, "--seed", 3, "--backend", "numpy", "--no-loo")
    assert no_loo.exit_code == 0, no_loo.output
    only = json.loads((tmp_path / "gcv" / "sweep.json").read_text())["selections"]
    assert [s["criterion"] for s in only] == ["gcv"] and only[0]["A_avg"] == selections["gcv"]["A_avg"]


def test_a_choice_at_the_edge_of_the_range_is_warned_about_and_recorded(tmp_path, store):
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 4, "--projection-dim", 48,
                    "--seed", 3, "--backend", "numpy", "--gamma", "auto", "--select", "gcv", "--gamma-grid", "1e3,1e5")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["gammas_selected"] == [1e3] * 4 and metrics["gamma_search"]["at_edge"] == [True] * 4
    assert "the smallest of --gamma-grid" in result.output
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--gammas", "1e3,1e5", "--tasks", 4,
                    "--projection-dim", 48, "--seed", 3, "--backend", "numpy", "--no-loo")
    assert result.exit_code == 0, result.output
    assert "GCV's refined choice, 1000, is an end of the searched range" in result.output


def test_same_bytes_twice(tmp_path, store):
    for command, files in (("learn", ("metrics.json", "model.safetensors")), ("sweep", ("sweep.json",))):
        extra = ["--gamma", "auto", "--gamma-grid", RANGE] if command == "learn" else ["--gammas", RANGE]
        for run in ("a", "b"):
            result = invoke(command, "--features", store, "--out", tmp_path / f"{command}{run}", "--tasks", 4,
                            "--projection-dim", 48, "--seed", 3, "--backend", "numpy", *extra)
            assert result.exit_code == 0, result.output
        for name in files:
            assert (tmp_path / f"{command}a" / name).read_bytes() == (tmp_path / f"{command}b" / name).read_bytes()


def test_per_decade_zero_is_the_grid_and_a_negative_one_is_refused(tmp_path, store):
    metrics, _ = learn(store, tmp_path / "grid", "--gamma", "auto", "--gamma-grid", "1e-3,1,1e3", "--per-decade", 0)
    assert metrics["gamma_search"]["gammas"] == [1e-3, 1, 1e3]
    assert_clean_error(invoke("learn", "--features", store, "--out", tmp_path / "x", "--gamma", "auto",
                              "--per-decade", -1, "--backend", "numpy"), "--per-decade must be an integer >= 0",
                       tmp_path / "x")


def test_python_auto_takes_the_refined_gcv_choice(store):
    """``AnalyticClassifier(gamma="auto")`` on the raw features: GCV by hand over the 49 points."""
    Xtr, ytr, _, _ = read(store)
    X = Xtr.astype(np.float64)
    clf = AnalyticClassifier(gamma="auto", engine="gram", gamma_grid=[1e-3, 1e3]).fit(X, ytr)
    Y = (ytr[:, None] == np.unique(ytr)[None, :]).astype(float)
    n = X.shape[0]
    gcv = []
    for g in POINTS:
        hat = X @ np.linalg.solve(X.T @ X + g * np.eye(X.shape[1]), X.T)
        gcv.append(n * np.sum((Y - hat @ Y) ** 2) / (n - np.trace(hat)) ** 2)
    assert clf.gamma_ == pytest.approx(POINTS[int(np.argmin(gcv))], rel=1e-12)
