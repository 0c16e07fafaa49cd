"""Where the arithmetic cannot deliver the exact answer, the run refuses or marks it (the numerical audit of
2026-11-29): float64 sums too ill-conditioned for a gamma, an RSS below its rounding, sums that underflow, and
messages that name a fix that helps. References are closed forms in the kernel form ``H^T (H H^T + g I)^-1 Y``,
well conditioned where there are fewer rows than dimensions."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe import AnalyticClassifier, FoalPipeError
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.store import write_store


def _few_rows(n=20, D=300, classes=5, seed=100):
    """Fewer rows than dimensions: ``G = H^T H`` has rank ``n`` and ``D - n`` eigenvalues at rounding level."""
    rng = np.random.default_rng(seed)
    H = 1.0 / (1.0 + np.exp(-rng.normal(size=(n, 10)) @ rng.normal(size=(10, D))))
    y = np.arange(n) % classes
    return H, y, (y[:, None] == np.arange(classes)).astype(np.float64)


def _kernel_ridge(H, Y, gamma):
    return H.T @ np.linalg.solve(H @ H.T + gamma * np.eye(len(H)), Y)


def test_float64_sums_too_ill_conditioned_for_gamma_are_refused():
    """At gamma 1e-13 the float64 solve left W 20-40% off the exact ridge (exit 0); it is refused now, and a gamma
    the sums resolve keeps W within 1e-9 of the closed form."""
    H, y, Y = _few_rows()
    clf = AnalyticClassifier(gamma=1e-13).partial_fit(H, y)
    with pytest.raises(FoalPipeError, match=r"rounding of the float64 Gram sums may move the weights by about .*more "
                                            r"than 0.0001.*use a gamma of at least \S+ \(a later task's sums, over more "
                                            r"rows, may need more\)$"):
        clf.predict(H)
    W = AnalyticClassifier(gamma=1e-2).partial_fit(H, y).weights_
    exact = _kernel_ridge(H, Y, 1e-2)
    assert np.linalg.norm(W - exact) / np.linalg.norm(exact) < 1e-9


@pytest.mark.parametrize("head", ["balanced", "dual"])
def test_heads_solving_float64_sums_refuse_the_same_gammas(tmp_path, head):
    H, y, _ = _few_rows()
    store = write_store(tmp_path / "s.zarr", (H[:, :12], y), (H[:, :12], y), [f"c{i}" for i in range(5)], chunk_rows=8)
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 1, "--head", head, "--projection-dim", 300,
                    "--gamma", "1e-13")
    assert_clean_error(result, "the rounding of the float64 Gram sums may move the weights", out)


@pytest.mark.parametrize("route", ["eigen", "tridiagonal"])
def test_gcv_is_left_out_where_the_rss_is_below_its_rounding(route):
    """Near interpolation the Gram form's RSS is a difference of numbers of the size of |Y|^2: at gamma 1e-6 it
    read 0.0 or 1% off at the audit's boundaries (and --select gcv chose that gamma). Such a GCV is infinite
    (never chosen, null in the files); every GCV given equals the closed form."""
    H, y, Y = _few_rows()
    stats = RidgeStatistics.from_batch(H, y, np.unique(y))
    path = stats.eigen() if route == "eigen" else stats.tridiagonal()
    gammas = np.array([1e-6, 1e-2, 1.0])
    gcv = path.gcv(gammas)
    assert np.isinf(gcv[0])
    n = len(H)
    for g, value in zip(gammas[1:], gcv[1:]):
        A = np.linalg.inv(H @ H.T + g * np.eye(n))
        residual = g * (A @ Y)
        exact = n * np.sum(residual**2) / (g * np.trace(A)) ** 2
        assert value == pytest.approx(exact, rel=1e-6)


def test_float32_sums_that_underflow_are_refused(tmp_path):
    """Features near 1e-30: their float32 products underflow to 0, G was all zeros and W = Q / gamma (100x off,
    exit 0)."""
    rng = np.random.default_rng(7)
    y = np.repeat(np.arange(4), 6)
    X = (rng.normal(size=(4, 6))[y] * 2 + rng.normal(size=(24, 6))) * 1e-30
    store = write_store(tmp_path / "s.zarr", (X, y), (X, y), list("abcd"), chunk_rows=8)
    args = ("--projection-dim", 0, "--gamma", "1e-60", "--tasks", 2)
    assert invoke("learn", "--features", store, "--out", tmp_path / "f64", *args).exit_code == 0
    out = tmp_path / "f32"
    assert_clean_error(invoke("learn", "--features", store, "--out", out, *args, "--dtype", "float32"),
                       "the float32 Gram sums underflowed", out)


def test_fecam_on_a_class_without_variance_names_a_fix_that_helps(tmp_path):
    y = np.repeat(np.arange(4), 3)
    store = write_store(tmp_path / "s.zarr", (np.ones((12, 6)), y), (np.ones((8, 6)), np.repeat(np.arange(4), 2)),
                        list("abcd"), chunk_rows=8)
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--tasks", 2)
    assert_clean_error(result, "has no variance in any dimension", out)
    assert "--shrinkage" not in result.output


def test_a_task_without_rows_lists_a_few_of_its_classes(tmp_path):
    y = np.repeat([0, 6999], 5)
    rng = np.random.default_rng(0)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(10, 6)), y), (rng.normal(size=(6, 6)), y[:6]),
                        [f"k{i}" for i in range(7000)], chunk_rows=8)
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 3, "--projection-dim", 8)
    assert_clean_error(result, "has no training rows", out)
    assert len(result.output) < 400


@pytest.mark.parametrize(("option", "value"), [("--gammas", "1,,2"), ("--gammas", "1,2,"), ("--heads", "ridge,,ncm"),
                                               ("--order-seeds", "0,,1")])
def test_an_empty_item_in_a_list_option_is_refused(tmp_path, option, value):
    rng = np.random.default_rng(0)
    y = np.arange(40) % 4
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(40, 6)), y), (rng.normal(size=(8, 6)), y[:8]),
                        list("abcd"), chunk_rows=8)
    out = tmp_path / "o"
    result = invoke("sweep", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 8, option, value)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output  # usage error
    assert "has an empty item between commas; remove the extra comma" in result.output and not out.exists()


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_choice_by_gcv_where_no_gamma_has_one_is_refused(tmp_path, command):
    """Every gamma of the search too small for GCV's residual: the choice fell on the first gamma in silence;
    it is refused before any output, while a sweep choosing by leave-one-out still runs (GCV null)."""
    H, y, _ = _few_rows()
    store = write_store(tmp_path / "s.zarr", (H[:, :12], y), (H[:, :12], y), [f"c{i}" for i in range(5)], chunk_rows=8)
    out = tmp_path / "o"
    grid = ("--gamma", "auto", "--gamma-grid", "1e-8,1e-7", "--per-decade", 0) if command == "learn" else (
        "--gammas", "1e-8,1e-7", "--no-loo")
    result = invoke(command, "--features", store, "--out", out, "--tasks", 1, "--projection-dim", 300, "--select", "gcv",
                    *grid)
    assert_clean_error(result, "GCV cannot be computed at any gamma of the search", out)
    with pytest.raises(FoalPipeError, match="GCV cannot be computed"):
        AnalyticClassifier(gamma="auto", gamma_grid=[1e-8, 1e-7]).partial_fit(H, y).predict(H)
    if command == "sweep":
        assert invoke("sweep", "--features", store, "--out", out, "--tasks", 1, "--projection-dim", 300,
                      "--gammas", "2e-8,1e-7").exit_code == 0  # at 1e-8 the solve's own rounding is refused on two BLAS threads


def test_the_sweep_table_marks_no_gcv_choice_where_gcv_has_no_value(tmp_path):
    H, y, _ = _few_rows()
    store = write_store(tmp_path / "s.zarr", (H[:, :12], y), (H[:, :12], y), [f"c{i}" for i in range(5)], chunk_rows=8)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 1, "--projection-dim", 300,
                    "--gammas", "2e-8,1e-7")  # at 1e-8 the solve's own rounding is refused on two BLAS threads
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.lstrip("│ ").startswith(("2e-0", "1e-0"))]
    assert len(rows) == 2 and not any("gcv" in row for row in rows)


def test_a_sweep_records_no_gcv_choice_where_gcv_has_no_value(tmp_path):
    """GCV null at every gamma: sweep.json recorded a GCV "selection" (the first gamma, its test accuracy) and the
    df/n warning of that non-choice; now GCV's selection is left out with a warning, leave-one-out's kept."""
    import json

    H, y, _ = _few_rows()
    store = write_store(tmp_path / "s.zarr", (H[:, :12], y), (H[:, :12], y), [f"c{i}" for i in range(5)], chunk_rows=8)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 1, "--projection-dim", 300,
                    "--gammas", "2e-8,1e-7")  # at 1e-8 the solve's own rounding is refused on two BLAS threads
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert all(g is None for r in report["results"] for g in r["gcv"])
    assert [s["criterion"] for s in report["selections"]] == ["loo", "loo_accuracy"]
    assert "GCV has no value at any gamma" in result.output and "effective degrees of freedom" not in result.output
    assert "GCV " not in next(line for line in result.output.splitlines() if line.startswith("refined search"))


def _digits_activations(D=200, n=800):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    P = np.random.default_rng(0).normal(size=(64, D)) / 8
    return 1.0 / (1.0 + np.exp(-(X[:n] / 16.0) @ P)), y[:n]


def _augmented_ridge(H, y, gamma):
    """The ridge solution by least squares on ``[H; sqrt(gamma) I]``: no normal equations, so accurate where
    ``G + gamma I`` is ill-conditioned."""
    Y = (y[:, None] == np.unique(y)).astype(np.float64)
    D = H.shape[1]
    return np.linalg.lstsq(np.vstack([H, np.sqrt(gamma) * np.eye(D)]), np.vstack([Y, np.zeros((D, Y.shape[1]))]),
                           rcond=None)[0]


def _rls(H, y, gamma, batch=10):
    clf = AnalyticClassifier(gamma=gamma, engine="rls")
    with np.errstate(all="ignore"):
        for i in range(0, len(H), batch):
            clf.partial_fit(H[i : i + batch], y[i : i + batch])
    return clf


def test_the_rls_recursion_that_drifted_in_float64_is_refused():
    """The audit: gamma 1e-9 left the float64 recursion's W 27% off the exact ridge on digits, exit 0, where the
    sums' exact solve is within 1e-7. The weights are now checked against that solve: refused where the recursion
    moved them by more than 1e-4, given (and within 1e-4 of the least-squares reference) where it did not."""
    H, y = _digits_activations()
    drifted = _rls(H, y, 1e-9)
    reference = _augmented_ridge(H, y, 1e-9)
    assert np.linalg.norm(drifted._engine.W - reference) / np.linalg.norm(reference) > 1e-3  # the fault is there
    with pytest.raises(FoalPipeError, match=r"^the RLS recursion's rounding moved the weights by .* \(more than 0.0001\) "
                                            r"from the exact solve of the same sums at gamma 1e-09; use a larger gamma "
                                            r"or engine='gram'$"):
        drifted.predict(H)
    for gamma in (1e-8, 1e-4, 1.0):
        W = _rls(H[:400], y[:400], gamma).weights_
        reference = _augmented_ridge(H[:400], y[:400], gamma)
        assert np.linalg.norm(W - reference) / np.linalg.norm(reference) < 1e-4


def test_learn_with_the_rls_engine_refuses_a_drifted_recursion(tmp_path):
    H, y = _digits_activations()
    store = write_store(tmp_path / "s.zarr", (H, y), (H[:100], y[:100]), [f"c{i}" for i in range(10)], chunk_rows=64)
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 0, "--engine", "rls",
                    "--batch-size", 10, "--gamma", "1e-9")
    assert_clean_error(result, "the RLS recursion's rounding moved the weights", out)
    assert "--gamma" in result.output and "--engine gram" in result.output
    assert invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 0, "--engine", "rls",
                  "--batch-size", 10, "--gamma", "1e-3").exit_code == 0


def test_a_loaded_rls_model_continues_checked_from_its_state(tmp_path):
    """A saved recursion keeps R and W only: continuing it is checked against the sums they stand for (``R^-1 - gamma
    I`` and ``R^-1 W``) plus the new rows', equal to the uninterrupted run's weights."""
    H, y = _digits_activations(n=600)
    whole = _rls(H, y, 0.5)
    first = _rls(H[:300], y[:300], 0.5)
    first.save(tmp_path / "m.safetensors")
    loaded = AnalyticClassifier.load(tmp_path / "m.safetensors")
    with np.errstate(all="ignore"):
        for i in range(300, 600, 10):
            loaded.partial_fit(H[i : i + 10], y[i : i + 10])
    np.testing.assert_allclose(loaded.weights_, whole.weights_, rtol=0, atol=1e-10)
    sums = loaded._engine._sums.aligned(loaded.classes_)
    np.testing.assert_allclose(sums.solve(0.5), whole.weights_, rtol=0, atol=1e-8)


def test_the_sweep_table_marks_every_training_criterions_choice(tmp_path):
    """The table marked test, GCV and LOO MSE but not leave-one-out accuracy, `--gamma auto`'s default criterion
    (docs/tour.md: "the choice of each criterion"); its row is marked now, whichever --select."""
    import json

    H, y = _digits_activations(D=64, n=400)
    store = write_store(tmp_path / "s.zarr", (H, y), (H[:100], y[:100]), [f"c{i}" for i in range(10)], chunk_rows=64)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 2, "--projection-dim", 100,
                    "--gammas", "0.01,1,100,10000")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "sweep.json").read_text())
    last = [r["loo_accuracy"][-1] for r in report["results"]]
    best = report["gammas"][int(np.argmax(last))] if last.count(max(last)) == 1 else None
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 5
            and line.split("│")[1].strip()[:1].isdigit()}
    marked = [g for g, line in rows.items() if "loo_accuracy" in line]
    assert len(marked) == 1 and (best is None or float(marked[0]) == best)
