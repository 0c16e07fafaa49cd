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


def _saved(tmp_path, settings):
    """Features X (n, 6), a projection P (6, 8) and the file of an estimator fitted on sigmoid(X P) in two batches."""
    rng = np.random.default_rng(4)
    X, y, P = rng.normal(size=(50, 6)), rng.integers(0, 4, 50) * 3, rng.normal(size=(6, 8))
    H = HAND["sigmoid"](X @ P)
    clf = AnalyticClassifier(**settings).partial_fit(H[:20], y[:20]).partial_fit(H[20:], y[20:])
    path = clf.save(tmp_path / "m.safetensors", SmoothProjection.from_matrix(P), class_names=list("abcd"))
    return X, y, P, H, clf, path


@pytest.mark.parametrize("settings", [{"gamma": 0.5}, {"gamma": 0.5, "dtype": "float32"}, {"gamma": "auto"},
                                      {"gamma": 0.5, "engine": "rls"}],
                         ids=lambda s: "-".join(map(str, s.values())))
def test_saved_ridge_predicts_as_the_estimator_and_the_closed_form(tmp_path, settings):
    """load_model(estimators=False), what predict, evaluate and learn --init-model load: the estimator's scores,
    predictions, statistics and file, to the bit; the scores those of the closed-form ridge solution."""
    from foal_pipe.model.deploy import load_model
    from foal_pipe.model.ridgemodel import SavedRidge

    X, y, P, H, clf, path = _saved(tmp_path, settings)
    full, light = load_model(path), load_model(path, estimators=False)
    assert isinstance(full.classifier, AnalyticClassifier) and isinstance(full.projection, SmoothProjection)
    assert isinstance(light.classifier, SavedRidge) and isinstance(light.projection, Expansion)
    scores = light.scores(X)
    np.testing.assert_array_equal(scores, full.scores(X))
    Y = (y[:, None] == np.array([0, 3, 6, 9])[None, :]).astype(np.float64)
    gamma = clf.gamma_
    expected = H @ np.linalg.solve(H.T @ H + gamma * np.eye(8), H.T @ Y)
    np.testing.assert_allclose(scores, expected, rtol=1e-3 if "dtype" in settings else 1e-9, atol=1e-4)
    np.testing.assert_array_equal(light.predict(X), full.predict(X))
    np.testing.assert_array_equal(light.predict(X, classes=range(12)), full.predict(X, classes=range(12)))
    assert light.predict_names(X) == full.predict_names(X)
    np.testing.assert_array_equal(light.predict_proba(X), full.predict_proba(X))
    assert light.classifier.n_samples_seen_ == full.classifier.n_samples_seen_ == 50
    np.testing.assert_array_equal(light.classifier.classes_, full.classifier.classes_)
    if settings.get("engine") != "rls":
        ours, theirs = light.classifier.statistics_, full.classifier.statistics_
        for name in ("G", "Q", "classes", "counts"):
            np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
            assert getattr(ours, name).dtype == getattr(theirs, name).dtype
        assert ours.n == theirs.n
    else:
        with pytest.raises(FoalPipeError, match="only the gram engine keeps sufficient statistics"):
            light.classifier.statistics_  # noqa: B018
    again = light.save(tmp_path / "light.safetensors")
    assert again.read_bytes() == full.save(tmp_path / "full.safetensors").read_bytes()


def test_saved_ridge_refuses_what_the_estimator_refuses(tmp_path):
    from foal_pipe.model.deploy import load_model

    X, y, _, _, _, path = _saved(tmp_path, {"gamma": 0.5})
    light = load_model(path, estimators=False)
    with pytest.raises(FoalPipeError, match=r"only predicts; load it with load_model\(path\)"):
        light.partial_fit(X, y)
    H = np.full((2, 8), np.nan)
    for classifier, nan in ((light.classifier, "X contains NaN or inf"), (load_model(path).classifier, "X contains NaN")):
        with pytest.raises(FoalPipeError, match=nan):
            classifier.class_scores(H)
        with pytest.raises(FoalPipeError, match=r"classes lacks the seen labels \[9\]"):
            classifier.predict(np.zeros((2, 8)), classes=[0, 3, 6])
    model = RidgeModel.load(path)
    for grid, engine in (([1e-2, 1e2], "rls"), ([1e-2, -1.0], "gram")):  # refused when written, as when read
        state = {"R": np.eye(8), "W": model.weights} if engine == "rls" else model.state
        bad = RidgeModel(state, model.weights, model.classes, model.gamma, engine, "float64", 50, grid)
        with pytest.raises(FoalPipeError, match="metadata 'gamma_grid'"):
            bad.save(tmp_path / "bad.safetensors", np.eye(6, 8))
        assert not (tmp_path / "bad.safetensors").exists()


def test_ridge_model_load_reads_what_save_wrote(tmp_path):
    rng = np.random.default_rng(2)
    H, y = rng.random((30, 5)), rng.integers(0, 3, 30)
    model = RidgeModel.solved(RidgeStatistics.from_batch(H, y), 0.25)
    model.save(tmp_path / "m.safetensors", rng.random((4, 5)), activation="relu")
    loaded = RidgeModel.load(tmp_path / "m.safetensors")
    assert (loaded.gamma, loaded.engine, loaded.dtype, loaded.n_samples, loaded.gamma_grid) == (0.25, "gram", "float64",
                                                                                                 30, None)
    np.testing.assert_array_equal(loaded.weights, model.weights)
    np.testing.assert_array_equal(loaded.classes, [0, 1, 2])
    assert sorted(loaded.state) == sorted(model.state)
    for name, value in model.state.items():
        np.testing.assert_array_equal(loaded.state[name], value)


def test_an_rls_float32_file_of_earlier_versions_predicts_but_learns_no_more(tmp_path):
    """Files with the RLS recursion's float32 state were written before that pairing was refused: they load and
    predict as saved, and a further ``partial_fit`` is refused rather than drifting on."""
    from foal_pipe.model.modelfile import read_model, write_model

    X, y, P, H, clf, path = _saved(tmp_path, {"gamma": 0.5, "engine": "rls"})
    tensors, meta = read_model(path)
    tensors = {k: v.astype(np.float32) if k in ("R",) else v for k, v in tensors.items() if k not in ("G", "Q", "counts")}
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version", "sums_rounding",
                                                       "sums_rounding_errors")} | {"dtype": "float32"}
    old = write_model(tmp_path / "old.safetensors", tensors, meta)
    loaded = AnalyticClassifier.load(old)
    np.testing.assert_array_equal(loaded.predict(H), clf.predict(H))
    with pytest.raises(FoalPipeError, match="is refused"):
        loaded.partial_fit(H[:5], y[:5])
