"""Audit (session 30), second pass over class labels and class names end to end: ``FileRecord`` joins (merges of
loaded learners), ``columns_checked()`` (DeployedModel skipping scikit-learn's column checks), ``DeployedModel``
(``named``, the ``class_names`` getter, ``partial_fit`` checking names first), ``load_model``'s
``feature_names_in_``, ``write_store``'s label checks and ``learn --init-model``'s names.

Faults found (each test below fails on the code as audited, for its reason; all six fixed in session 30: load_model's
classifier keeps its file's record for merges, merges compare names both ways and keep the ids they name, a DeployedModel
behind an identity checks its classifier's columns too, names refused in one line for a classifier of other labels,
write_store reads booleans among ids):

1. ``AnalyticClassifier.load(a).merge(load_model(b).classifier)`` (two files of one projection naming ids [0, 1]
   ['ant', 'bee'] and ['bee', 'ant']): expected refused, as ``AnalyticClassifier.load(b)`` is ("label 0 is class 'ant'
   in one model file and 'bee' in the other"); actual: merged silently, one file's 'bee' rows added to the 'ant'
   column, the saved file predicting 'bee' for 'ant' rows. Cause: ``load_model`` builds its classifier with
   ``AnalyticClassifier.from_model`` and sets no ``_recorded`` (FileRecord), so ``merge`` has one record and keeps it
   (``merged._recorded = records[0] or records[1]``) with no names to compare.
2. Three-way merge ``a.merge(b).merge(d)``: a names ids 0..2 ['ant', 'bee', 'cow'], b (saved from Python without
   names) holds ids 0..3, d names ids 0..3 ['cow', 'dog', 'eel', 'fox']. Expected: refused, as ``a.merge(d)`` is
   (label 0 is 'ant' in one file and 'cow' in the other); actual: saved with d's names, a's 'ant' rows named 'cow'.
   Cause: ``filerecord._names_by_id`` returns None for a merge's record whose ``class_names`` are short of a name
   (b names none), so ``FileRecord.joined`` compares nothing and takes d's names.
3. ``a.merge(b)`` of two files that name one class at two ids ('ant' is id 0 in a, id 2 in b, b's ids [2, 3]
   ['ant', 'cow']): expected refused at the merge naming the class (or matched by name); actual: merged, the 'ant'
   rows split over two columns, and ``save`` refused with a reader's advice that does not fit ("metadata
   'class_names' (...) names 'ant' twice; pass a model.safetensors written by `foal-pipe learn` ... or train it
   again"). Cause: ``FileRecord.joined`` checks one label id named two ways, not one name at two ids.
4. ``DeployedModel(clf, identity_projection, names)`` where the identity projection was fitted on a DataFrame of
   columns ['a', 'b', 'c'] and ``clf`` on the same frame's columns in another order ['c', 'b', 'a']: expected
   refused (the classifier alone refuses ``df[['a', 'b', 'c']]``); actual: ``predict(df)`` accepted and scored with the
   columns swapped (accuracy 1/3 against 1.0), and saved and loaded so. Cause: ``DeployedModel._check_columns`` checks
   the projection's names only when the projection has some, and ``columns_checked()`` then skips the classifier's.
5. ``DeployedModel`` over an ``AnalyticClassifier`` fitted on string labels (``predict_names`` works):
   ``partial_fit(X, ['dog', ...])`` (or a known name) raises NumPy's ``UFuncTypeError`` ("ufunc 'maximum' did not
   contain a loop ...") instead of a one-line FoalPipeError (or learning the rows). Cause: ``DeployedModel.label_ids``
   computes ``int(known.max()) + 1`` over the classifier's (string) ``classes_``.
6. ``write_store(path, (x, [0, True, 2, 1]), ...)``: expected refused as all-boolean labels are ("labels are
   booleans, not class ids"; the docstring: "a boolean (written as id 0 or 1)" is refused); actual: written, True as
   label id 1 (a list or object array mixing bools and ints is read by NumPy as int64 before the bool check).

Checked and found to hold (guards below for the cheap ones): ``learn --init-model`` of a ridge model and of every
head (ncm, slda, fecam, balanced, dual, cosine) over a store of the model's classes in another order plus a new one
(['cow', 'dog', 'ant'] over ['ant', 'bee', 'cow']): the continued model's names, ids and predictions equal
``DeployedModel.partial_fit`` by name; ``predict --features`` refusing such a store in one line (ids disagree);
pickling a loaded ``DeployedModel`` (names, ``predict_names``, ``partial_fit`` of a new class, column checks kept);
``classes_`` and ``decision_function`` columns for unsorted ``partial_fit(classes=...)`` of strings and ints;
DataFrames reordered, with a column missing or extra, or with NFD column names refused by the estimators and by every
``DeployedModel`` entry (predict, predict_names, best, scores, predict_proba, activations, partial_fit), also after
save & load (both ``estimators``) and pickle; a plain classifier's column check in a thread while another thread runs
``DeployedModel.predict`` (the ContextVar is per thread); label containers through ``DeployedModel.partial_fit``
(pandas Int64, Categorical of ints and of names, string, uint64, object ints; NA, bools, bytes, mixes, dicts and 2-D
refused); merges of loaded learners with fresh ones, after pickle / deepcopy, ``fit`` anew forgetting the file's
names; the ``class_names`` getter refusing after ``classifier.fit`` with other ids or a declared class.

Observations, not tested: a model saved from Python without names that ``partial_fit`` gives one named class saves
its id names '0', '1', ... as real names, so a store of its original classes matched by name is then all unknown
(``store_predictions`` true = -1), or refused by ``predict --features``; ``DeployedModel`` refusing NFD column names
prints both lists alike ("(['café', 'b', 'c'] against ['café', 'b', 'c'])").
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import foal_pipe
from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.deploy import DeployedModel
from foal_pipe.model.modelfile import read_model


def _rows(labels: np.ndarray, width: int = 4, seed: int = 0) -> np.ndarray:
    """Rows near a class-dependent mean, so that predictions follow the labels."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(labels.size, width)) + 3.0 * np.eye(8, width)[labels]


# --- 1. merge of a loaded learner with load_model's classifier --------------------------------------------------------

def test_merge_with_load_models_classifier_compares_class_names(tmp_path):
    """Files of one projection naming ids [0, 1] ['ant', 'bee'] and ['bee', 'ant']. Expected: the merge refused, as
    it is for two ``AnalyticClassifier.load`` learners (or matched by name). Actual: merged, saved, and the merged
    model names 'ant' rows 'bee' (``load_model``'s classifier carries no FileRecord)."""
    y = np.arange(60) % 2
    X = np.where(y[:, None] == 0, _rows(np.zeros(60, int)), _rows(np.ones(60, int), seed=3))
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    H = projection.transform(X)
    AnalyticClassifier().fit(H[:30], y[:30]).save(tmp_path / "a.safetensors", projection=projection,
                                                   class_names=["ant", "bee"])
    AnalyticClassifier().fit(H[30:], 1 - y[30:]).save(tmp_path / "b.safetensors", projection=projection,
                                                       class_names=["bee", "ant"])
    with pytest.raises(FoalPipeError, match="cannot merge"):
        AnalyticClassifier.load(tmp_path / "a.safetensors").merge(AnalyticClassifier.load(tmp_path / "b.safetensors"))
    a = AnalyticClassifier.load(tmp_path / "a.safetensors")
    b = foal_pipe.load_model(tmp_path / "b.safetensors").classifier
    try:
        merged = a.merge(b)
    except FoalPipeError:
        return  # refused: the files name their ids differently
    merged.save(tmp_path / "m.safetensors")
    assert foal_pipe.load_model(tmp_path / "m.safetensors").predict_names(X[:8]) == list(np.array(["ant", "bee"])[y[:8]])


# --- 2. a three-way merge through a file without names -----------------------------------------------------------------

def test_three_way_merge_through_an_unnamed_file_compares_the_names_it_has(tmp_path):
    """a names ids 0..2 ['ant', 'bee', 'cow'], b (no names) holds ids 0..3, d names 0..3 ['cow', 'dog', 'eel', 'fox'].
    Expected: ``a.merge(b).merge(d)`` refused as ``a.merge(d)`` is (label 0 named 'ant' and 'cow'). Actual: saved with
    d's names: a's 'ant' rows in the class named 'cow' (the merge's record names are short, so none are compared)."""
    y = np.arange(60) % 3
    X = _rows(y)
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    H = projection.transform(X)
    with_3 = np.where(np.arange(20) < 3, 3, y[:20])
    AnalyticClassifier().fit(H[:20], y[:20]).save(tmp_path / "a.safetensors", projection=projection,
                                                   class_names=["ant", "bee", "cow"])
    AnalyticClassifier().fit(H[20:40], with_3).save(tmp_path / "b.safetensors", projection=projection)
    AnalyticClassifier().fit(H[40:], with_3).save(tmp_path / "d.safetensors", projection=projection,
                                                   class_names=["cow", "dog", "eel", "fox"])

    def load(name: str) -> AnalyticClassifier:
        return AnalyticClassifier.load(tmp_path / f"{name}.safetensors")

    with pytest.raises(FoalPipeError, match="label 0 is class 'ant'"):
        load("a").merge(load("d"))
    try:
        merged = load("a").merge(load("b")).merge(load("d"))
        merged.save(tmp_path / "m.safetensors")
    except FoalPipeError:
        return  # refused: a and d name label 0 differently
    names = read_model(tmp_path / "m.safetensors")[1].get("class_names")
    pytest.fail(f"merged and saved with class_names {names}: a's 'ant' rows now named {names[0]!r}")


# --- 3. one class name at two label ids --------------------------------------------------------------------------------

def test_merge_of_files_naming_one_class_at_two_ids_is_refused_at_the_merge(tmp_path):
    """'ant' is id 0 in a (['ant', 'bee']) and id 2 in b (ids [2, 3] ['ant', 'cow']). Expected: ``a.merge(b)`` refused
    naming the class (one class's rows would split over two columns), or merged by name so the result saves. Actual:
    merged; its ``save`` refused with a reader's advice ("pass a model.safetensors written by `foal-pipe learn`")."""
    y = np.arange(60) % 2
    X = _rows(y)
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    AnalyticClassifier().fit(projection.transform(X[:30]), y[:30]).save(tmp_path / "a.safetensors", projection=projection,
                                                                         class_names=["ant", "bee"])
    yb = np.arange(30) % 2
    Xb = _rows(np.where(yb == 0, 0, 2), seed=1)
    AnalyticClassifier().fit(projection.transform(Xb), yb + 2).save(tmp_path / "b.safetensors", projection=projection,
                                                                     class_names=["ant", "cow"])
    a, b = AnalyticClassifier.load(tmp_path / "a.safetensors"), AnalyticClassifier.load(tmp_path / "b.safetensors")
    try:
        merged = a.merge(b)
    except FoalPipeError as exc:
        assert "ant" in str(exc)
        return
    merged.save(tmp_path / "m.safetensors")  # fails today: "names 'ant' twice; pass a model.safetensors written by ..."
    names = read_model(tmp_path / "m.safetensors")[1]["class_names"]
    assert len(set(names)) == len(names)


# --- 4. an identity projection's columns and the classifier's other order ------------------------------------------------

def test_deployed_model_refuses_a_classifier_of_other_column_order_behind_an_identity_projection():
    """Identity projection fitted on columns ['a', 'b', 'c'], classifier on ['c', 'b', 'a']. Expected: refused in one
    line (at construction or at predict), as the classifier alone refuses ``df[['a', 'b', 'c']]``. Actual: predicted
    with the columns swapped (``_check_columns`` checks the projection's names; ``columns_checked`` skips the
    classifier's)."""
    import pandas as pd
    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    df = pd.DataFrame(rng.normal(size=(60, 3)) + 3 * np.eye(3)[y], columns=["a", "b", "c"])
    identity = SmoothProjection(n_components=0, activation="identity").fit(df)
    clf = AnalyticClassifier().fit(df[["c", "b", "a"]], y)
    with pytest.raises(FoalPipeError):
        clf.predict(df)  # the classifier alone refuses the other order
    try:
        model = DeployedModel(clf, identity, ["x", "y", "z"])
        predicted = model.predict(df)
    except FoalPipeError:
        return
    np.testing.assert_array_equal(predicted, clf.predict(df[["c", "b", "a"]]))


# --- 5. DeployedModel over a string-labelled classifier ------------------------------------------------------------------

@pytest.mark.parametrize("labels", [["dog"] * 3, ["bee"] * 3])
def test_partial_fit_of_a_string_labelled_deployed_model_answers_in_one_line(labels):
    """Expected: learned, or a one-line FoalPipeError (the model wants integer ids). Actual: NumPy's UFuncTypeError
    ("ufunc 'maximum' did not contain a loop ...": ``label_ids`` takes ``int(classes_.max()) + 1`` of strings)."""
    y = np.arange(60) % 3
    X = _rows(y, 5)
    projection = SmoothProjection(n_components=12, random_state=0).fit(X)
    names = np.array(["ant", "bee", "cow"])
    try:
        model = DeployedModel(AnalyticClassifier().fit(projection.transform(X), names[y]), projection, list(names))
        assert model.predict_names(X[:3]) == ["ant", "bee", "cow"]
        model.partial_fit(X[:3], labels)
    except FoalPipeError:
        return


# --- 6. write_store and labels that mix booleans and ids -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["list", "object"])
def test_write_store_refuses_a_boolean_among_integer_labels(tmp_path, kind):
    """Expected: refused as all-boolean labels are (a boolean is no class id). Actual: written, True as id 1."""
    from foal_pipe.store import write_store

    x = np.random.default_rng(0).normal(size=(4, 3))
    labels = [0, True, 2, 1] if kind == "list" else np.array([0, True, 2, 1], dtype=object)
    with pytest.raises(FoalPipeError, match="write_store: train labels are booleans"):
        write_store(tmp_path / "bools.zarr", ([[1.0] * 3] * 4, [True, False, True, False]), (x, [0, 1, 2, 0]),
                    ["a", "b", "c"])
    with pytest.raises(FoalPipeError, match="bool"):
        write_store(tmp_path / "s.zarr", (x, labels), (x, [0, 1, 2, 0]), ["a", "b", "c"])
    assert not (tmp_path / "s.zarr").exists()


# --- guards: what held ----------------------------------------------------------------------------------------------------

def test_guard_a_plain_classifier_checks_columns_while_another_thread_predicts_through_a_deployed_model():
    """``columns_checked()`` is per thread: a plain classifier's DataFrame check still refuses reordered columns (and
    warns of unnamed rows) while another thread runs ``DeployedModel.predict``."""
    import pandas as pd
    y = np.arange(60) % 3
    X = _rows(y, 5)
    df = pd.DataFrame(X, columns=list("abcde"))
    projection = SmoothProjection(n_components=10, random_state=0).fit(df)
    model = DeployedModel(AnalyticClassifier().fit(projection.transform(df), y), projection, ["x", "y", "z"])
    plain = AnalyticClassifier().fit(df, y)
    seen: dict[str, object] = {}
    stop = threading.Event()

    def deployed() -> None:
        while not stop.is_set():
            model.predict(X)

    def checks() -> None:
        refused = []
        for _ in range(30):
            try:
                plain.predict(df[list("edcba")])
                refused.append(False)
            except FoalPipeError:
                refused.append(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plain.predict(X)
        seen["refused"], seen["warned"] = all(refused), any("feature names" in str(w.message) for w in caught)

    threads = [threading.Thread(target=deployed), threading.Thread(target=checks)]
    threads[0].start()
    threads[1].start()
    threads[1].join()
    stop.set()
    threads[0].join()
    assert seen == {"refused": True, "warned": True}


def test_guard_a_pickled_deployed_model_keeps_names_and_learns_a_new_class(tmp_path):
    import pickle

    y = np.arange(60) % 3
    X = _rows(y, 5)
    projection = SmoothProjection(n_components=12, random_state=0).fit(X)
    AnalyticClassifier().fit(projection.transform(X), y).save(tmp_path / "m.safetensors", projection=projection,
                                                               class_names=["ant", "bee", "cow"])
    model = pickle.loads(pickle.dumps(foal_pipe.load_model(tmp_path / "m.safetensors")))
    assert model.predict_names(X[:3]) == ["ant", "bee", "cow"]
    model.partial_fit(_rows(np.full(20, 3), 5, seed=2), ["dog"] * 20)
    assert model.class_names == ["ant", "bee", "cow", "dog"]
    assert model.predict_names(_rows(np.full(3, 3), 5, seed=4)) == ["dog"] * 3


def test_guard_init_model_over_a_store_of_other_class_order_names_classes_as_partial_fit_does(tmp_path):
    from foal_pipe.protocol import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, run_learn
    from foal_pipe.protocol.entry import LearnSettings, learn
    from foal_pipe.store import write_store

    y = np.arange(60) % 3
    x = _rows(y, 6)
    first = write_store(tmp_path / "a.zarr", (x, y), (x[:15], y[:15]), ["ant", "bee", "cow"], chunk_rows=16)
    run_learn(first, tmp_path / "run", StreamConfig(tasks=1), ModelConfig(projection_dim=12, gamma=0.5),
              EvaluationConfig(), ExecutionConfig(backend="numpy"), log=lambda _: None)
    model = tmp_path / "run" / "model.safetensors"
    ys = np.arange(60) % 3
    xs = _rows(np.array([2, 3, 0])[ys], 6, seed=1)  # store ids: 0 'cow', 1 'dog', 2 'ant'
    second = write_store(tmp_path / "b.zarr", (xs, ys), (xs[:15], ys[:15]), ["cow", "dog", "ant"], chunk_rows=16)
    learn(second, tmp_path / "next", LearnSettings(stream=StreamConfig(tasks=1), model=ModelConfig(),
                                                   execution=ExecutionConfig(backend="numpy"), init_model=model),
          log=lambda _: None)
    continued = foal_pipe.load_model(tmp_path / "next" / "model.safetensors")
    in_python = foal_pipe.load_model(model).partial_fit(xs, np.array(["cow", "dog", "ant"])[ys])
    assert continued.class_names == in_python.class_names == ["ant", "bee", "cow", "dog"]
    truth = np.array([2, 3, 0])[ys]  # the means: 'ant' 0, 'bee' 1, 'cow' 2, 'dog' 3
    assert continued.predict_names(xs) == in_python.predict_names(xs)
    assert np.mean(np.array(continued.predict_names(xs)) == np.array(["ant", "bee", "cow", "dog"])[truth]) > 0.9
