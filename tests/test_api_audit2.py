"""The second Python API audit: declared classes without rows, read-only fitted arrays, overflowing scores, checked
statistics, refused first calls, predict_proba's argmax in the docs, short messages and the activations listed."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from foal_pipe import AnalyticClassifier, FoalPipeError, SmoothProjection, load_model
from foal_pipe.core.activations import ACTIVATIONS
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.deploy import DeployedModel
from foal_pipe.model.headestimator import ESTIMATORS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and len(message) < 320, message
    return message


def _ridge(X: np.ndarray, y: np.ndarray, classes: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """The closed-form ridge weights, columns for ``classes``."""
    Y = (y[:, None] == classes[None, :]).astype(float)
    return np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)


@pytest.fixture
def two_of_four():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 5)), np.repeat([0, 1], 20), rng.normal(size=(200, 5))


# 1. classes declared by partial_fit(classes=...) without rows never win
@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_declared_classes_without_rows_are_never_predicted(two_of_four, engine):
    X, y, Z = two_of_four
    clf = AnalyticClassifier(engine=engine).partial_fit(X, y, classes=np.arange(4))
    assert clf.classes_.tolist() == [0, 1, 2, 3]
    S = Z @ _ridge(X, y, np.arange(2))
    np.testing.assert_array_equal(clf.predict(Z), np.argmax(S, axis=1))
    # the published code's rule (classes=) still lets a class never seen win at score 0
    spread = np.concatenate([S, np.zeros((len(Z), 2))], axis=1)
    assert (spread.argmax(1) >= 2).any()
    np.testing.assert_array_equal(clf.predict(Z, classes=np.arange(4)), spread.argmax(1))
    # rows of class 2 make it a class seen
    extra = np.random.default_rng(1).normal(size=(10, 5)) + 3
    clf.partial_fit(extra, np.full(10, 2))
    Xa, ya = np.vstack([X, extra]), np.r_[y, np.full(10, 2)]
    np.testing.assert_array_equal(clf.predict(Z), np.argmax(Z @ _ridge(Xa, ya, np.arange(3)), axis=1))


def test_declared_classes_without_rows_survive_save_and_merge(two_of_four, tmp_path):
    X, y, Z = two_of_four
    clf = AnalyticClassifier().partial_fit(X, y, classes=np.arange(4))
    expected = np.argmax(Z @ _ridge(X, y, np.arange(2)), axis=1)
    P = SmoothProjection(n_components=0, activation="identity").fit(X)
    path = clf.save(tmp_path / "m.safetensors", projection=P)
    np.testing.assert_array_equal(AnalyticClassifier.load(path).predict(Z), expected)
    for estimators in (True, False):
        np.testing.assert_array_equal(load_model(path, estimators=estimators).predict(Z), expected)
    other = AnalyticClassifier().fit(X[:3] * 0 + 1, np.array([1, 1, 1]))
    merged = clf.merge(other)
    Xm, ym = np.vstack([X, X[:3] * 0 + 1]), np.r_[y, [1, 1, 1]]
    np.testing.assert_array_equal(merged.predict(Z), np.argmax(Z @ _ridge(Xm, ym, np.arange(2)), axis=1))
    # an rls file keeps its checking sums' row counts (since the twenty-eighth stop), so it records them too
    rls = AnalyticClassifier(engine="rls").partial_fit(X, y, classes=np.arange(4))
    loaded = AnalyticClassifier.load(rls.save(tmp_path / "r.safetensors"))
    np.testing.assert_array_equal(loaded.classes_, np.arange(4))
    np.testing.assert_array_equal(loaded.predict(Z), expected)
    new = np.array([2, 2, 3])
    np.testing.assert_allclose(loaded.partial_fit(X[:3] + 1, new).weights_,
                               _ridge(np.vstack([X, X[:3] + 1]), np.r_[y, new], np.arange(4)), rtol=0, atol=1e-10)


# 2. fitted arrays are read-only
@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_weights_cannot_be_written_through(two_of_four, engine):
    X, y, Z = two_of_four
    clf = AnalyticClassifier(engine=engine).fit(X, y)
    for array in (clf.weights_, clf.coef_):
        with pytest.raises(ValueError, match="read-only"):
            array[:] *= 1.5
    np.testing.assert_allclose(clf.weights_, _ridge(X, y, np.arange(2)), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(Z), np.argmax(Z @ _ridge(X, y, np.arange(2)), axis=1))


def test_statistics_cannot_be_written_through(two_of_four):
    X, y, _ = two_of_four
    clf = AnalyticClassifier().fit(X, y)
    stats = clf.statistics_
    with pytest.raises(ValueError, match="read-only"):
        stats.G[0, 0] = 1e9
    stats += RidgeStatistics.from_batch(X, y)  # a new array for the copy, the classifier's sums untouched
    np.testing.assert_allclose(stats.G, 2 * X.T @ X)
    np.testing.assert_allclose(clf.statistics_.G, X.T @ X)
    np.testing.assert_allclose(clf.weights_, _ridge(X, y, np.arange(2)), rtol=1e-10, atol=1e-12)


# 3. scores that overflow float64 are refused
def test_overflowing_scores_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 4)) * 0.01, np.repeat([0, 1, 2], 10)
    Z = np.sign(rng.normal(size=(20, 4))) * 1e308
    P = SmoothProjection(n_components=0, activation="identity").fit(X)
    path = AnalyticClassifier(gamma=1e-6).fit(X, y).save(tmp_path / "m.safetensors", projection=P)
    estimators = [AnalyticClassifier(gamma=1e-6), ESTIMATORS["ridge"](gamma=1e-6), ESTIMATORS["slda"](),
                  ESTIMATORS["balanced"](gamma=1e-6)]
    calls = [getattr(e.fit(X, y), m) for e in estimators for m in ("class_scores", "predict", "predict_proba")
             if hasattr(e, m)]
    calls += [getattr(load_model(path, estimators=s), m) for s in (True, False) for m in ("predict", "predict_proba")]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="numpy")  # scikit-learn's finiteness sum
        warnings.filterwarnings("error", module=r"foal_pipe\.")  # refused without an overflow warning of ours first
        for call in calls:
            with pytest.raises(FoalPipeError, match="overflow float64") as exc:
                call(Z)
            _one_line(exc)


# 4. RidgeStatistics refuses sums no rows make
@pytest.mark.parametrize("change, match", [
    (lambda s: {"G": -s.G}, "negative diagonal"),
    (lambda s: {"G": np.full_like(s.G, np.nan)}, "NaN or inf"),
    (lambda s: {"n": -5}, "below 0"),
    (lambda s: {"n": 2.7}, "whole number"),
    (lambda s: {"n": 0, "counts": None}, "n=0"),
    (lambda s: {"counts": [-1, 30, 21]}, "holds -1"),
    (lambda s: {"counts": [1.5, 30, 18.5]}, "whole numbers"),
    (lambda s: {"n": 10}, "more than n=10"),
])
def test_statistics_refuse_sums_no_rows_make(change, match):
    rng = np.random.default_rng(0)
    s = RidgeStatistics.from_batch(rng.normal(size=(50, 4)), np.repeat([0, 1, 2], [16, 17, 17]))
    given = {"G": s.G, "Q": s.Q, "classes": s.classes, "n": 50, "counts": s.counts} | change(s)
    with pytest.raises(FoalPipeError, match=match) as exc:
        RidgeStatistics(**given)
    _one_line(exc)
    assert RidgeStatistics(s.G, s.Q, s.classes, 50.0, s.counts).n == 50  # a whole float is a row count


# 5. a refused first call leaves the estimator unfitted
@pytest.mark.parametrize("make", [AnalyticClassifier, *ESTIMATORS.values()], ids=lambda c: c.__name__)
def test_refused_first_call_leaves_the_estimator_as_it_was(make):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    for bad_y in (rng.normal(size=30), np.array(["a", 1] * 15, dtype=object)):
        estimator = make()
        before = dict(vars(estimator))
        with pytest.raises(FoalPipeError):
            estimator.partial_fit(X, bad_y)
        assert vars(estimator).keys() == before.keys()
        with pytest.raises(NotFittedError):
            check_is_fitted(estimator)


# 6. predict_proba's argmax is predict's only where a row has a positive score
def test_deploy_docs_state_where_predict_proba_argmax_differs(tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 4)), np.repeat([0, 1, 2], 20)
    X[y == 1] += 3
    P = SmoothProjection(n_components=0, activation="identity").fit(X)
    model = load_model(AnalyticClassifier().fit(X, y).save(tmp_path / "m.safetensors", projection=P))
    Z = -5 * np.abs(rng.normal(size=(50, 4)))
    scores, shares = model.scores(Z), model.predict_proba(Z)
    positive = (scores > 0).any(axis=1)
    assert positive.any() and not positive.all()
    picked = model.classifier.classes_[shares.argmax(1)]
    np.testing.assert_array_equal(picked[positive], model.predict(Z)[positive])
    assert (picked[~positive] != model.predict(Z)[~positive]).any()
    deploy = " ".join((DOCS / "deploy.md").read_text().split())
    assert "the argmax is `predict`'s)" not in deploy and "a row with none is uniform" in deploy
    assert "The argmax is :meth:`predict`'s;" not in DeployedModel.predict_proba.__doc__


# 7. short one-line messages
def test_input_messages_are_one_short_line():
    X = np.random.default_rng(0).normal(size=(5, 768))
    with pytest.raises(FoalPipeError, match="Reshape your data") as exc:
        AnalyticClassifier().fit(X[0], np.arange(768) % 3)
    _one_line(exc)
    clf = AnalyticClassifier().fit(X, [0, 1, 0, 1, 0])
    with pytest.raises(FoalPipeError, match="contains NaN.*impute") as exc:
        clf.predict(np.full((1, 768), np.nan))
    assert "HistGradientBoosting" not in _one_line(exc)
    with pytest.raises(FoalPipeError, match="Complex data not supported") as exc:
        AnalyticClassifier().fit(X + 1j, [0, 1, 0, 1, 0])
    _one_line(exc)


@pytest.mark.parametrize("seed", [-1, "a", 1.5, True])
def test_bad_random_state_is_a_one_line_error(seed):
    with pytest.raises(FoalPipeError, match="random_state") as exc:
        SmoothProjection(n_components=4, random_state=seed).fit(np.zeros((2, 3)))
    _one_line(exc)


def test_huge_projection_refused_before_allocating(monkeypatch):
    from foal_pipe import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**30)
    with pytest.raises(FoalPipeError, match="n_components") as exc:
        SmoothProjection(n_components=10**9).fit(np.zeros((2, 6)))
    _one_line(exc)


# 8. the docs list every activation the code takes
def test_python_api_docs_list_every_activation():
    text = " ".join((DOCS / "python-api.md").read_text().split())
    signature = re.search(r"`SmoothProjection\(\*,.*?activation=(\S+),", text)
    assert signature is not None
    assert re.findall(r'"(\w+)"', signature.group(1)) == list(ACTIVATIONS)


@pytest.mark.parametrize("head", ["slda"])  # ncm and cosine score unit rows: no overflow
def test_a_saved_heads_overflowing_scores_are_refused(tmp_path, head):
    """The deploy path of a head's model file (HeadClassifier) refuses infinite scores as ridge's does."""
    from foal_pipe.protocol.commands import run_learn
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.store import write_store

    rng = np.random.default_rng(5)
    y = np.arange(60) % 3
    x = (rng.normal(size=(60, 4)) + 5.0 * np.eye(3, 4)[y]).astype(np.float32)  # class means 5 apart
    store = write_store(tmp_path / "a.zarr", (x, y), (x[:15], y[:15]), ["a", "b", "c"], chunk_rows=16)
    run_learn(store, tmp_path / "run", StreamConfig(tasks=1), ModelConfig(head=head),
              EvaluationConfig(), ExecutionConfig(backend="numpy"), log=lambda _: None)
    model = load_model(tmp_path / "run" / "model.safetensors")
    np.testing.assert_array_equal(model.predict(x[:15]), y[:15])  # rows of the training range answer
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module=r"foal_pipe\.")  # refused without an overflow warning of ours first
        with pytest.raises(FoalPipeError, match="overflow float64") as exc:
            model.predict(np.full((3, 4), 1e308))  # x . mean of a class = 5e308 at least
    _one_line(exc)
