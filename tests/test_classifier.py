"""AnalyticClassifier and SmoothProjection: exactness against closed-form ridge, class growth, save/load."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, FoalPipeError, SmoothProjection


def ridge(H: np.ndarray, y: np.ndarray, classes: np.ndarray, gamma: float) -> np.ndarray:
    """The closed-form solution (H^T H + gamma I)^-1 H^T Y, written out independently of the engines."""
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(42)
    X = rng.normal(size=(260, 24))
    y = rng.integers(0, 9, size=260) * 3  # non-contiguous label ids
    H = SmoothProjection(n_components=40, random_state=1).fit(X).transform(X)
    return H, y


@pytest.mark.parametrize("engine", ["gram", "rls"])
@pytest.mark.parametrize("batch_size", [1, 7, 10, 64])
@pytest.mark.parametrize("gamma", [1e-2, 1.0, 30.0])
def test_every_prefix_equals_closed_form_ridge(data, engine, batch_size, gamma):
    H, y = data
    order = np.random.default_rng(batch_size).permutation(len(y))
    clf = AnalyticClassifier(gamma=gamma, engine=engine)
    for start in range(0, len(y), batch_size):
        clf.partial_fit(H[order[start : start + batch_size]], y[order[start : start + batch_size]])
        seen = order[: start + batch_size]
        expected = ridge(H[seen], y[seen], np.unique(y[seen]), gamma)
        np.testing.assert_array_equal(clf.classes_, np.unique(y[seen]))
        rel = np.abs(clf.weights_ - expected).max() / np.abs(expected).max()
        assert rel < 1e-9, f"prefix {start + batch_size}: relative error {rel:.2e}"
    assert clf.n_samples_seen_ == len(y)


def test_class_growth_inserts_zero_columns_where_classes_sort():
    rng = np.random.default_rng(0)
    H = rng.random((30, 6))
    clf = AnalyticClassifier(engine="rls").partial_fit(H[:10], np.full(10, 5))
    assert clf.classes_.tolist() == [5]
    before = clf.weights_[:, 0].copy()
    clf.partial_fit(H[10:20], np.r_[np.full(5, 2), np.full(5, 9)])
    assert clf.classes_.tolist() == [2, 5, 9]
    # the old column moved to where 5 sorts and was updated by the Woodbury step, not overwritten by zeros
    assert not np.allclose(clf.weights_[:, 1], before)
    expected = ridge(H[:20], np.r_[np.full(10, 5), np.full(5, 2), np.full(5, 9)], np.array([2, 5, 9]), 1.0)
    np.testing.assert_allclose(clf.weights_, expected, rtol=1e-10, atol=1e-12)


def test_predict_score_and_decision_function():
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(4, 10)) * 4
    y = rng.integers(0, 4, 400)
    X = centers[y] + rng.normal(size=(400, 10))
    proj = SmoothProjection(n_components=64, random_state=0).fit(X)
    clf = AnalyticClassifier(gamma=0.1)
    for i in range(0, 300, 10):
        clf.partial_fit(proj.transform(X[i : i + 10]), y[i : i + 10])
    H_test = proj.transform(X[300:])
    scores = clf.decision_function(H_test)
    np.testing.assert_allclose(scores, H_test @ clf.weights_)
    two = AnalyticClassifier(gamma=0.1).fit(proj.transform(X[:300]), y[:300] % 2)  # binary: sklearn's margin
    margin = two.decision_function(H_test)
    np.testing.assert_allclose(margin, (H_test @ two.weights_) @ [-1, 1])
    np.testing.assert_array_equal(two.predict(H_test), two.classes_[(margin > 0).astype(int)])
    np.testing.assert_array_equal(clf.predict(H_test), clf.classes_[scores.argmax(1)])
    assert clf.score(H_test, y[300:]) > 0.9
    np.testing.assert_array_equal(clf.coef_, clf.weights_.T)


def test_merge_equals_one_stream():
    rng = np.random.default_rng(5)
    H, y = rng.random((80, 12)), rng.integers(0, 6, 80)
    a = AnalyticClassifier(gamma=0.5).partial_fit(H[:50], y[:50])
    b = AnalyticClassifier(gamma=0.5).partial_fit(H[50:], y[50:])
    merged = a.merge(b)
    np.testing.assert_allclose(merged.weights_, ridge(H, y, np.unique(y), 0.5), rtol=1e-10, atol=1e-12)
    assert merged.n_samples_seen_ == 80
    with pytest.raises(FoalPipeError, match="gram"):
        AnalyticClassifier(engine="rls").partial_fit(H, y).merge(b)


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_save_load_then_continue_equals_uninterrupted(tmp_path, data, engine):
    H, y = data
    proj = SmoothProjection(n_components=H.shape[1], random_state=0).fit(np.zeros((1, 3)))  # maps d = 3 to W's D = 40
    full = AnalyticClassifier(gamma=2.0, engine=engine)
    part = AnalyticClassifier(gamma=2.0, engine=engine)
    for i in range(0, 120, 10):
        full.partial_fit(H[i : i + 10], y[i : i + 10])
        part.partial_fit(H[i : i + 10], y[i : i + 10])
    path = part.save(tmp_path / "state.safetensors", projection=proj, dataset="toy")
    loaded = AnalyticClassifier.load(path)
    assert (loaded.gamma, loaded.engine, loaded.n_samples_seen_) == (2.0, engine, 120)
    for i in range(120, len(y), 10):
        full.partial_fit(H[i : i + 10], y[i : i + 10])
        loaded.partial_fit(H[i : i + 10], y[i : i + 10])
    np.testing.assert_array_equal(loaded.classes_, full.classes_)
    np.testing.assert_allclose(loaded.weights_, full.weights_, rtol=0, atol=1e-12)
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(load_file(str(path))["projection"], proj.components_)


def test_rls_in_float32_is_refused_before_any_state(data):
    """The RLS recursion in float32 drifted without a bound (correlated ReLU rows, gamma 1e-4: W 20% off, exit 0);
    it is refused before anything is learned, and the gram engine's float32 sums stay available."""
    H, y = data
    clf = AnalyticClassifier(engine="rls", dtype="float32")
    with pytest.raises(FoalPipeError, match=r"engine='rls' with dtype='float32' is refused.*engine='gram'"):
        clf.partial_fit(H, y)
    assert not hasattr(clf, "classes_")
    with pytest.raises(FoalPipeError, match="is refused"):
        AnalyticClassifier(engine="rls", dtype="float32").fit(H, y)
    w64 = AnalyticClassifier(engine="rls").partial_fit(H, y).weights_
    w32 = AnalyticClassifier(dtype="float32").partial_fit(H, y).weights_
    assert np.abs(w32 - w64).max() / np.abs(w64).max() < 1e-4


def test_projection_is_seeded_and_matches_its_init():
    X = np.zeros((2, 400))
    a = SmoothProjection(n_components=300, random_state=4).fit(X).components_
    b = SmoothProjection(n_components=300, random_state=4).fit(X).components_
    np.testing.assert_array_equal(a, b)
    assert a.shape == (400, 300)
    assert np.abs(a).max() <= 1 / np.sqrt(400)
    normal = SmoothProjection(n_components=300, init="normal", random_state=4).fit(X).components_
    np.testing.assert_allclose(normal.var(), a.var(), rtol=0.05)  # same variance, 1/(3d)
    H = SmoothProjection(n_components=300, random_state=4).fit(X).transform(np.full((1, 400), 0.1))
    np.testing.assert_allclose(H, 1 / (1 + np.exp(-(np.full((1, 400), 0.1) @ a))), rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "call", "message"),
    [
        ({"gamma": 0.0}, "fit", "gamma must be a positive number"),
        ({"gamma": -1.0}, "fit", "gamma must be a positive number"),
        ({"engine": "sgd"}, "fit", "unknown engine"),
        ({"dtype": "float16"}, "fit", "unsupported dtype"),
        ({}, "predict", "not fitted"),
    ],
)
def test_bad_parameters(kwargs, call, message):
    clf = AnalyticClassifier(**kwargs)
    with pytest.raises(FoalPipeError, match=message):
        if call == "fit":
            clf.partial_fit(np.ones((2, 3)), [0, 1])
        else:
            clf.predict(np.ones((2, 3)))


def test_bad_inputs():
    clf = AnalyticClassifier().partial_fit(np.ones((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="has 4 features"):
        clf.partial_fit(np.ones((2, 4)), [0, 1])
    with pytest.raises(ValueError, match="NaN"):
        clf.partial_fit(np.array([[1.0, np.nan, 0.0]]), [0])
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        clf.partial_fit(np.ones((2, 3)), [0])
    with pytest.raises(FoalPipeError, match="at least 0"):
        SmoothProjection(n_components=-1).fit(np.ones((1, 3)))


def test_ill_conditioned_float32_is_refused():
    rng = np.random.default_rng(0)
    H = rng.random((50, 30)) * 1e20
    clf = AnalyticClassifier(gamma=1e-30, dtype="float32")
    with np.errstate(over="ignore"), pytest.raises(FoalPipeError, match="overflow the float32 Gram sums"):
        clf.partial_fit(H, rng.integers(0, 3, 50))  # refused before the sums take it (it was at every predict after)
    assert not hasattr(clf, "classes_")
