"""Numerical extremes of the inputs, end to end (audit s25).

Raw features (``--projection-dim 0``) whose columns differ in scale (one column 1e12 times the others, or half the
columns 1e5 and half 1e-5) are solved, to the closed form: the gamma checks measure each entry's rounding against
its own columns' scales (``|dG_ij| <= c u sqrt(G_ii G_jj)``, ``core.drift.column_scales``), as a Cholesky solve of
the sums is accurate whatever the columns' scales, instead of ``u max|G|`` for every entry, which grew with the
spread of the scales although the weights do not and named a gamma (2.98e16) that threw the unit-scale columns away.
A refusal stays where the weights are noise: a rank-deficient block of small columns at a gamma below their rounding.
dual's refusal of its sums names a gamma for them alone and says its recursion's checks may ask for more.

Also: a float16 store near float16's largest value (65504) through learn and predict, against the closed form on
the stored values (no other test runs float16 rows near the top of their range end to end).
"""

import csv
import json

import numpy as np
import pytest
from helpers import invoke
from safetensors.numpy import load_file

from foal_pipe import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store

NOISE = ("would be noise", "too ill-conditioned")


def blobs(n: int, d: int = 6, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``k`` classes in turn about fixed centres 3 apart (the same centres for every ``seed``)."""
    y = np.arange(n) % k
    centres = 3.0 * np.random.default_rng(99).normal(size=(k, d))
    return centres[y] + np.random.default_rng(seed).normal(size=(n, d)), y


def exact_ridge(H: np.ndarray, y: np.ndarray, gamma: float, classes: np.ndarray) -> np.ndarray:
    """(H^T H + gamma I)^-1 H^T Y, solved after symmetric diagonal equilibration (S G S, S = diag(G)^-1/2), which
    leaves the solution the same and the solve well conditioned whatever the columns' scales."""
    H = H.astype(np.float64)
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    A = H.T @ H + gamma * np.eye(H.shape[1])
    s = 1.0 / np.sqrt(np.diag(A))
    return s[:, None] * np.linalg.solve(s[:, None] * A * s[None, :], s[:, None] * (H.T @ Y))


def learn(store, out, *extra):
    return invoke("learn", "--features", store, "--out", out, "--backend", "numpy", "--seed", 3, "--tasks", 1, *extra)


def scaled_store(path, scales):
    s = np.asarray(scales, dtype=np.float64)
    (X, y), (Xt, yt) = blobs(60), blobs(30, seed=1)
    train, test = ((X * s).astype(np.float32), y), ((Xt * s).astype(np.float32), yt)
    return write_store(path, train, test, ["a", "b", "c"], chunk_rows=32), train, test


UNEQUAL = [
    pytest.param([1e12, 1, 1, 1, 1, 1], "1", id="one-column-1e12-gamma-1"),
    pytest.param([1e12, 1, 1, 1, 1, 1], "1e6", id="one-column-1e12-gamma-1e6"),
    pytest.param([1e5] * 3 + [1e-5] * 3, "1", id="halves-1e5-1e-5-gamma-1"),
]


@pytest.mark.parametrize(("scales", "gamma"), UNEQUAL)
def test_raw_columns_of_unequal_scale_are_solved_exactly_not_refused_as_noise(tmp_path, scales, gamma):
    """Solved, to the closed form (the float64 solve of the same sums is exact to 1e-15), where "so the solve would
    be noise" / "may move the weights by about 0.006" was said."""
    store, (X, y), (Xt, yt) = scaled_store(tmp_path / "s.zarr", scales)
    result = learn(store, tmp_path / "run", "--projection-dim", 0, "--gamma", gamma)
    assert result.exit_code == 0, result.output
    model = load_file(str(tmp_path / "run" / "model.safetensors"))
    W = exact_ridge(X, y, float(gamma), model["classes"])
    np.testing.assert_allclose(model["W"], W, rtol=1e-9, atol=1e-12 * np.abs(W).max())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["A_last"] == pytest.approx(float(np.mean(np.argmax(Xt.astype(np.float64) @ W, axis=1) == yt)))


def test_the_gamma_named_for_unequal_columns_does_not_throw_the_small_columns_away(tmp_path):
    """gamma 1 (A_last 100%, exact) runs rather than being refused as noise toward "a gamma of at least 2.98e+16",
    at which the unit-scale columns' weights vanish (A_last 66.7%)."""
    store, (X, y), (Xt, yt) = scaled_store(tmp_path / "s.zarr", [1e12, 1, 1, 1, 1, 1])
    refused = learn(store, tmp_path / "run", "--projection-dim", 0, "--gamma", 1)
    exact_at_1 = np.mean(np.argmax(Xt.astype(np.float64) @ exact_ridge(X, y, 1.0, np.arange(3)), axis=1) == yt)
    assert exact_at_1 == 1.0
    if refused.exit_code != 0:  # the refusal's own reason: noise; it is not (see the test above)
        assert not any(word in refused.output for word in NOISE), refused.output


@pytest.mark.parametrize(("scales", "gamma"), [([1e5] * 3 + [1e-5] * 3, 1.0), ([1e15, 1, 1, 1, 1, 1], 1e6)])
def test_the_estimator_solves_unequal_columns_exactly(scales, gamma):
    """AnalyticClassifier.fit solves them as learn does, to the closed form."""
    X, y = blobs(60)
    X = X * np.asarray(scales)
    clf = AnalyticClassifier(gamma=gamma).fit(X, y)
    W = exact_ridge(X, y, gamma, np.arange(3))
    np.testing.assert_allclose(clf.weights_, W, rtol=1e-9, atol=1e-12 * np.abs(W).max())


def f16_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four classes of 32 features within float16's range, up to its largest value 65504."""
    centres = np.random.default_rng(1).uniform(-1, 1, size=(4, 32))
    y = np.arange(n) % 4
    X = (centres[y] + 0.3 * np.random.default_rng(seed).normal(size=(n, 32))) * 60000
    return np.clip(X, -65504, 65504).astype(np.float16), y


@pytest.mark.parametrize("extra", [("--projection-dim", "16"), ("--projection-dim", "16", "--activation", "relu"),
                                   ("--projection-dim", "0")])
def test_a_float16_store_near_its_largest_value_learns_and_predicts_the_closed_form(tmp_path, extra):
    (X, y), (Xt, yt) = f16_rows(80, 0), f16_rows(40, 1)
    store = write_store(tmp_path / "s.zarr", (X, y), (Xt, yt), list("abcd"), chunk_rows=32, dtype="float16")
    run = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", run, "--backend", "numpy", "--seed", 3, "--tasks", 2, *extra)
    assert result.exit_code == 0, result.output
    model = load_file(str(run / "model.safetensors"))
    act = json.loads((run / "metrics.json").read_text())["activation"]
    P = model.get("projection")

    def expand(rows):
        Z = rows.astype(np.float64) if P is None else rows.astype(np.float64) @ P.astype(np.float64)
        with np.errstate(over="ignore"):
            return 1 / (1 + np.exp(-Z)) if act == "sigmoid" else np.maximum(Z, 0) if act == "relu" else Z

    W = exact_ridge(expand(X), y, 1.0, model["classes"])
    np.testing.assert_allclose(model["W"], W, rtol=1e-9, atol=1e-12 * np.abs(W).max())
    predicted = invoke("predict", "--model", run / "model.safetensors", "--features", store, "--out", tmp_path / "p.csv")
    assert predicted.exit_code == 0, predicted.output
    with open(tmp_path / "p.csv") as f:
        got = np.array([int(r["predicted_class"]) for r in csv.DictReader(f)])
    np.testing.assert_array_equal(got, model["classes"][np.argmax(expand(Xt) @ W, axis=1)])


def test_small_columns_of_rank_deficient_sums_are_still_refused_and_the_named_gamma_fits():
    """Beside a column 1e12 times the others, two identical small columns at gamma 1e-20: their direction
    ``(e_2 - e_3)`` has no sum but gamma, far below the rounding of their own sums, so the weights are noise and
    refused; the gamma the refusal names passes every check and gives the closed form."""
    X, y = blobs(60)
    X = X * np.asarray([1e12, 1, 1, 1, 1, 1])
    X[:, 2] = X[:, 1]
    with pytest.raises(FoalPipeError, match="too ill-conditioned|would be noise") as refused:
        AnalyticClassifier(gamma=1e-20).fit(X, y).weights_  # noqa: B018 (solved where first read)
    named = float(str(refused.value).split("a gamma of at least ")[1].split()[0])
    assert named < 1  # the small columns' own scale (about 1e-8 here), not the large column's (about 1e16)
    clf = AnalyticClassifier(gamma=named).fit(X, y)
    W = exact_ridge(X, y, named, np.arange(3))
    np.testing.assert_allclose(clf.weights_, W, rtol=1e-6, atol=1e-9 * np.abs(W).max())


def test_dual_names_a_gamma_for_its_sums_and_says_its_recursion_may_ask_more(tmp_path):
    """dual on nearly identical rows (48 raw features about 1e4, 20 rows a task) at gamma 1e-3: its sums' rounding
    is refused, naming a gamma for ``--gamma`` and saying that its per-batch recursion's checks, run after, may ask
    for more; at the named gamma the sums pass, and a refusal left is the recursion's, as said."""
    def rows(n, seed):
        return (1e4 + np.random.default_rng(seed).normal(size=(n, 48))).astype(np.float32), np.arange(n) % 4

    store = write_store(tmp_path / "s.zarr", rows(40, 0), rows(20, 1), list("abcd"), chunk_rows=32)
    args = ("--features", store, "--backend", "numpy", "--tasks", 2, "--head", "dual", "--projection-dim", 0)
    first = invoke("learn", *args, "--out", tmp_path / "a", "--gamma", "1e-3")
    assert first.exit_code == 1 and "rounding of the float64 Gram sums" in first.output, first.output
    assert "(for --gamma); dual's checks of its per-batch recursion, run after this one, may then ask" in first.output
    named = first.output.split("a gamma of at least ")[1].split()[0]
    again = invoke("learn", *args, "--out", tmp_path / "b", "--gamma", named)
    assert "Gram sums" not in again.output, again.output
    assert again.exit_code == 0 or "dual's compensation weights" in again.output or "per-batch recursion" in again.output
