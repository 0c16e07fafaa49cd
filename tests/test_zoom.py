"""The zoom of leave-one-out's refined search (issue 31): its points and choice against a plain implementation of
the rule written here, on random curves with plateaus and ties; learn's default sample (every row of a small
store) and --loo-sample 0 choose alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import build_store, learn

from foal_pipe.core.gammasearch import best_point, search_grid, zoom


def best_by_hand(points: list[int], curves: dict[str, np.ndarray], name: str, larger: bool, tie: str | None) -> int:
    """The best of ``points``: greatest (or least) value, NaN never; among equals the least ``tie``, then the least
    index."""
    def rank(p: int) -> tuple[float, float, int]:
        v = curves[name][p]
        better = -np.inf if np.isnan(v) else v if larger else -v  # the greater, the better
        t = np.inf if tie is None or np.isnan(curves[tie][p]) else curves[tie][p]
        return (-better, t, p)
    return min(points, key=rank)


def zoom_by_hand(start: list[int], curves: dict[str, np.ndarray], name: str, larger: bool,
                 tie: str | None) -> list[int]:
    """The rule as stated: evaluate ``start``; then bisect in index space between the best and its nearest
    evaluated neighbours, until the best's immediate neighbours are evaluated."""
    seen = set(start)
    while True:
        b = best_by_hand(sorted(seen), curves, name, larger, tie)
        below, above = [p for p in seen if p < b], [p for p in seen if p > b]
        new = set()
        if below and max(below) < b - 1:
            new.add((max(below) + b) // 2)
        if above and min(above) > b + 1:
            new.add((b + min(above)) // 2)
        if not new:
            return sorted(seen)
        seen |= new


def random_curves(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    """A LOO accuracy with plateaus (few distinct counts) and a LOO MSE with exact ties and a NaN or inf or two."""
    counts = np.round(rng.normal(size=size).cumsum() + rng.integers(0, 3, size=size)) / 50
    mse = np.round(np.abs(rng.normal(size=size).cumsum()), 1)
    mse[rng.integers(0, size, size=2)] = rng.choice([np.inf, np.nan])
    return {"loo_accuracy": counts, "loo": mse}


RULES = {"loo": (False, None), "loo_accuracy": (True, "loo")}


@pytest.mark.parametrize("seed", range(40))
def test_zoom_equals_the_rule_by_hand_on_random_curves(seed):
    rng = np.random.default_rng(seed)
    grid = 10.0 ** np.arange(-4, int(rng.integers(-2, 9)))
    fine = search_grid(grid, int(rng.integers(1, 12)))
    start = np.searchsorted(fine, grid)
    curves = random_curves(rng, fine.size)
    asked, ties = [], []

    def evaluate(at, names):  # gives only what is asked, as a cheaper pass for one criterion does
        (asked if set(names) == set(rules) else ties).append(at.copy())
        return {name: curves[name][at] for name in names}

    for rules in (RULES, {"loo": RULES["loo"]}, {"loo_accuracy": RULES["loo_accuracy"]}):
        asked.clear()
        ties.clear()
        points, got = zoom(fine.size, start, evaluate, rules)
        union = sorted(set().union(*(zoom_by_hand(start.tolist(), curves, n, *r) for n, r in rules.items())))
        assert sorted(np.concatenate(asked).tolist()) == union  # in lockstep: each point evaluated once
        for name, (larger, tie) in rules.items():
            at = points[name]
            assert at.tolist() == zoom_by_hand(start.tolist(), curves, name, larger, tie)  # as if alone
            np.testing.assert_array_equal(got[name][at], curves[name][at])
            chosen = at[best_point(got[name][at], larger, None if tie is None else got[tie][at])]
            assert chosen == best_by_hand(at.tolist(), curves, name, larger, tie)
        if "loo" in rules:
            assert not ties  # the tie-breaker is a criterion here: evaluated with it, never again
        else:  # asked for only at the points tied for the best, where it is then the curve's own value
            visited = np.concatenate(ties) if ties else np.zeros(0, dtype=np.int64)
            assert np.isin(visited, points["loo_accuracy"]).all()
            known = ~np.isnan(got["loo"]) | np.isin(np.arange(fine.size), visited)
            np.testing.assert_array_equal(got["loo"][known], curves["loo"][known])
            assert np.isnan(got["loo"][~np.isin(np.arange(fine.size), visited)]).all()


def test_a_unimodal_curve_gets_the_full_grid_best_from_few_points():
    fine = search_grid(10.0 ** np.arange(-4, 9), 8)
    assert fine.size == 97
    for centre in (0, 5, 37, 50, 90, 96):
        curve = np.abs(np.arange(97) - centre) + 0.5 * (np.arange(97) < centre)
        points, got = zoom(97, np.arange(0, 97, 8), lambda i, _names, c=curve: {"loo": c[i]}, {"loo": (False, None)})
        at = points["loo"]
        assert at[np.argmin(got["loo"][at])] == centre and at.size <= 13 + 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("zoom") / "blobs.zarr", n_train=300, noise=2.5)


@pytest.mark.parametrize("select", ["loo_accuracy", "loo"])
def test_the_default_sample_of_every_row_and_loo_sample_zero_choose_alike(tmp_path, store, select):
    """300 rows: the default --loo-sample 4096 holds every row; both zoom over the same values, in two codes."""
    default, _ = learn(store, tmp_path / "default", "--gamma", "auto", "--select", select)
    exact, _ = learn(store, tmp_path / "exact", "--gamma", "auto", "--select", select, "--loo-sample", 0)
    a, b = default["gamma_search"], exact["gamma_search"]
    assert a["sample_eps"] == [0.0] * 4 and "sample_eps" not in b
    assert a["evaluated"] == b["evaluated"] and a["gammas_selected"] == b["gammas_selected"]
    assert all(len(e) < len(a["gammas"]) for e in a["evaluated"])  # a zoom: fewer points than the 97
    for va, vb in zip(a["values"], b["values"]):
        np.testing.assert_allclose(va, vb, rtol=1e-9, atol=1e-12)
    assert default["accuracy_matrix"] == exact["accuracy_matrix"]


def test_the_memory_estimate_counts_the_samples_coordinates(store):
    """The zoom keeps the sampled rows' eigen-coordinates (float64): the largest boundary sample x D x 8 bytes, their
    leverages at every gamma of the refined grid (for LOO accuracy's screen always, otherwise where the grid holds at
    most D gammas), and for LOO accuracy their float32 copy."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.memoryparts import memory_parts
    from foal_pipe.protocol.run import prepare

    settings = (StreamConfig(tasks=4), ModelConfig(projection_dim=48, gamma="auto", loo_sample=100), EvaluationConfig(),
                ExecutionConfig(backend="numpy"))
    parts = memory_parts(prepare(store, *settings, loo=True), 1, True)
    # every boundary past 100 rows holds 100; LOO accuracy's screen adds a float32 copy and the 97 gammas' leverages
    assert parts["leave-one-out sample's eigen-coordinates"] == 100 * 48 * 8 + 100 * 48 * 4 + 100 * 97 * 8
    by_mse = (settings[0], ModelConfig(projection_dim=48, gamma="auto", loo_sample=100, select="loo"), *settings[2:])
    parts = memory_parts(prepare(store, *by_mse, loo=True), 1, True)
    assert parts["leave-one-out sample's eigen-coordinates"] == 100 * 48 * 8  # 97 gammas > D: not held
    wide = (settings[0], replace(by_mse[1], projection_dim=120), *settings[2:])
    parts = memory_parts(prepare(store, *wide, loo=True), 1, True)
    assert parts["leave-one-out sample's eigen-coordinates"] == 100 * 120 * 8 + 100 * 97 * 8  # held: D >= 97
    exact = (settings[0], ModelConfig(projection_dim=48, gamma="auto", loo_sample=0), *settings[2:])
    assert not any("eigen-coordinates" in name for name in memory_parts(prepare(store, *exact, loo=True), 1, True))


@pytest.mark.parametrize("edit", ["a value too many", "an index beyond gammas", "indices not ascending"])
def test_a_search_whose_evaluated_does_not_pair_with_its_values_is_refused(tmp_path, store, edit):
    """The zoom's record pairs ``values[k]`` with ``evaluated[k]``; a file that breaks the pairing is refused."""
    import json

    from foal_pipe.errors import FoalPipeError
    from foal_pipe.protocol.schema import LearnMetrics

    metrics, _ = learn(store, tmp_path / "run", "--gamma", "auto")
    assert LearnMetrics.from_dict(metrics).gamma_search.evaluated == metrics["gamma_search"]["evaluated"]
    search = json.loads(json.dumps(metrics["gamma_search"]))
    if edit == "a value too many":
        search["values"][0].append(0.5)
    elif edit == "an index beyond gammas":
        search["evaluated"][0][-1] = len(search["gammas"])
    else:
        search["evaluated"][0][:2] = search["evaluated"][0][1::-1]
    with pytest.raises(FoalPipeError, match="'evaluated' should hold, at each boundary of 'values', the ascending"):
        LearnMetrics.from_dict({**metrics, "gamma_search": search}, "runs/x/metrics.json")
