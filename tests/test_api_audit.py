"""The Python API audit's faults: a projection saved without its activation, head estimators that kept learning with
changed options or kept a refused batch, label dtypes whose union merges ids, rows whose norm overflows, a refused
first device batch, and raw errors where a one-line FoalPipeError names the fix."""

import copy
import pickle
import warnings

import numpy as np
import pytest
from helpers import fault_store, invoke

from foal_pipe import AnalyticClassifier, FoalPipeError, SmoothProjection, head_classifier, load_model
from foal_pipe.heads.moments import unit_rows

RNG = np.random.default_rng(0)
F, Y = RNG.normal(size=(120, 8)), RNG.integers(0, 4, 120)


@pytest.mark.parametrize("activation", ["relu", "identity"])
def test_save_records_the_projection_activation_and_dtype(tmp_path, activation):
    P = SmoothProjection(n_components=30, activation=activation, random_state=0, dtype="float32").fit(F)
    clf = AnalyticClassifier(gamma=0.1).fit(P.transform(F), Y)
    clf.save(tmp_path / "m.safetensors", projection=P)
    model = load_model(tmp_path / "m.safetensors")
    assert model.projection.activation == activation
    np.testing.assert_array_equal(model.activations(F), P.transform(F))  # the same matrix, dtype and activation
    np.testing.assert_array_equal(model.predict(F), clf.predict(P.transform(F)))
    with pytest.raises(FoalPipeError, match="contradicts the projection's activation"):
        clf.save(tmp_path / "n.safetensors", projection=P, activation="sigmoid")
    assert not (tmp_path / "n.safetensors").exists()


@pytest.mark.parametrize("projection", [SmoothProjection(n_components=8), np.eye(8)], ids=["unfitted", "ndarray"])
def test_save_refuses_a_projection_that_is_not_a_fitted_one(tmp_path, projection):
    clf = AnalyticClassifier().fit(F, Y)
    with pytest.raises(FoalPipeError, match="projection"):
        clf.save(tmp_path / "m.safetensors", projection=projection)


def test_head_estimator_keeps_its_fitted_options():
    e = head_classifier("ridge", gamma=1.0).fit(F, Y)
    e.set_params(gamma=50.0)
    with pytest.raises(FoalPipeError, match="fitted with 1.0"):
        e.partial_fit(F[:10], Y[:10])
    for twin in (pickle.loads(pickle.dumps(e)), copy.deepcopy(e)):  # rebuilt with the fitted options, not the new ones
        np.testing.assert_array_equal(twin.class_scores(F), e.class_scores(F))
    e.set_params(gamma=1.0)
    e.partial_fit(F[:10], Y[:10])
    fresh = head_classifier("ridge", gamma=1.0).fit(F, Y).partial_fit(F[:10], Y[:10])
    np.testing.assert_array_equal(e.class_scores(F), fresh.class_scores(F))
    e.set_params(gamma=50.0)
    np.testing.assert_allclose(e.fit(F, Y).class_scores(F), head_classifier("ridge", gamma=50.0).fit(F, Y).class_scores(F))


def test_refused_head_batch_leaves_the_estimator_as_it_was():
    X, y = F[:40, :4], Y[:40]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = head_classifier("ridge", gamma=1e-13).fit(X, y)
        before = e.__getstate__()["_tensors"]
        with pytest.raises(FoalPipeError, match="gamma"):  # refused as the batch comes (its sums' resolution), or at
            e.partial_fit(X[:5] * 1e3, y[:5])  # the solve, when the model is needed
            e.class_scores(X)
        after = e.__getstate__()["_tensors"]
        assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
        assert e.n_samples_seen_ == 40
        e.partial_fit(X[5:10], y[5:10])
        fresh = head_classifier("ridge", gamma=1e-13).fit(X, y).partial_fit(X[5:10], y[5:10])
    np.testing.assert_array_equal(e.class_scores(X), fresh.class_scores(X))


@pytest.mark.parametrize("make", [AnalyticClassifier, lambda: head_classifier("ridge"), lambda: head_classifier("ncm")])
def test_labels_whose_union_cannot_hold_every_id_are_refused(make):
    X = F[:6, :3]
    big = np.array([2**62, 2**62 + 1] * 2, dtype=np.int64)
    with pytest.raises(FoalPipeError, match="2\\*\\*53"):
        make().partial_fit(X[:4], big).partial_fit(X[4:], np.array([0.0, 1.0]))
    with pytest.raises(FoalPipeError, match="2\\*\\*53"):
        make().partial_fit(X[:4], np.array([2**64 - 1, 2**64 - 2] * 2, dtype=np.uint64)).partial_fit(X[4:], np.array([-1, -2]))
    small = make().partial_fit(X[:4], np.array([0, 1, 0, 1])).partial_fit(X[4:], np.array([2.0, 3.0]))
    assert small.classes_.tolist() == [0, 1, 2, 3]  # exact in float64: still allowed


def test_unit_rows_of_huge_and_tiny_rows_are_unit():
    X = RNG.normal(size=(5, 4))
    expected = X / np.sqrt((X**2).sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(unit_rows(X), X / np.linalg.norm(X, axis=1, keepdims=True))  # ordinary rows: same bits
    mixed = np.vstack([X[:2] * 1e160, X[2:4] * 1e-170, X[4:], np.zeros((1, 4))])
    np.testing.assert_allclose(unit_rows(mixed), np.vstack([expected, np.zeros((1, 4))]), rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", ["ncm", "cosine", "fecam"])
def test_heads_on_rows_whose_norm_overflows_predict_as_on_the_rows_scaled_down(name):
    X = RNG.normal(size=(60, 4)) + np.repeat(np.eye(3, 4) * 5, 20, axis=0)
    y = np.repeat([0, 1, 2], 20)
    expected = head_classifier(name).fit(X, y).predict(X)
    np.testing.assert_array_equal(head_classifier(name).fit(X * 1e160, y).predict(X * 1e160), expected)
    if name != "fecam":  # fecam's covariances depend on the unit rows only up to rounding; ncm and cosine's argmax too
        np.testing.assert_array_equal(head_classifier(name).fit(X, y).predict(X * 1e160), expected)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the sums overflow before the refusal
def test_slda_and_cosine_refuse_sums_that_overflow():
    with pytest.raises(FoalPipeError, match="overflow"):
        head_classifier("slda").fit(RNG.normal(size=(30, 4)) * 1e160, np.arange(30) % 3)
    X = np.where(np.arange(30)[:, None] % 2 == 0, -1.7e308, 1.7e308) * np.ones((30, 4))
    with pytest.raises(FoalPipeError, match="overflow"):
        head_classifier("cosine").fit(X, np.arange(30) % 3)


def test_refused_first_device_batch_leaves_the_classifier_unfitted():
    torch = pytest.importorskip("torch")
    c = AnalyticClassifier()
    with pytest.raises(FoalPipeError, match="NaN"):
        c.partial_fit(torch.full((2, 5), float("nan"), dtype=torch.float64), [0, 1])
    assert not c.__sklearn_is_fitted__() and not hasattr(c, "classes_")
    X = torch.asarray(F[:, :5], requires_grad=True)  # no gradient is needed: taken as its values
    np.testing.assert_array_equal(c.fit(X, Y).predict(F[:, :5]), AnalyticClassifier().fit(F[:, :5], Y).predict(F[:, :5]))


def test_loading_a_head_model_file_as_a_ridge_classifier_names_load_model(tmp_path):
    store = fault_store(tmp_path / "s.zarr")
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 2, "--head", "ncm").exit_code == 0
    with pytest.raises(FoalPipeError, match="ncm head's model file.*load_model"):
        AnalyticClassifier.load(tmp_path / "run" / "model.safetensors")


def test_messages_name_the_problem_and_the_fix(tmp_path):
    with pytest.raises(FoalPipeError, match="gamma_grid must hold positive numbers, got -1"):
        AnalyticClassifier(gamma="auto", gamma_grid=[-1, 5]).fit(F, Y)
    clf = AnalyticClassifier().fit(F, Y)
    with pytest.raises(FoalPipeError, match="classes= holds None"):
        clf.predict(F, classes=[0, 1, 2, 3, None])
    for make in (AnalyticClassifier, lambda: head_classifier("ncm")):
        with pytest.raises(FoalPipeError, match="None\\) at row 1"):
            make().fit(F[:3], ["a", None, "b"])
    with pytest.raises(FoalPipeError, match="class label -2 is negative"):
        AnalyticClassifier().fit(F, Y - 2).save(tmp_path / "neg.safetensors")


def test_docs_claim_no_weights_for_the_ridge_head_estimator():
    from pathlib import Path

    text = " ".join((Path(__file__).parents[1] / "docs" / "python-api.md").read_text().split())
    assert not hasattr(head_classifier("ridge").fit(F, Y), "weights_")
    assert "predictions and weights as" not in text


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_a_refused_later_batch_adds_no_class(engine):
    """A later batch refused (rows at 1e200: the RLS update singular, the Gram sums overflowing) still added its new
    class: a zero column that then won the rows whose every score is negative (4 of 100 predicted as the unseen 7),
    and the gram engine took the rows, every later predict refused. Both now leave the classifier as it was."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((100, 6)), rng.integers(0, 3, 100)
    clf = AnalyticClassifier(engine=engine, gamma=1.0).fit(X, y)
    before = clf.predict(X)
    with np.errstate(all="ignore"), pytest.raises(FoalPipeError, match="scale the features"):
        clf.partial_fit(np.full((2, 6), 1e200), [7, 7])
    assert clf.classes_.tolist() == [0, 1, 2] and clf.n_samples_seen_ == 100
    np.testing.assert_array_equal(clf.predict(X), before)
    np.testing.assert_allclose(clf.partial_fit(X[:10], y[:10]).weights_,  # and it learns on as if never offered
                               AnalyticClassifier(engine=engine, gamma=1.0).fit(np.vstack([X, X[:10]]),
                                                                              np.concatenate([y, y[:10]])).weights_,
                               rtol=0, atol=1e-12)
