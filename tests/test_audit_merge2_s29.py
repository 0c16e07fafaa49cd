"""Audit (session 29, second pass) of the uncommitted merge / class-name / column-check changes: ``FileRecord.joined``
(``AnalyticClassifier.merge`` of two learners loaded from model files), ``joined_classes``, ``DeployedModel.class_names``'
refusal and ``named``, ``load_model``'s ``feature_names_in_`` with ``columns_checked``, ``predict --features``' NFC
match and ``check_solution``'s power-of-two scaling.

Checked and found to hold (no failing test): ``learn`` / ``predict`` / ``learn --init-model`` (ridge and slda) /
``evaluate`` outputs byte-identical to the committed code (CSV, model files, stdout; metrics.json differs only by the
``init_model`` path); a three-way merge of loaded files then ``learn --init-model`` on a fourth store (rows 180 + 60,
no ``rows_outside_stores``, each merged store refused again); merged then ``DeployedModel.partial_fit`` then save
(``rows_outside_stores`` = the new rows), merged then ``classifier.partial_fit`` then save; fresh + loaded merges in
either order and three-way with a fresh middle (the fresh rows counted outside stores once); ``load_model(p).classifier``
against ``AnalyticClassifier.load(p)`` with DataFrames (identity projection and feature names behind a projection: the
same ``feature_names_in_``, the same refusal of reordered columns, the same warning for NumPy rows), no warnings from
``DeployedModel.predict/partial_fit/scores/predict_proba/best/predict_names``; ``columns_checked`` is a ContextVar reset
in ``finally`` (no generator methods are decorated; other threads keep scikit-learn's checks); F- against C-ordered
features give the same scores as before the change; head models (slda, continued slda) and ridge through
``partial_fit`` of a new name, ``predict_names``, pickle, deepcopy, copy, save and reload; 3 threads of
``partial_fit`` (new names) / ``predict_names`` / ``best`` / ``label_ids`` (no spurious refusal of the new getter).

Faults found (each test below failed on the code as audited; all fixed in session 29):

1. ``a.merge(b)`` where ``a``'s file has no projection and ``b``'s has one (``same_projection`` lets them merge): the
   merged record takes ``b``'s projection with ``a``'s metadata, so ``save`` records ``b``'s relu projection with the
   activation 'sigmoid' (``FileRecord.kept`` defaults it): the reloaded model scores 0.79 away from the learner of both
   streams (``FileRecord.joined``: ``metadata = dict(self.metadata)`` while the projection may be ``other``'s).
2. ``FileRecord.joined`` unions ``learned_from`` but not ``learned_data``: the merged file keeps only the first
   file's data identities, so ``learn --init-model`` of the merged file on a re-extraction of the second file's store
   (new generation, same data identity) is not refused, and its rows count twice.
3. A loaded learner whose ``partial_fit`` added a class, merged with a loaded learner whose file names the ids
   differently: no refusal (``_names_by_id`` gives None for the stale names, so nothing is compared) and the merged
   file names the first learner's 'ant' rows 'bee' (the other file's names), the fault the join was meant to refuse.
4. ``a.merge(b)`` of a file without an encoder (saved from Python, same projection) and a ``learn`` file: the merged
   file records no encoder, ``b.merge(a)`` records ``b``'s (other keys are only ``self``'s).
5. Merging two loaded learners that learned the same store (one file loaded twice) is not refused: every row of the
   store is in the sums twice (``n_samples_seen`` 60 for a 30-row store) while the merged file records the store once
   and no rows outside stores, the double counting ``learn --init-model`` refuses.
6. ``check_solution`` of a correct solve whose sums are subnormal (``max|G|`` 5e-313, gamma 1) raises a bare
   ``OverflowError`` ("math range error": ``math.ldexp(gamma, shift)`` in ``solutioncheck.unsolved``) where the
   committed check accepted it; an edited gamma raises the same instead of the one-line refusal (``np.ldexp(Q,
   shift)`` overflows too).
7. Merge order decides the names: a file without names (ids [0, 1, 2]) merged with one naming [0, 1] 'ant', 'bee':
   ``unnamed.merge(named).save`` writes no class names (the other file's silently dropped), ``named.merge(unnamed)
   .save`` is refused with "the loaded model file named 2 classes, but the model has 3 now (partial_fit added
   classes)", which no ``partial_fit`` did (``FileRecord.joined`` keeps ``self``'s metadata when the names do not
   cover the merged classes).
8. ``learn --init-model`` of a model file that records no class names but the stores it learned (a loaded model whose
   ``metadata`` names were dropped, then saved: ``named`` False) on a store lacking some of its classes crashes with a
   bare ``KeyError: 0`` (``continuation.continued_outputs`` now takes names from the store only when the model is not
   ``named``); the committed code continued it (class names ['0', '1', '2', 'x']).
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

import foal_pipe
from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import check_solution, read_model

ENCODER = {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}


def _rows(labels: np.ndarray, width: int = 5, seed: int = 0) -> np.ndarray:
    """Rows near a class-dependent mean, so that predictions follow the labels."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(labels.size, width)) + 3.0 * np.eye(8, width)[labels]


def _two_files(tmp_path: Path, first: dict, second: dict, activation: str = "sigmoid"):
    """Two learners of one projection on halves of 60 rows, saved with the given keywords (``projection``: True to
    record the projection)."""
    y = np.arange(60) % 3
    X = _rows(y)
    projection = SmoothProjection(n_components=8, activation=activation, random_state=0).fit(X)
    H = projection.transform(X)
    paths = []
    for name, rows, kw in (("a", slice(0, 30), first), ("b", slice(30, 60), second)):
        kw = dict(kw)
        if kw.pop("projection", True):
            kw["projection"] = projection
        AnalyticClassifier().fit(H[rows], y[rows]).save(tmp_path / f"{name}.safetensors", **kw)
        paths.append(tmp_path / f"{name}.safetensors")
    return X, y, H, projection, paths


# --- 1. the other file's projection saved with this file's activation -------------------------------------------------

def test_merge_records_the_activation_of_the_projection_it_keeps(tmp_path):
    """a: saved without a projection; b: with a relu projection. Expected: the merged file records b's projection with
    'relu' (or no projection, as the committed code saved it), so ``load_model`` of it scores as the learner of both
    streams. Actual: activation 'sigmoid' beside b's relu matrix, scores 0.79 away (``FileRecord.joined`` takes
    ``other.projection`` with ``self.metadata``, which has no activation; ``kept`` defaults it to sigmoid)."""
    X, y, H, projection, (pa, pb) = _two_files(tmp_path, {"projection": False}, {}, activation="relu")
    merged = AnalyticClassifier.load(pa).merge(AnalyticClassifier.load(pb))
    merged.save(tmp_path / "m.safetensors")
    tensors, meta = read_model(tmp_path / "m.safetensors")
    if "projection" not in tensors:
        return  # saved without a projection: nothing claims an activation
    assert meta.get("activation") == "relu", meta.get("activation")
    both = AnalyticClassifier().fit(H, y)
    np.testing.assert_allclose(foal_pipe.load_model(tmp_path / "m.safetensors").scores(X), both.class_scores(H),
                               atol=1e-9)


# --- 2. learned_data not joined ---------------------------------------------------------------------------------------

def test_merge_records_both_files_learned_data(tmp_path):
    """Expected: the merged file records both files' ``learned_data`` (as it records both ``learned_from``), so
    continuing it on a re-extraction of b's store (a new generation, b's data identity 'db') is refused, as b's own
    file refuses it. Actual: ``learned_data`` ['da'] only and ``check_new_rows`` lets the store through (its rows
    would count twice); ``FileRecord.joined`` joins ``learned_from`` only."""
    from foal_pipe.protocol.newrows import check_new_rows
    from foal_pipe.store import write_store

    _, _, _, _, (pa, pb) = _two_files(tmp_path, {"learned_from": ["a" * 64], "learned_data": ["da"]},
                                      {"learned_from": ["b" * 64], "learned_data": ["db"]})
    AnalyticClassifier.load(pa).merge(AnalyticClassifier.load(pb)).save(tmp_path / "m.safetensors")
    y = np.arange(12) % 3
    real = write_store(tmp_path / "s.zarr", (_rows(y), y), (_rows(y), y), ["0", "1", "2"], chunk_rows=16)
    again = types.SimpleNamespace(meta=types.SimpleNamespace(generation="c" * 64, format_version=3),
                                  data_identity=lambda: "db", path=Path(real))  # b's rows, extracted again
    with pytest.raises(FoalPipeError):
        check_new_rows(foal_pipe.load_model(pb), again, "b-again.zarr", "b.safetensors")
    assert set(read_model(tmp_path / "m.safetensors")[1].get("learned_data", [])) == {"da", "db"}
    with pytest.raises(FoalPipeError):
        check_new_rows(foal_pipe.load_model(tmp_path / "m.safetensors"), again, "b-again.zarr", "m.safetensors")


# --- 3. names not compared once partial_fit added a class -------------------------------------------------------------

def test_merge_compares_names_after_partial_fit_added_a_class(tmp_path):
    """a's file: ids [0, 1] named ['ant', 'bee']; a then learns id 2. b's file: [0, 1, 2] named ['bee', 'ant', 'cow'].
    Expected: the merge refused (id 0 is 'ant' in one file and 'bee' in the other), as it is without a's extra class.
    Actual: merged, and the merged file names id 0 'bee': a's 'ant' rows become 'bee' (``_names_by_id`` returns None
    for a's names, whose length no longer fits its classes, so ``joined`` compares nothing and takes b's)."""
    y = np.arange(90) % 3
    X = _rows(y)
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    H = projection.transform(X)
    two = y[:30] < 2
    AnalyticClassifier().fit(H[:30][two], y[:30][two]).save(tmp_path / "a.safetensors", projection=projection,
                                                            class_names=["ant", "bee"])
    AnalyticClassifier().fit(H[30:60], y[30:60]).save(tmp_path / "b.safetensors", projection=projection,
                                                      class_names=["bee", "ant", "cow"])
    b = AnalyticClassifier.load(tmp_path / "b.safetensors")
    with pytest.raises(FoalPipeError):  # without the extra class: refused
        AnalyticClassifier.load(tmp_path / "a.safetensors").merge(b)
    a = AnalyticClassifier.load(tmp_path / "a.safetensors")
    a.partial_fit(H[60:][y[60:] == 2], y[60:][y[60:] == 2])
    try:
        merged = a.merge(b)
        merged.save(tmp_path / "m.safetensors")
    except FoalPipeError:
        return  # refused: the files name id 0 differently
    names = read_model(tmp_path / "m.safetensors")[1].get("class_names")
    assert names is None or names[0] == "ant", names  # a's id-0 rows are 'ant'


# --- 4. the other file's encoder dropped ------------------------------------------------------------------------------

def test_merge_keeps_the_encoder_whichever_side_records_it(tmp_path):
    """Expected: ``a.merge(b)`` records b's encoder when a's file records none, as ``b.merge(a)`` does (the merged
    sums hold rows of b's encoder). Actual: ``a.merge(b)`` records no encoder (``FileRecord.joined`` refuses two
    different encoders but takes only ``self``'s metadata), ``b.merge(a)`` records it."""
    _, _, _, _, (pa, pb) = _two_files(tmp_path, {}, {"encoder": ENCODER})
    a, b = AnalyticClassifier.load(pa), AnalyticClassifier.load(pb)
    b.merge(a).save(tmp_path / "ba.safetensors")
    a.merge(b).save(tmp_path / "ab.safetensors")
    assert read_model(tmp_path / "ba.safetensors")[1].get("encoder") == ENCODER
    assert read_model(tmp_path / "ab.safetensors")[1].get("encoder") == ENCODER


# --- 5. two loaded learners of one store --------------------------------------------------------------------------------

def test_merge_of_two_learners_of_one_store_is_refused(tmp_path):
    """One file (30 rows of store 'a...') loaded twice and merged. Expected: refused, as ``learn --init-model`` on a
    store the file learned is refused (every row would count twice). Actual: merged, ``n_samples_seen`` 60 for the
    30-row store, the merged file records the store once and no rows outside stores (``FileRecord.joined`` unions
    ``learned_from`` without comparing them)."""
    _, _, _, _, (pa, _) = _two_files(tmp_path, {"learned_from": ["a" * 64]}, {})
    try:
        merged = AnalyticClassifier.load(pa).merge(AnalyticClassifier.load(pa))
    except FoalPipeError:
        return
    merged.save(tmp_path / "m.safetensors")
    meta = read_model(tmp_path / "m.safetensors")[1]
    assert meta["n_samples_seen"] == 30, (meta["n_samples_seen"], meta.get("learned_from"),
                                          meta.get("rows_outside_stores"))


# --- 6. check_solution's scaling overflows -----------------------------------------------------------------------------

def test_check_solution_of_subnormal_sums_accepts_the_solve_or_refuses_in_one_line():
    """Sums of rows near 1e-157 (``max|G|`` 5e-313, subnormal), gamma 1, ``W`` solved by NumPy. Expected: accepted,
    as the committed check accepted it, and an edited gamma refused with a FoalPipeError. Actual: ``OverflowError``
    "math range error" for both (``solutioncheck.unsolved``: ``math.ldexp(gamma, shift)`` with shift ~1037)."""
    A = np.random.default_rng(0).normal(size=(50, 4)) * 1e-157
    G, Q = A.T @ A, A.T @ np.eye(3)[np.arange(50) % 3]
    W = np.linalg.solve(G + np.eye(4), Q)
    check_solution(W, G, Q, 1.0)
    with pytest.raises(FoalPipeError):
        check_solution(W, G, Q, 2.0)


# --- 7. merge order decides whether names are dropped or refused -------------------------------------------------------

def test_merge_order_does_not_decide_whether_class_names_are_dropped(tmp_path):
    """Expected: ``u.merge(n)`` and ``n.merge(u)`` (u: no names, ids [0, 1, 2]; n: [0, 1] named 'ant', 'bee') end
    alike: both saved with the same names, or both refused. Actual: ``u.merge(n).save`` writes no class names (n's
    dropped), ``n.merge(u).save`` is refused naming a ``partial_fit`` that never ran."""
    y = np.arange(60) % 3
    X = _rows(y)
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    H = projection.transform(X)
    AnalyticClassifier().fit(H[:30], y[:30]).save(tmp_path / "u.safetensors", projection=projection)
    two = y[30:] < 2
    AnalyticClassifier().fit(H[30:][two], y[30:][two]).save(tmp_path / "n.safetensors", projection=projection,
                                                          class_names=["ant", "bee"])
    outcomes = []
    for first, second in (("u", "n"), ("n", "u")):
        merged = AnalyticClassifier.load(tmp_path / f"{first}.safetensors").merge(
            AnalyticClassifier.load(tmp_path / f"{second}.safetensors"))
        try:
            merged.save(tmp_path / f"{first}{second}.safetensors")
        except FoalPipeError:
            outcomes.append("refused")
            continue
        outcomes.append(repr(read_model(tmp_path / f"{first}{second}.safetensors")[1].get("class_names")))
    assert outcomes[0] == outcomes[1], outcomes


# --- 8. init-model of an unnamed model on a store lacking a class -------------------------------------------------------

def test_init_model_of_an_unnamed_model_on_a_store_lacking_its_classes(tmp_path):
    """A ``learn`` model of classes '0', '1', '2' saved again without names (``metadata['class_names']`` dropped:
    ``DeployedModel.save`` writes no names as the ids spell them), continued on a store of classes ['1', 'x'].
    Expected: exit 0 and names ['0', '1', '2', 'x'], as the committed code gives. Actual: exit 1 with ``KeyError(0)``
    (``continued_outputs``: ``names`` holds only the store's classes when ``deployed.named`` is False)."""
    from helpers import invoke

    from foal_pipe.store import write_store

    y = np.arange(60) % 3
    store = write_store(tmp_path / "s.zarr", (_rows(y, 6), y), (_rows(y, 6)[:15], y[:15]), ["0", "1", "2"],
                        chunk_rows=16)
    learned = invoke("learn", "--features", store, "--out", tmp_path / "r", "--tasks", 1, "--projection-dim", 12,
                     "--backend", "numpy")
    assert learned.exit_code == 0, learned.output
    model = foal_pipe.load_model(tmp_path / "r" / "model.safetensors")
    model.metadata.pop("class_names")
    model.save(tmp_path / "u.safetensors")
    meta = read_model(tmp_path / "u.safetensors")[1]
    assert meta.get("class_names") is None and meta.get("learned_from")
    y2 = np.arange(40) % 2
    other = write_store(tmp_path / "s2.zarr", (_rows(y2, 6, 1), y2), (_rows(y2, 6, 1)[:10], y2[:10]), ["1", "x"],
                        chunk_rows=16)
    result = invoke("learn", "--init-model", tmp_path / "u.safetensors", "--features", other, "--out", tmp_path / "n",
                    "--tasks", 1, "--backend", "numpy")
    assert result.exit_code == 0, repr(result.exception)
    assert foal_pipe.load_model(tmp_path / "n" / "model.safetensors").class_names == ["0", "1", "2", "x"]


# --- a guard: rows through merges of loaded and fresh learners ---------------------------------------------------------

def test_rows_outside_stores_through_three_way_merges_and_partial_fit(tmp_path):
    """Guard (holds): loaded a + fresh (20 rows) + loaded b, then ``DeployedModel.partial_fit`` of 6 rows: the file
    records both stores and 26 rows outside them, 86 rows in all."""
    X, y, H, projection, (pa, pb) = _two_files(tmp_path, {"learned_from": ["a" * 64], "class_names": ["x", "y", "z"]},
                                               {"learned_from": ["b" * 64], "class_names": ["x", "y", "z"]})
    fresh = AnalyticClassifier().fit(H[:20], y[:20])
    merged = AnalyticClassifier.load(pa).merge(fresh).merge(AnalyticClassifier.load(pb))
    merged.save(tmp_path / "m.safetensors")
    model = foal_pipe.load_model(tmp_path / "m.safetensors")
    model.partial_fit(X[:6], np.array(["x", "y", "z"])[y[:6]])
    model.save(tmp_path / "m2.safetensors")
    meta = read_model(tmp_path / "m2.safetensors")[1]
    assert (meta["n_samples_seen"], meta.get("rows_outside_stores"), sorted(meta["learned_from"])) == (
        86, 26, ["a" * 64, "b" * 64])
