"""scikit-learn conformance: check_estimator on both estimators, pipelines, cross-validation and grid search."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.model.classifier import SKLEARN_EXPECTED_FAILURES


@parametrize_with_checks(
    [AnalyticClassifier(), AnalyticClassifier(gamma="auto"), AnalyticClassifier(engine="rls"),
     SmoothProjection(n_components=20), SmoothProjection(n_components=0, activation="relu")],
    expected_failed_checks=lambda est: SKLEARN_EXPECTED_FAILURES if isinstance(est, AnalyticClassifier) else {},
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_expected_failures_are_few_and_explained():
    assert len(SKLEARN_EXPECTED_FAILURES) <= 3
    assert all(len(reason) > 20 for reason in SKLEARN_EXPECTED_FAILURES.values())


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def test_pipeline_cross_validation_and_grid_search(digits):
    X, y = digits
    pipe = make_pipeline(SmoothProjection(n_components=300, random_state=0), AnalyticClassifier(gamma=1.0))
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.85
    search = GridSearchCV(pipe, {"analyticclassifier__gamma": [1e-2, 1.0, 100.0],
                                 "smoothprojection__activation": ["sigmoid", "relu"]}, cv=3)
    search.fit(X, y)
    assert search.best_params_["analyticclassifier__gamma"] in (1e-2, 1.0, 100.0)
    assert search.best_score_ >= scores.mean() - 1e-12  # the grid holds the first pipeline
    assert search.score(X, y) > 0.9


def test_auto_gamma_is_gcv_on_the_grid(digits):
    from foal_pipe.core.statistics import RidgeStatistics

    X, y = digits
    H = SmoothProjection(n_components=200, random_state=1).fit_transform(X)
    grid = [1e-3, 1e-1, 10.0, 1e3]
    clf = AnalyticClassifier(gamma="auto", gamma_grid=grid).fit(H, y)
    expected = grid[int(np.argmin(RidgeStatistics.from_batch(H, y).eigen().gcv(grid)))]
    assert clf.gamma_ == expected
    np.testing.assert_allclose(clf.weights_, AnalyticClassifier(gamma=expected).fit(H, y).weights_, rtol=0, atol=1e-10)
    pipe = make_pipeline(SmoothProjection(n_components=200, random_state=1), AnalyticClassifier(gamma="auto"))
    assert cross_val_score(pipe, X, y, cv=3).min() > 0.85


def test_fit_forgets_and_equals_partial_fit_in_pieces(digits):
    X, y = digits
    H = SmoothProjection(n_components=64, random_state=2).fit_transform(X)
    pieces = AnalyticClassifier(gamma=0.5)
    for lo in range(0, len(y), 333):
        pieces.partial_fit(H[lo : lo + 333], y[lo : lo + 333])
    refit = AnalyticClassifier(gamma=0.5).fit(H[:100], y[:100]).fit(H, y)  # fit starts over
    assert refit.n_samples_seen_ == pieces.n_samples_seen_ == len(y)
    np.testing.assert_allclose(refit.weights_, pieces.weights_, rtol=0, atol=1e-10)


def test_params_clone_and_keyword_only():
    clf = AnalyticClassifier(gamma=3.0, engine="rls", dtype="float32")
    assert clf.get_params() == {"gamma": 3.0, "engine": "rls", "dtype": "float32", "backend": "numpy",
                                "gamma_grid": None, "per_decade": 8}
    copy = clone(clf).set_params(gamma=0.1)
    assert copy.gamma == 0.1 and clf.gamma == 3.0
    assert SmoothProjection(activation="relu").get_params()["activation"] == "relu"
    with pytest.raises(TypeError):
        AnalyticClassifier(1.0)
    with pytest.raises(TypeError):
        SmoothProjection(100)
