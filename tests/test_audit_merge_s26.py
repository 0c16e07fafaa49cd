"""Audit (session 26) of ``AnalyticClassifier.merge``, ``from_statistics`` and ``statistics_``.

Audited, against an independent NumPy closed form ``(H^T H + gamma I)^-1 H^T Y``: merges of learners with overlapping,
disjoint, int / float / bool / str labels, classes declared without rows on one side, float32 with float64, gram with
rls (refused), different gammas (self's wins, as documented), gamma="auto" with other grids, numpy with torch and
array_api_strict, other n_features (refused), a learner with itself (counts and rows doubled), unfitted sides
(refused), loaded learners, a merged learner then partial_fit / pickle / save / load, ``from_statistics`` of hand-made
statistics (non-symmetric, negative diagonal, NaN, shapes, unsorted or duplicated classes, counts above n: refused),
writes into ``weights_``, ``coef_`` and ``statistics_`` (refused or copies). Those held.

Faults found (each test below failed on b543cdb for its reason; all fixed):

1. ``clf.statistics_`` is a snapshot whose ``n`` and ``counts`` are copies but whose ``G`` and ``Q`` are views that a
   later ``partial_fit`` adds into in place: the object then holds the sums of all rows with the row count of the
   first, and ``from_statistics`` (or ``+``) of it is silently wrong (torch's copy does not move: backends differ);
   a learner cloned by ``from_statistics(source.statistics_)`` moves when the source learns on.
2. ``from_statistics(s)`` keeps the caller's ``s.G`` / ``s.Q`` as its state: ``s += more`` moves the learner's
   weights unseen (``n_samples_seen_`` unchanged), and the learner's ``partial_fit`` writes into the caller's ``s.G``.
3. ``RidgeStatistics`` ``+`` of integer-labelled and name-labelled statistics (or of int64 ids above 2**53 and
   fractional labels) fails with NumPy's ValueError, and a mixed object ``classes`` with a TypeError, not a
   ``FoalPipeError`` naming the fix (``merge`` checks label kinds; the statistics' own ``+`` does not).
4. ``RidgeStatistics`` accepts NaN in ``classes`` (twice, too: ``nan <= nan`` is False, so the sorted-and-unique
   check passes), and ``from_statistics`` builds a learner that predicts NaN; ``partial_fit`` refuses NaN labels.
5. ``from_statistics`` of statistics whose ``counts`` say 0 rows for a class whose column of ``Q`` is not zero (so
   it has rows) takes the class as declared without rows and never predicts it: predictions differ from the closed
   form's argmax, silently.
6. ``merge`` of loaded learners ignores what their files record beside the state: learners saved with different
   projections (other random matrices: other feature spaces) merge silently, their sums of different columns added;
   and the merged learner of two loaded with the same projection drops it (and the class names), so its ``save``
   writes a file ``load_model`` refuses ("has no 'projection' tensor"), where the learner that saw both streams
   (the loaded one continued by ``partial_fit``) saves a deployable one.
"""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.deploy import load_model
from foal_pipe.model.projection import SmoothProjection

RNG = np.random.default_rng(26)
H1, Y1 = RNG.normal(size=(40, 5)), RNG.integers(0, 3, 40)
H2, Y2 = RNG.normal(size=(30, 5)), RNG.integers(0, 3, 30)


def closed_form(H: np.ndarray, y: np.ndarray, gamma: float = 1.0, classes=(0, 1, 2)) -> np.ndarray:
    """The ridge weights of rows ``H`` labelled ``y``, by NumPy alone."""
    Y = (np.asarray(y)[:, None] == np.asarray(classes)[None, :]).astype(np.float64)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


def test_statistics_snapshot_is_not_moved_by_a_later_partial_fit():
    clf = AnalyticClassifier(gamma=1.0).partial_fit(H1, Y1)
    snapshot = clf.statistics_
    clf.partial_fit(H2, Y2)
    assert snapshot.n == 40
    # the sums must still be those of the 40 rows the snapshot's n counts
    np.testing.assert_allclose(snapshot.G, H1.T @ H1, rtol=1e-12, atol=1e-12)
    W = AnalyticClassifier.from_statistics(snapshot, gamma=1.0).weights_
    np.testing.assert_allclose(W, closed_form(H1, Y1), rtol=1e-10, atol=1e-12)


def test_learner_built_from_statistics_is_not_moved_by_its_sources_partial_fit():
    source = AnalyticClassifier(gamma=1.0).partial_fit(H1, Y1)
    clone = AnalyticClassifier.from_statistics(source.statistics_, gamma=1.0)
    source.partial_fit(H2, Y2)
    assert clone.n_samples_seen_ == 40
    np.testing.assert_allclose(clone.weights_, closed_form(H1, Y1), rtol=1e-10, atol=1e-12)


def test_from_statistics_learner_is_not_moved_by_the_callers_in_place_add():
    s = RidgeStatistics.from_batch(H1, Y1)
    clf = AnalyticClassifier.from_statistics(s, gamma=1.0)
    s += RidgeStatistics.from_batch(H2, Y2)  # the caller goes on summing its own statistics
    assert clf.n_samples_seen_ == 40
    np.testing.assert_allclose(clf.weights_, closed_form(H1, Y1), rtol=1e-10, atol=1e-12)


def test_from_statistics_learner_partial_fit_leaves_the_callers_statistics():
    s = RidgeStatistics.from_batch(H1, Y1)
    clf = AnalyticClassifier.from_statistics(s, gamma=1.0)
    clf.partial_fit(H2, Y2)
    np.testing.assert_allclose(clf.weights_, closed_form(np.vstack([H1, H2]), np.concatenate([Y1, Y2])), rtol=1e-10,
                               atol=1e-12)
    assert s.n == 40
    np.testing.assert_allclose(s.G, H1.T @ H1, rtol=1e-12, atol=1e-12)  # the caller's sums: still its 40 rows


@pytest.mark.parametrize(("first", "second"), [
    (Y1, np.array(["a", "b", "c"])[Y2]),
    (np.array(["a", "b", "c"])[Y1], Y2),
    (Y1 + 2**62, Y2 + 0.5),
], ids=["int+str", "str+int", "bigint+fraction"])
def test_adding_statistics_of_other_label_kinds_is_a_foal_refusal(first, second):
    a, b = RidgeStatistics.from_batch(H1, first), RidgeStatistics.from_batch(H2, second)
    with pytest.raises(FoalPipeError):
        a + b  # noqa: B018 (the refusal is the result)
    with pytest.raises(FoalPipeError):
        a += b


def test_statistics_of_mixed_object_classes_are_a_foal_refusal():
    G, Q = H1.T @ H1, H1.T @ (Y1[:, None] == [0, 1, 2]).astype(float)
    with pytest.raises(FoalPipeError):
        RidgeStatistics(G, Q, np.array([0, "a", 2.5], dtype=object), 40)


@pytest.mark.parametrize("classes", [[0.0, 1.0, np.nan], [0.0, np.nan, np.nan]], ids=["one-nan", "two-nans"])
def test_from_statistics_refuses_nan_classes(classes):
    G, Q = H1.T @ H1, H1.T @ (Y1[:, None] == [0, 1, 2]).astype(float)
    with pytest.raises(FoalPipeError):
        AnalyticClassifier.from_statistics(RidgeStatistics(G, Q, np.array(classes), 40), gamma=1.0).predict(H1)


def test_from_statistics_class_with_sums_but_zero_count_is_refused_or_predicted():
    G, Q = H1.T @ H1, H1.T @ (Y1[:, None] == [0, 1, 2]).astype(float)
    assert np.abs(Q[:, 2]).max() > 0  # class 2 has rows: its column sums their activations
    counts = [int((Y1 == 0).sum()) + int((Y1 == 2).sum()), int((Y1 == 1).sum()), 0]  # sums to n, but 0 for class 2
    try:
        clf = AnalyticClassifier.from_statistics(RidgeStatistics(G, Q, [0, 1, 2], 40, counts), gamma=1.0)
    except FoalPipeError:
        return  # refused: the counts contradict Q
    expected = np.array([0, 1, 2])[np.argmax(H1 @ closed_form(H1, Y1), axis=1)]
    assert (expected == 2).any()
    np.testing.assert_array_equal(clf.predict(H1), expected)


def _loaded_with_projection(tmp_path, name, seed, X, y):
    projection = SmoothProjection(n_components=8, random_state=seed).fit(X)
    path = tmp_path / f"{name}.safetensors"
    AnalyticClassifier(gamma=1.0).partial_fit(projection.transform(X), y).save(path, projection=projection,
                                                                                 class_names=["x", "y", "z"])
    return AnalyticClassifier.load(path), projection


def test_merge_refuses_loaded_learners_of_different_projections(tmp_path):
    X1, X2 = np.hstack([H1, H1[:, :1]]), np.hstack([H2, H2[:, :1]])
    first, p1 = _loaded_with_projection(tmp_path, "a", 1, X1, Y1)
    second, p2 = _loaded_with_projection(tmp_path, "b", 2, X2, Y2)
    assert not np.allclose(p1.components_, p2.components_)  # two feature spaces
    with pytest.raises(FoalPipeError):
        first.merge(second)


def test_merge_of_loaded_learners_saves_a_deployable_model(tmp_path):
    X1, X2 = np.hstack([H1, H1[:, :1]]), np.hstack([H2, H2[:, :1]])
    first, projection = _loaded_with_projection(tmp_path, "a", 1, X1, Y1)
    second, _ = _loaded_with_projection(tmp_path, "b", 1, X2, Y2)  # the same seed: the same projection
    merged = first.merge(second)
    merged.save(tmp_path / "merged.safetensors")
    deployed = load_model(tmp_path / "merged.safetensors")
    np.testing.assert_array_equal(deployed.projection.components_, projection.components_)
    F = np.vstack([projection.transform(X1), projection.transform(X2)])
    np.testing.assert_allclose(deployed.classifier.weights_, closed_form(F, np.concatenate([Y1, Y2])), rtol=1e-9, atol=1e-12)


def test_statistics_are_read_under_the_learners_lock(monkeypatch) -> None:
    """A ``partial_fit`` in another thread adds to ``G`` and then to ``Q`` and ``n``: ``statistics_`` (and so
    ``merge``) read beside it waits for the call, and gets sums and a row count of one moment (before, ``G`` of 70
    rows with ``n`` of 40 where the read fell between)."""
    import threading

    import foal_pipe.core.statistics as statistics_module

    rng = np.random.default_rng(4)
    H, y = rng.normal(size=(70, 5)), np.arange(70) % 3
    clf = AnalyticClassifier().fit(H[:40], y[:40])
    original, inside, release = statistics_module._added, threading.Event(), threading.Event()

    def paused(a, b):
        out = original(a, b)
        if not inside.is_set():  # the first sum of the call (G): the others wait
            inside.set()
            release.wait(5)
        return out

    monkeypatch.setattr(statistics_module, "_added", paused)
    writer = threading.Thread(target=clf.partial_fit, args=(H[40:], y[40:]))
    writer.start()
    assert inside.wait(5)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(clf.statistics_))
    reader.start()
    reader.join(0.5)
    release.set()
    writer.join(5)
    reader.join(5)
    snapshot = got[0]
    G = np.asarray(snapshot.G)
    np.testing.assert_allclose(G, H[: snapshot.n].T @ H[: snapshot.n], rtol=1e-12, atol=1e-12)  # G of its own n rows
    assert snapshot.n == 70
