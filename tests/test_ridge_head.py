"""Ridge as a head of the registry (issue 30): built by ``make_head`` like every head, exact against the closed form
at every boundary, its state in the ridge model file's own layout (``G``, ``Q``, ``counts``, ``W``), so a model file
``learn`` wrote scores and continues through the head."""

from __future__ import annotations

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import build_store, invoke, learn, written_copy

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.heads.ridge import RidgeHead
from foal_pipe.model.modelfile import read_model
from foal_pipe.model.ridgemodel import RidgeModel, SavedRidge


def _rows(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 6, n)
    return rng.normal(size=(n, dim)) + y[:, None] * 0.4, y


def _closed_form(X: np.ndarray, y: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    classes = np.unique(y)
    Y = (y[:, None] == classes).astype(np.float64)
    return classes, np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)


def test_registry_builds_ridge_and_every_boundary_is_the_closed_form():
    assert HEADS["ridge"].factory is RidgeHead and HEADS["ridge"].gram_lanes
    X, y = _rows(300, 7, 0)
    head = make_head("ridge", {"gamma": 2.5}, xnp, 7)
    seen = np.zeros(0, dtype=int)
    for task in (np.isin(y, [4, 1]), np.isin(y, [0, 2, 3, 5])):  # class 4 first: columns grow where they sort
        for block in np.array_split(np.flatnonzero(task), 3):
            head.add(X[block], y[block])
        seen = np.concatenate([seen, np.flatnonzero(task)])
        scorer = head.boundary()
        classes, W = _closed_form(X[seen], y[seen], 2.5)
        assert scorer.classes.tolist() == classes.tolist()
        np.testing.assert_allclose(scorer.W, W, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(scorer.scores(X[:5]), X[:5] @ W, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.0, -1.0, "big", True])
def test_a_bad_gamma_is_refused_when_the_head_is_built(gamma):
    with pytest.raises(FoalPipeError, match="gamma must be a positive number"):
        make_head("ridge", {"gamma": gamma}, xnp, 3)


def test_state_dict_is_the_ridge_model_files_layout(tmp_path):
    """The head's tensors are those RidgeModel.solved saves for the same rows, bit for bit."""
    X, y = _rows(200, 5, 1)
    head = make_head("ridge", {"gamma": 0.7}, xnp, 5)
    head.add(X, y)
    scorer = head.boundary()
    state = head.state_dict(scorer)
    RidgeModel.solved(head.engine.statistics, 0.7).save(tmp_path / "m.safetensors")
    tensors, meta = read_model(tmp_path / "m.safetensors")
    assert set(state) == set(RidgeHead.scorer_tensors) | set(RidgeHead.state_tensors) == {"W", "G", "Q", "counts"}
    assert set(state) <= set(tensors) and meta["engine"] == "gram" and meta["gamma"] == 0.7
    for name, value in state.items():
        np.testing.assert_array_equal(tensors[name], value)


def test_a_ridge_model_file_from_learn_scores_and_continues_through_the_head(tmp_path):
    """``learn``'s model file: the head's scorer from its tensors scores as predict's SavedRidge does, and a head
    loaded from it and given more rows equals one head given every row (gram sums add exactly)."""
    store = build_store(tmp_path / "s.zarr")
    learn(store, tmp_path / "run", gamma=0.5, D=20)
    tensors, meta = read_model(tmp_path / "run" / "model.safetensors")
    saved = SavedRidge(RidgeModel.load(tmp_path / "run" / "model.safetensors"))
    X, y = _rows(60, tensors["G"].shape[0], 2)
    scorer = RidgeHead.scorer_from(tensors["classes"], tensors, {"gamma": meta["gamma"]})
    np.testing.assert_array_equal(scorer.scores(X), saved.class_scores(X))

    head = make_head("ridge", {"gamma": meta["gamma"]}, xnp, X.shape[1])
    head.load_state_dict(tensors)
    head.add(X, y + 12)  # six new classes after the store's twelve
    stats = saved.statistics_
    G, Q = stats.G + X.T @ X, np.concatenate([stats.Q, X.T @ (y[:, None] == np.unique(y))], axis=1)
    classes = np.concatenate([stats.classes, np.unique(y) + 12])
    W = np.linalg.solve(G + meta["gamma"] * np.eye(G.shape[0]), Q)
    got = head.boundary()
    assert got.classes.tolist() == classes.tolist()
    np.testing.assert_allclose(got.W, W, rtol=1e-9, atol=1e-12)
    assert head.engine.statistics.n == stats.n + X.shape[0]


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_one_continuation_entry_takes_any_model_file(tmp_path, head):
    """``run_continue`` continues a ridge model and a head's model alike (it told a Python caller with a head's file
    to call another function); its outputs are the bytes ``learn --init-model`` writes."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.continuation import run_continue

    first = written_copy(build_store(tmp_path / "a0.zarr", seed=1), tmp_path / "a.zarr")
    second = written_copy(build_store(tmp_path / "b0.zarr", seed=2), tmp_path / "b.zarr")
    size = ("--projection-dim", 20) if head == "ridge" else ()
    assert invoke("learn", "--features", first, "--out", tmp_path / "a", "--head", head, "--tasks", 2, *size).exit_code == 0
    init = tmp_path / "a" / "model.safetensors"
    cli = invoke("learn", "--features", second, "--out", tmp_path / "cli", "--init-model", init, "--tasks", 2)
    assert cli.exit_code == 0, cli.output
    done = run_continue(init, second, tmp_path / "py", StreamConfig(tasks=2), ModelConfig(), EvaluationConfig(),
                        ExecutionConfig(), log=lambda _: None)
    assert done.metrics.n_tasks == 2 and done.metrics.continuation is not None
    assert done.metrics.head == (None if head == "ridge" else head)
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_the_heads_walk_takes_ridge_and_equals_learns_gram_lanes(tmp_path):
    """Ridge built by the registry and fed by the heads' learner of the walk (``HeadsLearner``, the learner every
    other head takes) gives ``learn``'s accuracy matrix and, at the last boundary, its weights."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.headscores import build_heads, head_accuracies
    from foal_pipe.protocol.learners.heads import HeadsLearner
    from foal_pipe.protocol.run import prepare
    from foal_pipe.protocol.walk import walk

    store = build_store(tmp_path / "s.zarr")
    metrics, tensors = learn(store, tmp_path / "run", gamma=0.5, D=30)
    stream = StreamConfig(tasks=4, batch_size=10, seed=3)
    run = prepare(store, stream, ModelConfig(projection_dim=30, gamma=0.5), EvaluationConfig(),
                  ExecutionConfig(backend="numpy"))
    heads = build_heads(run, ["ridge"], {"gamma": 0.5})
    boundaries = walk(run, [HeadsLearner(run, heads)])[0].boundaries
    acc = head_accuracies(run, boundaries, {"ridge": "activations"})["ridge"]
    expected = metrics["accuracy_matrix"]
    assert [row[: i + 1] for i, row in enumerate(acc.tolist())] == expected
    last = boundaries["ridge"][-1]
    np.testing.assert_allclose(last.W, tensors["W"], rtol=1e-9, atol=1e-12 * np.abs(tensors["W"]).max())
