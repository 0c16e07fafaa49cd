"""The head estimators solve on demand: ``partial_fit`` adds a task's rows to the head's statistics and the model is
solved when a prediction, ``class_scores`` or pickling needs it, once per run of calls. Its scores, attributes and
pickled tensors are the bits of a solve after every call (the estimator before), dual still solves at every call (its
boundaries end tasks), and a refused solve returns the estimator to its last solved model."""

import pickle
import warnings

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import scores_in_threads

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.heads.state import export_head
from foal_pipe.model.headestimator import ESTIMATORS, head_classifier

RNG = np.random.default_rng(3)
D = 12
# calls of uneven sizes (dual's batch of 10 is cut across them), classes arriving out of order and recurring
CALLS = [(RNG.normal(size=(n, D)) + 0.3 * RNG.normal(size=D), np.array(list(labels))[RNG.permutation(n) % len(labels)])
         for n, labels in [(13, "dbc"), (7, "ae"), (25, "bf"), (9, "gca"), (6, "ed")]]
T = RNG.normal(size=(30, D))
NAMES = list(ESTIMATORS)


def eager(name):
    """What each call gave before: the head's rows added and its boundary solved at every call; per call, the scores
    of ``T`` in ``classes_`` order, and the head and scorer after the last call."""
    head, ids, seen, out = make_head(name, {}, xnp, D), {}, np.empty(0, dtype="<U1"), []
    for X, y in CALLS:
        for label in np.unique(y).tolist():  # the estimator's class ids: in sorted order within a call
            ids.setdefault(label, len(ids))
        head.add(X, np.array([ids[v] for v in y.tolist()], dtype=np.int64))  # no copy: a copy may align otherwise
        scorer = head.boundary()
        seen = np.union1d(seen, y)
        out.append(np.asarray(scorer.scores(T), dtype=np.float64)[:, [ids[c] for c in seen.tolist()]])
    return out, head, scorer


def counting(monkeypatch, name):
    """Count the head's solves (its class's ``boundary``)."""
    calls = []
    original = HEADS[name].head.boundary

    def boundary(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(HEADS[name].head, "boundary", boundary)
    return calls


@pytest.mark.parametrize("name", NAMES)
def test_a_prediction_after_every_call_gives_the_eager_bits(name):
    expected, _, _ = eager(name)
    est = head_classifier(name)
    for (X, y), scores in zip(CALLS, expected):
        est.partial_fit(X, y)
        assert np.array_equal(est.class_scores(T), scores)
        assert np.array_equal(est.predict(T), est.classes_[np.argmax(scores, axis=1)])


@pytest.mark.parametrize("name", NAMES)
def test_calls_then_one_prediction_give_the_solve_of_every_row(name):
    """Several calls, then one prediction: the bits of the solve after the last call (dual: of its per-call solves);
    the fitted attributes and the pickled model-file tensors are those of the eager estimator."""
    expected, head, scorer = eager(name)
    est = head_classifier(name)
    for X, y in CALLS[:3]:
        est.partial_fit(X, y)
    assert np.array_equal(est.class_scores(T), expected[2])
    for X, y in CALLS[3:]:
        est.partial_fit(X, y)
    assert est.classes_.tolist() == list("abcdefg")
    assert est.n_samples_seen_ == sum(len(y) for _, y in CALLS) and est.n_features_in_ == D
    assert np.array_equal(est.class_scores(T), expected[-1])
    tensors, reference = est.__getstate__()["_tensors"], export_head(name, head, scorer)
    assert tensors.keys() == reference.keys() and all(np.array_equal(tensors[k], reference[k]) for k in tensors)
    assert np.array_equal(pickle.loads(pickle.dumps(est)).class_scores(T), expected[-1])


@pytest.mark.parametrize("name", NAMES)
def test_k_calls_then_one_prediction_solve_once(monkeypatch, name):
    """Five calls, then predict, class_scores, score and pickling: one solve (before: five); the fitted attributes
    need none; dual solves at every call, as its boundaries end tasks."""
    solves = counting(monkeypatch, name)
    est = head_classifier(name)
    for X, y in CALLS:
        est.partial_fit(X, y)
    assert (est.classes_.tolist(), est.n_samples_seen_) == (list("abcdefg"), 60)
    lazy = name != "dual"
    assert len(solves) == (0 if lazy else len(CALLS))
    est.predict(T)
    est.class_scores(T)
    est.score(T, est.predict(T))
    pickle.dumps(est)
    assert len(solves) == (1 if lazy else len(CALLS))
    est.partial_fit(*CALLS[0])
    est.predict(T)
    assert len(solves) == (2 if lazy else len(CALLS) + 1)
    assert HEADS[name].head.solve_on_demand == lazy


@pytest.mark.parametrize("name", NAMES)
def test_fit_solves_at_once(monkeypatch, name):
    """fit is refused where its model cannot be solved, so it solves in the call; a prediction after it solves
    nothing and changes no attribute."""
    solves = counting(monkeypatch, name)
    X = np.concatenate([x for x, _ in CALLS])
    y = np.concatenate([y for _, y in CALLS])
    est = head_classifier(name).fit(X, y)
    assert len(solves) == 1
    before = dict(est.__dict__)
    est.predict(T)
    assert len(solves) == 1 and est.__dict__ == before


@pytest.mark.parametrize("name", ["ridge", "balanced"])
def test_a_refused_solve_returns_to_the_last_solved_model(name):
    """A batch whose sums gamma 1e-13 cannot resolve: the solve it needs is refused when the model is needed, naming
    gamma and the calls undone; the estimator is back at its last solved model and keeps learning from it exactly."""
    X, y = RNG.normal(size=(40, 4)), RNG.integers(0, 4, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = head_classifier(name, gamma=1e-13).fit(X, y)
        before = est.__getstate__()["_tensors"]
        # ridge refuses the batch as it comes (its fixed gamma below the resolution its sums would have: the model as
        # it was); balanced takes both calls and undoes them when the solve is refused
        undone = r"the rows of its last 2 partial_fit calls are undone|this batch is refused and the model left as it was"
        with pytest.raises(FoalPipeError, match=rf"gamma 1e-13 .* ({undone})"):
            est.partial_fit(X[:5] * 1e3, y[:5]).partial_fit(X[5:7], y[5:7])
            est.predict(X)
        after = est.__getstate__()["_tensors"]
        assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
        assert est.n_samples_seen_ == 40
        est.partial_fit(X[5:10], y[5:10])
        fresh = head_classifier(name, gamma=1e-13).fit(X, y).partial_fit(X[5:10], y[5:10])
        assert np.array_equal(est.class_scores(X), fresh.class_scores(X))


def test_a_refused_fecam_solve_undoes_the_new_class():
    X, y = RNG.normal(size=(40, 4)), RNG.integers(0, 4, 40)
    est = head_classifier("fecam").fit(X, y)
    est.partial_fit(np.ones((3, 4)), np.array([9, 9, 9]))
    assert est.classes_.tolist() == [0, 1, 2, 3, 9]
    with pytest.raises(FoalPipeError, match="no variance .* the rows of its last partial_fit call are undone"):
        est.class_scores(X)
    assert est.classes_.tolist() == [0, 1, 2, 3] and est.n_samples_seen_ == 40
    assert np.array_equal(est.class_scores(X), head_classifier("fecam").fit(X, y).class_scores(X))


def test_a_refused_first_solve_leaves_it_unfitted():
    est = head_classifier("fecam").partial_fit(np.ones((3, 4)), np.array([1, 1, 1]))
    with pytest.raises(FoalPipeError, match="no variance .* is back at not fitted"):
        est.predict(np.ones((1, 4)))
    assert not hasattr(est, "classes_") and not hasattr(est, "n_features_in_")
    with pytest.raises(FoalPipeError, match="no variance"):
        head_classifier("fecam").fit(np.ones((3, 4)), np.array([1, 1, 1]))


def test_an_interrupted_solve_keeps_the_rows(monkeypatch):
    """An interruption is no refusal of the statistics: the next access solves them."""
    est = head_classifier("slda").partial_fit(*CALLS[0])
    original = HEADS["slda"].head.boundary

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(HEADS["slda"].head, "boundary", interrupted)
    with pytest.raises(KeyboardInterrupt):
        est.predict(T)
    monkeypatch.setattr(HEADS["slda"].head, "boundary", original)
    assert np.array_equal(est.class_scores(T), head_classifier("slda").fit(*CALLS[0]).class_scores(T))


def _fresh(name, calls, **options):
    est = head_classifier(name, **options)
    for X, y in calls:
        est.partial_fit(X, y)
    return est


@pytest.mark.parametrize("name", NAMES)
def test_a_head_refuses_a_batch_before_it_writes(name):
    """Head.add's contract: rows of another width (with a new class) are refused in one line and the state stays as it
    was, so the next rows and solve give the bits of a head that never saw them."""
    head, clean = make_head(name, {}, xnp, D), make_head(name, {}, xnp, D)
    for X, y in CALLS[:2]:
        labels = np.unique(y, return_inverse=True)[1].astype(np.int64)
        head.add(X, labels)
        clean.add(X, labels)
    with pytest.raises(FoalPipeError, match=rf"^rows have shape \(3, {D + 1}\) but the head was built for dim={D}"):
        head.add(RNG.normal(size=(3, D + 1)), np.array([0, 9, 9]))
    X, y = CALLS[2]
    labels = np.unique(y, return_inverse=True)[1].astype(np.int64)
    head.add(X, labels)
    clean.add(X, labels)
    assert np.array_equal(np.asarray(head.boundary().scores(T)), np.asarray(clean.boundary().scores(T)))


def test_a_refused_batch_keeps_the_calls_before_it():
    """ridge's rows whose Gram overflows, after two calls not yet solved: refused by that call, whose refusal undoes
    nothing (before, the two calls went with it); with a new class, its column goes again."""
    r = np.random.default_rng(0)
    calls = [(r.normal(size=(20, 5)), np.arange(20) % 2) for _ in range(2)]
    est = _fresh("ridge", calls, gamma=1.0)
    for labels in ([0, 1], [0, 7]):
        with pytest.raises(FoalPipeError, match=r"^features of magnitude 1e\+160 overflow the float64 Gram sums "
                                                r"\(\|x\|\^2 beyond the largest number\); scale the features$"):
            est.partial_fit(np.full((2, 5), 1e160), labels)
    assert est.n_samples_seen_ == 40 and est.classes_.tolist() == [0, 1]
    X = r.normal(size=(6, 5))
    assert np.array_equal(est.class_scores(X), _fresh("ridge", calls, gamma=1.0).class_scores(X))
    est.partial_fit(X, [0, 7] * 3)
    assert np.array_equal(est.class_scores(X), _fresh("ridge", [*calls, (X, [0, 7] * 3)], gamma=1.0).class_scores(X))


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_the_head_refuses_keeps_the_pending_calls(monkeypatch, name):
    """Any head's add refusing a batch (a FoalPipeError, before it writes): the estimator keeps the calls since its
    last solve; only an error that may leave the head half-written returns it to its last solved model."""
    original = HEADS[name].head.add

    def add(self, X, labels):
        if X[0, 0] == 999.0:
            raise FoalPipeError("refused")
        if X[0, 0] == 555.0:
            raise MemoryError
        return original(self, X, labels)

    est = _fresh(name, CALLS[:1])
    est.predict(T)
    est.partial_fit(*CALLS[1]).partial_fit(*CALLS[2])
    monkeypatch.setattr(HEADS[name].head, "add", add)
    bad = np.full((2, D), 999.0)
    with pytest.raises(FoalPipeError, match="^refused$"):
        est.partial_fit(bad, CALLS[0][1][:2])
    assert est.n_samples_seen_ == sum(y.size for _, y in CALLS[:3])
    assert np.array_equal(est.class_scores(T), _fresh(name, CALLS[:3]).class_scores(T))
    est.partial_fit(*CALLS[3])
    with pytest.raises(MemoryError):
        est.partial_fit(bad - 444.0, CALLS[0][1][:2])
    lazy = HEADS[name].head.solve_on_demand  # dual adds to a copy: the failed call alone goes
    assert est.n_samples_seen_ == sum(y.size for _, y in CALLS[:3 if lazy else 4])
    assert np.array_equal(est.class_scores(T), _fresh(name, CALLS[:3 if lazy else 4]).class_scores(T))


@pytest.mark.parametrize(("name", "options", "first", "later"), [
    ("ridge", {"gamma": 1e-12}, (RNG.normal(size=(3, 6)), np.array([0, 1, 0])),
     (RNG.normal(size=(60, 6)), np.arange(60) % 2)),
    ("fecam", {}, (np.vstack([np.ones((2, 6)), RNG.normal(size=(6, 6))]), np.array([0, 0, 1, 1, 1, 1, 1, 1])),
     (RNG.normal(size=(10, 6)), np.zeros(10, dtype=int))),
])
def test_a_call_unsolvable_alone_is_kept_where_later_rows_solve_it(name, options, first, later):
    """A call whose own solve is refused (ridge: gamma 1e-12 on 3 rows of 6 features; fecam: a class of 2 equal rows)
    is refused by the next prediction if it comes first, but kept where a later call makes the model solvable (the
    eager estimator refused it): the model is then the exact solve over every row, as fit on them all."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FoalPipeError, match="is back at not fitted: the rows of its last partial_fit call are undone"):
            head_classifier(name, **options).partial_fit(*first).predict(T[:, :6])
        est = _fresh(name, [first, later], **options)
        X, y = np.vstack([first[0], later[0]]), np.concatenate([first[1], later[1]])
        whole = head_classifier(name, **options).fit(X, y)
        assert est.n_samples_seen_ == y.size and est.classes_.tolist() == whole.classes_.tolist()
        np.testing.assert_allclose(est.class_scores(T[:, :6]), whole.class_scores(T[:, :6]), rtol=1e-9, atol=1e-9)
        if name == "ridge":  # the closed form: (H^T H + gamma I)^-1 H^T Y
            W = np.linalg.solve(X.T @ X + 1e-12 * np.eye(6), X.T @ np.eye(2)[y])
            np.testing.assert_allclose(est.class_scores(T[:, :6]), T[:, :6] @ W, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", [n for n in NAMES if HEADS[n].head.solve_on_demand])
def test_readers_in_threads_solve_the_pending_calls_once_for_all(monkeypatch, name):
    """Four threads ask for scores at once after calls not yet solved: each gets the scores of every row (before, all
    but the first failed on the state the first had cleared), the solve runs once for all (under the estimator's lock)
    and the model is kept."""
    est = _fresh(name, CALLS[:3])
    want = _fresh(name, CALLS[:3]).class_scores(T)
    out, solves = scores_in_threads(monkeypatch, name, lambda: est.class_scores(T))
    assert all(isinstance(o, np.ndarray) and np.array_equal(o, want) for o in out), out
    assert solves == 1
    assert "_undo" not in est.__dict__ and np.array_equal(est.class_scores(T), want)


def test_a_refused_solve_pickles_as_an_equal_model():
    """Back at its last solved model after a refused solve, the estimator pickles to the bytes of an estimator given
    only the calls kept (before, its attributes came back in another order)."""
    r = np.random.default_rng(1)
    X, y = r.normal(size=(40, 5)), np.arange(40) % 3
    est = head_classifier("ridge", gamma=1e-3).partial_fit(X, y)
    est.predict(X[:2])
    with pytest.raises(FoalPipeError, match="back at its last solved model|this batch is refused"):
        est.partial_fit(r.normal(size=(4, 5)) * 1e6, [0, 1, 2, 0])  # refused as it comes (the sums' resolution)
        est.predict(X[:2])
    equal = head_classifier("ridge", gamma=1e-3).partial_fit(X, y)
    assert list(vars(est)) == [k for k in vars(equal) if k != "_undo"]
    assert pickle.dumps(est) == pickle.dumps(equal)


@pytest.mark.parametrize("name", ["slda", "balanced"])
def test_a_call_whose_gram_overflows_is_refused_and_the_calls_before_kept(name):
    """A call whose rows' squares overflow float64 is refused in one line, with no NumPy warning, and the calls before
    it stay: the model is that of the calls accepted (before, the call was taken, and its inf sums undid the last 3
    calls at the next prediction)."""
    r = np.random.default_rng(0)
    X, y = r.standard_normal((40, 8)), np.repeat([0, 1], 20)
    est = head_classifier(name).partial_fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError) as refused:
            est.partial_fit(X * 1e160, y)
        est.partial_fit(X + 1, y)
        scores, predicted = est.class_scores(X), est.predict(X)
    assert str(refused.value) == (f"{name}: features of magnitude 3.77e+160 overflow the float64 Gram sums (|x|^2 beyond "
                                  "the largest number); scale the features down (e.g. divide by their largest value)")
    accepted = head_classifier(name).partial_fit(X, y).partial_fit(X + 1, y)
    assert np.array_equal(scores, accepted.class_scores(X)) and np.array_equal(predicted, accepted.predict(X))
    assert est.n_samples_seen_ == 80


def _held(head):
    """The running state of an slda or balanced head, as host arrays."""
    if head.name == "slda":
        s = head.sums
        return [s.classes, s.counts, s.sums, s.shift, s.gram, np.asarray(s.n)]
    return [head.classes_, head.counts_, *(np.stack([head_part[c] for c in head.classes_.tolist()])
                                           for head_part in (head._grams, head._sums))]


def _third_batch_refused(name, options, fitting, third, labels):
    """Two heads given the batches ``fitting`` (whose Gram sums fit float64); the first is then given ``third``,
    whose squares of 4.47e153 would take them past the largest float64: refused in one line, with no NumPy warning.
    Gives both heads, to compare their states."""
    head, kept = make_head(name, options, xnp, 2), make_head(name, options, xnp, 2)
    for h in (head, kept):
        for batch in fitting:
            h.add(batch, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError, match=rf"^{name}: features of magnitude 4.47e\+153 overflow the float64 Gram"):
            head.add(third, labels)
    return head, kept


@pytest.mark.parametrize("name", ["slda", "balanced"])
def test_batches_whose_gram_sums_together_overflow_are_refused_before_writing(name):
    """Rows of 4.5e153 (squares of max/9): two batches of 4 fit the Gram sums (7/9 of the largest float64), a third
    would take them to 11/9, inf: it is refused, the state bit for bit that of the two batches (before: taken)."""
    s = (np.finfo(np.float64).max / 9) ** 0.5
    batch = np.column_stack([np.full(4, s), np.arange(4.0)])
    first = batch.copy()
    first[0, 0] = 0.0  # slda sums rows less the first row added: a first row of 0 keeps the shift small
    labels = np.zeros(4, dtype=np.int64)
    head, kept = _third_batch_refused(name, {}, (first, batch), batch, labels)
    assert all(np.isfinite(a).all() for a in _held(head))
    assert all(np.array_equal(a, b) for a, b in zip(_held(head), _held(kept), strict=True))


def test_dual_refuses_a_call_whose_relu_gram_overflows_before_writing():
    """dual: rows of 1e160 are refused at add in one line, with no NumPy warning (before: overflow and invalid
    RuntimeWarnings in the Woodbury products, then a refused solve asking for a larger gamma), and the estimator
    predicts as one given only the calls before; G_main's largest square is counted, as slda's sums."""
    r = np.random.default_rng(0)
    X, y = r.standard_normal((40, 8)), np.repeat([0, 1], 20)
    est = head_classifier("dual").partial_fit(X, y)
    top = float(np.max(X)) * 1e160  # the relu rows' largest entry: only G_main takes squares of the features
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError) as refused:
            est.partial_fit(X * 1e160, y)
        scores, predicted = est.class_scores(T[:, :8]), est.predict(T[:, :8])
    assert str(refused.value) == (f"dual: features of magnitude {top:.3g} overflow the float64 Gram sums (|x|^2 beyond "
                                  "the largest number); scale the features down (e.g. divide by their largest value)")
    fresh = head_classifier("dual").partial_fit(X, y)
    assert np.array_equal(scores, fresh.class_scores(T[:, :8])) and np.array_equal(predicted, fresh.predict(T[:, :8]))
    assert est.n_samples_seen_ == 40
    s = (np.finfo(np.float64).max / 9) ** 0.5  # two batches of 4 rows of s fit G_main (8/9 of the largest), a third not
    batch, labels = np.column_stack([np.full(4, s), -np.arange(4.0)]), np.zeros(4, dtype=np.int64)
    head, kept = _third_batch_refused("dual", {"batch_size": 1}, (batch, batch), batch, labels)
    assert all(np.array_equal(head._state[k], kept._state[k]) for k in head.state_tensors)
    assert [b.tolist() for b, _ in head._pending] == [b.tolist() for b, _ in kept._pending]
