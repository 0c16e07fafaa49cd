"""The scikit-learn audit of the estimators' options and scores: a head option given as None is refused where the head
does not take None (the CLI's None, "not given", keeps the default); every fitted option round-trips through pickle,
deepcopy and joblib; ``decision_function`` agrees with ``predict`` when ``partial_fit(classes=...)`` declared a class
without rows."""

from __future__ import annotations

import copy
import io
import pickle

import array_api_compat.numpy as xnp
import joblib
import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, FoalPipeError, head_classifier
from foal_pipe.heads import HEADS, make_head
from foal_pipe.model.headestimator import ESTIMATORS


def _data(seed: int = 5, n: int = 60, d: int = 8, classes: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.integers(0, classes, n), rng.normal(size=(40, d))


#: Every head option a caller may give as None, with the refusal it gets (the head's default, what it takes).
NONE_REFUSED = {
    (head, option): f"{option}=None is not a value of {head}'s {option}; leave it out for the default {default!r}, or "
                    "pass a value docs/heads.md lists"
    for head, option, default in (("ridge", "gamma", 1.0), ("slda", "shrinkage", 0.0001), ("fecam", "shrinkage", 1.0),
                                  ("fecam", "shrinkage_offdiag", 0.0), ("balanced", "gamma", 1.0), ("dual", "gamma", 1.0),
                                  ("dual", "compensation", 1.0), ("dual", "batch_size", 10))
}


def test_every_option_but_gamma_comp_is_listed():
    """The table above covers every head option whose default is not None (dual's gamma_comp documents None)."""
    options = {(name, key) for name, entry in HEADS.items() for key in entry.head.option_names()}
    assert options - set(NONE_REFUSED) == {("dual", "gamma_comp")}


@pytest.mark.parametrize(("name", "option"), list(NONE_REFUSED))
@pytest.mark.parametrize("call", ["fit", "partial_fit"])
def test_none_option_is_refused_naming_the_default(name, option, call):
    """Before: None silently meant the default (slda's shrinkage=None scored as 1e-4, where scikit-learn's LDA reads
    "no shrinkage"; dual's compensation=None fitted, then failed to unpickle with a TypeError)."""
    X, y, _ = _data()
    est = head_classifier(name, **{option: None})
    with pytest.raises(FoalPipeError) as refused:
        getattr(est, call)(X, y)
    assert str(refused.value) == NONE_REFUSED[name, option]
    assert "\n" not in str(refused.value)
    assert not hasattr(est, "n_features_in_") and not hasattr(est, "classes_")  # a refused first call leaves it unfitted
    assert est.get_params()[option] is None  # the parameter stays as given


def test_dual_compensation_none_no_longer_fits_into_an_unpicklable_estimator():
    """The audit's example: ``fit`` refuses at once rather than fitting an estimator whose pickle cannot be loaded."""
    X, y, _ = _data()
    with pytest.raises(FoalPipeError, match=r"^compensation=None is not a value of dual's compensation; leave it out"):
        ESTIMATORS["dual"](compensation=None).fit(X, y)


def test_gamma_comp_none_keeps_its_documented_meaning():
    """dual's gamma_comp=None is "the same as gamma", as the head documents: it fits, equal bit for bit to gamma_comp=gamma,
    and round-trips through pickle."""
    X, y, T = _data()
    none = head_classifier("dual", gamma=0.5, gamma_comp=None).fit(X, y)
    same = head_classifier("dual", gamma=0.5, gamma_comp=0.5).fit(X, y)
    assert np.array_equal(none.class_scores(T), same.class_scores(T))
    back = pickle.loads(pickle.dumps(none))
    assert back.get_params()["gamma_comp"] is None and back._fitted_with["gamma_comp"] is None
    assert np.array_equal(back.class_scores(T), none.class_scores(T))


def test_the_cli_path_still_reads_none_as_not_given():
    """make_head (the CLI's and a model file's path) keeps None as "the head's default": its outputs are unchanged."""
    X, y, T = _data()
    for name, option in NONE_REFUSED:
        given, default = make_head(name, {option: None}, xnp, X.shape[1]), make_head(name, {}, xnp, X.shape[1])
        assert given.options == default.options
    slda = make_head("slda", {"shrinkage": None}, xnp, X.shape[1])
    slda.add(X, y)
    assert np.array_equal(slda.boundary().scores(T), head_classifier("slda").fit(X, y).class_scores(T))


#: Every head's every option at a value other than its default.
NON_DEFAULT = {"ridge": {"gamma": 0.25}, "ncm": {}, "slda": {"shrinkage": 0.3}, "fecam": {"shrinkage": 0.5,
               "shrinkage_offdiag": 0.2}, "balanced": {"gamma": 0.3}, "cosine": {},
               "dual": {"gamma": 0.4, "gamma_comp": 2.0, "compensation": 0.6, "batch_size": 7}}


def _joblib_copy(est):
    buffer = io.BytesIO()
    joblib.dump(est, buffer)
    buffer.seek(0)
    return joblib.load(buffer)


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("how", ["pickle", "deepcopy", "joblib"])
def test_fitted_options_round_trip_at_non_default_values(name, how):
    """The options recorded at fit come back as they were (get_params and _fitted_with), the model scores with the same
    bits, and a later partial_fit continues exactly as on the estimator never copied."""
    assert set(NON_DEFAULT) == set(HEADS)
    options = NON_DEFAULT[name]
    assert set(options) == set(HEADS[name].head.option_names())
    X, y, T = _data(seed=11, n=80)
    est = head_classifier(name, **options).fit(X[:50], y[:50])
    est.class_scores(T)  # solved
    back = {"pickle": lambda e: pickle.loads(pickle.dumps(e)), "deepcopy": copy.deepcopy, "joblib": _joblib_copy}[how](est)
    assert back.get_params() == est.get_params() == options
    assert back._fitted_with == est._fitted_with == options
    assert np.array_equal(back.class_scores(T), est.class_scores(T))
    if name == "dual":
        assert back._head.options == est._head.options
        assert back._model.compensation == est._model.compensation == 0.6
    est.partial_fit(X[50:], y[50:])
    back.partial_fit(X[50:], y[50:])
    assert np.array_equal(back.class_scores(T), est.class_scores(T))


@pytest.mark.parametrize("declared", [[0, 1], [-1, 0]])
def test_binary_decision_function_agrees_with_predict_with_a_declared_class(declared):
    """The audit's example: every row labelled 0, class 1 (or -1) only declared. Before: the declared class's column was
    0, winning argmax(decision_function) wherever the seen class scored below 0 (19 of 40 rows here for [0, 1])."""
    rng = np.random.default_rng(0)
    X, T = rng.normal(size=(60, 5)), rng.normal(size=(40, 5))
    clf = AnalyticClassifier().partial_fit(X, np.zeros(60, dtype=int), classes=declared)
    margin, predicted = clf.decision_function(T), clf.predict(T)
    assert clf.classes_.tolist() == sorted(declared)
    assert (predicted == 0).all()
    assert np.array_equal(clf.classes_[(margin > 0).astype(int)], predicted)
    assert np.isinf(margin).all() and ((margin < 0) == (declared == [0, 1])).all()


def test_multiclass_decision_function_argmax_is_predict_with_a_declared_class():
    """Three seen classes and one declared (3): its column is -inf, so argmax(decision_function) is predict, also after
    pickling and a save/load of the model file; once rows of class 3 arrive its column is a score again."""
    X, y, T = _data(seed=3, n=90, d=6)
    X, T = np.abs(X) + 1, -np.abs(T)  # rows unlike the data: every seen class scores below 0 on many of them
    clf = AnalyticClassifier(gamma=0.5).partial_fit(X, y, classes=[0, 1, 2, 3])
    scores = clf.decision_function(T)
    assert np.isneginf(scores[:, 3]).all() and np.isfinite(scores[:, :3]).all()
    assert (clf.class_scores(T)[:, :3].max(axis=1) < 0).sum() > 10  # before the fix, rows where class 3's 0 won
    assert np.array_equal(scores[:, :3], clf.class_scores(T)[:, :3])
    assert np.array_equal(clf.classes_[scores.argmax(axis=1)], clf.predict(T))
    back = pickle.loads(pickle.dumps(clf))
    assert np.array_equal(back.decision_function(T), scores)
    more = _data(seed=4, n=10, d=6)[0]
    clf.partial_fit(more, np.full(10, 3))
    scores = clf.decision_function(T)
    assert np.isfinite(scores).all() and np.array_equal(scores, clf.class_scores(T))
    assert np.array_equal(clf.classes_[scores.argmax(axis=1)], clf.predict(T))


def test_decision_function_survives_save_and_load(tmp_path):
    X, y, T = _data(seed=3, n=90, d=6)
    clf = AnalyticClassifier(gamma=0.5).partial_fit(X, y, classes=[0, 1, 2, 3])
    loaded = AnalyticClassifier.load(clf.save(tmp_path / "m.safetensors"))
    assert np.array_equal(loaded.decision_function(T * 5), clf.decision_function(T * 5))
    assert np.array_equal(loaded.classes_[loaded.decision_function(T * 5).argmax(axis=1)], clf.predict(T * 5))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_head_estimators_with_classes_declared_ahead(name):
    """A head estimator takes classes= naming labels with rows only (a rowless one is refused), so predict is the argmax
    of class_scores; where the head has probabilities their argmax is predict's (softmax: every row; the clipped shares
    of ridge, balanced and dual: every row with a positive score, the others uniform)."""
    X, y, T = _data(seed=7, n=90)
    with pytest.raises(FoalPipeError, match="which has no rows yet"):
        head_classifier(name).partial_fit(X, np.zeros(90, dtype=int), classes=[0, 1])
    est = head_classifier(name).partial_fit(X[:45], y[:45], classes=np.unique(y[:45])).partial_fit(X[45:], y[45:])
    scores = est.class_scores(T * 3)
    assert np.array_equal(est.predict(T * 3), est.classes_[scores.argmax(axis=1)])
    if not hasattr(est, "predict_proba"):
        return
    proba = est.predict_proba(T * 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    positive = scores.max(axis=1) > 0 if HEADS[name].head.probabilities == "shares" else np.ones(len(T), dtype=bool)
    assert np.array_equal(est.classes_[proba.argmax(axis=1)][positive], est.predict(T * 3)[positive])
    assert (proba[~positive] == 1 / proba.shape[1]).all()


def test_a_pickle_from_before_none_was_refused_loads_with_the_default():
    """An estimator fitted with ``shrinkage=None`` before None was refused (it then meant the default) was pickled with
    that None recorded; it loads, and scores as the default it was fitted with."""
    X, y, T = _data()
    est = head_classifier("slda").fit(X, y)
    scores = est.class_scores(T)
    est.set_params(shrinkage=None)
    est._fitted_with = {**est._fitted_with, "shrinkage": None}  # as such a fit recorded it
    back = pickle.loads(pickle.dumps(est))
    assert np.array_equal(back.class_scores(T), scores)
