"""A deployed model checks a DataFrame's columns against those its projection was fitted on.

A ``SmoothProjection`` fitted on a DataFrame (a scikit-learn pipeline's first step) refuses a frame of other columns;
saved with its classifier and loaded by ``load_model``, it forgot them, and ``DeployedModel.predict`` read a reordered
frame by position: other predictions, no warning. The model file now records them (``projection_feature_names``),
``load_model`` restores them (estimators or not, ridge and heads), ``DeployedModel`` refuses a frame of other columns
and every save keeps them. Each test below that refuses failed before: the frame was scored.
"""

from __future__ import annotations

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
from foal_pipe.model.modelfile import read_model, write_model
from foal_pipe.model.projection import SmoothProjection
from foal_pipe.store import write_store

COLUMNS = ["w", "x", "y", "z"]


def _frame(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """``n`` rows of three classes whose means differ in every column, so that a reordered frame predicts otherwise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 4)) + y[:, None] * np.array([2.0, -1.0, 0.5, 3.0])
    return pd.DataFrame(X, columns=COLUMNS), y


def _saved(path: Path) -> tuple[Path, pd.DataFrame]:
    """A pipeline's projection and classifier fitted on a frame, saved together; the frame."""
    X, y = _frame(60, 0)
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    AnalyticClassifier().fit(projection.transform(X), y).save(path, projection=projection)
    return path, X


@pytest.mark.parametrize("estimators", [True, False])
def test_a_loaded_model_refuses_a_frame_of_other_columns(tmp_path: Path, estimators: bool) -> None:
    path, X = _saved(tmp_path / "m.safetensors")
    model = foal_pipe.load_model(path, estimators=estimators)
    swapped = X[COLUMNS[::-1]]
    assert not np.array_equal(model.predict(swapped.to_numpy()), model.predict(X.to_numpy()))  # the test has teeth
    with pytest.raises(FoalPipeError, match=r"columns differ from those the model was fitted on at position 0"):
        model.predict(swapped)  # before: predicted from the columns read in the wrong order
    with pytest.raises(FoalPipeError, match="at position 3"):
        model.scores(X[["w", "x", "y"]].assign(q=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither a frame in order nor an array warns
        in_order, array = model.predict(X), model.predict(X.to_numpy())
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    expected = AnalyticClassifier().fit(projection.transform(X), _frame(60, 0)[1]).predict(projection.transform(X))
    np.testing.assert_array_equal(in_order, expected)
    np.testing.assert_array_equal(array, expected)


@pytest.mark.parametrize("estimators", [True, False])
def test_every_save_keeps_the_columns(tmp_path: Path, estimators: bool) -> None:
    path, X = _saved(tmp_path / "m.safetensors")
    assert read_model(path)[1]["projection_feature_names"] == COLUMNS
    model = foal_pipe.load_model(path, estimators=estimators)
    model.save(tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()
    if estimators:  # a model loaded without estimators only predicts
        model.partial_fit(X.iloc[:6], [0, 1, 2, 0, 1, 2])
    model.save(tmp_path / "more.safetensors")
    assert read_model(tmp_path / "more.safetensors")[1]["projection_feature_names"] == COLUMNS
    with pytest.raises(FoalPipeError, match="columns differ"):
        foal_pipe.load_model(tmp_path / "more.safetensors").predict(X[COLUMNS[::-1]])
    loaded = AnalyticClassifier.load(path)  # the learner alone keeps the file's projection, and its columns
    loaded.save(tmp_path / "learner.safetensors")
    assert read_model(tmp_path / "learner.safetensors")[1]["projection_feature_names"] == COLUMNS
    plain = SmoothProjection(n_components=16, random_state=0).fit(X.to_numpy())  # a new projection: its own (none)
    loaded.save(tmp_path / "other.safetensors", projection=plain)
    assert "projection_feature_names" not in read_model(tmp_path / "other.safetensors")[1]


def test_names_that_contradict_the_projection_are_refused(tmp_path: Path) -> None:
    X, y = _frame(30, 1)
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    clf = AnalyticClassifier().fit(projection.transform(X), y)
    with pytest.raises(FoalPipeError, match="contradicts the projection's feature_names_in_"):
        clf.save(tmp_path / "m.safetensors", projection=projection, projection_feature_names=["a", "b", "c", "d"])
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("names", [["a", "b"], ["a", "a", "b", "c"], ["a", "b", "c", 4]])
def test_a_file_whose_columns_do_not_fit_its_projection_is_refused(tmp_path: Path, names) -> None:
    path, _ = _saved(tmp_path / "m.safetensors")
    tensors, meta = read_model(path)
    meta = {k: v for k, v in meta.items() if k not in ("format", "format_version", "checksum")}
    write_model(tmp_path / "bad.safetensors", tensors, {**meta, "projection_feature_names": names})
    for estimators in (True, False):
        with pytest.raises(FoalPipeError, match="'projection_feature_names' is not 4 distinct strings"):
            foal_pipe.load_model(tmp_path / "bad.safetensors", estimators=estimators)


def test_a_head_model_keeps_its_projections_columns(tmp_path: Path) -> None:
    """A head on the projection (dual) given a projection with columns: saved and loaded with them, and checked."""
    rng = np.random.default_rng(2)
    y = np.arange(48) % 4
    X = (rng.normal(size=(48, 4)) + 3 * y[:, None]).astype(np.float32)
    store = write_store(tmp_path / "s.zarr", (X[:32], y[:32]), (X[32:], y[32:]), ["a", "b", "c", "d"], chunk_rows=16)
    result = CliRunner().invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2",
                                      "--seed", "3", "--backend", "numpy", "--batch-size", "8", "--projection-dim", "12",
                                      "--head", "dual"])
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    model.projection.feature_names_in_ = np.asarray(COLUMNS, dtype=object)
    model.save(tmp_path / "named.safetensors")
    for estimators in (True, False):
        named = foal_pipe.load_model(tmp_path / "named.safetensors", estimators=estimators)
        assert list(named.projection.feature_names_in_) == COLUMNS
        frame = pd.DataFrame(X[32:], columns=COLUMNS)
        np.testing.assert_array_equal(named.predict(frame), model.predict(X[32:]))
        with pytest.raises(FoalPipeError, match="columns differ"):
            named.predict(frame[COLUMNS[::-1]])
