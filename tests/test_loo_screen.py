"""Leave-one-out accuracy counted from float32 products (issue 31): the screen decides each row as the float64
pipeline does, the rows it cannot decide go through that pipeline, and `learn --gamma auto` (which records the
accuracy curve only) writes the same bytes with and without it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_json_close, build_store, invoke, learn

from foal_pipe.core import leaveoneout, scoring
from foal_pipe.core.gammapath import Scratch
from foal_pipe.core.gammasearch import search_grid
from foal_pipe.core.leaveoneout import SampledLeaveOneOut
from foal_pipe.core.statistics import RidgeStatistics

GAMMAS = search_grid([1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6], 4)


def sampled(seed: int, n=400, D=60, classes=7, rows=150, spread=0.4, form="eigen"):
    """A sampled leave-one-out over overlapping Gaussian classes (margins of every size across the gammas), on
    ``G``'s eigenvectors or (``form="tridiagonal"``) the tridiagonal form."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    H = rng.normal(size=(n, D)) + spread * rng.normal(size=(classes, D))[labels]
    path = getattr(RidgeStatistics.from_batch(H, labels), form)()
    loo = SampledLeaveOneOut(path, GAMMAS, rows)
    pick = rng.choice(n, rows, replace=False)
    loo.add(H[pick[: rows // 2]], labels[pick[: rows // 2]])  # two blocks of coordinates
    loo.add(H[pick[rows // 2 :]], labels[pick[rows // 2 :]])
    return loo


def count_calls(monkeypatch, name):
    calls = []
    original = getattr(leaveoneout, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(leaveoneout, name, counted)
    return calls


@pytest.mark.parametrize("form", ["eigen", "tridiagonal"])
@pytest.mark.parametrize("seed", range(6))
def test_screened_accuracy_equals_the_float64_pipeline(seed, form, monkeypatch):
    loo = sampled(seed, form=form)
    screened = count_calls(monkeypatch, "screened_correct")
    for indices in (np.arange(GAMMAS.size), np.array([0, 5, 17]), np.array([GAMMAS.size - 1])):
        fast = loo.evaluate(indices, ("loo_accuracy",))
        exact = loo.evaluate(indices)
        assert set(fast) == {"loo_accuracy"}
        np.testing.assert_array_equal(fast["loo_accuracy"], exact["loo_accuracy"])
    assert screened  # the float32 route ran
    assert 0.0 < loo.evaluate()["loo_accuracy"].min() < loo.evaluate()["loo_accuracy"].max() < 1.0


def test_rows_the_screen_cannot_decide_go_through_float64(monkeypatch):
    """With an infinite allowance no row is decided in float32: every count comes from the float64 fallback, and it
    is the same; with the true bound almost every row is decided in float32."""
    loo = sampled(11)
    exact = loo.evaluate()["loo_accuracy"]
    again = count_calls(monkeypatch, "left_out")
    np.testing.assert_array_equal(loo.evaluate(None, ("loo_accuracy",))["loo_accuracy"], exact)
    decided_by_screen = 1 - sum(a[0].shape[0] for a in again) / (loo.rows * GAMMAS.size)
    assert decided_by_screen > 0.9
    again.clear()
    monkeypatch.setattr(scoring, "relative_bound", lambda depth: np.inf)
    np.testing.assert_array_equal(loo.evaluate(None, ("loo_accuracy",))["loo_accuracy"], exact)
    assert sum(a[0].shape[0] for a in again) == loo.rows * GAMMAS.size


def near_ties(offsets, seed=3):
    """Rows, gammas' scaled weights and leverages set so that the left-out prediction of each row's label misses
    its strongest rival's by ``offsets`` (drawn per row and gamma), in the exact arithmetic of the float64 scores."""
    rng = np.random.default_rng(seed)
    m, D, k, C = 300, 40, 3, 6
    Z = rng.normal(size=(m, D))
    base = rng.normal(size=(D, C)) / 50
    scaled = np.concatenate([base * f for f in (1.0, 0.8, 1.3)], axis=1)  # three gammas, one ranking of classes
    scores = (Z @ scaled).reshape(m, k, C)
    labels = np.argmax(scores[:, 0, :], axis=1)
    rivals = scores.copy()
    rivals[np.arange(m), :, labels] = -np.inf
    gap = scores[np.arange(m), :, labels] - rivals.max(axis=2)  # the leverage that makes the tie
    leverage = gap + rng.choice(offsets, size=(m, k))
    inside = (leverage > 1e-6) & (leverage < 0.9)
    leverage = np.where(inside, leverage, 0.5)
    column_norm = np.sqrt(np.einsum("dk,dk->k", scaled, scaled)).reshape(k, C).max(axis=1)
    got = leaveoneout.screened_correct(Z, Z.astype(np.float32), np.linalg.norm(Z, axis=1), leverage, scaled,
                                       scaled.astype(np.float32), column_norm, labels, np.arange(C), Scratch())
    return got, (Z, scaled, scores, leverage, labels, inside)


def test_margins_just_beyond_float32_rounding_are_decided_as_float64_does(monkeypatch):
    """Misses of 1e-9 (inside float32's rounding of the scores, far outside float64's) and of 1e-3."""
    again = count_calls(monkeypatch, "left_out")
    got, (_, _, scores, leverage, labels, inside) = near_ties([1e-9, -1e-9, 1e-3, -1e-3])
    assert again and inside.sum() > 500  # the 1e-9 rows went to float64; most rows kept their offsets
    again.clear()
    np.testing.assert_array_equal(got, leaveoneout.left_out(scores.copy(), leverage, labels, np.arange(6))[0])


def test_ties_to_float64_rounding_are_left_to_float64(monkeypatch):
    """Exact ties and misses of 1e-15: float64's own rounding decides them, so the screen leaves every such row
    to the float64 pipeline (each row's product of its own), whose decisions are then the counts."""
    again = count_calls(monkeypatch, "left_out")
    got, (Z, scaled, _, leverage, labels, inside) = near_ties([0.0, 1e-15, -1e-15])
    fallback = sum(call[0].shape[0] for call in again)
    assert fallback >= inside.sum() > 500
    again.clear()
    expected = np.zeros(3, dtype=np.int64)
    for g in range(3):
        rows = (Z @ scaled[:, g * 6 : (g + 1) * 6])[:, None, :]
        expected[g] = leaveoneout.left_out(rows, leverage[:, g : g + 1], labels, np.arange(6))[0][0]
    np.testing.assert_array_equal(got, expected)


def test_the_screen_steps_aside_where_float32_cannot_hold_the_coordinates():
    loo = sampled(2)
    loo._coordinates[0] = loo._coordinates[0] * 1e300
    assert loo._correct(np.arange(3)) is None


def test_one_class_has_no_rival_and_takes_the_float64_pipeline():
    H = np.random.default_rng(0).normal(size=(40, 5))
    labels = np.zeros(40, dtype=int)
    loo = SampledLeaveOneOut(RidgeStatistics.from_batch(H, labels).eigen(), GAMMAS, 40)
    loo.add(H, labels)
    assert loo._correct(np.arange(2)) is None
    np.testing.assert_array_equal(loo.evaluate(None, ("loo_accuracy",))["loo_accuracy"], np.ones(GAMMAS.size))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("screen") / "blobs.zarr", n_train=500, noise=2.5)


@pytest.mark.parametrize("extra", [(), ("--loo-sample", "200"), ("--order-seeds", "0,1"),
                                   ("--dtype", "float32", "--activation", "relu", "--gamma-grid", "0.1,10,1000,1e5")])
def test_learn_gamma_auto_writes_the_same_bytes_without_the_screen(tmp_path, store, monkeypatch, extra):
    screened = count_calls(monkeypatch, "screened_correct")
    learn(store, tmp_path / "fast", "--gamma", "auto", *extra)
    assert screened
    monkeypatch.setattr(SampledLeaveOneOut, "_correct", lambda self, indices: None)
    learn(store, tmp_path / "plain", "--gamma", "auto", *extra)
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_the_tridiagonal_route_chooses_as_the_eigenvectors_do(tmp_path, store, monkeypatch, command):
    """A sampled leave-one-out through the walk on the tridiagonal form (its reflectors and recurrences; the route
    of few rows at large D) against ``G``'s eigenvectors: the same choices and accuracy curves, the same LOO MSE up to
    float64 rounding, and weights equal to rounding (both solve the same ridge problems)."""
    import json

    from foal_pipe.core.gammapath import RidgeTridiagonal
    from foal_pipe.protocol import solvers

    recurrences = []
    original = RidgeTridiagonal.leverages
    monkeypatch.setattr(RidgeTridiagonal, "leverages", lambda self, *a: recurrences.append(1) or original(self, *a))
    written = {}
    for route, vectors in (("tridiagonal", False), ("eigenvectors", True)):
        monkeypatch.setattr(solvers, "sample_needs_vectors", lambda rows, dim, vectors=vectors: vectors)
        out = tmp_path / route
        if command == "learn":
            learn(store, out, "--gamma", "auto", "--loo-sample", "200")
            written[route] = json.loads((out / "metrics.json").read_text())["gamma_search"]
        else:
            result = invoke("sweep", "--features", store, "--out", out, "--tasks", 4, "--projection-dim", 48,
                            "--seed", 3, "--backend", "numpy", "--loo-sample", "200")
            assert result.exit_code == 0, result.output
            written[route] = json.loads((out / "sweep.json").read_text())
        if route == "tridiagonal":
            assert recurrences
            recurrences.clear()
    assert not recurrences  # the eigenvectors' route never runs a recurrence
    tri, eig = written["tridiagonal"], written["eigenvectors"]
    assert (tri["criterion"] == "loo_accuracy") if command == "learn" else tri["leave_one_out"]

    assert_json_close(tri, eig, rel=1e-6, abs_=1e-9)


def test_the_route_follows_the_blas_threads_in_force(tmp_path, store, monkeypatch):
    """On one BLAS thread a sample of fewer than ``2 D`` rows takes the tridiagonal form (its reflectors gain
    nothing from a second core, the eigenvectors' products do); on two, the eigenvectors down to ``D - 1,100``
    rows. Both routes choose the same gammas."""
    import json

    from threadpoolctl import threadpool_limits

    from foal_pipe.core.gammapath import RidgeTridiagonal
    from foal_pipe.core.leaveoneout import sample_needs_vectors

    assert sample_needs_vectors(96, 48, 1) and not sample_needs_vectors(95, 48, 1)
    assert sample_needs_vectors(1900, 3000, 2) and not sample_needs_vectors(1899, 3000, 2)
    assert sample_needs_vectors(60, 48, 2)
    recurrences = []
    original = RidgeTridiagonal.leverages
    monkeypatch.setattr(RidgeTridiagonal, "leverages", lambda self, *a: recurrences.append(1) or original(self, *a))
    chosen, routes = {}, {}
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            assert sample_needs_vectors(60, 48) == (threads == 2)
            learn(store, tmp_path / str(threads), "--gamma", "auto", "--loo-sample", "60")
        chosen[threads] = json.loads((tmp_path / str(threads) / "metrics.json").read_text())["gammas_selected"]
        routes[threads], recurrences[:] = bool(recurrences), []
    assert routes == {1: True, 2: False}
    assert chosen[1] == chosen[2]
