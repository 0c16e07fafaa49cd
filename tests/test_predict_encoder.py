"""``predict`` and ``DeployedModel.store_predictions`` judge a store's encoder by one rule: a model that records no
encoder (saved from Python) takes any store of its width in both; a recorded encoder that differs is refused by
both in the same words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import invoke

import foal_pipe
from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(60, 6)) + np.arange(60)[:, None] % 3).astype(np.float32)
    return x, np.arange(60) % 3


def _store(path: Path, x, y, encoder) -> Path:
    return write_store(path, (x, y), (x[:15], y[:15]), ["ant", "bee", "cow"],
                       encoder={"fusion": "none", "image_size": 0, "normalize": False} | encoder)


def test_a_model_without_an_encoder_record_predicts_any_store_of_its_width(tmp_path, data):
    x, y = data
    projection = SmoothProjection(n_components=12, random_state=0).fit(x)
    clf = AnalyticClassifier().fit(projection.transform(x), y)
    clf.save(tmp_path / "m.safetensors", projection=projection, class_names=["ant", "bee", "cow"])
    store = _store(tmp_path / "s.zarr", x, y, {"name": "pixels"})
    model = foal_pipe.load_model(tmp_path / "m.safetensors")
    assert model.encoder_spec is None
    true, predicted = model.store_predictions(store)
    np.testing.assert_array_equal(predicted, clf.predict(projection.transform(x[:15])))
    np.testing.assert_array_equal(true, y[:15])
    result = invoke("predict", "--model", tmp_path / "m.safetensors", "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "p.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[1]) for r in rows] == predicted.tolist()


def test_a_recorded_encoder_that_differs_is_refused_alike(tmp_path, data):
    x, y = data
    learned = _store(tmp_path / "a.zarr", x, y, {"name": "pixels", "image_size": 8})
    assert invoke("learn", "--features", learned, "--out", tmp_path / "run", "--tasks", "1",
                  "--projection-dim", "12").exit_code == 0
    other = _store(tmp_path / "b.zarr", x, y, {"name": "pixels", "image_size": 16})
    model = tmp_path / "run" / "model.safetensors"
    with pytest.raises(FoalPipeError) as caught:
        foal_pipe.load_model(model).store_predictions(other)
    result = invoke("predict", "--model", model, "--features", other, "--out", tmp_path / "p.csv")
    assert result.exit_code == 1
    assert f"Error: {caught.value}" in result.output
    assert "'image_size' is 16 in the store but 8 in the model" in str(caught.value)
