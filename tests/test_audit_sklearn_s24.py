"""Audit s24: the estimators used as scikit-learn users use them (joblib's memory-mapped loads, merge with feature
names, loky-parallel grid searches, nested set_params), checked against independent closed forms.

Angles no other test covers: ``joblib.load(..., mmap_mode="r")`` then ``partial_fit`` (the state arrives read-only),
``merge`` of learners fitted on named columns, ``GridSearchCV``/``cross_validate`` with ``n_jobs=2`` (loky) against
``n_jobs=1``, ``set_params(est__...)`` inside ``Pipeline(StandardScaler(), est)``.
"""

from __future__ import annotations

import warnings

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_validate
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from foal_pipe import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.headestimator import ESTIMATORS, head_classifier

RNG = np.random.default_rng(24)
X = RNG.normal(size=(400, 16))
Y = RNG.integers(0, 4, 400)
T = RNG.normal(size=(30, 16))
NAMES = [f"f{i}" for i in range(X.shape[1])]


def ridge(n: int, gamma: float = 1.0, columns: list[int] | None = None) -> np.ndarray:
    """Independent closed form: ridge on one-hot targets over the first ``n`` rows, ``(H^T H + g I)^-1 H^T Y``."""
    H = X[:n] if columns is None else X[:n][:, columns]
    onehot = (Y[:n, None] == np.arange(4)).astype(np.float64)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ onehot)


# --- 1. joblib.load(mmap_mode="r"): the fitted state is read-only; partial_fit must continue or refuse cleanly -------


def _mmap_copy(est, tmp_path):
    path = tmp_path / "est.joblib"
    joblib.dump(est, path)
    return joblib.load(path, mmap_mode="r")  # scikit-learn's documented way to share a large model's arrays


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_partial_fit_after_a_read_only_joblib_load_continues_or_refuses_cleanly(tmp_path, engine):
    """Fixed (rls): RLSEngine.update assigns the new ``W`` (``self.W = self.W + ...``), then ``self.R -= ...`` fails on
    the read-only memory map with numpy's bare "ValueError: output array is read-only". The refused call leaves ``W``
    holding all 400 rows while ``R`` and ``n_samples_seen_`` hold 200, and ``weights_``/``predict`` serve that
    half-update unchecked (a retry on a copy is then refused for a 0.6 drift). The gram engine and every head continue
    exactly. Expected: continue (no in-place update on the state), or a one-line FoalPipeError that changes nothing."""
    est = AnalyticClassifier(engine=engine).partial_fit(X[:200], Y[:200])
    _ = est.weights_  # solved (and, for rls, verified) before the dump
    loaded = _mmap_copy(est, tmp_path)
    try:
        loaded.partial_fit(X[200:], Y[200:])
        rows = 400
    except FoalPipeError as exc:
        assert "\n" not in str(exc)
        rows = 200
    assert loaded.n_samples_seen_ == rows
    np.testing.assert_allclose(loaded.weights_, ridge(rows), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(loaded.predict(T), AnalyticClassifier(engine=engine).fit(X[:rows], Y[:rows]).predict(T))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_heads_continue_after_a_read_only_joblib_load_with_the_same_bits(tmp_path, name):
    """Coverage: every head's state from a memory-mapped load keeps learning, and gives the bits of the estimator that
    was never dumped (the state is exported as model-file tensors, which the load copies)."""
    est = head_classifier(name).partial_fit(X[:200], Y[:200] % 3)
    est.predict(T)
    loaded = _mmap_copy(est, tmp_path)
    for part in (slice(200, 300), slice(300, 400)):  # a new class (3) arrives after the load
        est.partial_fit(X[part], Y[part])
        loaded.partial_fit(X[part], Y[part])
    assert loaded.class_scores(T).tobytes() == est.class_scores(T).tobytes()
    assert loaded.n_samples_seen_ == est.n_samples_seen_ == 400


# --- 2. merge and feature names -------------------------------------------------------------------------------------


def _named_fit(est: AnalyticClassifier, rows: slice, names: list[str]) -> AnalyticClassifier:
    """Fit on the columns ``names`` (a permutation of NAMES, or new names for X's columns) of rows ``rows``, as from a
    DataFrame: through pandas where it is installed, else the state scikit-learn's validate_data records for one."""
    columns = [NAMES.index(n) for n in names] if set(names) <= set(NAMES) else list(range(len(names)))
    try:
        import pandas as pd
    except ImportError:
        est.fit(X[rows][:, columns], Y[rows])
        est.feature_names_in_ = np.asarray(names, dtype=object)
        return est
    return est.fit(pd.DataFrame(X[rows][:, columns], columns=names), Y[rows])


def test_merge_of_learners_fitted_on_other_column_orders_is_refused_or_exact():
    """Fixed: AnalyticClassifier.merge adds the statistics whatever the feature names: a learner fitted on columns
    f0..f15 merged with one fitted on f15..f0 (the same features, other order) gives weights 0.09 off the learner of
    both, with no error or warning at merge time (partial_fit of the second block on the first learner is refused:
    "The feature names should match those that were passed during fit"). Columns of other names merge too.
    Expected: refuse in one line (or align the columns by name); the merge keeps ``feature_names_in_``."""
    first = _named_fit(AnalyticClassifier(), slice(0, 200), NAMES)
    reordered = _named_fit(AnalyticClassifier(), slice(200, 400), NAMES[::-1])
    try:
        merged = first.merge(reordered)
    except FoalPipeError as exc:
        assert "\n" not in str(exc) and "feature names" in str(exc).lower()
    else:  # aligned by name: exactly the learner of both, in the first one's column order
        np.testing.assert_allclose(merged.weights_, ridge(400), rtol=0, atol=1e-10)
        assert list(merged.feature_names_in_) == NAMES
    renamed = _named_fit(AnalyticClassifier(), slice(200, 400), [f"g{i}" for i in range(16)])
    with pytest.raises(FoalPipeError, match="(?i)feature names"):
        first.merge(renamed)


def test_merge_keeps_the_feature_names_both_learners_share():
    """Fixed: the merged learner has no ``feature_names_in_`` (from_statistics builds it afresh), so it no longer
    checks the columns it is given: a DataFrame in the wrong order would be scored with only scikit-learn's "fitted
    without feature names" warning. scikit-learn's estimators keep ``feature_names_in_`` through every fitted state."""
    first = _named_fit(AnalyticClassifier(), slice(0, 200), NAMES)
    second = _named_fit(AnalyticClassifier(), slice(200, 400), NAMES)
    merged = first.merge(second)
    np.testing.assert_allclose(merged.weights_, ridge(400), rtol=0, atol=1e-10)
    assert list(getattr(merged, "feature_names_in_", [])) == NAMES


# --- 3. pipelines, nested parameters and loky-parallel searches ------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    Xd, yd = load_digits(return_X_y=True)
    return Xd[:450] / 16.0, np.array(list("abcdefghij"))[yd[:450]]


@pytest.mark.parametrize(("make", "grid"), [
    (lambda: AnalyticClassifier(), {"est__gamma": [0.01, 1.0, 100.0]}),
    (lambda: head_classifier("slda"), {"est__shrinkage": [1e-4, 0.1, "oas"]}),
    (lambda: head_classifier("dual"), {"est__gamma": [0.1, 10.0], "est__compensation": [0.5, 1.0]}),
], ids=["analytic", "slda", "dual"])
def test_nested_set_params_and_loky_grid_search_agree_with_one_process(digits, make, grid):
    """Coverage: ``set_params(est__...)`` reaches the estimator inside ``Pipeline(StandardScaler(), est)``; a grid
    search and cross_validate on two loky workers give the one-process scores, best parameters and predictions."""
    Xd, yd = digits
    pipe = Pipeline([("sc", StandardScaler()), ("est", make())])
    first = {k: v[0] for k, v in grid.items()}
    pipe.set_params(**first)
    assert all(getattr(pipe[-1], k.removeprefix("est__")) == v for k, v in first.items())
    results = []
    for n_jobs in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no failed fit or score hidden as nan
            search = GridSearchCV(pipe, grid, cv=3, n_jobs=n_jobs).fit(Xd, yd)
            cv = cross_validate(pipe, Xd, yd, cv=3, n_jobs=n_jobs)
        results.append((search.best_params_, search.cv_results_["mean_test_score"], cv["test_score"],
                        search.predict(Xd[:60])))
    (params1, grid1, cv1, pred1), (params2, grid2, cv2, pred2) = results
    assert params1 == params2
    np.testing.assert_allclose(grid1, grid2, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cv1, cv2, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(pred1, pred2)
    assert np.isfinite(grid1).all() and grid1.max() > 0.8
