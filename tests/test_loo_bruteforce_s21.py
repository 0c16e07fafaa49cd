"""sweep.json's GCV and leave-one-out figures and `learn --gamma auto`'s choices against brute force written here in
NumPy float64: ridge refitted without each scored row, GCV from the hat matrix, the documented sample and bound, and
the documented zoom over the refits' curves. Float64 and float32 stores, a boundary with fewer rows than D, a class
with one training row, two class orders, every row and a sample."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers import build_store, invoke, read
from safetensors.numpy import load_file

from foal_pipe.store import write_store

GAMMAS = "1e-2,1,100"
GRID = 10.0 ** np.linspace(-2, 2, 9)  # --per-decade 2 over 1e-2 ... 1e2
SEED = 5
#: store name -> (--tasks, --projection-dim): store64's first boundary has fewer rows than D
SHAPES = {"store64": (5, 40), "store32": (3, 24)}


def _store64(path: Path) -> Path:
    """Five classes in float64, class 0 with a single training row."""
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(5, 9))
    y = rng.integers(1, 5, 130)
    y[17] = 0
    yt = np.arange(40) % 5
    return write_store(path, (centres[y] + 1.3 * rng.normal(size=(130, 9)), y),
                       (centres[yt] + 1.3 * rng.normal(size=(40, 9)), yt), [f"k{c}" for c in range(5)], chunk_rows=16,
                       dtype="float64")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bruteforce")
    return {"store64": _store64(root / "s64.zarr"), "store32": build_store(root / "s32.zarr", n_train=160, n_test=48, noise=2.0)}


def _args(store: Path, name: str, *extra) -> list:
    tasks, D = SHAPES[name]
    return ["--features", store, "--tasks", tasks, "--projection-dim", D, "--seed", SEED, "--batch-size", 7,
            "--backend", "numpy", *extra]


def _run(command: str, out: Path, *args) -> Path:
    result = invoke(command, *args, "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def projections(stores, tmp_path_factory) -> dict[str, np.ndarray]:
    """Each store's projection, as `learn` with the sweeps' seed draws it."""
    root = tmp_path_factory.mktemp("projection")
    runs = {name: _run("learn", root / name, *_args(store, name, "--gamma", 1)) for name, store in stores.items()}
    return {name: load_file(str(run / "model.safetensors"))["projection"] for name, run in runs.items()}


@cache
def _rows(store: str, classes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The train rows of ``classes`` (their indices, float64 features, labels)."""
    X, y, _, _ = read(Path(store))
    seen = np.flatnonzero(np.isin(y, classes))
    return seen, X[seen].astype(np.float64), y[seen]


def _curves(H: np.ndarray, y: np.ndarray, gamma: float, scored: np.ndarray) -> tuple[float, float, float]:
    """LOO accuracy and MSE over rows ``scored`` by refitting without each, and GCV ``n RSS / (n - df)^2`` from the
    hat matrix; columns the sorted classes of ``y``, an argmax tie to the first."""
    classes = np.unique(y)
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    n, D = H.shape
    G, Q, eye = H.T @ H, H.T @ Y, np.eye(D)
    h = H[scored]
    W = np.linalg.solve(G[None] - h[:, :, None] * h[:, None, :] + gamma * eye, Q[None] - h[:, :, None] * Y[scored][:, None, :])
    s = np.einsum("md,mdc->mc", h, W)
    accuracy = np.sum(classes[np.argmax(s, axis=1)] == y[scored]) / scored.size
    mse = float(np.sum((Y[scored] - s) ** 2) / (scored.size * classes.size))
    hat = H @ np.linalg.solve(G + gamma * eye, H.T)
    gcv = n * float(np.sum((Y - hat @ Y) ** 2)) / (n - np.trace(hat)) ** 2
    return float(accuracy), mse, gcv


def _sample(seen: np.ndarray, n_rows: int, m: int) -> np.ndarray:
    """The documented sample: the ``m`` rows seen with the least ranks of a permutation drawn from ``[seed, 23]``."""
    if m == 0 or m >= seen.size:
        return seen
    ranks = np.random.default_rng([SEED, 23]).permutation(n_rows)
    return np.sort(seen[np.argsort(ranks[seen])[:m]])


def _by_hand(stores, projections, name: str, tasks: list[list[int]], gammas, m: int = 0) -> list[dict[str, np.ndarray]]:
    """Per boundary: the scored store rows and each criterion's curve over ``gammas`` by brute force."""
    out = []
    P = projections[name]
    n_rows = read(stores[name])[1].size
    for k in range(len(tasks)):
        classes = tuple(sorted(c for task in tasks[: k + 1] for c in task))
        seen, X, y = _rows(str(stores[name]), classes)
        scored = _sample(seen, n_rows, m)
        H = 1.0 / (1.0 + np.exp(-(X @ P)))
        values = np.array([_curves(H, y, float(g), np.searchsorted(seen, scored)) for g in gammas])
        out.append({"seen": seen, "scored": scored, "loo_accuracy": values[:, 0], "loo": values[:, 1], "gcv": values[:, 2]})
    return out


def _zoom(curve: np.ndarray, tie: np.ndarray | None, larger: bool, start: np.ndarray) -> tuple[list[int], int]:
    """docs/gamma.md's zoom: the best evaluated point (ties: least ``tie``, then smallest gamma), then the index
    midpoints towards its evaluated neighbours, until they are its immediate neighbours."""
    own = {int(i) for i in start}
    while True:
        at = np.array(sorted(own))
        v = curve[at]
        best = at[v == (v.max() if larger else v.min())]
        if tie is not None and best.size > 1:
            best = best[tie[best] == tie[best].min()]
        i = int(np.flatnonzero(at == best[0])[0])
        lo, hi = at[max(i - 1, 0)], at[min(i + 1, at.size - 1)]
        new = {int((lo + best[0]) // 2), int((best[0] + hi) // 2)} - own
        if not new:
            return at.tolist(), int(best[0])
        own |= new


def _close(got, expected, rel: float = 1e-9) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, rtol=rel, atol=0)


START = np.flatnonzero(np.isin(GRID, [1e-2, 1.0, 100.0]))


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_row_sweep_equals_refits_and_its_selections_the_zoom_over_them(stores, projections, tmp_path, name):
    sweep = json.loads((_run("sweep", tmp_path / "s", *_args(stores[name], name, "--gammas", GAMMAS, "--per-decade", 2,
                                                              "--loo-sample", 0)) / "sweep.json").read_text())
    gammas = [r["gamma"] for r in sweep["results"]]
    coarse = _by_hand(stores, projections, name, sweep["tasks"], gammas)
    fine = _by_hand(stores, projections, name, sweep["tasks"], GRID)
    if name == "store64":
        assert coarse[0]["seen"].size < SHAPES[name][1]  # a boundary with fewer rows than D
    assert sweep["leave_one_out"]["exact"] and sweep["leave_one_out"]["sample_rows"] == [b["seen"].size for b in coarse]
    for i, result in enumerate(sweep["results"]):
        for key, curve in (("gcv", "gcv"), ("loo_mse", "loo")):
            _close(result[key], [b[curve][i] for b in coarse])
        assert result["loo_accuracy"] == [b["loo_accuracy"][i] for b in coarse]
    selections = {s["criterion"]: s for s in sweep["selections"]}
    _close(selections["gcv"]["gammas"], GRID, 1e-15)
    for k, b in enumerate(fine):
        _close(selections["gcv"]["values"][k], b["gcv"])
        assert selections["gcv"]["gammas_selected"][k] == GRID[np.argmin(b["gcv"])]
        for criterion, tie, larger in (("loo", None, False), ("loo_accuracy", b["loo"], True)):
            evaluated, chosen = _zoom(b[criterion], tie, larger, START)
            assert selections[criterion]["evaluated"][k] == evaluated
            _close(selections[criterion]["values"][k], b[criterion][evaluated])
            assert selections[criterion]["gammas_selected"][k] == GRID[chosen]


@pytest.mark.parametrize("name", list(SHAPES))
def test_learn_auto_chooses_by_the_refits_and_keeps_the_chosen_gammas_weights(stores, projections, tmp_path, name):
    run = _run("learn", tmp_path / "auto", *_args(stores[name], name, "--gamma", "auto", "--gamma-grid", GAMMAS,
                                                   "--per-decade", 2, "--loo-sample", 0))
    metrics = json.loads((run / "metrics.json").read_text())
    search = metrics["gamma_search"]
    for k, b in enumerate(_by_hand(stores, projections, name, metrics["tasks"], GRID)):
        evaluated, chosen = _zoom(b["loo_accuracy"], b["loo"], True, START)
        assert search["evaluated"][k] == evaluated
        assert search["values"][k] == b["loo_accuracy"][evaluated].tolist()
        assert search["gammas_selected"][k] == GRID[chosen]
    last = search["gammas_selected"][-1]
    fixed = _run("learn", tmp_path / "fixed", *_args(stores[name], name, "--gamma", repr(last)))
    assert (load_file(str(run / "model.safetensors"))["W"].tobytes()
            == load_file(str(fixed / "model.safetensors"))["W"].tobytes())


def test_a_sample_scores_the_documented_rows_within_its_recorded_bound(stores, projections, tmp_path):
    m, name = 40, "store64"
    sweep = json.loads((_run("sweep", tmp_path / "s", *_args(stores[name], name, "--gammas", GAMMAS, "--per-decade", 2,
                                                              "--loo-sample", m)) / "sweep.json").read_text())
    gammas = [r["gamma"] for r in sweep["results"]]
    sampled = _by_hand(stores, projections, name, sweep["tasks"], gammas, m)
    every = _by_hand(stores, projections, name, sweep["tasks"], gammas)
    record = sweep["leave_one_out"]
    eps = [0.0 if b["scored"].size == b["seen"].size else math.sqrt(math.log(2 * GRID.size / 0.05) / (2 * m)) for b in sampled]
    assert not record["exact"] and record["loo_sample"] == m and record["sample_delta"] == 0.05
    assert record["sample_rows"] == [b["scored"].size for b in sampled] and 0.0 in eps and max(eps) > 0
    _close(record["sample_eps"], eps, 1e-15)
    for i, result in enumerate(sweep["results"]):
        _close(result["loo_mse"], [b["loo"][i] for b in sampled])
        assert result["loo_accuracy"] == [b["loo_accuracy"][i] for b in sampled]
        assert all(abs(s["loo_accuracy"][i] - e["loo_accuracy"][i]) <= bound for s, e, bound in zip(sampled, every, eps))
    learned = _run("learn", tmp_path / "l", *_args(stores[name], name, "--gamma", "auto", "--gamma-grid", GAMMAS,
                                                    "--per-decade", 2, "--loo-sample", m))
    search = json.loads((learned / "metrics.json").read_text())["gamma_search"]
    assert search["sample_rows"] == record["sample_rows"] and search["sample_eps"] == record["sample_eps"]
    chosen = next(s for s in sweep["selections"] if s["criterion"] == "loo_accuracy")["gammas_selected"]
    assert search["gammas_selected"] == chosen


def test_every_class_order_equals_refits_over_its_own_tasks(stores, projections, tmp_path):
    name = "store64"
    sweep = json.loads((_run("sweep", tmp_path / "s", *_args(stores[name], name, "--gammas", GAMMAS, "--loo-sample", 0,
                                                              "--order-seeds", "0,1")) / "sweep.json").read_text())
    metrics = json.loads((_run("learn", tmp_path / "l", *_args(stores[name], name, "--gamma", "auto", "--gamma-grid", GAMMAS,
                                                                "--per-decade", 2, "--loo-sample", 0,
                                                                "--order-seeds", "0,1")) / "metrics.json").read_text())
    assert sweep["orders"][0]["tasks"] != sweep["orders"][1]["tasks"]
    for order, learned in zip(sweep["orders"], metrics["orders"]):
        gammas = [r["gamma"] for r in order["results"]]
        coarse = _by_hand(stores, projections, name, order["tasks"], gammas)
        for i, result in enumerate(order["results"]):
            _close(result["loo_mse"], [b["loo"][i] for b in coarse])
            _close(result["gcv"], [b["gcv"][i] for b in coarse])
            assert result["loo_accuracy"] == [b["loo_accuracy"][i] for b in coarse]
        fine = _by_hand(stores, projections, name, learned["tasks"], GRID)
        assert learned["gammas_selected"] == [GRID[_zoom(b["loo_accuracy"], b["loo"], True, START)[1]] for b in fine]
