"""`foal-pipe predict` audit: a model's far-apart class ids, CSV bytes whatever the locale or the file names, and the
accuracy line of a store with some unlabelled rows."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import invoke, make_image_tree

from foal_pipe import AnalyticClassifier, SmoothProjection
from foal_pipe.model.modelfile import read_model
from foal_pipe.model.predict import predict_split
from foal_pipe.store import write_store

NAMES = ["ant", "bee", "cat"]
ENCODER = {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    return (rng.normal(size=(3, 8))[y] * 2 + rng.normal(size=(n, 8))).astype(np.float32), y


def _store(path: Path, names=NAMES, test_labels=None) -> Path:
    X, y = _rows(60, 0)
    return write_store(path, (X, y), (X[:30], y[:30] if test_labels is None else test_labels), list(names),
                       encoder=dict(ENCODER), chunk_rows=16)


def _ridge_scores(model: Path, store: Path) -> tuple[np.ndarray, np.ndarray]:
    """``sigmoid(X P) W`` of the store's test rows and the model's class ids, from the files alone."""
    tensors, _ = read_model(model)
    X = np.asarray(zarr.open_group(str(store), mode="r")["test/features"][:], dtype=np.float64)
    return (1 / (1 + np.exp(-(X @ tensors["projection"])))) @ tensors["W"], tensors["classes"]


def test_a_far_class_id_costs_no_table_up_to_it(tmp_path):
    """A model saved from Python may number a class 10**7 (label ids need not be dense): the CSV's names were a list
    indexed by id up to the largest (10**12: out of memory), now only the ids there are."""
    store = _store(tmp_path / "s.zarr")
    X, y = _rows(60, 0)
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    far = 10**7
    clf = AnalyticClassifier().fit(projection.transform(X), np.where(y == 2, far, y))
    model = clf.save(tmp_path / "m.safetensors", projection=projection)
    tracemalloc.start()
    try:
        predictions = predict_split(model, store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak  # a list of 10**7 entries alone takes 80 MB
    scores, classes = _ridge_scores(model, store)
    np.testing.assert_array_equal(predictions.predicted, classes[scores.argmax(1)])
    buffer = io.StringIO()
    predictions.write_csv(buffer)
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    assert far in predictions.predicted
    assert [r["predicted_name"] for r in rows] == [str(far) if p == far else NAMES[p] for p in predictions.predicted]


def _learned(tmp_path: Path, names: list[str]) -> tuple[Path, Path]:
    store = _store(tmp_path / "s.zarr", names)
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "1", "--projection-dim", "16",
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    return store, tmp_path / "run" / "model.safetensors"


def _cli(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", *map(str, args)],
                          capture_output=True, timeout=300, env=os.environ | env)


def test_the_csv_is_utf8_in_any_locale(tmp_path):
    """Class names beyond ASCII under an ASCII locale: the CSV file and stdout were written in the locale's encoding,
    a traceback here (and other bytes under a Latin-1 locale); both are now UTF-8, the bytes of any locale."""
    names = ["café", "猫", "naïve, \"quoted\""]
    store, model = _learned(tmp_path, names)
    here = tmp_path / "here.csv"  # the UTF-8 locale's bytes, from a process of its own as the others are
    assert _cli("predict", "--model", model, "--features", store, "--out", here, env={"LC_ALL": "C.UTF-8"}).returncode == 0
    ascii_locale = {"PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONIOENCODING": ""}
    out = tmp_path / "c.csv"
    to_file = _cli("predict", "--model", model, "--features", store, "--out", out, env=ascii_locale)
    assert to_file.returncode == 0, to_file.stderr.decode(errors="replace")
    to_stdout = _cli("predict", "--model", model, "--features", store, env=ascii_locale)
    assert to_stdout.returncode == 0, to_stdout.stderr.decode(errors="replace")
    assert out.read_bytes() == to_stdout.stdout == here.read_bytes()
    rows = list(csv.DictReader(io.StringIO(out.read_bytes().decode("utf-8"), newline="")))
    _, y = _rows(30, 0)
    assert [r["true_name"] for r in rows] == [names[k] for k in y[:30]]
    scores, classes = _ridge_scores(model, store)
    assert [r["predicted_name"] for r in rows] == [names[k] for k in classes[scores.argmax(1)]]


def test_an_image_file_name_that_is_not_utf8_is_written_as_it_is(tmp_path):
    """A file name's bytes that are not UTF-8 (Python reads them as surrogates) stopped `--out` with a traceback; the
    CSV now holds the name's own bytes, as stdout does."""
    from foal_pipe.extract import ExtractSpec, run_extract

    tree = make_image_tree(tmp_path / "images", {"cat": 3, "dog": 3}, test_per_class=1)
    store = tmp_path / "px.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8, out=str(store),
                            device="cpu", workers=0, batch_size=4, chunk_rows=8))
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "1",
                  "--projection-dim", "12").exit_code == 0
    odd = tmp_path / "odd"
    odd.mkdir()
    raw = os.fsencode(odd) + b"/caf\xe9.png"
    try:
        with open(raw, "wb") as fh:
            fh.write((tree / "test" / "cat" / "img000.png").read_bytes())
    except OSError:
        pytest.skip("this file system takes only UTF-8 file names")
    out = tmp_path / "p.csv"
    model = tmp_path / "run" / "model.safetensors"
    result = _cli("predict", "--model", model, "--images", odd, "--out", out, env={})
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    by_stdout = _cli("predict", "--model", model, "--images", odd, env={})
    assert out.read_bytes() == by_stdout.stdout
    assert out.read_bytes().splitlines()[1].split(b",")[0] == raw


def test_the_accuracy_line_says_how_many_rows_are_labelled(tmp_path):
    """A store whose test rows are partly unlabelled (label -1, which write_store takes): the line gave the accuracy
    over the labelled rows beside the count of every row, as if over them all."""
    _, y = _rows(30, 0)
    labels = y.copy()
    labels[::3] = -1
    store = _store(tmp_path / "s.zarr", test_labels=labels)
    learned = _store(tmp_path / "learned.zarr")
    assert invoke("learn", "--features", learned, "--out", tmp_path / "run", "--tasks", "1", "--projection-dim",
                  "16", "--backend", "numpy").exit_code == 0
    model = tmp_path / "run" / "model.safetensors"
    result = invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    scores, classes = _ridge_scores(model, store)
    labelled = labels != -1
    hits = np.mean((classes[scores.argmax(1)] == labels)[labelled])
    assert f"30 rows, accuracy {100 * hits:.2f}% over its {int(labelled.sum())} labelled rows on test" in result.stderr
