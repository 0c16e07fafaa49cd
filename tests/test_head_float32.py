"""``--dtype float32`` for every head: the rows are rounded to float32 (features, projection and activation computed
in float32) and the statistics stay float64 (docs/heads.md, "--dtype float32"). float32's results equal float64's
within the documented tolerance, the model file records float32 and its reload predicts what the run scored, the
array-API namespaces agree with NumPy, a continued float32 model keeps its dtype, and ``sweep --heads`` and
``--order-seeds`` in float32 equal separate ``learn --head --dtype float32`` runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.model.deploy import load_model
from foal_pipe.model.modelfile import read_model
from foal_pipe.store import write_store

#: docs/heads.md's tolerance: the final models' predictions differ on at most this fraction of the test rows, every
#: accuracy-matrix entry within it, and every score within SCORE_RTOL of the row's largest absolute score.
PREDICTIONS_DIFFER = 0.01
SCORE_RTOL = 1e-4

#: Each head with the options that make it run quickly (balanced and dual: on a 64-wide projection).
HEAD_ARGS: dict[str, list] = {
    "ncm": [], "slda": [], "fecam": [], "cosine": [],
    "balanced": ["--gamma", 1, "--projection-dim", 64], "dual": ["--gamma", 1, "--projection-dim", 64],
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Float64 stores, so that rounding the rows to float32 changes them: Gaussian blobs, and scikit-learn's digits
    seen through a fixed random rotation (its raw pixels/8 - 1 are exact in float32)."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("f32")
    rng = np.random.default_rng(5)
    means = rng.normal(size=(8, 16))
    y = np.tile(np.arange(8), 60)
    x = means[y] + 1.5 * rng.normal(size=(y.size, 16))
    test = np.arange(y.size) % 5 == 4
    blobs = write_store(root / "blobs.zarr", (x[~test], y[~test]), (x[test], y[test]), [f"c{i}" for i in range(8)],
                        chunk_rows=64, dtype="float64")
    x = means[y] + 1.5 * rng.normal(size=(y.size, 16))  # new rows of the same classes: a store to continue on
    more = write_store(root / "more.zarr", (x[~test], y[~test]), (x[test], y[test]), [f"c{i}" for i in range(8)],
                       chunk_rows=64, dtype="float64")
    X, t = load_digits(return_X_y=True)
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(64, 64)))[0]
    X = (X / 8 - 1) @ rotation
    test = np.arange(t.size) % 5 == 4
    digits = write_store(root / "digits.zarr", (X[~test], t[~test]), (X[test], t[test]), [str(i) for i in range(10)],
                         chunk_rows=256, dtype="float64")
    return {"blobs": blobs, "more": more, "digits": digits}


def _learn(store: Path, out: Path, head: str, *extra) -> dict:
    result = invoke("learn", "--features", store, "--out", out, "--head", head, *HEAD_ARGS[head], "--tasks", 5,
                    "--seed", 1, "--backend", "numpy", *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _test_rows(store: Path) -> tuple[np.ndarray, np.ndarray]:
    from foal_pipe.store import open_store

    test = open_store(store).test
    return np.asarray(test.features[:]), np.asarray(test.labels[:])


@pytest.mark.parametrize("data", ["blobs", "digits"])
@pytest.mark.parametrize("head", list(HEAD_ARGS))
def test_float32_equals_float64_within_the_documented_tolerance(stores, tmp_path, head, data):
    store = stores[data]
    m64 = _learn(store, tmp_path / "f64", head)
    m32 = _learn(store, tmp_path / "f32", head, "--dtype", "float32")
    assert m64["dtype"] == "float64" and m32["dtype"] == "float32"
    a64, a32 = (np.array([row + [np.nan] * (5 - len(row)) for row in m["accuracy_matrix"]]) for m in (m64, m32))
    np.testing.assert_allclose(a32, a64, rtol=0, atol=PREDICTIONS_DIFFER, equal_nan=True)

    x, y = _test_rows(store)
    f64, f32 = load_model(tmp_path / "f64" / "model.safetensors"), load_model(tmp_path / "f32" / "model.safetensors")
    p64, p32 = f64.predict(x), f32.predict(x)
    assert np.mean(p64 != p32) <= PREDICTIONS_DIFFER
    np.testing.assert_array_equal(load_model(tmp_path / "f32" / "model.safetensors", estimators=False).predict(x), p32)
    s64, s32 = f64.scores(x), f32.scores(x)
    assert np.all(np.abs(s32 - s64) <= SCORE_RTOL * np.abs(s64).max(axis=1, keepdims=True))
    if head in ("balanced", "dual") or data == "blobs":  # digits' rotated pixels and every projection: rounded rows
        assert not np.array_equal(s32, s64)

    # the file records float32, and its reload predicts what the run scored after the last task
    _, meta = read_model(tmp_path / "f32" / "model.safetensors")
    assert meta["dtype"] == "float32" and "dtype" not in read_model(tmp_path / "f64" / "model.safetensors")[1]
    names = open_names(store)
    hit = np.array([names[c] for c in y]) == np.array(f32.predict_names(x))
    task_of = {c: k for k, classes in enumerate(m32["tasks"]) for c in classes}
    tasks = np.array([task_of[c] for c in y])
    assert [float(hit[tasks == k].mean()) for k in range(5)] == m32["accuracy_matrix"][-1]


def open_names(store: Path) -> list[str]:
    from foal_pipe.store import open_store

    return list(open_store(store).classes)


def _learn_on(store: Path, out: Path, head: str, backend: str) -> dict:
    """``learn --head HEAD --dtype float32`` through the library (the CLI offers no array_api_strict)."""
    from foal_pipe.protocol.commands import run_learn
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    model = {"gamma": 1.0, "projection_dim": 64} if head in ("balanced", "dual") else {}
    run_learn(store, out, StreamConfig(tasks=5, seed=1), ModelConfig(head=head, dtype="float32", **model),
              EvaluationConfig(), ExecutionConfig(backend=backend), log=lambda _: None)
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("backend", ["array_api_strict", "torch"])
@pytest.mark.parametrize("head", list(HEAD_ARGS))
def test_float32_on_the_array_api_path_equals_numpy(stores, tmp_path, head, backend):
    pytest.importorskip(backend)
    ref = _learn_on(stores["blobs"], tmp_path / "numpy", head, "numpy")
    got = _learn_on(stores["blobs"], tmp_path / backend, head, backend)
    assert got["backend"] == backend and got["accuracy_matrix"] == ref["accuracy_matrix"]
    want, _ = read_model(tmp_path / "numpy" / "model.safetensors")
    have, meta = read_model(tmp_path / backend / "model.safetensors")
    assert meta["dtype"] == "float32" and set(have) == set(want)
    for key in want:
        np.testing.assert_allclose(have[key], want[key], rtol=1e-6, atol=1e-6 * float(np.abs(want[key]).max()))


def test_a_float32_model_continues_in_float32(stores, tmp_path):
    store = stores["blobs"]
    _learn(store, tmp_path / "first", "slda", "--dtype", "float32")
    out = tmp_path / "more"
    result = invoke("learn", "--features", stores["more"], "--out", out, "--init-model", tmp_path / "first" / "model.safetensors",
                    "--tasks", 5, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert read_model(out / "model.safetensors")[1]["dtype"] == "float32"
    refused = tmp_path / "refused"
    assert_clean_error(invoke("learn", "--features", stores["more"], "--out", refused, "--init-model",
                              tmp_path / "first" / "model.safetensors", "--dtype", "float64", "--tasks", 5,
                              "--backend", "numpy"), "--dtype float64 conflicts with the model's slda head", refused)


def test_sweep_heads_in_float32_equal_learn_in_float32(stores, tmp_path):
    """``sweep --heads`` with ``--dtype float32`` (refused before) runs each head as ``learn --head --dtype float32``."""
    store = stores["blobs"]
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sweep", "--tasks", 5, "--seed", 1,
                    "--backend", "numpy", "--projection-dim", 32, "--gammas", "1", "--heads", "ridge,ncm,slda",
                    "--dtype", "float32")
    assert result.exit_code == 0, result.output
    heads = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["heads"]
    for name in ("ncm", "slda"):
        learned = _learn(store, tmp_path / name, name, "--dtype", "float32")
        assert heads[name]["accuracy_matrix"] == learned["accuracy_matrix"]


@pytest.mark.parametrize("head", ["slda", "balanced"])
def test_order_seeds_in_float32_equal_separate_float32_runs(stores, tmp_path, head):
    store = stores["blobs"]
    metrics = _learn(store, tmp_path / "orders", head, "--order-seeds", "0,1", "--dtype", "float32")
    for order in metrics["orders"]:
        seed = order["order_seed"]
        alone = _learn(store, tmp_path / f"seed{seed}", head, "--order-seed", seed, "--dtype", "float32")
        assert order["accuracy_matrix"] == alone["accuracy_matrix"] and order["tasks"] == alone["tasks"]
