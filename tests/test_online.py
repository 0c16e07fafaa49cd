"""Si-Blurry streams and anytime evaluation (`learn --stream si-blurry`, `--eval-every`): every number against an
independent float64 closed form written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    N_CLASSES,
    assert_clean_error,
    assert_one_line_error,
    assert_same_matrix,
    build_store,
    invoke,
    learn,
    read,
)

import foal_pipe.protocol.runstate as run_module
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.learners.rls import RLSLearner
from foal_pipe.protocol.run import prepare
from foal_pipe.protocol.solvers import FixedGamma, ManyGammas
from foal_pipe.protocol.stream import si_blurry
from foal_pipe.protocol.walk import walk

BLURRY = ("--stream", "si-blurry")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("store") / "blobs.zarr")


def sigmoid_features(P: np.ndarray):
    return lambda X: 1 / (1 + np.exp(-(X.astype(np.float64) @ P)))


def ridge(H: np.ndarray, y: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form ridge on one-hot targets over the labels present: (classes, W)."""
    seen = np.unique(y)
    return seen, np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ (y[:, None] == seen[None, :]))


def accuracy(W: np.ndarray, seen: np.ndarray, H_test: np.ndarray, y_test: np.ndarray, scored=None) -> float:
    """Accuracy on the test rows of the classes ``scored`` (default: ``seen``), argmax among ``seen``."""
    sel = np.isin(y_test, seen if scored is None else scored)
    return float(np.mean(seen[(H_test[sel] @ W).argmax(1)] == y_test[sel]))


def stream_of(store: Path, metrics: dict):
    _, ytr, _, _ = read(store)
    stream = si_blurry(ytr, N_CLASSES, 4, 10,
                       metrics["order_seed"], metrics["disjoint_ratio"], metrics["blurry_ratio"])
    assert stream.tasks == metrics["tasks"]
    return stream


# --- the stream -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,m", [(50, 10), (0, 30), (100, 0), (30, 100)])
def test_si_blurry_stream_properties(n, m):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 20, 3000)
    stream = si_blurry(labels, 20, 5, 10, seed=7, disjoint_ratio=n, blurry_ratio=m)
    rows = np.concatenate(stream.rows)
    np.testing.assert_array_equal(np.sort(rows), np.arange(labels.size))  # every row exactly once
    assert len(stream.disjoint_classes) == 20 * n // 100
    task_of_row = stream.row_tasks(labels.size)
    for c in stream.disjoint_classes:  # a disjoint class lives in exactly one task
        assert np.unique(task_of_row[labels == c]).size == 1
    blurry_rows = int(np.count_nonzero(~np.isin(labels, stream.disjoint_classes)))
    assert stream.blurred_rows == blurry_rows * m // 100
    for t, task in enumerate(stream.tasks):
        assert task == sorted(np.unique(labels[stream.rows[t]]).tolist())
    if m == 0:  # nothing dealt over: every class in one task
        for c in range(20):
            assert np.unique(task_of_row[labels == c]).size == 1


def test_si_blurry_classes_recur_and_seeds_differ():
    labels = np.random.default_rng(1).integers(0, 20, 4000)
    a = si_blurry(labels, 20, 5, 10, seed=0)
    b = si_blurry(labels, 20, 5, 10, seed=0)
    assert a.tasks == b.tasks and all(np.array_equal(x, y) for x, y in zip(a.rows, b.rows))
    counts = {tuple(len(t) for t in si_blurry(labels, 20, 5, 10, seed=s).tasks) for s in range(6)}
    assert len(counts) > 1  # a stochastic number of classes per task
    c = si_blurry(labels, 20, 5, 10, seed=1)
    assert c.tasks != a.tasks or any(not np.array_equal(x, y) for x, y in zip(a.rows, c.rows))
    recurring = [k for k in range(20) if sum(k in t for t in a.tasks) > 1]
    assert recurring and not set(recurring) & set(a.disjoint_classes)  # the blurry classes recur


# --- learn on a Si-Blurry stream ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_si_blurry_final_weights_and_metrics_by_hand(tmp_path, store, engine):
    metrics, model = learn(store, tmp_path / "run", *BLURRY, "--engine", engine, gamma=0.5)
    Xtr, ytr, Xte, yte = read(store)
    stream = stream_of(store, metrics)
    assert metrics["stream"] == "si-blurry" and metrics["disjoint_classes"] == stream.disjoint_classes
    assert metrics["n_train_seen"] == ytr.size  # never drops a row
    act = sigmoid_features(model["projection"])
    Hte = act(Xte)
    seen, W = ridge(act(Xtr), ytr, 0.5)  # every row of the stream, whatever its order
    np.testing.assert_array_equal(model["classes"], seen)
    assert np.abs(model["W"] - W).max() / np.abs(W).max() < 1e-9
    # task ends: the classes seen so far (Moon et al. 2023)
    ends, per_class = [], []
    for t in range(len(stream.tasks)):
        rows = np.concatenate(stream.rows[: t + 1])
        classes, Wt = ridge(act(Xtr[rows]), ytr[rows], 0.5)
        ends.append(classes)
        pred = classes[(Hte @ Wt).argmax(1)]
        per_class.append({c: float(np.mean(pred[yte == c] == c)) for c in classes})
        assert metrics["accuracy_matrix"][t][-1] == pytest.approx(accuracy(Wt, classes, Hte, yte), abs=1e-12)
        for j in range(t + 1):
            assert metrics["accuracy_matrix"][t][j] == pytest.approx(accuracy(Wt, classes, Hte, yte, ends[j]), abs=1e-12)
    steps = [row[-1] for row in metrics["accuracy_matrix"]]
    assert metrics["A_steps"] == pytest.approx(steps, abs=1e-12)
    assert metrics["A_avg"] == pytest.approx(np.mean(steps), abs=1e-12)
    assert metrics["A_last"] == pytest.approx(accuracy(W, seen, Hte, yte), abs=1e-12)
    T = len(stream.tasks)
    drops = [max(per_class[i][c] for i in range(T - 1) if c in per_class[i]) - per_class[-1][c] for c in ends[T - 2]]
    assert metrics["F"] == pytest.approx(np.mean(drops), abs=1e-12)
    assert 0.3 < metrics["A_last"] < 1.0


def test_same_seed_same_bytes(tmp_path, store):
    args = (*BLURRY, "--eval-every", "70", "--gamma", "auto", "--select", "gcv")
    learn(store, tmp_path / "a", *args)
    learn(store, tmp_path / "b", *args)
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other, _ = learn(store, tmp_path / "c", *args, "--order-seed", "4")
    assert other["tasks"] != json.loads((tmp_path / "a" / "metrics.json").read_text())["tasks"]


def test_disjoint_is_the_default(tmp_path, store):
    learn(store, tmp_path / "a")
    metrics, _ = learn(store, tmp_path / "b", "--stream", "disjoint")
    assert (tmp_path / "a" / "metrics.json").read_bytes() == (tmp_path / "b" / "metrics.json").read_bytes()
    assert "stream" not in metrics and "A_auc" not in metrics and "anytime" not in metrics


# --- anytime evaluation -----------------------------------------------------------------------------------------


def _run(store: Path, stream: str, engine: str, gamma, every: int):
    return prepare(store, StreamConfig(tasks=4, seed=3, stream=stream),
                   ModelConfig(projection_dim=24, gamma=gamma, engine=engine),
                   EvaluationConfig(eval_every=every), ExecutionConfig(backend="numpy"), loo=gamma == "auto")


@pytest.mark.parametrize("stream", ["disjoint", "si-blurry"])
@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_every_point_is_closed_form_ridge(store, monkeypatch, stream, engine):
    monkeypatch.setattr(run_module, "block_rows", lambda dim: 32)  # several blocks between points
    run = _run(store, stream, engine, 0.7, 45)
    anytime = Anytime(run, 45)
    if engine == "rls":
        boundaries = walk(run, [RLSLearner(run, anytime)])[0].boundaries
    else:
        boundaries = walk(run, [GramLearner(run, {None: FixedGamma(0.7)}, anytime=anytime)])[0].boundaries
    Xtr, ytr, _, _ = read(store)
    H = sigmoid_features(run.projection.components_)(Xtr)
    order = np.concatenate(run.stream.rows)
    assert anytime.samples == list(range(45, order.size + 1, 45)) and len(anytime.samples) == order.size // 45
    for n, b in zip(anytime.samples, anytime.snapshots):
        seen, W = ridge(H[order[:n]], ytr[order[:n]], 0.7)
        np.testing.assert_array_equal(b.classes, seen)
        assert np.abs(b.W[:, 0, :] - W).max() / np.abs(W).max() < 1e-9, n
    assert len(boundaries) == run.stream.n_tasks


def test_auto_gamma_at_points_is_the_last_task_ends(store):
    run = _run(store, "si-blurry", "gram", "auto", 40)
    anytime = Anytime(run, 40)
    solver = ManyGammas(run.model.gamma_grid, True, "loo")
    boundaries = walk(run, [GramLearner(run, {None: solver}, anytime=anytime)])[0].boundaries
    ends = np.cumsum([r.size for r in run.stream.rows])
    Xtr, ytr, _, _ = read(store)
    H = sigmoid_features(run.projection.components_)(Xtr)
    order = np.concatenate(run.stream.rows)
    for n, b in zip(anytime.samples, anytime.snapshots):
        done = int(np.searchsorted(ends, n, side="right"))  # task ends at or before n
        expected = 1.0 if done == 0 else float(boundaries[done - 1].gammas[0])
        assert float(b.gammas[0]) == expected
        seen, W = ridge(H[order[:n]], ytr[order[:n]], expected)
        assert np.abs(b.W[:, 0, :] - W).max() / np.abs(W).max() < 1e-9


@pytest.mark.parametrize("extra", [(), BLURRY, ("--engine", "rls")])
def test_curve_and_a_auc_by_hand(tmp_path, store, extra):
    metrics, model = learn(store, tmp_path / "run", *extra, "--eval-every", "50", gamma=0.5)
    Xtr, ytr, Xte, yte = read(store)
    act = sigmoid_features(model["projection"])
    Hte = act(Xte)
    if "si-blurry" in extra:
        order = np.concatenate(stream_of(store, metrics).rows)
    else:
        from foal_pipe.protocol.stream import build_stream

        order = np.concatenate(build_stream(ytr, N_CLASSES, 4, 10, 3).rows)
    curve = metrics["anytime"]
    assert curve["eval_every"] == 50 and curve["samples_seen"] == list(range(50, 601, 50))
    expected = []
    for n in curve["samples_seen"]:
        seen, W = ridge(act(Xtr[order[:n]]), ytr[order[:n]], 0.5)
        expected.append(accuracy(W, seen, Hte, yte))
    np.testing.assert_allclose(curve["accuracy"], expected, rtol=0, atol=1e-12)
    assert metrics["A_auc"] == pytest.approx(float(np.mean(expected)), abs=1e-12)
    assert curve["gammas"] == [0.5] * len(expected)


def test_eval_every_keeps_the_task_end_matrix(tmp_path, store):
    plain, _ = learn(store, tmp_path / "a", gamma=0.5)
    anytime, _ = learn(store, tmp_path / "b", "--eval-every", "64", gamma=0.5)
    assert_same_matrix(anytime["accuracy_matrix"], plain["accuracy_matrix"])
    for key in ("A_avg", "A_last", "F"):
        assert anytime[key] == pytest.approx(plain[key], abs=1e-12)


def test_sweep_and_order_seeds_take_the_stream(tmp_path, store):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sweep", "--tasks", 4, "--projection-dim", 48,
                    "--seed", 3, "--backend", "numpy", "--gammas", "0.5,2", "--no-loo", *BLURRY)
    assert result.exit_code == 0, result.output
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    for r in sweep["results"]:
        metrics, _ = learn(store, tmp_path / f"g{r['gamma']}", *BLURRY, gamma=r["gamma"])
        assert_same_matrix(r["accuracy_matrix"], metrics["accuracy_matrix"])
        assert r["F"] == pytest.approx(metrics["F"], abs=1e-12)
    both, _ = learn(store, tmp_path / "orders", *BLURRY, "--eval-every", "100", "--order-seeds", "1,2")
    for entry in both["orders"]:
        one, _ = learn(store, tmp_path / f"o{entry['order_seed']}", *BLURRY, "--eval-every", "100", "--order-seed",
                       str(entry["order_seed"]))
        assert entry["tasks"] == one["tasks"] and entry["A_auc"] == one["A_auc"]
        assert_same_matrix(entry["accuracy_matrix"], one["accuracy_matrix"])
    assert both["A_auc"] == pytest.approx(np.mean([e["A_auc"] for e in both["orders"]]), abs=1e-15)


@pytest.mark.parametrize("args,message", [
    (("--stream", "si-blurry", "--disjoint-ratio", "150"), "--disjoint-ratio is a percentage"),
    (("--stream", "si-blurry", "--blurry-ratio", "-1"), "--blurry-ratio is a percentage"),
    (("--eval-every", "0"), "--eval-every counts training rows"),
    (("--eval-every", "601"), "is more than the stream's 600 training rows"),
    (("--stream", "blurry"), "--stream"),
    (("--stream", "si-blurry", "--drop-remainder"), "--drop-remainder splits disjoint tasks"),
])
def test_bad_values_refused_in_one_line(tmp_path, store, args, message):
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--projection-dim", 16, "--backend", "numpy", *args)
    if args == ("--stream", "blurry"):  # typer's own choice check
        assert result.exit_code == 2 and "blurry" in result.output and not out.exists()
        return
    assert_clean_error(result, message, out)
    assert_one_line_error(result, message)


def test_evaluate_plots_the_curve(tmp_path, store):
    metrics, _ = learn(store, tmp_path / "run", *BLURRY, "--eval-every", "100")
    result = invoke("evaluate", "--run", tmp_path / "run", "--out", tmp_path / "eval")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "eval" / "anytime.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "eval" / "anytime.csv").read_text().splitlines()
    assert rows[0] == "samples_seen,accuracy" and len(rows) == 1 + len(metrics["anytime"]["accuracy"])
    for line, n, a in zip(rows[1:], metrics["anytime"]["samples_seen"], metrics["anytime"]["accuracy"]):
        assert line == f"{n},{100 * a:.6g}"
    assert "disagree" not in result.output  # the Si-Blurry summary is recomputed by its own definition
    summary = (tmp_path / "eval" / "summary.md").read_text()
    assert f"| A_auc (%) | {100 * metrics['A_auc']:.2f} |" in summary
    assert "stream si-blurry (disjoint ratio 50%, blurry ratio 10%)" in summary
    plain = tmp_path / "plain"
    learn(store, plain)
    assert invoke("evaluate", "--run", plain, "--out", tmp_path / "eval2").exit_code == 0
    assert not (tmp_path / "eval2" / "anytime.png").exists()


def test_anytime_record_round_trip():
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.protocol.schema import LearnMetrics

    data = {"accuracy_matrix": [[0.5]], "A_avg": 0.5, "A_last": 0.5, "F": 0.0, "A_auc": 0.4, "stream": "si-blurry",
            "disjoint_ratio": 50, "blurry_ratio": 10, "disjoint_classes": [1], "blurred_rows": 3,
            "anytime": {"eval_every": 10, "samples_seen": [10, 20], "accuracy": [0.3, 0.5], "gammas": [1.0, 1.0]}}
    record = LearnMetrics.from_dict(data)
    assert record.anytime.samples_seen == [10, 20]
    assert record.to_dict() == {**data, "format": "foal-pipe/metrics", "format_version": 3}  # now naming its format
    with pytest.raises(FoalPipeError, match="eval_every"):
        LearnMetrics.from_dict({**data, "anytime": {**data["anytime"], "eval_every": 0}})
    with pytest.raises(FoalPipeError, match="accuracy"):
        LearnMetrics.from_dict({**data, "anytime": {**data["anytime"], "accuracy": [1.5, 0.2]}})
