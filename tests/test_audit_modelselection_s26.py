"""Audit s26: the estimators inside scikit-learn's model selection and parallel machinery, as a user sweeping
hyperparameters uses them, checked against independent NumPy closed forms.

Audited (held unless listed below): GridSearchCV / RandomizedSearchCV (scipy distributions, NumPy scalar gammas) /
cross_validate / cross_val_predict (predict, decision_function, predict_proba) / learning_curve (with and without
``exploit_incremental_learning``) / validation_curve / permutation_importance over Pipeline(SmoothProjection,
AnalyticClassifier) and every head, with n_jobs=1, loky n_jobs=2 and the threading backend; folds whose training part
lacks classes (cross_val_predict's column layout), string labels, gamma="auto" chosen by GCV on each fold's training
rows (checked against an SVD GCV), clone of a loaded ``gamma="auto"`` model, refit's best_estimator_ then save/load
and load_model, OneVsRest (fit and partial_fit) / OneVsOne / MultiOutput / Calibrated / TunedThreshold / Voting /
Stacking / Bagging wrappers, score(sample_weight) (plain, in a pipeline, routed by metadata routing), fit's
sample_weight (refused by Python's signature, as scikit-learn expects of an estimator without weights), FoalPipeError
crossing loky workers, pickles across hash seeds. Threading results are bit-equal to one process; loky workers run
one BLAS thread, so their scores differ in the last bits (1e-15) unless the parent also runs one (docs/guarantees.md:
"the same BLAS threads"), which a passing test pins.

Faults found (their tests failed on 9ba7b1e; both fixed):

1. An AnalyticClassifier's pickle (joblib.dump) changes with a read: ``predict`` solves lazily and caches the
   solution (gram) or verifies and gathers its pending rows (rls) in the pickled engine, so dump, predict, dump gives
   other bytes (the head estimators solve in ``__getstate__`` and do not). An rls classifier dumped before any read
   also carries its pending training rows (up to 4,095 rows of X and their labels) inside the pickle.
2. SmoothProjection's default ``random_state=None`` draws a new matrix at every fit, so the documented
   ``make_pipeline(SmoothProjection(...), AnalyticClassifier(gamma="auto"))`` in GridSearchCV / cross_val_predict is
   not the same bytes twice, and within one search every (candidate, fold) is scored on its own projection: two
   identical candidates get different scores and the chosen gamma reflects projection luck. (scikit-learn's
   convention stays; the documented pipelines now seed it and say why.)
"""

from __future__ import annotations

import io

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, cross_val_predict, learning_curve
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import make_pipeline
from threadpoolctl import threadpool_limits

from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.model.headestimator import ESTIMATORS


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    order = np.argsort(y[:360], kind="stable")  # sorted labels: unshuffled KFold folds lack classes in their train part
    return X[:360][order] / 16.0, y[:360][order]


def _ridge(H: np.ndarray, labels: np.ndarray, classes: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Independent closed form ``(H^T H + gamma I)^-1 H^T Y`` on one-hot targets over ``classes``."""
    Y = (labels[:, None] == classes[None, :]).astype(np.float64)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


def _dump(obj) -> bytes:
    buffer = io.BytesIO()
    joblib.dump(obj, buffer)
    return buffer.getvalue()


# --- fault 1: a read changes the pickle ------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"engine": "rls"}, {"gamma": "auto"}], ids=["gram", "rls", "auto"])
def test_a_prediction_does_not_change_the_pickle(digits, params):
    """Fails: ``joblib.dump(clf)``, ``clf.predict(X)``, ``joblib.dump(clf)`` give other bytes (gram: the engine's
    cached ``_solution`` is pickled once solved; rls: ``_pending``, ``_sums``, ``_verified`` and ``drift`` change at the
    first read). A read must not change what the model is: the same call twice, the same bytes (HeadEstimator solves
    in ``__getstate__`` and keeps that promise). Fix: AnalyticClassifier.__getstate__ that settles the engine under the
    lock (gram: solve, rls: verify), or pickles without the cached solution."""
    X, y = digits
    clf = AnalyticClassifier(**params).partial_fit(X[:200], y[:200]).partial_fit(X[200:], y[200:])
    before = _dump(clf)
    expected = joblib.load(io.BytesIO(before)).predict(X[:40])
    assert np.array_equal(clf.predict(X[:40]), expected)  # the model did not change ...
    assert _dump(clf) == before  # ... so neither may its pickle


def test_an_rls_pickle_does_not_carry_the_training_rows(digits):
    """Fails: RLSEngine keeps each batch (a copy of X) in ``_pending`` until a read or 4,096 rows gather it into its
    checking sums, and the pickle holds them: a dumped rls model ships up to 4,095 raw training rows and their labels
    (here the 360 x 64 rows: 185 KB in a 232 KB pickle, 82 KB after one predict). Fix: gather the pending rows before
    pickling (``_gather`` or ``verify`` in a ``__getstate__``)."""
    X, y = digits
    clf = AnalyticClassifier(engine="rls").fit(X, y)
    blob = _dump(clf)
    row = np.ascontiguousarray(X[17]).tobytes()  # one training row's float64 bytes (a row with many non-zero pixels)
    assert np.count_nonzero(X[17]) > 20
    assert row not in blob, "the pickle of a fitted rls classifier holds its training rows"


# --- fault 2: the documented pipeline is not reproducible inside a search --------------------------------------------


def test_the_documented_search_pipeline_gives_the_same_bytes_twice(digits):
    """docs/python-api.md's ``make_pipeline(SmoothProjection(...), AnalyticClassifier(gamma="auto"))`` had no
    random_state: the default None (scikit-learn's convention) draws a fresh matrix at every fit, so the same call gave
    other cross-validated scores and inside one GridSearchCV two identical candidates were scored on different
    projections. The example now seeds it (and says why): the same call twice gives the same bytes, and identical
    candidates the same scores. Unseeded, the same calls differ (what the docs warn of)."""
    X, y = digits
    cv = StratifiedKFold(3, shuffle=True, random_state=0)

    def runs(seed):
        pipe = make_pipeline(SmoothProjection(n_components=40, activation="relu", random_state=seed),
                             AnalyticClassifier(gamma="auto"))
        first = cross_val_predict(pipe, X, y, cv=cv, method="decision_function")
        second = cross_val_predict(pipe, X, y, cv=cv, method="decision_function")
        search = GridSearchCV(pipe, {"analyticclassifier__per_decade": [8, 8]}, cv=cv).fit(X, y)
        scores = [search.cv_results_[f"split{k}_test_score"] for k in range(3)]
        return first.tobytes() == second.tobytes(), all(s[0] == s[1] for s in scores)

    assert runs(0) == (True, True)
    assert runs(None)[0] is False  # the reason for the seed


# --- held: closed forms through cross_val_predict, folds that lack classes, threads and loky -------------------------


@pytest.mark.filterwarnings("ignore:Number of classes in training fold")
def test_cross_val_predict_decision_function_equals_the_closed_form_per_fold(digits):
    """Coverage: with sorted string labels and unshuffled KFold(3) every training part lacks classes; each fold's
    columns equal ``H_test @ W`` of the fold's own closed form, the classes it lacks get scikit-learn's fill (the least
    float), and the threading backend on two workers gives the same bits as one process."""
    X, y = digits
    labels = np.array([f"c{i}" for i in range(10)])[y]
    projection = SmoothProjection(n_components=60, activation="relu", random_state=0)
    pipe = make_pipeline(projection, AnalyticClassifier(gamma=0.5))
    cv = KFold(3)
    got = cross_val_predict(pipe, X, labels, cv=cv, method="decision_function")
    with joblib.parallel_backend("threading", n_jobs=2):
        threaded = cross_val_predict(pipe, X, labels, cv=cv, method="decision_function", n_jobs=2)
    assert threaded.tobytes() == got.tobytes()
    H = SmoothProjection(n_components=60, activation="relu", random_state=0).fit(X).transform(X)
    every = np.unique(labels)
    for train, test in cv.split(X):
        present = np.unique(labels[train])
        assert present.size < every.size  # the fold really lacks classes
        columns = np.searchsorted(every, present)
        np.testing.assert_allclose(got[test][:, columns], H[test] @ _ridge(H[train], labels[train], present, 0.5),
                                   rtol=0, atol=1e-10)
        missing = np.setdiff1d(np.arange(every.size), columns)
        assert (got[test][:, missing] == np.finfo(np.float64).min).all()


@pytest.mark.filterwarnings("ignore:Number of classes in training fold")
def test_ridge_head_predict_proba_columns_in_cross_val_predict(digits):
    """Coverage: the ridge head's predict_proba through cross_val_predict, with folds lacking classes: each fold's
    columns are the clipped shares of its closed-form scores (docs: ridge's rule), the lacking classes 0."""
    X, y = digits
    cv = KFold(3)
    got = cross_val_predict(ESTIMATORS["ridge"](gamma=2.0), X, y, cv=cv, method="predict_proba")
    for train, test in cv.split(X):
        present = np.unique(y[train])
        scores = np.clip(X[test] @ _ridge(X[train], y[train], present, 2.0), 0.0, None)
        total = scores.sum(axis=1, keepdims=True)
        shares = np.where(total > 0, scores / np.where(total > 0, total, 1.0), 1.0 / present.size)
        np.testing.assert_allclose(got[test][:, present], shares, rtol=0, atol=1e-10)
        assert (got[test][:, np.setdiff1d(np.arange(10), present)] == 0).all()


def test_loky_workers_equal_one_process_on_one_blas_thread(digits):
    """Coverage: loky's workers run one BLAS thread each (joblib limits them), so n_jobs=2 equals n_jobs=1 bit for
    bit when the parent runs one BLAS thread too (the guarantee's "same BLAS threads"), gamma="auto" included."""
    X, y = digits
    pipe = make_pipeline(SmoothProjection(n_components=80, activation="relu", random_state=0), AnalyticClassifier())
    grid = {"analyticclassifier__gamma": [0.1, "auto"]}
    cv = StratifiedKFold(3, shuffle=True, random_state=1)
    loky = cross_val_predict(pipe, X, y, cv=cv, method="decision_function", n_jobs=2)
    search = GridSearchCV(pipe, grid, cv=cv, n_jobs=2).fit(X, y)
    with threadpool_limits(1):
        alone = cross_val_predict(pipe, X, y, cv=cv, method="decision_function")
        one = GridSearchCV(pipe, grid, cv=cv).fit(X, y)
    assert loky.tobytes() == alone.tobytes()
    assert search.best_params_ == one.best_params_
    assert search.cv_results_["mean_test_score"].tobytes() == one.cv_results_["mean_test_score"].tobytes()


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_incremental_learning_curve_equals_refits_and_the_closed_form(digits, engine):
    """Coverage: learning_curve(exploit_incremental_learning=True) calls partial_fit(..., classes=every label) on
    growing slices whose first lacks classes; the scores equal refits on each prefix, and the final model equals the
    closed form over the training rows."""
    X, y = digits
    cv = KFold(3, shuffle=True, random_state=0)
    sizes = [0.15, 1.0]
    _, _, incremental = learning_curve(AnalyticClassifier(engine=engine), X, y, cv=cv, train_sizes=sizes,
                                       exploit_incremental_learning=True)
    _, _, refits = learning_curve(AnalyticClassifier(engine=engine), X, y, cv=cv, train_sizes=sizes)
    assert incremental.tobytes() == refits.tobytes()
    train, test = next(cv.split(X))
    assert np.unique(y[train[:int(0.15 * train.size)]]).size < 10  # the first slice lacks classes
    expected = np.unique(y[train])[np.argmax(X[test] @ _ridge(X[train], y[train], np.unique(y[train])), axis=1)]
    assert incremental[-1, 0] == np.mean(expected == y[test])


def test_one_vs_rest_partial_fit_equals_the_binary_closed_forms(digits):
    """Coverage: OneVsRestClassifier.partial_fit passes classes=(0, 1) to every binary AnalyticClassifier, whose first
    sorted batch holds no positives for most classes (a declared class without rows); after all batches each binary
    margin equals the closed form's ``H (W1 - W0)``."""
    X, y = digits
    ovr = OneVsRestClassifier(AnalyticClassifier())
    for lo in range(0, len(y), 120):
        ovr.partial_fit(X[lo:lo + 120], y[lo:lo + 120], classes=np.arange(10))
    margins = np.column_stack([X[:50] @ (W[:, 1] - W[:, 0]) for W in
                               (_ridge(X, (y == k).astype(int), np.array([0, 1])) for k in range(10))])
    np.testing.assert_allclose(ovr.decision_function(X[:50]), margins, rtol=0, atol=1e-10)
