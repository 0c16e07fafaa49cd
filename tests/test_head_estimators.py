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

from foal_pipe import SmoothProjection
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
    "balanced": {f"check_classifiers_train{args}": _SHARES
                 for args in ("", "(readonly_memmap=True)", "(readonly_memmap=True,X_dtype=float32)")},
}


@parametrize_with_checks([cls() for cls in ESTIMATORS.values()],
                         expected_failed_checks=lambda est: EXPECTED_FAILURES.get(est.head, {}))
def test_head_estimator_is_a_scikit_learn_estimator(estimator, check):
    check(estimator)


def test_every_head_but_ridge_has_an_estimator_with_its_options():
    assert set(ESTIMATORS) == {name for name, entry in HEADS.items() if entry.factory is not None}
    assert head_classifier("slda", shrinkage="oas").get_params() == {"shrinkage": "oas"}
    assert set(head_classifier("dual").get_params()) == {"gamma", "gamma_comp", "compensation", "batch_size"}
    assert type(head_classifier("ridge")).__name__ == "AnalyticClassifier"
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


def test_klda_style_pipeline_random_features_then_slda(digits):
    X, y, T, yt = digits
    pipe = make_pipeline(SmoothProjection(n_components=300, activation="relu", random_state=0),
                         head_classifier("slda", shrinkage=0.01)).fit(X / 16, y)
    assert pipe.score(T / 16, yt) > 0.9
