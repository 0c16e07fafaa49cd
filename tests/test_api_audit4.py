"""The fourth Python API audit: arrays on another device than the host's, boolean array-API features, a reloaded
classifier's bits, ``hasattr`` of the RLS engine's statistics and scikit-learn's messages with their fix."""

from __future__ import annotations

import array_api_strict as xs
import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, FoalPipeError, SmoothProjection, head_classifier, load_model


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert isinstance(exc.value, FoalPipeError) and "\n" not in message and len(message) < 320, message
    return message


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 12)), np.repeat([0, 1, 2, 3], 10), rng.normal(size=(16, 12))


@pytest.mark.parametrize("where", ["device1", "no_float64"])
def test_classifier_copies_device_arrays_to_the_host(data, where):
    X, y, Xt = data
    if where == "no_float64":
        X, Xt = X.astype(np.float32), Xt.astype(np.float32)
    on = xs.Device(where)
    host = AnalyticClassifier().fit(X[:20], y[:20]).partial_fit(X[20:], y[20:])
    clf = AnalyticClassifier().fit(xs.asarray(X[:20], device=on), y[:20]).partial_fit(xs.asarray(X[20:], device=on), y[20:])
    assert np.array_equal(clf.weights_, host.weights_)
    assert np.array_equal(clf.class_scores(xs.asarray(Xt, device=on)), host.class_scores(Xt))
    assert np.array_equal(clf.predict(xs.asarray(Xt, device=on)), head_classifier("ridge").fit(X, y).predict(Xt))


def test_projection_refuses_a_device_without_its_dtype_in_one_line(data):
    X, _, _ = data
    on = xs.Device("no_float64")
    with pytest.raises(FoalPipeError) as exc:
        SmoothProjection(n_components=15, random_state=0).fit(X).transform(xs.asarray(X.astype(np.float32), device=on))
    assert _one_line(exc) == ("X is on device array_api_strict.Device('no_float64'), which does not hold float64, the "
                              "projection's dtype; move X to a device that holds float64, or fit the projection with "
                              "dtype='float32'")
    narrow = SmoothProjection(n_components=15, random_state=0, dtype="float32").fit(X)
    Z = narrow.transform(xs.asarray(X.astype(np.float32), device=on))
    assert Z.device == on and np.array_equal(np.from_dlpack(Z.to_device(xs.Device("CPU_DEVICE"))),
                                             narrow.transform(X.astype(np.float32)))


def test_projection_takes_array_api_booleans_as_numpy_booleans(data):
    X, _, _ = data
    projection = SmoothProjection(n_components=15, random_state=0).fit(X)
    Z = projection.transform(xs.asarray(X > 0))
    assert np.array_equal(np.asarray(Z), projection.transform(X > 0))
    assert np.array_equal(np.asarray(Z), projection.transform((X > 0).astype(np.float64)))


def test_reloaded_gram_classifier_scores_the_same_bits(tmp_path):
    rng = np.random.default_rng(0)
    projection = SmoothProjection(n_components=50, random_state=0).fit(rng.normal(size=(2, 12)))
    H, y = projection.transform(rng.normal(size=(60, 12))), rng.integers(0, 5, 60)
    Ht = projection.transform(rng.normal(size=(32, 12)))
    for i, options in enumerate(({}, {"gamma": "auto"}, {"dtype": "float32"}, {"engine": "rls"}, {"backend": "torch"})):
        if options.get("backend") == "torch":
            pytest.importorskip("torch")
        fitted = AnalyticClassifier(**options).fit(H, y)
        path = fitted.save(tmp_path / f"{i}.safetensors", projection=projection)
        loaded = AnalyticClassifier.load(path, backend=options.get("backend", "numpy"))
        assert np.array_equal(fitted.weights_, loaded.weights_)
        assert int((fitted.class_scores(Ht) != loaded.class_scores(Ht)).sum()) == 0, options


def test_rls_statistics_is_an_attribute_error(data):
    X, y, _ = data
    clf = AnalyticClassifier(engine="rls").fit(X, y)
    assert not hasattr(clf, "statistics_")
    with pytest.raises(FoalPipeError, match="^only the gram engine keeps sufficient statistics; use engine='gram'$"):
        clf.statistics_  # noqa: B018
    assert hasattr(AnalyticClassifier().fit(X, y), "statistics_")


def _refusal(call) -> str:
    with pytest.raises(FoalPipeError) as exc:
        call()
    return _one_line(exc)


@pytest.mark.parametrize("make", [AnalyticClassifier, lambda: head_classifier("slda")])
def test_scikit_learn_messages_name_the_fix(data, make):
    X, y, _ = data
    name = type(make()).__name__
    inf = X.copy()
    inf[3, 4] = np.inf
    assert _refusal(lambda: make().fit(inf, y)) == (
        "Input X contains infinity or a value too large for dtype('float64'); check the features (re-extract the store), "
        "or drop the rows with such values")
    assert _refusal(lambda: make().fit(X, np.where(np.arange(40) == 5, np.nan, y))) == (
        "Input y contains NaN, which is not a class label; give every row a label (integer id or name), or drop the "
        "unlabelled rows")
    fitted = make().fit(X, y)
    assert _refusal(lambda: fitted.predict(X[:, :11])) == (
        f"X has 11 features, but {name} is expecting 12 features as input; pass rows of the features it was fitted on "
        "(from the same encoder and projection)")
    assert _refusal(lambda: fitted.predict(X[:0])) == (
        f"Found array with 0 sample(s) (shape=(0, 12)) while a minimum of 1 is required by {name}; pass a non-empty "
        "batch (one row or more)")
    assert _refusal(lambda: make().fit(X[:, :0], y)) == (
        f"Found array with 0 feature(s) (shape=(40, 0)) while a minimum of 1 is required by {name}; pass one feature "
        "(column) or more")
    assert _refusal(lambda: make().fit(X, y[:39])) == (
        "Found input variables with inconsistent numbers of samples: [40, 39]; pass one label per row of X")


def test_projection_and_device_paths_say_the_same_fix(data):
    X, y, _ = data
    projection = SmoothProjection(n_components=15, random_state=0).fit(X)
    assert _refusal(lambda: projection.transform(X[:, :11])) == (
        "X has 11 features, but SmoothProjection is expecting 12 features as input; pass rows of the features it was "
        "fitted on (from the same encoder and projection)")
    nan = X.copy()
    nan[0, 0] = np.nan
    assert _refusal(lambda: projection.transform(nan)).endswith("drop the rows with missing values or impute them first")
    fitted = AnalyticClassifier().fit(X, y)
    assert _refusal(lambda: fitted.predict(xs.asarray(X[:, :11]))) == _refusal(lambda: fitted.predict(X[:, :11]))


def test_saved_rls_model_statistics_is_an_attribute_error(tmp_path):
    """A loaded rls model's ``statistics_`` too: ``hasattr`` says False instead of raising."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 6)), np.repeat(np.arange(4), 10)
    proj = SmoothProjection(n_components=8).fit(X)
    path = AnalyticClassifier(engine="rls").fit(proj.transform(X), y).save(tmp_path / "m.safetensors", projection=proj)
    model = load_model(path, estimators=False)
    assert not hasattr(model.classifier, "statistics_")
    with pytest.raises(FoalPipeError, match="only the gram engine keeps sufficient statistics"):
        _ = model.classifier.statistics_
