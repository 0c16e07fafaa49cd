"""Audit s26: column names (the identity of each input feature) kept and checked, and DataFrames read as arrays are.

Audited, holding (compared with scikit-learn's ``LogisticRegression`` in the same situation): every head estimator
(ridge, ncm, slda, fecam, balanced, dual, cosine) and ``AnalyticClassifier`` fitted on a DataFrame refuse a frame of
reordered or renamed columns in ``predict``, ``predict_proba``, ``score``, ``class_scores``, ``decision_function`` and
``partial_fit`` (a refused ``partial_fit`` changes nothing), after pickle, ``copy.deepcopy``, ``clone`` and
``set_params``; duplicated column names are refused by ``fit``; int-named frames warn as scikit-learn's do;
``SmoothProjection.set_output(transform="pandas")`` (sigmoid, identity, cos) gives the NumPy values under
``get_feature_names_out`` and keeps the index; pipelines of it and every head refuse reordered frames; a pipeline's
projection and classifier saved together and loaded by ``load_model`` predict as the pipeline and refuse reordered
frames in ``predict``, ``predict_proba``, ``predict_names``, ``best``, ``activations`` and ``partial_fit``; a Series is
refused by shape; torch tensors predict as NumPy arrays; a ridge ``learn --projection-dim 0`` model and a head on the
activations keep the columns set on their projection through a save.

Faults found (each test below fails on the code of 9ba7b1e for the reason given):

1. ``load_model`` drops the classifier's own ``feature_names`` (written by ``AnalyticClassifier.save``, restored by
   ``AnalyticClassifier.load``): behind an identity projection (``n_components=0``) ``DeployedModel`` means to check a
   frame against them (``_check_columns``), but the loaded classifier has none (and the loaded identity, rebuilt by
   ``from_matrix``, is not ``is_identity``), so a reordered frame is scored by position, silently (estimators or not),
   and ``DeployedModel.save`` writes the file without them. (Fixed: behind an identity projection the file's
   classifier columns are the projection's, restored by ``load_model`` and saved again as the projection's.)
2. ``DeployedModel`` reads a frame whose column names are not all strings by position without a word, where the
   projection it was saved from refuses mixed names (scikit-learn's ``TypeError``) and warns of int names.
3. ``merge`` of a learner fitted on named columns with one fitted on an array forgets the names, where the learner
   that saw both streams (``partial_fit`` of the array) keeps them and refuses a reordered frame.
4. A head on the store's features (ncm, slda, fecam: ``space == "features"``) saved by ``DeployedModel.save`` drops the
   columns set on its projection (``HeadClassifier.save`` records them only for a projection it stores), so the
   reloaded model scores a reordered frame by position; a head on the projection (dual) keeps them.
5. ``DeployedModel`` refuses a frame of pandas' nullable dtypes (``Float64``, ``Int64``) without missing values as
   "object values", which the projection and classifier it was saved from read as the numbers they are.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.headestimator import ESTIMATORS
from foal_pipe.model.modelfile import read_model
from foal_pipe.model.projection import SmoothProjection
from foal_pipe.store import write_store

COLUMNS = ["w", "x", "y", "z"]


def _frame(n: int = 60, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """``n`` rows of three classes whose means differ in every column, so that a reordered frame predicts otherwise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 4)) + y[:, None] * np.array([2.0, -1.0, 0.5, 3.0])
    return pd.DataFrame(X, columns=COLUMNS), y


def _projected_model(path: Path) -> tuple[Path, pd.DataFrame]:
    """A projection fitted on a frame and its classifier, saved together (a pipeline's steps)."""
    X, y = _frame()
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    AnalyticClassifier().fit(projection.transform(X), y).save(path, projection=projection)
    return path, X


# --- 1. load_model forgets the classifier's own column names --------------------------------------------------------

def _identity_model(path: Path) -> tuple[Path, pd.DataFrame]:
    """A learner fitted on a frame, saved with the identity projection (ridge on the raw features)."""
    X, y = _frame()
    identity = SmoothProjection(n_components=0, activation="identity").fit(X.to_numpy())
    AnalyticClassifier().fit(X, y).save(path, projection=identity)
    return path, X


@pytest.mark.parametrize("estimators", [True, False])
def test_load_model_checks_the_classifiers_columns_behind_an_identity_projection(tmp_path: Path, estimators: bool) -> None:
    path, X = _identity_model(tmp_path / "m.safetensors")
    assert read_model(path)[1]["feature_names"] == COLUMNS  # the file records them
    with pytest.raises(FoalPipeError):  # as the learner loaded alone refuses it
        AnalyticClassifier.load(path).predict(X[COLUMNS[::-1]])
    model = foal_pipe.load_model(path, estimators=estimators)
    swapped = X[COLUMNS[::-1]]
    assert not np.array_equal(model.predict(swapped.to_numpy()), model.predict(X.to_numpy()))  # the test has teeth
    with pytest.raises(FoalPipeError, match="columns"):
        model.predict(swapped)  # now: scored by position, other predictions, no warning


@pytest.mark.parametrize("estimators", [True, False])
def test_a_loaded_and_saved_model_keeps_the_classifiers_columns(tmp_path: Path, estimators: bool) -> None:
    """Saved again by ``DeployedModel.save``, the file still names the columns (the classifier's, or its identity
    projection's, which are the same inputs), and both readers check a frame against them."""
    path, X = _identity_model(tmp_path / "m.safetensors")
    foal_pipe.load_model(path, estimators=estimators).save(tmp_path / "again.safetensors")
    meta = read_model(tmp_path / "again.safetensors")[1]
    assert COLUMNS in (meta.get("feature_names"), meta.get("projection_feature_names"))  # before: neither
    learner = AnalyticClassifier.load(tmp_path / "again.safetensors")
    assert list(learner.feature_names_in_) == COLUMNS
    with pytest.raises(FoalPipeError):
        learner.predict(X[COLUMNS[::-1]])
    with pytest.raises(FoalPipeError, match="columns"):
        foal_pipe.load_model(tmp_path / "again.safetensors", estimators=estimators).predict(X[COLUMNS[::-1]])


# --- 2. frames whose column names are not all strings ---------------------------------------------------------------

def test_a_loaded_model_refuses_a_frame_of_mixed_column_name_types(tmp_path: Path) -> None:
    path, X = _projected_model(tmp_path / "m.safetensors")
    mixed = pd.DataFrame(X.to_numpy()[:, ::-1], columns=["z", "y", "x", 0])  # reordered, one name lost on the way
    with pytest.raises(FoalPipeError):  # the projection it was saved from refuses it (scikit-learn's TypeError)
        SmoothProjection(n_components=16, random_state=0).fit(X).transform(mixed)
    model = foal_pipe.load_model(path)
    assert not np.array_equal(model.predict(mixed.to_numpy()), model.predict(X.to_numpy()))
    with pytest.raises(FoalPipeError):
        model.predict(mixed)  # now: scored by position


def test_a_loaded_model_does_not_read_int_named_columns_silently(tmp_path: Path) -> None:
    """scikit-learn warns of a frame without string names given to an estimator fitted on named columns (the
    projection did); the loaded model says nothing. Refusing would do as well."""
    path, X = _projected_model(tmp_path / "m.safetensors")
    numbered = pd.DataFrame(X.to_numpy()[:, ::-1], columns=[3, 2, 1, 0])  # the columns reversed, numbered
    model = foal_pipe.load_model(path)
    assert not np.array_equal(model.predict(numbered.to_numpy()), model.predict(X.to_numpy()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.predict(numbered)
            refused = False
        except FoalPipeError:
            refused = True
    assert refused or any("feature names" in str(w.message) for w in caught), "a renumbered frame scored silently"


# --- 3. merge of a named and an unnamed learner ---------------------------------------------------------------------

def test_merge_of_a_named_learner_with_an_unnamed_one_keeps_the_names() -> None:
    X, y = _frame()
    named = AnalyticClassifier().fit(X.iloc[:30], y[:30])
    unnamed = AnalyticClassifier().fit(X.to_numpy()[30:], y[30:])
    both = copy.deepcopy(named)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's "X does not have valid feature names"
        both.partial_fit(X.to_numpy()[30:], y[30:])  # the learner that saw both streams: it keeps the names
    merged = named.merge(unnamed)
    np.testing.assert_allclose(merged.weights_, both.weights_, rtol=1e-10, atol=1e-12)  # the same learner
    swapped = X[COLUMNS[::-1]]
    assert not np.array_equal(merged.predict(swapped.to_numpy()), merged.predict(X.to_numpy()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FoalPipeError):
            both.predict(swapped)
        assert list(getattr(merged, "feature_names_in_", [])) == COLUMNS  # now: forgotten
        with pytest.raises(FoalPipeError):
            merged.predict(swapped)  # now: scored by position, with only scikit-learn's "fitted without" warning


# --- 4. a head on the store's features drops its columns when saved -------------------------------------------------

@pytest.mark.parametrize("head", ["ncm", "slda"])
def test_a_head_on_the_features_keeps_the_columns_set_on_its_projection(tmp_path: Path, head: str) -> None:
    """As tests/test_deploy_input_names.py's dual model keeps them (a head on the projection): a head on the store's
    features (its projection the identity, not written) dropped them at save."""
    rng = np.random.default_rng(2)
    y = np.arange(48) % 4
    X = (rng.normal(size=(48, 4)) + 3 * y[:, None] * np.array([1.0, -1.0, 0.5, 2.0])).astype(np.float32)
    store = write_store(tmp_path / "s.zarr", (X[:32], y[:32]), (X[32:], y[32:]), ["a", "b", "c", "d"], chunk_rows=16)
    result = CliRunner().invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2",
                                      "--seed", "3", "--backend", "numpy", "--batch-size", "8", "--head", head])
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    model.projection.feature_names_in_ = np.asarray(COLUMNS, dtype=object)
    frame = pd.DataFrame(X[32:], columns=COLUMNS)
    with pytest.raises(FoalPipeError, match="columns differ"):  # checked in memory
        model.predict(frame[COLUMNS[::-1]])
    model.save(tmp_path / "named.safetensors")
    for estimators in (True, False):
        named = foal_pipe.load_model(tmp_path / "named.safetensors", estimators=estimators)
        assert not np.array_equal(named.predict(X[32:, ::-1]), named.predict(X[32:]))  # the test has teeth
        np.testing.assert_array_equal(named.predict(frame), model.predict(X[32:]))
        with pytest.raises(FoalPipeError, match="columns differ"):
            named.predict(frame[COLUMNS[::-1]])  # now: scored by position


# --- 5. pandas' nullable dtypes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["Float64", "Int64"])
def test_a_loaded_model_reads_a_nullable_frame_as_its_numbers(tmp_path: Path, dtype: str) -> None:
    path, X = _projected_model(tmp_path / "m.safetensors")
    frame = X.round().astype(dtype)  # no missing value
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    values = frame.to_numpy(dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's "X does not have valid feature names" for the array
        np.testing.assert_array_equal(projection.transform(frame), projection.transform(values))  # the estimators read it
    model = foal_pipe.load_model(path)
    np.testing.assert_array_equal(model.predict(frame), model.predict(values))  # now: refused as "object values"


# --- held: a head estimator's partial_fit refuses a reordered frame and changes nothing ------------------------------

@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_partial_fit_of_a_reordered_frame_is_refused_and_changes_nothing(name: str) -> None:
    X, y = _frame()
    est = ESTIMATORS[name]().fit(X.iloc[:30], y[:30])
    before = est.class_scores(X.iloc[30:])
    with pytest.raises(FoalPipeError, match="feature names"):
        est.partial_fit(X.iloc[30:][COLUMNS[::-1]], y[30:])
    assert est.n_samples_seen_ == 30
    np.testing.assert_array_equal(est.class_scores(X.iloc[30:]), before)
