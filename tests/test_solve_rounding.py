"""The float64 solve's own rounding: where ``G`` has rank one (every row alike) it moves ``W`` by up to
``u sqrt(D) lambda_max / gamma``, which the sums' drift estimate (scaled by ``max|G|``) does not see. Every weight
given out lies within 1e-4 of the closed form, or its gamma is refused (``core.linalg.check_solved``)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe import FoalPipeError
from foal_pipe.core.backend import get_namespace
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.heads.balanced import BalancedHead
from foal_pipe.protocol.solvers import ManyGammas
from foal_pipe.store import write_store

GAMMAS = np.logspace(-10, -2, 33)


COUNTS = np.array([200, 100, 50, 50])


def _rank_one(D: int, a: float) -> tuple[np.ndarray, np.ndarray, RidgeStatistics]:
    """400 rows, every one ``c 1`` with ``400 c^2 = a``: ``G = a 1 1^T``, whose solve is ``1 (c counts)^T / (a D + gamma)``."""
    labels = np.repeat(np.arange(4), COUNTS)
    H = np.full((labels.size, D), np.sqrt(a / labels.size))
    return H, labels, RidgeStatistics.from_batch(H, labels)


def _closed_form(H: np.ndarray, gamma: float) -> np.ndarray:
    n, D = H.shape
    c = H[0, 0]
    return np.ones((D, 1)) * (c * COUNTS)[None, :] / (n * c * c * D + gamma)


def _relative(W: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(W - exact) / np.linalg.norm(exact))


def _given(route: str, H: np.ndarray, labels: np.ndarray, statistics: RidgeStatistics, gamma: float) -> list[float]:
    """Each model the route gives out at a boundary searching ``gamma``, as its relative distance from the closed form:
    ``learn --gamma G``'s Cholesky solve, or a boundary's gamma path (the eigenvectors, which leave-one-out uses, or
    the tridiagonal form) with every gamma it reports."""
    if route == "cholesky":
        return [_relative(statistics.solve(gamma), _closed_form(H, gamma))]
    solver = ManyGammas([gamma], loo=route == "eigen", choose=None, per_decade=0)
    pending = solver.start(statistics, 0)
    if route == "eigen":
        pending.loo.add(H, labels)
        solver.zoom(pending)
    boundary = solver.finish(pending)
    W = np.asarray(boundary.W)
    return [_relative(W[:, m, :], _closed_form(H, g)) for m, g in enumerate(boundary.gammas)]


@pytest.mark.parametrize("route", ["cholesky", "eigen", "tridiagonal"])
@pytest.mark.parametrize(("D", "a"), [(300, 100.0), (1000, 100.0), (1000, 5000.0)])
def test_every_weight_given_out_is_within_its_promise_of_the_closed_form(route, D, a):
    H, labels, statistics = _rank_one(D, a)
    given, refused_by_solve = [], 0
    for gamma in map(float, GAMMAS):
        try:
            given += _given(route, H, labels, statistics, gamma)
        except FoalPipeError as error:
            refused_by_solve += "iterative refinement" in str(error)
    assert given and max(given) <= 1e-4, max(given)
    assert refused_by_solve  # the sums' estimate alone let through gammas whose weights were off by up to 8e-3


def test_the_refusal_measures_the_solve_and_names_the_gamma():
    H, _, statistics = _rank_one(1000, 5000.0)
    path = statistics.gamma_path(True)
    W = np.asarray(path.weights([1e-5]))[:, 0, :]
    assert _relative(W, _closed_form(H, 1e-5)) > 5e-4  # what was given out before
    with pytest.raises(FoalPipeError, match=r"at gamma 1e-05 the float64 solve's own rounding may move the weights by "
                                            r"up to 0\.00[0-9]+ .*use gammas above 1e-05"):
        path.check_weights(statistics.G, statistics.Q, np.array([1.0, 1e-5]), path.weights([1.0, 1e-5]))


def test_ordinary_sums_are_not_refused_at_small_gammas():
    """Sigmoid features: the solve stays within 1e-6 of the closed form down to gamma 1e-6 on every route."""
    rng = np.random.default_rng(0)
    H = 1.0 / (1.0 + np.exp(-rng.normal(size=(3000, 64)) @ rng.normal(size=(64, 300)) / 8.0))
    labels = rng.integers(0, 10, 3000)
    statistics = RidgeStatistics.from_batch(H, labels)
    Y = (labels[:, None] == np.arange(10)).astype(np.float64)
    for gamma in (1e-6, 1e-3):
        exact = np.linalg.solve(H.T @ H + gamma * np.eye(300), H.T @ Y)
        assert _relative(statistics.solve(gamma), exact) < 1e-6
        for vectors in (True, False):
            path = statistics.gamma_path(vectors)
            weights = path.weights([gamma])
            path.check_weights(statistics.G, statistics.Q, np.array([gamma]), weights)
            assert _relative(np.asarray(weights)[:, 0, :], exact) < 1e-6


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_store_of_identical_rows_at_a_tiny_gamma_is_refused_cleanly(tmp_path, command):
    X = np.ones((400, 16))
    y = np.arange(400) % 4
    store = write_store(tmp_path / "s.zarr", (X, y), (X, y), list("abcd"), chunk_rows=100)
    out = tmp_path / "o"
    gamma = ("--gamma", "1e-6") if command == "learn" else ("--gammas", "1e-6,1", "--no-loo")
    result = invoke(command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 1000, *gamma)
    assert_clean_error(result, "at gamma 1e-06 the float64 solve's own rounding may move the weights", out)
    if command == "learn":
        assert invoke(command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 1000,
                      "--gamma", "1e-4").exit_code == 0


def test_the_balanced_heads_weights_are_within_their_promise_or_refused():
    """The balanced head's re-weighted ridge of identical rows: ``(s c^2 1 1^T + gamma I)^-1 1 (c w n)^T``. Which
    check refuses the least gammas depends on the CPU's rounding (the sums' resolution alone on an AVX-512 EPYC, the
    solve's iterative refinement too elsewhere): every weight given is within the promise, and the least are refused."""
    H, labels, _ = _rank_one(1000, 100.0)
    weights = (1.0 / COUNTS) * (COUNTS.size / np.sum(1.0 / COUNTS))
    c = H[0, 0]
    given, refused = [], []
    for gamma in map(float, GAMMAS):
        head = BalancedHead(gamma=gamma, xp=get_namespace("numpy"), dim=H.shape[1])
        head.add(H, labels)
        try:
            W = np.asarray(head.boundary().W)
        except FoalPipeError as error:
            assert "iterative refinement" in str(error) or "rounding of the float64 Gram sums" in str(error), error
            refused.append(gamma)
            continue
        scale = np.sum(weights * COUNTS) * c * c * H.shape[1] + gamma
        exact = np.ones((H.shape[1], 1)) * (c * weights * COUNTS)[None, :] / scale
        given.append(_relative(W, exact))
    assert given and max(given) <= 1e-4, max(given)
    assert refused and refused == [float(g) for g in GAMMAS[:len(refused)]], refused  # the least, and only they
