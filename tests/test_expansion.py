"""Expansion choices (activation, no projection) and the bounded-memory walk over the tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import DIM, N_CLASSES, build_store, invoke, learn, read

from foal_pipe import SmoothProjection
from foal_pipe.core.activations import relu, sigmoid
from foal_pipe.core.expansion import Expansion
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.run import prepare
from foal_pipe.protocol.solvers import FixedGamma, ManyGammas
from foal_pipe.protocol.stream import build_stream
from foal_pipe.protocol.walk import walk
from foal_pipe.store import Split

HAND = {
    "sigmoid": lambda z: 1 / (1 + np.exp(-z)),
    "relu": lambda z: np.where(z > 0, z, 0.0),
    "identity": lambda z: z,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("exp") / "blobs.zarr")


@pytest.mark.parametrize("activation", sorted(HAND))
def test_each_activation_matches_a_hand_computation(activation):
    X = np.random.default_rng(0).normal(size=(30, 9)) * 3
    proj = SmoothProjection(n_components=20, activation=activation, random_state=1).fit(X)
    np.testing.assert_allclose(proj.transform(X), HAND[activation](X @ proj.components_), rtol=1e-12, atol=1e-15)
    rebuilt = SmoothProjection.from_matrix(proj.components_, activation=activation)
    np.testing.assert_array_equal(rebuilt.transform(X), proj.transform(X))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sigmoid_writes_into_its_argument_with_the_bits_of_the_formula(dtype):
    """NumPy's tanh goes into the projection's block (no fresh block of pages); the values are those of
    ``0.5 (1 + tanh(z / 2))`` to the bit, the infinities and zero included, on a strided view as on a whole array."""
    z = (np.random.default_rng(2).normal(size=(64, 33)) * 40).astype(dtype)
    z[0, :3] = [np.inf, -np.inf, 0.0]
    expected = 0.5 * (1.0 + np.tanh(z / 2))
    out = sigmoid(z)
    assert out is z and out.dtype == dtype
    np.testing.assert_array_equal(out, expected)
    w = (np.random.default_rng(3).normal(size=(40, 50)) * 40).astype(dtype)
    before = w.copy()
    expected = 0.5 * (1.0 + np.tanh(w[::3, 1::2] / 2))
    np.testing.assert_array_equal(sigmoid(w[::3, 1::2]), expected)
    np.testing.assert_array_equal(w[::3, 1::2], expected)
    untouched = np.ones(w.shape, dtype=bool)
    untouched[::3, 1::2] = False
    np.testing.assert_array_equal(w[untouched], before[untouched])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("zeros", [False, True])
def test_relu_in_place_keeps_the_masks_bits(dtype, zeros):
    """relu's fast route (``maximum``, no zero entry) and its mask route give the bits of ``z[z < 0] = 0``: negative
    entries +0, NaN payloads and (with zeros) -0 kept, in place."""
    z = (np.random.default_rng(4).normal(size=(97, 61)) * 5).astype(dtype)
    bits = z.view(np.uint64 if dtype == np.float64 else np.uint32)
    bits[3, :4] = [0x7FF8000000000123, 0xFFF8000000000456, 0x7FF0000000000000, 0xFFF0000000000000] if dtype == \
        np.float64 else [0x7FC00123, 0xFFC00456, 0x7F800000, 0xFF800000]
    if zeros:
        z[5, :3] = [-0.0, 0.0, -0.0]
    expected = z.copy()
    expected[expected < 0] = 0
    out = relu(z)
    assert out is z
    assert out.tobytes() == expected.tobytes()
    assert np.signbit(out[5, 0]) == zeros


def test_projection_dim_zero_is_the_raw_features():
    X = np.random.default_rng(1).normal(size=(5, 7))
    proj = SmoothProjection(n_components=0, activation="identity").fit(X)
    np.testing.assert_array_equal(proj.components_, np.eye(7))
    np.testing.assert_array_equal(proj.transform(X), X)
    np.testing.assert_allclose(SmoothProjection(n_components=0, activation="relu").fit(X).transform(X), np.maximum(X, 0))


def closed_form(store, P: np.ndarray, act, gamma: float, tasks: int = 4, seed: int = 3) -> list[tuple]:
    """(seen classes, W) after every task, and the test accuracy matrix, written out from the raw arrays."""
    Xtr, ytr, Xte, yte = read(store)
    stream = build_stream(ytr, N_CLASSES, tasks, 10, seed)
    out = []
    for k in range(tasks):
        rows = np.concatenate(stream.rows[: k + 1])
        H = act(Xtr[rows].astype(np.float64) @ P)
        seen = np.unique(ytr[rows])
        W = np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ (ytr[rows][:, None] == seen[None, :]))
        accuracy = []
        for task in stream.tasks[: k + 1]:
            sel = np.isin(yte, task)
            accuracy.append(float(np.mean(seen[(act(Xte[sel].astype(np.float64) @ P) @ W).argmax(1)] == yte[sel])))
        out.append((seen, W, accuracy))
    return out


@pytest.mark.parametrize(("activation", "dim"), [("relu", 40), ("identity", 0)])
def test_learn_with_activation_or_raw_features_equals_closed_form(tmp_path, store, activation, dim):
    metrics, model = learn(store, tmp_path / "run", "--activation", activation, D=dim, gamma=0.7)
    P = model["projection"]
    assert P.shape == ((DIM, DIM) if dim == 0 else (DIM, dim))
    expected = closed_form(store, P, HAND[activation], 0.7)
    assert metrics["activation"] == activation and metrics["projection_dim"] == dim
    assert metrics["accuracy_matrix"] == [acc for _, _, acc in expected]
    seen, W, _ = expected[-1]
    np.testing.assert_array_equal(model["classes"], seen)
    assert np.abs(model["W"] - W).max() / np.abs(W).max() < 1e-9
    from safetensors import safe_open

    with safe_open(str(tmp_path / "run" / "model.safetensors"), "numpy") as f:
        assert json.loads(f.metadata()["activation"]) == activation
    out = tmp_path / "pred.csv"
    result = invoke("predict", "--model", tmp_path / "run" / "model.safetensors", "--features", store, "--out", out)
    assert result.exit_code == 0, result.output
    _, _, Xte, _ = read(store)
    predicted = [int(line.split(",")[1]) for line in out.read_text().splitlines()[1:]]
    np.testing.assert_array_equal(predicted, seen[(HAND[activation](Xte.astype(np.float64) @ P) @ W).argmax(1)])


def test_projection_dim_zero_defaults_to_identity(tmp_path, store):
    metrics, _ = learn(store, tmp_path / "run", D=0)
    assert metrics["activation"] == "identity"


@pytest.mark.parametrize("loo", [False, True])
def test_walk_holds_the_closed_form_at_every_boundary_and_decodes_each_chunk_once(store, monkeypatch, loo):
    run = prepare(store, StreamConfig(tasks=4, seed=3), ModelConfig(projection_dim=40, activation="relu"),
                  EvaluationConfig(), ExecutionConfig(backend="numpy"), loo=loo)
    decoded = []
    original = Split.read_raw

    def counting(self, lo, hi):  # where the walk decodes a train chunk
        decoded.append((self.name, lo))
        return original(self, lo, hi)

    monkeypatch.setattr(Split, "read_raw", counting)
    Xtr, ytr, _, _ = read(store)
    seen_sums = []

    def check(k, statistics):
        rows = np.concatenate(run.stream.rows[: k + 1])
        H = np.maximum(Xtr[rows].astype(np.float64) @ run.projection.components_, 0)
        np.testing.assert_allclose(statistics.G, H.T @ H, rtol=1e-12, atol=1e-9)
        assert statistics.n == rows.size
        seen_sums.append(k)

    solver = ManyGammas([0.5], loo=True, choose="loo") if loo else FixedGamma(0.5)
    learner = GramLearner(run, {None: solver}, on_task=lambda k, lanes: check(k, lanes[None].running))
    boundaries = walk(run, [learner])[0].boundaries
    assert seen_sums == [0, 1, 2, 3]
    expected = closed_form(store, run.projection.components_, HAND["relu"], 0.5)
    for b, (seen, W, _) in zip(boundaries, expected, strict=True):
        np.testing.assert_array_equal(b.classes, seen)
        assert np.abs(b.W[:, 0, :] - W).max() / np.abs(W).max() < 1e-9
    chunks = -(-run.store.train.n_rows // run.store.train.chunk_rows)
    assert sorted(decoded) == sorted(set(decoded)) and len(decoded) == chunks  # every chunk once, leave-one-out too


@pytest.mark.parametrize("activation", ["sigmoid", "cos"])
def test_the_value_at_zero_is_the_activation_of_the_bias_on_each_namespace(activation):
    """What an erased row's activations all equal (the walk's refusal and the workers' ErasedRows share it): 0.5 for
    the sigmoid, ``sqrt(2 / D) cos(b)`` for random Fourier features with bias ``b``; computed once per namespace and
    device, the same on NumPy and torch."""
    import array_api_compat.torch as xt

    rng = np.random.default_rng(0)
    b = rng.uniform(0, 2 * np.pi, size=5) if activation == "cos" else None
    expansion = Expansion.from_matrix(rng.normal(size=(3, 5)), activation, bias=b)
    numpy_zero = expansion.at_zero(np, "cpu")
    expected = np.sqrt(2 / 5) * np.cos(b) if activation == "cos" else np.full(5, 0.5)
    np.testing.assert_allclose(numpy_zero, expected[None, :], rtol=1e-15)
    assert numpy_zero.dtype == np.float64
    assert expansion.at_zero(np, "cpu") is numpy_zero  # cached
    torch_zero = expansion.at_zero(xt, xt.asarray(0.0).device).numpy()
    np.testing.assert_array_equal(torch_zero, numpy_zero)
