"""Every head's scikit-learn estimator: conformance (parametrize_with_checks), the head's exact model on the rows
given, one partial_fit per task, pickling, and building by name."""

from __future__ import annotations

import pickle

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import ref_cosine, ref_slda
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.model.headestimator import ESTIMATORS, head_classifier

#: The checks a head's estimator fails on purpose, with the reason.
_SHARES = ("ridge's probability rule (DeployedModel.predict_proba): scores clipped at 0 and normalised, so a row "
           "whose every score is negative gets uniform shares, whose argmax need not be predict's")
EXPECTED_FAILURES = {
    "fecam": {"check_fit2d_1sample": "FeCAM needs two rows per class for a covariance; it says so in one line",
              "check_fit2d_1feature": "FeCAM normalises rows to unit length: one feature leaves every row at +-1, a "
                                      "class of zero variance, which it refuses in one line"},
    **{name: {f"check_classifiers_train{args}": _SHARES
              for args in ("", "(readonly_memmap=True)", "(readonly_memmap=True,X_dtype=float32)")}
       for name in ("balanced", "ridge")},
}


@parametrize_with_checks([cls() for cls in ESTIMATORS.values()],
                         expected_failed_checks=lambda est: EXPECTED_FAILURES.get(est.head, {}))
def test_head_estimator_is_a_scikit_learn_estimator(estimator, check):
    check(estimator)


def test_every_head_has_an_estimator_with_its_options():
    assert set(ESTIMATORS) == set(HEADS)
    assert head_classifier("slda", shrinkage="oas").get_params() == {"shrinkage": "oas"}
    assert set(head_classifier("dual").get_params()) == {"gamma", "gamma_comp", "compensation", "batch_size"}
    assert head_classifier("ridge", gamma=0.5).get_params() == {"gamma": 0.5}
    with pytest.raises(FoalPipeError, match="gamma must be a positive number"):
        head_classifier("ridge", gamma=-1.0).fit(np.eye(3), [0, 1, 1])
    with pytest.raises(FoalPipeError, match="the ncm head takes no option shrinkage"):
        head_classifier("ncm", shrinkage=0.1)
    with pytest.raises(FoalPipeError, match="unknown head 'knn'"):
        head_classifier("knn")
    with pytest.raises(FoalPipeError, match="must lie in"):
        head_classifier("slda", shrinkage=3.0).fit(np.eye(3), [0, 1, 1])


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:900], y[:900], X[900:1100], y[900:1100]


@pytest.mark.parametrize(("name", "reference"), [("cosine", ref_cosine), ("slda", lambda X, y, T: ref_slda(X, y, T))])
def test_estimator_equals_the_heads_definition_over_tasks(digits, name, reference):
    X, y, T, yt = digits
    labels = np.array(list("abcdefghij"))[y]  # any labels: the estimator maps them to the head's class ids
    est = head_classifier(name)
    tasks = [np.isin(y, [3, 1, 7]), np.isin(y, [0, 2, 4, 5, 6, 8, 9])]
    est.partial_fit(X[tasks[0]], labels[tasks[0]])
    classes, expected = reference(X[tasks[0]], labels[tasks[0]], T)
    assert est.classes_.tolist() == classes.tolist() == ["b", "d", "h"]
    np.testing.assert_allclose(est.class_scores(T), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
    est.partial_fit(X[tasks[1]], labels[tasks[1]])
    classes, expected = reference(X, labels, T)
    assert est.classes_.tolist() == classes.tolist()
    np.testing.assert_allclose(est.class_scores(T), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
    assert (est.predict(T) == classes[expected.argmax(axis=1)]).all()
    assert est.score(T, np.array(list("abcdefghij"))[yt]) > 0.85


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimator_equals_the_head_pickles_and_clones(digits, name):
    X, y, T, _ = digits
    est = head_classifier(name).fit(X, y)
    head = make_head(name, {}, xnp, X.shape[1])
    head.add(X.astype(np.float64), y)
    np.testing.assert_array_equal(est.class_scores(T), head.boundary().scores(T.astype(np.float64)))
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.class_scores(T), est.class_scores(T))
    assert clone(est).get_params() == est.get_params()


@pytest.mark.parametrize("gamma", [1.0, 30.0, "auto"])
def test_ridge_estimator_from_the_registry_equals_analytic_classifier(digits, gamma):
    """``head_classifier("ridge")`` is RidgeHead through the generic estimator; over two tasks whose labels first
    appear out of sorted order (so the head's class ids are not the estimator's order) its scores, predictions and
    weights equal AnalyticClassifier's, and both equal the closed form solve(H^T H + gamma I, H^T Y)."""
    X, y, T, yt = digits
    labels = np.array(list("abcdefghij"))[y]
    tasks = [np.isin(y, [3, 1, 7]), np.isin(y, [0, 2, 4, 5, 6, 8, 9])]
    est, ref = head_classifier("ridge", gamma=gamma), AnalyticClassifier(gamma=gamma)
    for task in tasks:
        est.partial_fit(X[task], labels[task])
        ref.partial_fit(X[task], labels[task])
    assert est.classes_.tolist() == ref.classes_.tolist() == list("abcdefghij")
    np.testing.assert_array_equal(est.predict(T), ref.predict(T))
    W = est._scorer.W[:, [est._ids[c] for c in est.classes_.tolist()]]  # the head's columns, in classes_ order
    np.testing.assert_allclose(W, ref.weights_, rtol=1e-12, atol=1e-12 * np.abs(ref.weights_).max())
    g = ref.gamma_ if gamma == "auto" else gamma
    closed = np.linalg.solve(X.T @ X + g * np.eye(X.shape[1]), X.T @ (labels[:, None] == est.classes_))
    np.testing.assert_allclose(W, closed, rtol=1e-7, atol=1e-7 * np.abs(closed).max())
    np.testing.assert_allclose(est.class_scores(T), T @ closed, rtol=1e-7, atol=1e-7 * np.abs(T @ closed).max())
    assert est.score(T, np.array(list("abcdefghij"))[yt]) == ref.score(T, np.array(list("abcdefghij"))[yt]) > 0.85


def test_klda_style_pipeline_random_features_then_slda(digits):
    X, y, T, yt = digits
    pipe = make_pipeline(SmoothProjection(n_components=300, activation="relu", random_state=0),
                         head_classifier("slda", shrinkage=0.01)).fit(X / 16, y)
    assert pipe.score(T / 16, yt) > 0.9
