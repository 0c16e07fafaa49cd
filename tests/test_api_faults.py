"""Faults of the Python API found by an audit: label dtypes and kinds across calls, parameters changed after a fit, a
model of no class, the projection's parameters and inputs, and the device-array inputs of AnalyticClassifier."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from foal_pipe import AnalyticClassifier, SmoothProjection, head_classifier
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model import modelfile
from foal_pipe.model.classifier import NotFitted
from foal_pipe.model.modelfile import read_model, write_model

X = np.random.default_rng(0).normal(size=(40, 4))


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert isinstance(exc.value, FoalPipeError) and "\n" not in message
    assert not isinstance(exc.value, NotFitted) or isinstance(exc.value, NotFittedError)
    return message


# 1. classes_ holds every label seen, whatever the latest batch's dtype


def test_head_classes_keep_a_dtype_of_every_label() -> None:
    first, then = np.array(["zebra", "yak"] * 10), np.array(["a", "b"] * 10)
    est = head_classifier("ncm").fit(X[:20], first).partial_fit(X[20:], then)
    assert est.classes_.tolist() == ["a", "b", "yak", "zebra"]
    whole = head_classifier("ncm").fit(X, np.concatenate([first, then]))
    np.testing.assert_allclose(est.class_scores(X), whole.class_scores(X), rtol=1e-12, atol=1e-12)
    assert est.predict(X).tolist() == whole.predict(X).tolist()


def test_head_classes_keep_a_wide_integer_dtype() -> None:
    first, then = np.array([1000, 1] * 10), np.array([1, 2] * 10, dtype=np.int8)
    est = head_classifier("slda").fit(X[:20], first).partial_fit(X[20:], then)
    assert est.classes_.tolist() == [1, 2, 1000] and est.classes_.dtype == np.int64
    whole = head_classifier("slda").fit(X, np.concatenate([first, then.astype(np.int64)]))
    np.testing.assert_allclose(est.predict_proba(X), whole.predict_proba(X), rtol=1e-10, atol=1e-12)


# 2. int labels and str labels do not mix; a refused call changes nothing


@pytest.mark.parametrize("make", [lambda: head_classifier("ncm"), lambda: AnalyticClassifier(gamma=1.0)])
def test_label_kinds_do_not_mix_and_state_is_kept(make) -> None:
    est = make().fit(X[:20], np.array([0, 1] * 10))
    scores, classes = est.class_scores(X), est.classes_.copy()
    with pytest.raises(FoalPipeError) as exc:
        est.partial_fit(X[20:], np.array(["a", "b"] * 10))
    assert "labels of kind str after labels of kind int" in _one_line(exc)
    assert est.classes_.tolist() == classes.tolist() and est.n_samples_seen_ == 20
    np.testing.assert_array_equal(est.class_scores(X), scores)
    est.partial_fit(X[20:], np.array([1, 2] * 10))  # still learns
    whole = make().fit(X, np.array([0, 1] * 10 + [1, 2] * 10))
    np.testing.assert_allclose(est.class_scores(X), whole.class_scores(X), rtol=1e-10, atol=1e-12)


def test_classes_of_another_kind_than_y_refused() -> None:
    clf = AnalyticClassifier()
    with pytest.raises(FoalPipeError) as exc:
        clf.partial_fit(X, np.array([0, 1] * 20), classes=["a"])
    assert "classes= holds labels of kind str" in _one_line(exc)
    assert not hasattr(clf, "classes_")


def test_merge_of_int_and_str_labels_refused() -> None:
    ints = AnalyticClassifier().fit(X[:20], np.array([0, 1] * 10))
    names = AnalyticClassifier().fit(X[20:], np.array(["a", "b"] * 10))
    with pytest.raises(FoalPipeError) as exc:
        ints.merge(names)
    assert "labels of kind str into one of labels of kind int" in _one_line(exc)


# 3. gamma_ and save report the state as fitted; partial_fit refuses a changed parameter


def test_set_params_after_fit_keeps_the_fitted_gamma(tmp_path) -> None:
    y = np.array([0, 1] * 20)
    for engine in ("gram", "rls"):
        clf = AnalyticClassifier(gamma=1.0, engine=engine).fit(X, y)
        weights = clf.weights_
        clf.set_params(gamma=100.0)
        assert clf.gamma_ == 1.0
        loaded = AnalyticClassifier.load(clf.save(tmp_path / f"{engine}.safetensors"))
        assert loaded.gamma_ == 1.0 and loaded.gamma == 1.0
        np.testing.assert_array_equal(loaded.weights_, weights)
        with pytest.raises(FoalPipeError) as exc:
            clf.partial_fit(X, y)
        assert "gamma is 100.0 but this AnalyticClassifier was fitted with 1.0" in _one_line(exc)
        np.testing.assert_array_equal(clf.weights_, weights)
        assert clf.n_samples_seen_ == 40
        np.testing.assert_array_equal(clf.fit(X, y).weights_, AnalyticClassifier(gamma=100.0, engine=engine).fit(X, y).weights_)


def test_set_params_engine_after_fit_saves_the_fitted_engine(tmp_path) -> None:
    clf = AnalyticClassifier().fit(X, np.array([0, 1] * 20))
    clf.set_params(engine="rls")
    loaded = AnalyticClassifier.load(clf.save(tmp_path / "m.safetensors"))
    assert loaded.engine == "gram"
    np.testing.assert_array_equal(loaded.statistics_.G, clf.statistics_.G)


# 4. a model of no class is refused where it is made, written and read


def _no_class() -> tuple[dict[str, np.ndarray], dict[str, object]]:
    tensors = {"W": np.zeros((4, 0)), "classes": np.zeros(0, np.int64), "G": np.zeros((4, 4)), "Q": np.zeros((4, 0)),
               "counts": np.zeros(0, np.int64)}
    return tensors, {"gamma": 1.0, "engine": "gram", "dtype": "float64", "n_samples_seen": 0}


def test_model_of_no_class_refused(tmp_path, monkeypatch) -> None:
    with pytest.raises(FoalPipeError) as exc:
        AnalyticClassifier.from_statistics(RidgeStatistics.from_batch(np.zeros((0, 4)), np.zeros(0, int)), gamma=1.0)
    assert "no class" in _one_line(exc)
    tensors, meta = _no_class()
    with pytest.raises(FoalPipeError) as exc:
        write_model(tmp_path / "refused.safetensors", tensors, meta)
    assert "holds no class" in _one_line(exc)
    assert not (tmp_path / "refused.safetensors").exists()
    with monkeypatch.context() as patch:  # a file written by another tool, or an older foal-pipe
        patch.setattr(modelfile, "validate_model", lambda *args, **kwargs: None)
        path = write_model(tmp_path / "z.safetensors", tensors, meta)
    for read in (read_model, AnalyticClassifier.load):
        with pytest.raises(FoalPipeError) as exc:
            read(path)
        assert "holds no class" in _one_line(exc)


# 5. SmoothProjection's parameters and inputs


@pytest.mark.parametrize("n_components", [2.5, True, 3.0])
def test_projection_dimension_must_be_a_whole_number(n_components) -> None:
    with pytest.raises(FoalPipeError) as exc:
        SmoothProjection(n_components=n_components).fit(X)
    assert "whole number" in _one_line(exc)
    got = SmoothProjection(n_components=np.int64(3), random_state=0).fit(X).transform(X)  # a NumPy integer is one
    np.testing.assert_array_equal(got, SmoothProjection(n_components=3, random_state=0).fit(X).transform(X))


def test_projection_dtype_must_be_float() -> None:
    with pytest.raises(FoalPipeError) as exc:
        SmoothProjection(n_components=3, dtype="int8").fit(X)
    assert "not a float dtype" in _one_line(exc)
    got = SmoothProjection(n_components=3, dtype="float32", random_state=0).fit(X).transform(X)
    want = SmoothProjection(n_components=3, random_state=0).fit(X).transform(X)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_projection_transform_before_fit_is_not_fitted() -> None:
    with pytest.raises(NotFitted) as exc:  # the project's, also scikit-learn's NotFittedError
        SmoothProjection().transform(X)
    assert "not fitted yet" in _one_line(exc)


def test_projection_refuses_non_finite_torch_input() -> None:
    torch = pytest.importorskip("torch")
    proj = SmoothProjection(n_components=3, random_state=0).fit(X)
    bad = torch.from_numpy(X.copy())
    bad[1, 2] = float("nan")
    with pytest.raises(FoalPipeError) as exc:
        proj.transform(bad)
    assert "NaN or inf" in _one_line(exc)
    np.testing.assert_allclose(proj.transform(torch.from_numpy(X)).numpy(), proj.transform(X), rtol=1e-12)


# 6. the rest


def test_torch_complex_and_empty_batches_refused_as_numpy_ones() -> None:
    torch = pytest.importorskip("torch")
    y = np.array([0, 1] * 3)
    with pytest.raises(FoalPipeError) as exc:
        AnalyticClassifier(backend="torch").fit(torch.ones(6, 4, dtype=torch.complex64) * (1 + 1j), y)
    assert "complex" in _one_line(exc)
    clf = AnalyticClassifier(backend="torch").fit(torch.from_numpy(X[:6]), y)
    weights = clf.weights_
    for empty in (torch.ones(0, 4, dtype=torch.float64), np.ones((0, 4))):
        with pytest.raises(FoalPipeError):
            clf.partial_fit(empty, np.zeros(0, int))
        with pytest.raises(FoalPipeError):
            AnalyticClassifier(backend="torch").fit(empty, np.zeros(0, int))
    assert clf.n_samples_seen_ == 6
    np.testing.assert_array_equal(clf.weights_, weights)


def test_merge_with_an_unfitted_classifier_refused() -> None:
    clf = AnalyticClassifier().fit(X, np.array([0, 1] * 20))
    with pytest.raises(NotFitted) as exc:
        clf.merge(AnalyticClassifier())
    assert "cannot merge an unfitted AnalyticClassifier" in _one_line(exc)


def test_labels_beyond_int64_named_on_save(tmp_path) -> None:
    clf = AnalyticClassifier().fit(X, np.array([2**63, 1] * 20, dtype=np.uint64))
    with pytest.raises(FoalPipeError) as exc:
        clf.save(tmp_path / "m.safetensors")
    assert "class label 9223372036854775808 is above 2**63 - 1" in _one_line(exc)


@pytest.mark.parametrize(("head", "option"), [("balanced", "gamma"), ("dual", "compensation"), ("slda", "shrinkage")])
def test_head_options_refuse_booleans(head, option) -> None:
    with pytest.raises(FoalPipeError) as exc:
        head_classifier(head, **{option: True}).fit(X, np.array([0, 1] * 20))
    assert f"{option} must be a number, got True" in _one_line(exc)
    one = head_classifier(head, **{option: 1.0}).fit(X, np.array([0, 1] * 20))
    assert one.predict(X).tolist() == head_classifier(head, **{option: 1}).fit(X, np.array([0, 1] * 20)).predict(X).tolist()


def test_head_partial_fit_classes_without_rows_refused() -> None:
    y = np.array([0, 1] * 20)
    est = head_classifier("ncm")
    with pytest.raises(FoalPipeError) as exc:
        est.partial_fit(X, y, classes=[0, 1, 2])
    assert "classes= names 2, which has no rows yet" in _one_line(exc)
    assert not hasattr(est, "classes_")
    est.partial_fit(X, y, classes=[0, 1])  # every class with rows: accepted
    np.testing.assert_array_equal(est.class_scores(X), head_classifier("ncm").fit(X, y).class_scores(X))


def test_head_checks_refuse_a_boolean_where_a_number_is_meant():
    """``float(True)`` is 1: a head built directly (not through an estimator) took ``gamma=True`` as 1."""
    from foal_pipe.heads.checks import positive

    with pytest.raises(FoalPipeError, match="gamma must be a number, got True"):
        positive("gamma", True)
    assert positive("gamma", np.float32(2.5)) == 2.5


def test_a_batch_the_head_refuses_leaves_its_sums_as_they_were():
    """fecam refuses a class of one row at its boundary, after its sums took the batch: the next batch then learned on
    top of the refused rows (scores other than a fit without them). The counts are now checked before the sums."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 5)) + np.repeat(np.eye(3, 5) * 3, 20, axis=0)
    y = np.repeat([0, 1, 2], 20)
    first, later = np.r_[0:15, 20:35], np.r_[15:20, 35:40, 40:60]
    estimator = head_classifier("fecam").fit(X[first], y[first])
    lone = rng.normal(size=(1, 5))
    with pytest.raises(FoalPipeError, match="fecam needs at least 2 training rows per class"):
        estimator.partial_fit(np.vstack([X[later[:3]], lone]), np.r_[y[later[:3]], 7])
    estimator.partial_fit(X[later], y[later])
    fresh = head_classifier("fecam").fit(X[first], y[first]).partial_fit(X[later], y[later])
    np.testing.assert_array_equal(estimator.class_scores(X), fresh.class_scores(X))
    assert estimator.n_samples_seen_ == 60 and estimator.classes_.tolist() == [0, 1, 2]
