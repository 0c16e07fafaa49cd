"""Rows whose float64 scores tie within their own rounding are refused, not ranked by rounding: on features that vary
only in their last digits around a large value (1e8 + 1e-7 z), learn, sweep and predict gave classes that float64's
rounding picked (learn 16.7%, sweep and the exact argmax 25%) with exit 0. Exact argmaxes here are of rational
arithmetic on the same float64 values (``fractions``)."""

import importlib.util
from fractions import Fraction

import numpy as np
import pytest
from helpers import invoke

from foal_pipe import AnalyticClassifier, FoalPipeError, head_classifier, load_model
from foal_pipe.core.backend import get_namespace
from foal_pipe.core.scoring import ModelScores, Rows, Ties, best_of, spread
from foal_pipe.store import write_store

TIED = "tie within their own rounding"
BACKENDS = [
    "array_api_strict",
    pytest.param("torch", marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")),
]


def offset_rows(spread: float, n: int = 40, D: int = 10, seed: int = 0) -> np.ndarray:
    """Rows ``1e8 + spread z``: at ``spread`` 1e-7 they differ from each other in their last digit or two."""
    return 1e8 + spread * np.random.default_rng(seed).normal(size=(n, D))


def level_weights(D: int = 10, C: int = 4, seed: int = 1) -> np.ndarray:
    """Columns ``w0 + 1e-3 v_c`` with the ``v_c`` centred: every class takes about the same share of the offset, so
    the classes differ by the rows' small part only (``w0 > 0``: scores about 1e8, far above an unseen class's 0)."""
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(D, C))
    return np.abs(rng.normal(size=(D, 1))) + 1e-3 * (V - V.mean(axis=0))


def exact_argmax(H: np.ndarray, W: np.ndarray) -> np.ndarray:
    """The argmax of ``H @ W`` in rational arithmetic (first of equal scores)."""
    Wf = [[Fraction(float(v)) for v in col] for col in W.T]
    best = []
    for h in H:
        hf = [Fraction(float(v)) for v in h]
        scores = [sum((a * b for a, b in zip(hf, col)), Fraction(0)) for col in Wf]
        best.append(max(range(len(scores)), key=lambda k: (scores[k], -k)))
    return np.array(best)


def test_scores_tied_within_rounding_are_refused_where_float64_ranks_them_wrongly():
    H, W = offset_rows(1e-7), level_weights()
    assert np.any(np.argmax(H @ W, axis=1) != exact_argmax(H, W))  # what the refusal guards: float64's own picks
    with pytest.raises(FoalPipeError, match=TIED) as caught:
        ModelScores(W, 1).argmax(Rows.of(H))
    assert "center the features" in str(caught.value) and "\n" not in str(caught.value)


def test_leads_beyond_rounding_rank_as_the_exact_scores_do():
    H, W = offset_rows(1e2), level_weights()
    expected = exact_argmax(H, W)
    assert len(set(expected.tolist())) > 1
    np.testing.assert_array_equal(ModelScores(W, 1).argmax(Rows.of(H))[:, 0], expected)
    np.testing.assert_array_equal(ModelScores(np.tile(W, 3), 3).argmax(Rows.of(H)), np.stack([expected] * 3, axis=1))


def test_ties_of_exact_zeros_go_to_the_first_column():
    """A row of zeros scores exactly 0 everywhere, and a column of zeros scores exactly 0: ties, not rounding."""
    H, W = offset_rows(1e2), level_weights()
    H[:5] = 0.0
    W[:, 2] = 0.0
    expected = exact_argmax(H, W)
    np.testing.assert_array_equal(ModelScores(W, 1).argmax(Rows.of(H))[:, 0], expected)
    assert np.all(expected[:5] == 0)


def test_unseen_classes_zeros_count_as_rivals_without_rounding():
    H, W = offset_rows(1e-7), level_weights()
    with pytest.raises(FoalPipeError, match=TIED):
        ModelScores(W, 1, np.array([0, 2, 3, 5]), 7).argmax(Rows.of(H))
    H = offset_rows(1e2)
    full = np.zeros((H.shape[0], 7))
    full[:, [0, 2, 3, 5]] = H @ W
    np.testing.assert_array_equal(ModelScores(W, 1, np.array([0, 2, 3, 5]), 7).argmax(Rows.of(H))[:, 0],
                                  np.argmax(full, axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_namespaces_refuse_the_same_rows(backend):
    xp = get_namespace(backend)
    H, W = offset_rows(1e-7), level_weights()
    with pytest.raises(FoalPipeError, match=TIED):
        ModelScores(xp.asarray(W), 1).argmax(Rows.of(xp.asarray(H)))
    H = offset_rows(1e2)
    np.testing.assert_array_equal(ModelScores(xp.asarray(W), 1).argmax(Rows.of(xp.asarray(H)))[:, 0], exact_argmax(H, W))


def test_identical_columns_tie_exactly_and_the_first_wins():
    """Two classes with the same weights score alike on every row: an exact tie, not rounding's pick."""
    H, W = offset_rows(1e2), level_weights()
    W[:, 1] += 1.0  # class 1 leads every row by far
    W[:, 3] = W[:, 1]
    expected = exact_argmax(H, W)
    assert np.all(expected == 1)
    np.testing.assert_array_equal(ModelScores(W, 1).argmax(Rows.of(H))[:, 0], expected)
    labels, _ = best_of(H @ W, np.arange(4), ties=(Ties.of(W), H))
    np.testing.assert_array_equal(labels, expected)


def test_classes_with_the_same_training_rows_keep_float64s_pick():
    """A class whose rows are another's: the exact weights are equal, the solved ones differ by the solve's rounding
    (summed in other orders), so their scores tie within rounding; float64's pick stands, as documented."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 12)), rng.integers(0, 3, 60)
    X, y = np.concatenate([X, X[y == 1]]), np.concatenate([y, np.full(int((y == 1).sum()), 3)])
    T = rng.normal(size=(200, 12))
    for engine in ("gram", "rls"):
        clf = AnalyticClassifier(gamma=1.0, engine=engine)
        for batch in np.array_split(rng.permutation(y.size), 5):
            clf.partial_fit(X[batch], y[batch], classes=[0, 1, 2, 3])
        W = clf.weights_
        assert not np.array_equal(W[:, 1], W[:, 3]) and np.abs(W[:, 1] - W[:, 3]).max() < 1e-14
        scores = clf.class_scores(T)
        twins_lead = np.isin(np.argmax(scores, axis=1), [1, 3])
        assert twins_lead.sum() > 20
        np.testing.assert_array_equal(clf.predict(T), clf.classes_[np.argmax(scores, axis=1)])
        np.testing.assert_array_equal(ModelScores(np.ascontiguousarray(W), 1).argmax(Rows.of(T))[:, 0],
                                      np.argmax(scores, axis=1))


def test_best_of_checks_each_score_with_its_own_rounding():
    H, W = offset_rows(1e-7), level_weights()
    classes = np.array([3, 5, 8, 9])
    with pytest.raises(FoalPipeError, match=TIED):
        best_of(H @ W, classes, ties=(Ties.of(W), H))
    with pytest.raises(FoalPipeError, match=TIED):
        best_of(H @ W, classes, np.arange(12), (Ties.of(W), H))
    H = offset_rows(1e2)
    labels, _ = best_of(H @ W, classes, ties=(Ties.of(W), H))
    np.testing.assert_array_equal(labels, classes[exact_argmax(H, W)])


def degenerate_split(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four classes of 10-d blobs, shrunk to 1e-7 around 1e8 (the audit's store)."""
    rng = np.random.default_rng(7)
    means = rng.normal(size=(4, 10))
    y = np.repeat(np.arange(4), n_per_class)
    noise = np.random.default_rng(seed).normal(size=(y.size, 10))
    return 1e8 + 1e-7 * (means[y] + 0.3 * noise), y


def widened(X: np.ndarray, factor: float) -> np.ndarray:
    """The same blobs, ``factor`` times wider around 1e8."""
    return 1e8 + factor * (X - 1e8)


@pytest.fixture
def model_file(tmp_path) -> tuple[object, object]:
    """A model learnt on the audit's training rows, whose test rows (the same blobs 1e6 times wider) it ranks; and
    the audit's store, whose test rows it cannot."""
    train, test = degenerate_split(10, 1), degenerate_split(15, 2)
    wide = write_store(tmp_path / "wide.zarr", train, (widened(test[0], 1e6), test[1]), ["a", "b", "c", "e"],
                       dtype="float64", chunk_rows=64)
    result = invoke("learn", "--features", wide, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 0,
                    "--gamma", "1e8", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    store = write_store(tmp_path / "s.zarr", train, test, ["a", "b", "c", "e"], dtype="float64", chunk_rows=64)
    return tmp_path / "run" / "model.safetensors", store


def test_estimators_and_model_files_refuse_rows_they_cannot_rank(model_file):
    X, y = degenerate_split(10, 1)
    T, _ = degenerate_split(15, 2)
    clf = AnalyticClassifier(gamma=1e8).fit(X, y)
    with pytest.raises(FoalPipeError, match=TIED):
        clf.predict(T)
    path, _ = model_file
    for estimators in (True, False):
        model = load_model(path, estimators=estimators)
        with pytest.raises(FoalPipeError, match=TIED):
            model.predict(T)
        with pytest.raises(FoalPipeError, match=TIED):
            model.best(T)
        wide = widened(T, 1e6)  # ranked as before the check
        np.testing.assert_array_equal(model.predict(wide), model.classifier.classes_[np.argmax(model.scores(wide), axis=1)])


def test_learn_sweep_and_predict_refuse_with_one_line_and_write_nothing(tmp_path, model_file):
    path, store = model_file
    for command in ("learn", "sweep"):
        result = invoke(command, "--features", store, "--out", tmp_path / command, "--tasks", 1, "--projection-dim", 0,
                        "--gamma" if command == "learn" else "--gammas", "1e8", "--backend", "numpy")
        assert result.exit_code == 1, result.output
        assert TIED in result.output and "Traceback" not in result.output
        assert not (tmp_path / command).exists()
    result = invoke("predict", "--model", path, "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 1 and TIED in result.output, result.output
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("head", ["balanced", "ridge"])
def test_linear_heads_refuse_what_they_cannot_rank(tmp_path, head):
    """balanced's and the ridge head's scores are ``h @ W`` too: their learn gave 25% with exit 0."""
    train, test = degenerate_split(10, 1), degenerate_split(15, 2)
    store = write_store(tmp_path / "s.zarr", train, test, ["a", "b", "c", "e"], dtype="float64", chunk_rows=64)
    args = ("--tasks", 1, "--projection-dim", 0, "--backend", "numpy")
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--head", head, "--gamma", "1e8", *args)
    assert result.exit_code == 1 and TIED in result.output, result.output
    assert not (tmp_path / "run").exists()
    heads = "ridge,ncm" if head == "ridge" else f"ridge,{head}"
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sweep", "--heads", heads, "--gammas", "1e8", *args)
    assert result.exit_code == 1 and TIED in result.output, result.output
    estimator = head_classifier(head, gamma=1e8).fit(*train)
    with pytest.raises(FoalPipeError, match=TIED):
        estimator.predict(test[0])
    wide = widened(test[0], 1e8)
    np.testing.assert_array_equal(estimator.predict(wide), estimator.classes_[np.argmax(estimator.class_scores(wide), axis=1)])
    wide_store = write_store(tmp_path / "w.zarr", train, (wide, test[1]), ["a", "b", "c", "e"], dtype="float64")
    result = invoke("learn", "--features", wide_store, "--out", tmp_path / "ok", "--head", head, "--gamma", "1e8", *args)
    assert result.exit_code == 0, result.output
    model = load_model(tmp_path / "ok" / "model.safetensors", estimators=False)
    with pytest.raises(FoalPipeError, match=TIED):
        model.predict(test[0])
    with pytest.raises(FoalPipeError, match=TIED):
        model.best(test[0])
    np.testing.assert_array_equal(model.predict(wide), model.classifier.classes_[np.argmax(model.scores(wide), axis=1)])


def dark_pixel_rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training rows whose first feature is always 0, and test rows of which the first five are set there alone."""
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(60, 8)), rng.integers(0, 3, 60)
    X[:, 0] = 0.0
    T = rng.normal(size=(30, 8))
    T[:5] = 0.0
    T[:5, 0] = 1.0
    return X, y, T


def test_scores_whose_every_product_is_zero_tie_exactly():
    """A test row set only where no training row was (a pixel always dark in training) meets a row of zeros in W:
    every score is exactly 0, a tie the first class wins, not rounding's pick. The norm bound |h| |w| is not 0 there;
    the sum of |h_j w_j| is."""
    X, y, T = dark_pixel_rows()
    clf = AnalyticClassifier(gamma=1.0).fit(X, y)
    assert np.all(clf.weights_[0] == 0.0) and np.all(clf.class_scores(T[:5]) == 0.0)
    expected = exact_argmax(T, clf.weights_)
    np.testing.assert_array_equal(clf.predict(T), clf.classes_[expected])
    np.testing.assert_array_equal(ModelScores(np.ascontiguousarray(clf.weights_), 1).argmax(Rows.of(T))[:, 0], expected)
    assert np.all(expected[:5] == 0)


def test_mirrored_classes_tie_exactly_on_the_mirror_line(tmp_path):
    """Two classes mirrored in x1: W = [[a, -a], [0, 0]] exactly, so a row (0, t) scores 0 and 0."""
    X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, -1.0], [-1.0, 0.0], [-1.0, 1.0], [-1.0, -1.0]])
    y = np.array([0, 0, 0, 1, 1, 1])
    T = np.array([[0.0, 1.0], [0.5, 2.0], [-0.5, 1.0]])
    clf = AnalyticClassifier(gamma=1.0).fit(X, y)
    np.testing.assert_array_equal(clf.predict(T), [0, 0, 1])
    store = write_store(tmp_path / "m.zarr", (X, y), (T, np.array([0, 0, 1])), ["a", "b"], dtype="float64")
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 0,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output


def test_products_summed_in_parts_give_the_same_verdicts(monkeypatch):
    from foal_pipe.core import scoring

    monkeypatch.setattr(scoring, "PRODUCT_ROWS", 7)
    H, W = offset_rows(1e-7), level_weights()
    with pytest.raises(FoalPipeError, match="of 40 test rows tie"):
        ModelScores(W, 1).argmax(Rows.of(H))
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(60, 8)), rng.integers(0, 3, 60)
    X[:, 0] = 0.0
    T = rng.normal(size=(30, 8))
    T[:20] = 0.0
    T[:20, 0] = rng.normal(size=20)  # 20 rows scoring exactly 0 everywhere, in three parts
    W = np.ascontiguousarray(AnalyticClassifier(gamma=1.0).fit(X, y).weights_)
    np.testing.assert_array_equal(ModelScores(W, 1).argmax(Rows.of(T))[:, 0], exact_argmax(T, W))


CHANGED = "the RLS recursion's rounding changed the class of"


def test_rls_weights_whose_drift_would_pick_the_class_are_refused(tmp_path):
    """The RLS recursion's weights lie 8e-7 from the exact solve of its sums on the audit's rows: inside the 1e-4
    drift check, but far beyond the classes' 1e-17 differences. Its learn gave 25% with exit 0 where gram gives
    100% on test rows 1e6 times wider (1e8 here, where no exact score ties within its rounding); the recursion's
    measured drift now joins the ties check. On the audit's own rows, which gram refuses too, the fix named is to
    center the features."""
    train, test = degenerate_split(10, 1), degenerate_split(15, 2)
    wide = widened(test[0], 1e8)
    store = write_store(tmp_path / "w.zarr", train, (wide, test[1]), ["a", "b", "c", "e"], dtype="float64")
    args = ("--features", store, "--tasks", 1, "--projection-dim", 0, "--gamma", "1e8", "--backend", "numpy")
    result = invoke("learn", *args, "--out", tmp_path / "gram")
    assert result.exit_code == 0 and "A_last 100.00" in result.output, result.output
    result = invoke("learn", *args, "--out", tmp_path / "rls", "--engine", "rls")
    assert result.exit_code == 1 and CHANGED in result.output and "--engine gram" in result.output, result.output
    assert not (tmp_path / "rls").exists()
    store = write_store(tmp_path / "d.zarr", train, test, ["a", "b", "c", "e"], dtype="float64")
    result = invoke("learn", *args[2:], "--features", store, "--out", tmp_path / "rls", "--engine", "rls")
    assert result.exit_code == 1 and CHANGED in result.output and "center or rescale" in result.output, result.output
    assert "--engine gram" not in result.output
    rls = AnalyticClassifier(gamma=1e8, engine="rls").fit(*train)
    exact = AnalyticClassifier(gamma=1e8).fit(*train)
    W = rls.weights_  # checked against the exact solve, which measures the drift
    drift = rls._engine.drift
    np.testing.assert_allclose(drift, W - exact.weights_, rtol=0, atol=1e-12 * np.abs(exact.weights_).max())
    assert np.abs(drift).max() > 1e-9 * np.abs(exact.weights_).max()  # what the check stands on: a real drift
    np.testing.assert_array_equal(exact.predict(wide), test[1])
    with pytest.raises(FoalPipeError, match=CHANGED):
        rls.predict(wide)


def test_a_drift_sends_rows_within_its_reach_to_the_exact_weights():
    """Leads beyond the scores' rounding but within ``|h| |d|`` are ranked by the exact weights ``W - d`` too: refused
    where their class differs, kept where it does not (a drift along W itself)."""
    H, W = offset_rows(1e2), level_weights()
    expected = exact_argmax(H, W)
    scores = H @ W
    lead = np.sort(scores, axis=1)[:, -1] - np.sort(scores, axis=1)[:, -2]
    relative = lead / (np.linalg.norm(H, axis=1) * 2 * np.linalg.norm(W, axis=0).max())
    assert relative.min() > 1e-13 and relative.max() < 1e-8  # the 1e8 offset's share: leads of 1e-11 ... 1e-9
    across = 1e-8 * np.abs(W).max() * np.random.default_rng(6).normal(size=W.shape)
    assert np.any(exact_argmax(H, W - across) != expected)
    with pytest.raises(FoalPipeError, match=CHANGED):
        ModelScores(W, 1, drift=across).argmax(Rows.of(H))
    with pytest.raises(FoalPipeError, match=CHANGED):
        best_of(scores, np.arange(4), ties=(Ties.of(W, drift=across), H))
    with pytest.raises(FoalPipeError, match=CHANGED):  # the unseen classes' zeros in their places
        ModelScores(W, 1, np.array([0, 2, 3, 5]), 7, across).argmax(Rows.of(H))
    for along in (1e-8 * W, 1e-15 * W):
        np.testing.assert_array_equal(ModelScores(W, 1, drift=along).argmax(Rows.of(H))[:, 0], expected)
        np.testing.assert_array_equal(best_of(scores, np.arange(4), ties=(Ties.of(W, drift=along), H))[0], expected)
    rng = np.random.default_rng(5)  # leads far beyond float32's rounding: only a screen that counts the drift sends
    H, W = rng.normal(size=(40, 10)), rng.normal(size=(10, 4))  # them to the check
    across = 0.5 * rng.normal(size=W.shape)
    assert np.any(exact_argmax(H, W - across) != exact_argmax(H, W))
    with pytest.raises(FoalPipeError, match=CHANGED):
        ModelScores(W, 1, drift=across).argmax(Rows.of(H))
    np.testing.assert_array_equal(ModelScores(W, 1, drift=0.5 * W).argmax(Rows.of(H))[:, 0], exact_argmax(H, W))


def test_rls_rows_that_score_exactly_zero_still_tie_exactly():
    """A row set only at a pixel no training row had scores exactly 0 with the recursion's weights and with the exact
    ones (that pixel's row of W and of the drift is 0): a tie the first class wins, not the drift's refusal."""
    X, y, T = dark_pixel_rows()
    clf = AnalyticClassifier(gamma=1.0, engine="rls")
    for batch in np.array_split(np.arange(60), 6):
        clf.partial_fit(X[batch], y[batch], classes=[0, 1, 2])
    W = clf.weights_  # checked against the exact solve, which measures the drift
    drift = clf._engine.drift
    assert np.all(drift[0] == 0.0) and np.abs(drift).max() > 0
    np.testing.assert_array_equal(clf.predict(T), clf.classes_[exact_argmax(T, W)])


def test_dual_scores_tied_within_their_rounding_are_refused():
    """dual's scores are ``relu(h) W_main + C tanh(h) W_comp``: their rounding is checked as that of one sum over
    ``[relu(h), tanh(h)]``. The compensation stream's columns are equal here, so it moves every class alike."""
    from foal_pipe.heads.dual import DualScorer

    W = level_weights()
    comp = np.tile(np.random.default_rng(2).normal(size=(10, 1)), (1, 4))
    scorer = DualScorer(np.array([3, 5, 8, 9]), W, comp, 0.5)
    H = offset_rows(1e-7)
    with pytest.raises(FoalPipeError, match=TIED):
        best_of(scorer.scores(H), scorer.classes, ties=scorer.ties(H))
    H = offset_rows(1e2)
    labels, _ = best_of(scorer.scores(H), scorer.classes, ties=scorer.ties(H))
    np.testing.assert_array_equal(labels, scorer.classes[exact_argmax(H, W)])


def test_rls_twin_columns_are_judged_on_the_exact_weights():
    """A class whose rows are another's: the exact weights' two columns are equal, the recursion's drift parts them
    by more than :data:`TWIN` at gamma 1e-4 (2.8e-6 on digits). Float64's pick between them stands, as with gram,
    not a refusal."""
    from sklearn.datasets import load_digits

    from foal_pipe.core.scoring import TWIN

    X, y = load_digits(return_X_y=True)
    X, T = X[:1400].astype(np.float64), X[1400:].astype(np.float64)
    X, y = np.concatenate([X, X[y[:1400] == 0]]), np.concatenate([y[:1400], np.full(int((y[:1400] == 0).sum()), 10)])
    clf = AnalyticClassifier(gamma=1e-4, engine="rls")
    for batch in np.array_split(np.random.default_rng(0).permutation(y.size), 30):
        clf.partial_fit(X[batch], y[batch], classes=np.arange(11))
    W = clf.weights_
    assert np.linalg.norm(W[:, 0] - W[:, 10]) > TWIN * np.linalg.norm(W[:, 0])
    predicted = clf.predict(T)
    np.testing.assert_array_equal(predicted, clf.classes_[np.argmax(clf.class_scores(T), axis=1)])
    assert np.isin(predicted, [0, 10]).sum() > 20


def test_an_rls_classifier_pickled_before_the_drift_was_kept_measures_it_again():
    """Pickles of an rls engine made before it kept its drift lack the attribute: loaded, they check their weights
    again, which measures it, and predict and learn on as before."""
    import pickle

    rng = np.random.default_rng(8)
    X, y = rng.normal(size=(50, 5)), rng.integers(0, 3, 50)
    clf = AnalyticClassifier(gamma=1.0, engine="rls").fit(X, y)
    W = clf.weights_  # checked: an engine pickled after its weights were asked for
    del clf._engine.__dict__["drift"]
    old = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(old.predict(X), clf.classes_[exact_argmax(X, W)])
    np.testing.assert_allclose(old._engine.drift, old.weights_ - AnalyticClassifier(gamma=1.0).fit(X, y).weights_,
                               rtol=0, atol=1e-12)
    old.partial_fit(X[:5], np.array([3, 3, 0, 1, 2]))
    assert old.predict(X).shape == (50,) and old._engine.drift.shape == (5, 4)


def test_an_rls_model_file_keeps_its_drift_for_predict(tmp_path):
    """A model learnt with rls whose test rows pass (rows of zeros: an exact tie) is written with its drift, so
    ``predict`` on rows the drift would rank refuses as learn does; without the drift (a file from before it was
    kept) the rows are scored as saved; a gram file holding a drift is refused."""
    from foal_pipe.model.modelfile import read_model, write_model

    train, test = degenerate_split(10, 1), degenerate_split(15, 2)
    quiet = write_store(tmp_path / "z.zarr", train, (np.zeros((4, 10)), np.arange(4)), ["a", "b", "c", "e"],
                        dtype="float64")
    wide = write_store(tmp_path / "w.zarr", train, (widened(test[0], 1e8), test[1]), ["a", "b", "c", "e"],
                       dtype="float64")
    args = ("--tasks", 1, "--projection-dim", 0, "--gamma", "1e8", "--backend", "numpy")
    result = invoke("learn", "--features", quiet, "--out", tmp_path / "rls", "--engine", "rls", *args)
    assert result.exit_code == 0, result.output
    path = tmp_path / "rls" / "model.safetensors"
    tensors, meta = read_model(path)
    assert tensors["drift"].shape == tensors["W"].shape and np.abs(tensors["drift"]).max() > 0
    result = invoke("predict", "--model", path, "--features", wide, "--out", tmp_path / "p.csv")
    assert result.exit_code == 1 and CHANGED in result.output, result.output
    assert not (tmp_path / "p.csv").exists()
    rows = widened(test[0], 1e8)
    with pytest.raises(FoalPipeError, match=CHANGED):
        AnalyticClassifier.load(path).predict(rows)
    with pytest.raises(FoalPipeError, match=CHANGED):
        load_model(path).predict(rows)
    older = {name: a for name, a in tensors.items() if name != "drift"}
    write_model(tmp_path / "older.safetensors", older, meta)
    scored = AnalyticClassifier.load(tmp_path / "older.safetensors")
    np.testing.assert_array_equal(scored.predict(rows), scored.classes_[np.argmax(scored.class_scores(rows), axis=1)])
    result = invoke("learn", "--features", quiet, "--out", tmp_path / "gram", *args)
    tensors, meta = read_model(tmp_path / "gram" / "model.safetensors")
    with pytest.raises(FoalPipeError, match="'drift' does not belong to the gram engine"):
        write_model(tmp_path / "stray.safetensors", {**tensors, "drift": np.zeros_like(tensors["W"])}, meta)


def test_the_unseen_classes_zeros_are_one_rival_however_many():
    """With two classes unseen, their zeros were the top two (a gap of 0 that rounds nothing), so a seen class just
    below 0 was never checked: the drift's refusal (and rounding's, the same test) passed it by with exit 0."""
    W, H = np.array([[1.0], [-1.0]]), np.array([[1.0, 1.00001]])  # scores -1e-5; the exact W - d scores +9.9e-4
    drift = np.array([[-1e-3], [0.0]])
    for width in (2, 3, 5):
        with pytest.raises(FoalPipeError, match=CHANGED):
            Ties.of(W, drift=drift).spread(np.array([0]), width).check(spread(H @ W, np.array([0]), width)[:, None, :], H)
        with pytest.raises(FoalPipeError, match=CHANGED):
            ModelScores(W, 1, np.array([0]), width, drift).argmax(Rows.of(H))
