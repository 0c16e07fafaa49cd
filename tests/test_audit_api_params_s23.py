"""Audit (session 23, apip): scikit-learn parameter and argument conventions of the Python API, where a parameter or
argument could be silently ignored or silently wrong. Each test compares with an independent expectation (numpy's
weighted mean, a fresh fit, the refusal a fresh fit gives)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, FoalPipeError
from foal_pipe.model.headestimator import ESTIMATORS


def _data(n: int = 60, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.permutation(np.repeat([0, 1, 2], n // 3))


def _estimators() -> list:
    X, y = _data()
    return [AnalyticClassifier(gamma=1.0).fit(X, y), ESTIMATORS["ncm"]().fit(X, y), ESTIMATORS["slda"]().fit(X, y)]


# --- score(X, y, sample_weight=w): huge finite weights ------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 1, 2], ids=["analytic", "ncm", "slda"])
def test_score_huge_finite_weights_give_the_weighted_accuracy_or_a_refusal(index):
    """Finite weights >= 0 pass check_sample_weight, but their sum overflows float64: scikit-learn's weighted mean is
    then inf/inf = NaN (every row right) or x/inf = 0.0 (1 of 3 right), with only a RuntimeWarning. Equal weights must
    give the plain accuracy (the weighted mean is scale-free), or be refused in one line."""
    clf = _estimators()[index]
    X, y = _data()
    right = clf.predict(X) == y
    w = np.full(len(y), 1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            got = clf.score(X, y, sample_weight=w)
        except FoalPipeError:
            return  # a refusal naming the weights is acceptable
    assert got == pytest.approx(right.mean(), abs=1e-12), f"score gave {got}, the weighted accuracy is {right.mean()}"


def test_score_huge_weights_one_right_of_three_is_not_zero():
    """The silently wrong number (not even NaN): one right row of three, equal weights 1e308 -> 0.0 instead of 1/3."""
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    clf = AnalyticClassifier(gamma=1.0).fit(X, np.array([0, 1, 0]))
    y_true = np.array([0, 0, 1])  # predictions are [0, 1, 0]: only row 0 is right
    assert clf.predict(X).tolist() == [0, 1, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            got = clf.score(X, y_true, sample_weight=np.full(3, 1e308))
        except FoalPipeError:
            return
    assert got == pytest.approx(1 / 3)


# --- score's sample_weight of the wrong shape: the message blames the labels ------------------------------------

def test_score_sample_weight_of_shape_1_by_n_is_named_in_the_refusal():
    """A (1, n) sample_weight passes the size check (np.size == n) and scikit-learn refuses it as
    "inconsistent numbers of samples: [60, 60, 1]; pass one label per row of X": y has one label per row, the fix
    named is wrong. The refusal must name sample_weight."""
    clf = _estimators()[0]
    X, y = _data()
    with pytest.raises(FoalPipeError) as info:
        clf.score(X, y, sample_weight=np.ones((1, len(y))))
    message = str(info.value)
    assert "sample_weight" in message, message
    assert "label per row" not in message, message


# --- set_params to a value a fresh fit refuses, then partial_fit ---------------------------------------------------

@pytest.mark.parametrize(("make", "fitted", "changed"), [
    (lambda **kw: AnalyticClassifier(**kw), {"gamma": 1.0}, {"gamma": True}),
    (lambda **kw: AnalyticClassifier(**kw), {"gamma": "auto", "per_decade": 8}, {"per_decade": 8.0}),
    (lambda **kw: ESTIMATORS["dual"](**kw), {"batch_size": 1}, {"batch_size": True}),
], ids=["analytic-gamma-True", "analytic-per_decade-8.0", "dual-batch_size-True"])
def test_set_params_to_a_refused_value_does_not_keep_learning(make, fitted, changed):
    """fit refuses gamma=True / per_decade=8.0 / batch_size=True in one line; set_params to one of them after a fit
    passes partial_fit's same-parameters check (np.array_equal(True, 1.0)), so the estimator keeps learning while
    get_params reports a value it refuses (and a clone of it cannot fit). partial_fit must refuse, as fit does."""
    X, y = _data()
    with pytest.raises(FoalPipeError):
        make(**{**fitted, **changed}).fit(X, y)  # the independent expectation: the value is refused
    clf = make(**fitted).fit(X, y)
    clf.set_params(**changed)
    with pytest.raises(FoalPipeError):
        clf.partial_fit(X, y)


# --- masked arrays: the masked entries' hidden values are learned ----------------------------------------------------

@pytest.mark.parametrize("name", ["analytic", "ncm"])
def test_masked_entries_are_not_learned_silently(name):
    """np.ma arrays are turned into their .data: a masked (missing) entry's hidden value (1e6 here) is learned as a
    feature, as NaN would be if it were not refused. Expected: refused in one line (as NaN is), or the model is that of
    the data without the masked entry's value (not checked: no imputation is documented)."""
    X, y = _data()
    masked = np.ma.masked_array(X.copy(), mask=np.zeros(X.shape, dtype=bool))
    masked.data[0, 0], masked.mask[0, 0] = 1e6, True
    clf = AnalyticClassifier(gamma=1.0) if name == "analytic" else ESTIMATORS["ncm"]()
    with pytest.raises(FoalPipeError):
        clf.fit(masked, y)


def test_masked_rows_are_not_predicted_silently():
    """The same at predict: a masked entry's hidden value decides the prediction."""
    X, y = _data()
    clf = AnalyticClassifier(gamma=1.0).fit(X, y)
    masked = np.ma.masked_array(X[:3].copy(), mask=np.zeros((3, X.shape[1]), dtype=bool))
    masked.data[:, 0], masked.mask[:, 0] = 1e6, True
    with pytest.raises(FoalPipeError):
        clf.predict(masked)
