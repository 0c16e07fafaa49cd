"""Faults the deployment audit of 2026-11-29 found: a carriage return in a class name split the prediction CSV's rows,
a failed write under a file ended in the error of removing its temporary instead of its own, and a reader closing
`predict`'s pipe was reported as a disk error."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest
from helpers import invoke

from foal_pipe import FoalPipeError, load_model
from foal_pipe.io import atomic_path
from foal_pipe.model.predict import predict_split
from foal_pipe.store import write_store

NAMES = ["a\rb", "c,d", 'e"f']


def _store(path, n=30, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    return write_store(path, ((np.eye(3, 8)[y] * 3 + rng.normal(size=(n, 8))).astype(np.float32), y),
                       ((np.eye(3, 8)[y[:6]] * 3 + rng.normal(size=(6, 8))).astype(np.float32), y[:6]), NAMES)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    store = _store(root / "s.zarr")
    assert invoke("learn", "--features", store, "--out", root / "run", "--tasks", 1, "--projection-dim", 20).exit_code == 0
    return store, root / "run"


def test_a_carriage_return_in_a_class_name_keeps_its_csv_row_whole(run, tmp_path):
    store, out = run
    result = invoke("predict", "--model", out / "model.safetensors", "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "p.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) == 7 and all(len(r) == len(rows[0]) for r in rows)
    predictions = predict_split(out / "model.safetensors", store)
    assert [r[2] for r in rows[1:]] == [NAMES[p] for p in predictions.predicted.tolist()]
    assert [r[5] for r in rows[1:]] == [NAMES[t] for t in predictions.true.tolist()]


def test_a_write_under_a_file_names_its_own_failure(run, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FoalPipeError, match=r"cannot write .*file/m.safetensors"):
        load_model(run[1] / "model.safetensors").save(tmp_path / "file" / "m.safetensors")
    with pytest.raises(FoalPipeError), atomic_path(tmp_path / "file" / "x.json") as tmp:
        tmp.write_text("{}")


def test_a_reader_that_closes_the_pipe_ends_predict_quietly(run, tmp_path):
    _, out = run
    store = _store(tmp_path / "big.zarr", n=6000)  # about 400 KB of CSV: more than a pipe holds, so the write fails
    code = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
    predict = subprocess.Popen([sys.executable, "-c", code, "predict", "--model", str(out / "model.safetensors"),
                                "--features", str(store), "--split", "train"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert predict.stdout is not None and predict.stdout.readline().startswith(b"row,")
    predict.stdout.close()  # as `| head -1` does
    _, stderr = predict.communicate(timeout=60)
    assert predict.returncode == 141 and b"Error" not in stderr and b"Traceback" not in stderr
