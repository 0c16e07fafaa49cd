"""The review audit's faults in the session's fixes: float64 rows outside float32's range are refused on every path
into a float32 model (predict, store_predictions, the API), not only in learn; and named as out of range, not as NaN
or inf, with no warning lines."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store

MESSAGE = "float32's range, which"


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    X = rng.normal(size=(y.size, 5)) + y[:, None]
    store = write_store(tmp_path / "a.zarr", (X, y), (X, y), ["a", "b", "c"], dtype="float64")
    result = invoke("learn", "--features", store, "--out", tmp_path / "m", "--tasks", 1, "--projection-dim", 0,
                    "--dtype", "float32")
    assert result.exit_code == 0, result.output
    return tmp_path / "m" / "model.safetensors", X, y


@pytest.mark.parametrize("scale", [1e-150, 1e40])
def test_every_path_into_a_float32_model_refuses_rows_outside_its_range(model, tmp_path, scale):
    path, X, y = model
    X = X.copy()
    X[4] *= scale
    store = write_store(tmp_path / "b.zarr", (X, y), (X, y), ["a", "b", "c"], dtype="float64")
    deployed = foal_pipe.load_model(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: deployed.predict(X), lambda: deployed.store_predictions(store)):
            with pytest.raises(FoalPipeError, match=MESSAGE):
                call()
        out = tmp_path / "p.csv"
        assert_clean_error(invoke("predict", "--model", path, "--features", store, "--out", out), MESSAGE, out)


def test_the_api_names_a_finite_row_beyond_float32_as_out_of_range():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(30, 4)), np.arange(30) % 3
    X[2, 1] = 2e40
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError, match=r"magnitude 2e\+40, beyond float32's range"):
            AnalyticClassifier(dtype="float32").fit(X, y)


def test_a_model_without_names_is_matched_by_label_id_in_store_predictions_as_in_predict(tmp_path):
    """A model saved from Python records no class names: predict reads the store's labels by id; so does
    store_predictions (before, it matched the model's placeholder names and knew no class)."""
    from foal_pipe import SmoothProjection

    rng = np.random.default_rng(2)
    y = np.repeat(np.arange(3), 20)
    X = rng.normal(size=(y.size, 5)) + y[:, None]
    store = write_store(tmp_path / "a.zarr", (X, y), (X, y), ["k0", "k1", "k2"])
    projection = SmoothProjection(n_components=12, random_state=0).fit(X)
    clf = AnalyticClassifier().fit(projection.transform(X.astype(np.float32).astype(np.float64)), y)
    clf.save(tmp_path / "m.safetensors", projection=projection)
    deployed = foal_pipe.load_model(tmp_path / "m.safetensors")
    true, predicted = deployed.store_predictions(store)
    np.testing.assert_array_equal(true, y)
    out = tmp_path / "p.csv"
    assert invoke("predict", "--model", tmp_path / "m.safetensors", "--features", store, "--out", out).exit_code == 0
    rows = [line.split(",") for line in out.read_text().splitlines()[1:]]
    assert [int(r[1]) for r in rows] == predicted.tolist() and [int(r[4]) for r in rows] == true.tolist()


@pytest.mark.parametrize("command", [("learn", "--head", "fecam"), ("sweep", "--heads", "ridge,fecam")])
def test_a_class_row_refusal_under_many_orders_names_the_order(tmp_path, command):
    """A Si-Blurry stream deals a class of two rows over the tasks by the order's draw: some orders leave it one
    row at a task's end, which fecam refuses; the refusal of many orders names the one."""
    rng = np.random.default_rng(1)
    y = np.concatenate([np.repeat(np.arange(5), 60), [5, 5]])
    rng.shuffle(y)
    X = rng.normal(size=(6, 6))[y] * 3 + rng.normal(size=(y.size, 6))
    store = write_store(tmp_path / "a.zarr", (X, y), (X, y), [f"c{i}" for i in range(6)], dtype="float64")
    args = ("--features", store, "--tasks", 3, "--stream", "si-blurry")
    refused = [s for s in range(3) if invoke(*command, *args, "--out", tmp_path / f"o{s}", "--order-seed", s).exit_code]
    assert refused, "no order refused: the store does not exercise the check"
    out = tmp_path / "all"
    result = invoke(*command, *args, "--out", out, "--order-seeds", "0,1,2")
    assert_clean_error(result, f"(class order seed {refused[0]}; --order-seed {refused[0]} alone is refused too)", out)


def test_continuing_a_model_that_records_no_encoder_says_so(tmp_path):
    from foal_pipe import SmoothProjection

    rng = np.random.default_rng(5)
    y = np.repeat(np.arange(3), 10)
    X = rng.normal(size=(y.size, 4)) + y[:, None]
    store = write_store(tmp_path / "a.zarr", (X, y), (X, y), ["k0", "k1", "k2"])
    projection = SmoothProjection(n_components=8, random_state=0).fit(X)
    AnalyticClassifier().fit(projection.transform(X), y).save(tmp_path / "m.safetensors", projection=projection)
    out = tmp_path / "next"
    result = invoke("learn", "--init-model", tmp_path / "m.safetensors", "--features", store, "--out", out)
    assert_clean_error(result, "the model records no encoder (a model saved from Python), so nothing shows that", out)
