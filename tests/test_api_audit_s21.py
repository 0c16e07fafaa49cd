"""Faults an audit of the Python API found (twenty-first stop), each shown wrong before its fix:

1. ``AnalyticClassifier.load`` then ``save`` dropped what the file recorded beside the state (class names, dataset,
   encoder provenance, ``learned_from``, the projection and its activation): a model loaded, continued and saved
   lost them without a word, and could no longer be deployed (``load_model``: no projection);
2. ``score``'s ``sample_weight`` took negative weights, giving a "mean accuracy" of 3.2 (or 26001 where the weights
   nearly cancel), and refused a weight of inf telling the user to re-extract the store;
3. a gram model whose ``G`` stands a rounding from symmetric (torch's float32 ``H^T H`` at D = 6) could not be saved:
   the file's check of ``W`` against the whole ``G`` called it altered, though ``W`` solves the triangle factored.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open

from foal_pipe import AnalyticClassifier, SmoothProjection, head_classifier, load_model
from foal_pipe.errors import FoalPipeError

NAMES = ["ant", "bee", "cat"]
RECORD = {"class_names": NAMES, "dataset": "insects", "encoder": {"name": "pixels", "image_size": 8},
          "learned_from": ["gen-1"]}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(21)
    X = rng.standard_normal((90, 8))
    y = np.tile([0, 1, 2], 30)
    projection = SmoothProjection(n_components=24, random_state=0).fit(X)
    return X, y, projection


def _metadata(path) -> dict:
    with safe_open(path, "np") as f:
        return {key: json.loads(value) for key, value in f.metadata().items()}


def _closed_form(H: np.ndarray, y: np.ndarray, classes: np.ndarray, gamma: float) -> np.ndarray:
    """The ridge solution ``(H^T H + gamma I)^-1 H^T Y`` on one-hot ``Y``, computed here from the rows alone."""
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


@pytest.fixture
def recorded(tmp_path, data):
    X, y, projection = data
    clf = AnalyticClassifier(gamma=0.5).fit(projection.transform(X[:60]), y[:60])
    return clf.save(tmp_path / "a.safetensors", projection=projection, **RECORD)


def test_a_loaded_model_saved_again_keeps_its_record_and_bytes(tmp_path, recorded):
    again = AnalyticClassifier.load(recorded).save(tmp_path / "b.safetensors")
    assert again.read_bytes() == recorded.read_bytes()  # the names, provenance and projection dropped before


def test_a_loaded_model_continued_keeps_its_record_and_counts_the_new_rows(tmp_path, data, recorded):
    X, y, projection = data
    clf = AnalyticClassifier.load(recorded)
    clf.partial_fit(projection.transform(X[60:]), y[60:])
    saved = clf.save(tmp_path / "b.safetensors")
    meta = _metadata(saved)
    for key, value in RECORD.items():
        assert meta[key] == value
    assert meta["activation"] == projection.activation
    assert meta["rows_outside_stores"] == 30  # no store identity records the rows partial_fit gave
    deployed = load_model(saved)  # a projection kept: deployable (refused for "no 'projection' tensor" before)
    assert deployed.class_names == NAMES
    np.testing.assert_array_equal(deployed.projection.components_, projection.components_)
    W = _closed_form(projection.transform(X), y, np.arange(3), 0.5)
    np.testing.assert_allclose(deployed.classifier.weights_, W, rtol=0, atol=1e-12)
    resaved = AnalyticClassifier.load(saved).save(tmp_path / "c.safetensors")
    assert _metadata(resaved)["rows_outside_stores"] == 30  # counted once, not again on a second load


def test_names_that_no_longer_fit_are_refused_not_dropped(tmp_path, data, recorded):
    X, y, projection = data
    clf = AnalyticClassifier.load(recorded).partial_fit(projection.transform(X[60:63]), [0, 1, 7])
    with pytest.raises(FoalPipeError, match="named 3 classes, but the model has 4 now .* pass class_names="):
        clf.save(tmp_path / "b.safetensors")
    assert not (tmp_path / "b.safetensors").exists()
    saved = clf.save(tmp_path / "b.safetensors", class_names=[*NAMES, "dog"])
    assert load_model(saved).class_names == [*NAMES, "dog"]


def test_keywords_given_replace_the_record(tmp_path, data, recorded):
    X, y, projection = data
    clf = AnalyticClassifier.load(recorded)
    with pytest.raises(FoalPipeError, match="activation='relu' contradicts the loaded projection's activation 'sigmoid'"):
        clf.save(tmp_path / "b.safetensors", activation="relu")  # would mislabel the recorded matrix
    relu = SmoothProjection(n_components=24, activation="relu", random_state=1).fit(X)
    meta = _metadata(clf.save(tmp_path / "b.safetensors", projection=relu, dataset="moths"))
    assert meta["activation"] == "relu" and meta["dataset"] == "moths" and meta["class_names"] == NAMES
    np.testing.assert_array_equal(load_model(tmp_path / "b.safetensors").projection.components_, relu.components_)


def test_fit_forgets_the_record_with_the_rows(tmp_path, data, recorded):
    X, y, projection = data
    clf = AnalyticClassifier.load(recorded).fit(projection.transform(X[:30]), y[:30] + 5)
    meta = _metadata(clf.save(tmp_path / "b.safetensors"))
    assert not set(RECORD) & set(meta) and "rows_outside_stores" not in meta


@pytest.mark.parametrize("make", [lambda: AnalyticClassifier(), lambda: head_classifier("ncm")], ids=["ridge", "ncm"])
def test_score_refuses_weights_that_give_no_accuracy(data, make):
    X, y, _ = data
    clf = make().fit(X, y)
    right = clf.predict(X) == y
    assert 0 < right.mean() < 1
    weights = np.where(right, 1.0, -0.9)  # "accuracy" 3.2 before
    with pytest.raises(FoalPipeError, match="negative weight, NaN or inf, .*; pass finite weights >= 0"):
        clf.score(X, y, sample_weight=weights)
    with pytest.raises(FoalPipeError, match="negative weight, NaN or inf"):
        clf.score(X, y, sample_weight=np.r_[np.inf, np.ones(89)])  # said "re-extract the store"
    with pytest.raises(FoalPipeError, match="holds <U1 values, not numbers"):
        clf.score(X, y, sample_weight=["a"] * 90)  # NumPy's words on ufunc signatures before
    weights = np.arange(90, dtype=np.float64)
    assert clf.score(X, y, sample_weight=weights) == pytest.approx(np.sum(weights * right) / np.sum(weights))


def test_a_gram_state_a_rounding_from_symmetric_is_saved_as_the_matrix_its_weights_solve(tmp_path):
    """A Gram product off NumPy (torch's float32 ``H^T H`` at D = 6) is not exactly symmetric; the solve factors its
    lower triangle, and the file's check of W against the whole G refused the model as altered."""
    from foal_pipe.model.ridgemodel import RidgeModel

    rng = np.random.default_rng(3)
    H = rng.standard_normal((40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    G = H.T @ H
    G_lower = np.tril(G) + np.tril(G, -1).T
    G[np.triu_indices(6, 1)] *= np.float32(1 + 4e-7)  # the upper triangle a few float32 roundings apart
    assert not np.array_equal(G, G.T)
    Q = (H.T @ (y[:, None] == np.arange(3))).astype(np.float32)
    W = np.linalg.solve(G_lower.astype(np.float64) + 10.0 * np.eye(6), Q.astype(np.float64))
    model = RidgeModel({"G": G, "Q": Q, "counts": np.bincount(y)}, W, np.arange(3), 10.0, "gram", "float32", 40)
    saved = model.save(tmp_path / "m.safetensors")  # refused before: "W does not solve ... the file was altered"
    loaded = RidgeModel.load(saved)
    np.testing.assert_array_equal(loaded.state["G"], G_lower)
    np.testing.assert_array_equal(loaded.weights, W)


def test_a_torch_float32_classifier_saves_and_continues_as_in_memory(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((400, 6)), rng.integers(0, 5, 400)
    clf = AnalyticClassifier(backend="torch", dtype="float32", gamma=10.0)
    for rows in np.array_split(np.arange(400), 10):
        clf.partial_fit(torch.tensor(X[rows]), y[rows])
    loaded = AnalyticClassifier.load(clf.save(tmp_path / "m.safetensors"), backend="torch")
    G = np.asarray(loaded.statistics_.G, dtype=np.float64)
    Q = np.asarray(loaded.statistics_.Q, dtype=np.float64)
    np.testing.assert_allclose(loaded.weights_, np.linalg.solve(G + 10.0 * np.eye(6), Q), rtol=0, atol=1e-12)
    clf.partial_fit(X[:7], y[:7])
    loaded.partial_fit(X[:7], y[:7])
    np.testing.assert_array_equal(loaded.weights_, clf.weights_)
