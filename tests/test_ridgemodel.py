"""The scikit-learn-free pieces that `learn` and `sweep` use: :class:`Expansion` (the projection's arithmetic) and
:class:`RidgeModel` (the ridge model file) give what the estimators give, to the bit, and the closed form."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.ridgemodel import RidgeModel

HAND = {"sigmoid": lambda z: 1 / (1 + np.exp(-z)), "relu": lambda z: np.maximum(z, 0), "identity": lambda z: z}


@pytest.mark.parametrize("activation", sorted(HAND))
@pytest.mark.parametrize(("n_components", "init"), [(20, "uniform"), (20, "normal"), (0, "uniform")])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_expansion_is_the_estimators_arithmetic(activation, n_components, init, dtype):
    X = np.random.default_rng(0).normal(size=(30, 6)).astype(np.float32)
    expansion = Expansion.draw(6, n_components, init, activation, 7, dtype)
    estimator = SmoothProjection(n_components=n_components, init=init, activation=activation, random_state=7,
                                 dtype=dtype).fit(X)
    np.testing.assert_array_equal(expansion.components_, estimator.components_)
    assert expansion.is_identity == estimator.is_identity == (n_components == 0)
    H = expansion.transform(X)
    np.testing.assert_array_equal(H, estimator.transform(X))
    P = np.eye(6) if n_components == 0 else expansion.components_.astype(np.float64)
    expected = HAND[activation](X.astype(np.float64) @ P)
    np.testing.assert_allclose(H, expected, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    assert H.dtype == np.dtype(dtype)


def test_expansion_refuses_features_of_another_width():
    with pytest.raises(FoalPipeError, match=r"expects \(rows, 6\)"):
        Expansion.draw(6, 4, "uniform", "sigmoid", 0, "float64").transform(np.zeros((3, 5)))


@pytest.mark.parametrize(("field", "value", "message"), [("n_components", -1, "at least 0"),
                                                         ("init", "he", "unknown projection init"),
                                                         ("activation", "tanh", "unknown activation")])
def test_expansion_refuses_bad_settings(field, value, message):
    settings = {"n_components": 4, "init": "uniform", "activation": "sigmoid"} | {field: value}
    with pytest.raises(FoalPipeError, match=message):
        Expansion.draw(6, settings["n_components"], settings["init"], settings["activation"], 0, "float64")


def test_ridge_model_solves_the_closed_form_and_saves_the_classifiers_file(tmp_path):
    rng = np.random.default_rng(1)
    H, y = rng.random((40, 5)), rng.integers(0, 3, 40) * 2
    model = RidgeModel.solved(RidgeStatistics.from_batch(H, y), 0.5)
    Y = (y[:, None] == np.array([0, 2, 4])[None, :]).astype(np.float64)
    np.testing.assert_allclose(model.weights, np.linalg.solve(H.T @ H + 0.5 * np.eye(5), H.T @ Y), rtol=1e-12)
    assert model.classes.tolist() == [0, 2, 4] and model.n_samples == 40 and model.dtype == "float64"
    P = rng.random((3, 5))
    meta = {"dataset": "d", "class_names": ["a", "b", "c"], "activation": "sigmoid"}
    model.save(tmp_path / "direct.safetensors", P, **meta)
    clf = AnalyticClassifier(gamma=0.5).fit(H, y)
    clf.save(tmp_path / "estimator.safetensors", SmoothProjection.from_matrix(P), **meta)
    assert (tmp_path / "direct.safetensors").read_bytes() == (tmp_path / "estimator.safetensors").read_bytes()


def test_ridge_model_refuses_labels_that_are_not_integers(tmp_path):
    statistics = RidgeStatistics.from_batch(np.eye(3), np.array(["a", "b", "c"]))
    with pytest.raises(FoalPipeError, match="only integer class labels"):
        RidgeModel.solved(statistics, 1.0).save(tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
