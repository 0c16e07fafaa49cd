"""Audit s25: portability and round trips of fitted models.

Audited, with tiny data (all of it held, so not tested again here): ``AnalyticClassifier`` fitted on numpy, torch (CPU)
and array_api_strict, float64 and float32, gram and rls, saved and loaded on every other backend (scores and
predictions bit for bit, the same bytes when saved twice, load + ``partial_fit`` equal to one fit of every row);
``gamma="auto"`` grids, numpy-scalar, ``Fraction`` and ``Decimal`` gammas through a file; ``partial_fit(classes=...)``
classes without rows through a file; pickle, ``copy.deepcopy`` and ``clone`` of fitted, unfitted, loaded and pending
estimators of every head (independent copies; a pending fecam solve that cannot be solved refused in one line by
pickling); ``set_params`` then ``fit`` / ``partial_fit``; string against integer labels and the order of ``classes_``;
``predict_proba`` rows summing to 1, far rows included; a model written by ``foal-pipe learn`` for ridge (float32,
``--gamma auto``, ``--engine rls``) and every head (float32, ``--head-rows activations``, ``cos``) loaded in Python,
with and without estimators, predicting what ``foal-pipe predict`` writes (predictions, and winning scores to the
bit), saved again to the same bytes, continued and reloaded; models saved from Python read by ``foal-pipe predict``;
metadata edited and written again with a valid checksum (grids, ``per_decade``, activations, NFC twins) and the
one-line refusals of the API's misuses of ``save``/``load``.

Faults found, fixed (each test below failed for its reason before the fix):

1. ``AnalyticClassifier.save``/``load`` drops ``feature_names_in_``: a learner fitted on a DataFrame refuses a frame of
   other column order (as its pickle does), but the loaded one scores the reordered columns silently, with other
   predictions (and a merge with it no longer checks the columns), although the docs say load, ``partial_fit`` and
   ``save`` lose nothing and ``load`` continues "as if the stream had never been interrupted".
2. A head's ``DeployedModel`` (``load_model`` of a ``learn --head`` file) that has learned with ``partial_fit`` can no
   longer be pickled or deep-copied: a bare ``TypeError: cannot pickle 'module' object`` from the head's running state
   (``HeadClassifier._head`` holds its array namespace module), where a ridge ``DeployedModel``, a freshly loaded
   head's and every head estimator (pickled "as their model-file tensors") pickle.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import ref_ncm
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of four classes in turn, 6 float32 features, each class's mean 3 apart."""
    rng = np.random.default_rng(seed)
    y = np.tile(np.arange(4), n // 4)
    return (rng.normal(size=(n, 6)) + 3 * y[:, None]).astype(np.float32), y


# --- 1. save/load forgets the column names a learner was fitted on --------------------------------------------------

def test_loaded_classifier_keeps_the_feature_names_it_was_fitted_on(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4)) + np.repeat(np.arange(3), 10)[:, None] * np.array([1.0, 0.0, -1.0, 0.0])
    y = np.repeat(np.arange(3), 10)
    columns = ["w", "x", "y", "z"]
    fitted = AnalyticClassifier().fit(pd.DataFrame(X, columns=columns), y)
    swapped = pd.DataFrame(X[:, ::-1], columns=columns[::-1])  # the same rows, columns in another order
    with pytest.raises(FoalPipeError):  # the fitted learner (and its pickle) refuse the reordered frame
        fitted.predict(swapped)
    with pytest.raises(FoalPipeError):
        pickle.loads(pickle.dumps(fitted)).predict(swapped)
    fitted.save(tmp_path / "m.safetensors")
    loaded = AnalyticClassifier.load(tmp_path / "m.safetensors")
    assert list(getattr(loaded, "feature_names_in_", [])) == columns, "the loaded learner forgot its column names"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's "fitted without feature names" warning is all it says now
        with pytest.raises(FoalPipeError):
            loaded.predict(swapped)  # before: predictions of the columns read in the wrong order
    frame = pd.DataFrame(X, columns=columns)
    np.testing.assert_array_equal(loaded.predict(frame), fitted.predict(frame))
    loaded.save(tmp_path / "again.safetensors")  # the names are kept by a save of the loaded learner: the same file
    assert (tmp_path / "again.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()


# --- 2. a head's DeployedModel that has learned cannot be pickled or copied ------------------------------------------

def test_head_deployed_model_pickles_after_partial_fit(tmp_path: Path) -> None:
    store = write_store(tmp_path / "s.zarr", _rows(32, 0), _rows(16, 1), ["a", "b", "c", "d"], chunk_rows=16)
    result = CliRunner().invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2",
                                      "--seed", "3", "--backend", "numpy", "--batch-size", "8",
                                      "--head", "ncm"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "run" / "model.safetensors"
    fresh = foal_pipe.load_model(path)
    Z = _rows(8, 7)[0]
    assert np.array_equal(pickle.loads(pickle.dumps(fresh)).scores(Z), fresh.scores(Z))  # holds before learning
    model = foal_pipe.load_model(path)
    X2, y2 = _rows(8, 5)
    model.partial_fit(X2, y2)
    expected = model.scores(Z)
    # independent expectation: ncm's model over the store's training rows and the new ones (helpers.ref_ncm)
    X1, y1 = _rows(32, 0)
    classes, reference = ref_ncm(np.vstack([X1, X2]).astype(np.float64), np.concatenate([y1, y2]), Z.astype(np.float64))
    assert model.classifier.classes_.tolist() == classes.tolist()
    np.testing.assert_allclose(expected, reference, rtol=1e-9, atol=1e-12)
    copied = pickle.loads(pickle.dumps(model))  # before: TypeError: cannot pickle 'module' object
    assert np.array_equal(copied.scores(Z), expected)
    assert np.array_equal(copy.deepcopy(model).scores(Z), expected)


@pytest.mark.parametrize("names", [["a", "b"], ["a", "a", "b", "c"], ["a", "b", "c", 4]])
def test_a_file_whose_feature_names_do_not_fit_its_weights_is_refused(tmp_path: Path, names) -> None:
    """`feature_names` written (with a valid checksum) as too few names, a name twice or a number: load refuses the file in
    one line naming the key, where the 4 distinct names of W's 4 rows load as feature_names_in_."""
    from test_modelfile import model

    from foal_pipe.model.modelfile import write_model

    tensors, meta = model()
    write_model(tmp_path / "good.safetensors", tensors, {**meta, "feature_names": ["a", "b", "c", "d"]})
    assert AnalyticClassifier.load(tmp_path / "good.safetensors").feature_names_in_.tolist() == ["a", "b", "c", "d"]
    write_model(tmp_path / "bad.safetensors", tensors, {**meta, "feature_names": names})
    with pytest.raises(FoalPipeError, match="'feature_names' is not 4 distinct strings"):
        AnalyticClassifier.load(tmp_path / "bad.safetensors")
