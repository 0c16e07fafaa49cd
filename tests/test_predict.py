"""`foal-pipe predict`: columns that say what they hold, numbers against a hand computation, checks before work."""

from __future__ import annotations

import csv
import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.modelfile import read_model
from foal_pipe.store import write_store

runner = CliRunner()
NAMES = ["ant", "bee", "cat", "dog", "eel"]
ENCODER = {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}


def make_store(path: Path, names=NAMES, encoder=ENCODER, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(len(names), 12)) * 1.5

    def split(n):
        y = np.arange(n) % len(names)
        return (means[y] + rng.normal(size=(n, 12))).astype(np.float32), y

    return write_store(path, split(300), split(75), list(names), encoder=dict(encoder), chunk_rows=32)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("predict")
    store = make_store(root / "s.zarr")
    # 2 tasks of 2 classes (one class dropped): the model knows 4 of the store's 5 classes
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(root / "run"), "--tasks", "2",
                                 "--drop-remainder", "--projection-dim", "24", "--backend", "numpy", "--seed", "1"])
    assert result.exit_code == 0, result.output
    return store, root / "run" / "model.safetensors"


def invoke(*args) -> object:
    return runner.invoke(app, ["predict", *[str(a) for a in args]])


def one_line_error(result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert last.startswith("Error: ") and fragment in last and "Traceback" not in result.output, result.output


def test_columns_and_values_against_a_hand_computation(tmp_path, trained):
    store, model = trained
    out = tmp_path / "pred.csv"
    result = invoke("--model", model, "--features", store, "--out", out)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["row", "predicted_class", "predicted_name", "score", "true_class", "true_name"]

    tensors, _ = read_model(model)
    import zarr

    group = zarr.open_group(str(store), mode="r")
    X, y = np.asarray(group["test/features"][:], dtype=np.float64), np.asarray(group["test/labels"][:])
    scores = (1 / (1 + np.exp(-(X @ tensors["projection"])))) @ tensors["W"]
    predicted = tensors["classes"][scores.argmax(1)]
    assert len(tensors["classes"]) == 4  # the model knows 4 classes, so predicted != true is possible by design
    assert [int(r["row"]) for r in rows] == list(range(len(y)))
    np.testing.assert_array_equal([int(r["predicted_class"]) for r in rows], predicted)
    np.testing.assert_allclose([float(r["score"]) for r in rows], scores.max(1), rtol=1e-12)
    assert [r["predicted_name"] for r in rows] == [NAMES[c] for c in predicted]
    np.testing.assert_array_equal([int(r["true_class"]) for r in rows], y)
    assert [r["true_name"] for r in rows] == [NAMES[c] for c in y]
    assert f"accuracy {100 * np.mean(predicted == y):.2f}%" in result.output

    stdout = invoke("--model", model, "--features", store)
    assert stdout.exit_code == 0
    assert list(csv.DictReader(io.StringIO(stdout.stdout))) == rows  # the same CSV on stdout


def _no_store_read(*args, **kwargs):
    raise AssertionError("the store was opened")


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist"), (b"garbage", "not a safetensors model file"), ("nan", "'W' holds NaN or inf")],
)
def test_model_is_validated_before_the_store_is_read(tmp_path, trained, monkeypatch, content, message):
    store, good = trained
    model = tmp_path / "m.safetensors"
    if content == "nan":  # a model whose W was altered in place: same size, NaN bytes
        data = bytearray(good.read_bytes())
        tensors, _ = read_model(good)
        at = bytes(data).index(tensors["W"].tobytes())
        data[at : at + 8] = np.array([np.nan]).tobytes()
        model.write_bytes(bytes(data))
    elif content is not None:
        model.write_bytes(content)
    import foal_pipe.model.deploy

    monkeypatch.setattr(foal_pipe.model.deploy, "open_model_store", _no_store_read)
    one_line_error(invoke("--model", model, "--features", store, "--out", tmp_path / "p.csv"), message)
    assert not (tmp_path / "p.csv").exists()


def test_model_without_projection(tmp_path, trained):
    store, _ = trained
    clf = AnalyticClassifier().partial_fit(np.random.default_rng(0).random((10, 3)), np.arange(10) % 2)
    path = clf.save(tmp_path / "bare.safetensors")
    one_line_error(invoke("--model", path, "--features", store), "has no 'projection' tensor")


def test_store_of_other_classes_or_encoder_is_refused(tmp_path, trained):
    store, model = trained
    _, meta = read_model(model)
    first = meta["class_names"][0]
    swapped = [NAMES[1], NAMES[0], *NAMES[2:]]
    other = make_store(tmp_path / "order.zarr", names=swapped)
    label = NAMES.index(first)
    one_line_error(invoke("--model", model, "--features", other),
                   f"label {label} is {first!r} in the model but {swapped[label]!r} in")
    other = make_store(tmp_path / "encoder.zarr", encoder=ENCODER | {"image_size": 224})
    one_line_error(invoke("--model", model, "--features", other), "'image_size' is 224 in the store but 0 in the model")


def test_a_store_of_fewer_classes_is_predicted_among_the_models(tmp_path, trained):
    """A store whose classes are some of the model's (say, the first store of a continued model) is predicted
    among every class of the model, with the true names from the store."""
    _, model = trained
    few = make_store(tmp_path / "few.zarr", names=NAMES[:2], seed=3)
    result = invoke("--model", model, "--features", few, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    tensors, meta = read_model(model)
    assert {r["predicted_name"] for r in rows} - set(NAMES[:2])  # classes the store lacks are predicted too
    assert all(meta["class_names"][list(tensors["classes"]).index(int(r["predicted_class"]))] == r["predicted_name"]
               for r in rows)
    assert {r["true_name"] for r in rows} == set(NAMES[:2])
    hits = np.mean([r["predicted_name"] == r["true_name"] for r in rows])
    assert f"accuracy {100 * hits:.2f}%" in result.output


def test_a_continued_model_predicts_its_first_store(tmp_path):
    """Issue 24: `learn --init-model` on a store of new classes, then `predict` on the first store."""
    old = make_store(tmp_path / "old.zarr", names=NAMES[:3])
    new = make_store(tmp_path / "new.zarr", names=["fox", "gnu", NAMES[1]], seed=1)
    common = ["--projection-dim", "16", "--backend", "numpy"]
    assert runner.invoke(app, ["learn", "--features", str(old), "--out", str(tmp_path / "a"), "--tasks", "1",
                               *common]).exit_code == 0
    result = runner.invoke(app, ["learn", "--features", str(new), "--out", str(tmp_path / "b"), "--tasks", "1",
                                 "--init-model", str(tmp_path / "a" / "model.safetensors"), "--backend", "numpy"])
    assert result.exit_code == 0, result.output
    model = tmp_path / "b" / "model.safetensors"
    result = invoke("--model", model, "--features", old, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len({r["predicted_name"] for r in rows}) > 3  # among the five classes of the continued model
    assert all(r["true_name"] == NAMES[int(r["true_class"])] for r in rows)
    # the new store numbers its classes otherwise than the model: refused, naming the class
    one_line_error(invoke("--model", model, "--features", new), "label 0 is 'ant' in the model but 'fox' in")


@pytest.mark.parametrize("mask", [True, False], ids=["seen classes", "published code"])
def test_predict_and_learn_score_the_same_way(tmp_path, mask):
    """The final row of learn's accuracy matrix equals the saved model's predictions on the test split, under
    either unseen-classes rule (the published code's: every class of the store, unseen ones scoring 0)."""
    import json

    import zarr

    from foal_pipe import load_model

    store = make_store(tmp_path / "s.zarr")
    args = ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2", "--drop-remainder",
            "--projection-dim", "8", "--activation", "identity", "--backend", "numpy"]
    assert runner.invoke(app, args + ([] if mask else ["--no-mask-unseen"])).exit_code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    group = zarr.open_group(str(store), mode="r")
    X, y = np.asarray(group["test/features"][:]), np.asarray(group["test/labels"][:])
    predicted = load_model(tmp_path / "run" / "model.safetensors").predict(X, None if mask else range(len(NAMES)))
    last = [float(np.mean(predicted[np.isin(y, task)] == y[np.isin(y, task)])) for task in metrics["tasks"]]
    np.testing.assert_allclose(last, metrics["accuracy_matrix"][-1], rtol=0, atol=1e-12)


def _predicted(*args, **kwargs):
    raise AssertionError("predicted although --out cannot be written")


def test_out_is_checked_before_predicting(tmp_path, trained, monkeypatch):
    store, model = trained
    import foal_pipe.model.predict

    monkeypatch.setattr(foal_pipe.model.predict, "predict_split", _predicted)
    one_line_error(invoke("--model", model, "--features", store, "--out", tmp_path), "is a directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke("--model", model, "--features", store, "--out", blocker / "p.csv")
    one_line_error(result, "is a file, not a directory")


def test_failed_write_keeps_the_previous_csv(tmp_path, trained, monkeypatch):
    store, model = trained
    out = tmp_path / "p.csv"
    assert invoke("--model", model, "--features", store, "--out", out).exit_code == 0
    before = out.read_bytes()

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    one_line_error(invoke("--model", model, "--features", store, "--split", "train", "--out", out),
                   "No space left on device")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]


@pytest.mark.parametrize("typed", [("--top-k", "3"), ("--skip-bad",), ("--batch-size", "8"), ("--device", "cuda"),
                                   ("--checkpoint", "vit.safetensors")])
def test_an_image_option_with_features_is_refused(tmp_path, trained, typed):
    """With --features these options would be ignored (the CSV unchanged): each is refused by name."""
    store, model = trained
    result = runner.invoke(app, ["predict", "--model", str(model), "--features", str(store), *typed,
                                 "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{typed[0]} acts only with --images and would be ignored here; drop {typed[0]}" in " ".join(result.output.split())
    assert not (tmp_path / "p.csv").exists()


def test_split_with_images_is_refused(tmp_path, trained):
    _, model = trained
    result = runner.invoke(app, ["predict", "--model", str(model), "--images", str(tmp_path / "a.png"), "--split", "train"])
    assert result.exit_code == 1
    assert "--split acts only with --features and would be ignored here; drop --split" in " ".join(result.output.split())
