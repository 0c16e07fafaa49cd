"""evaluate's text files in an ASCII locale: summary.md, class_accuracy.csv and confusion_matrix.csv were written in
the locale's encoding, so class names beyond ASCII stopped `evaluate` with a traceback there (and gave other bytes
under a Latin-1 locale); they are UTF-8 whatever the locale."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import numpy as np
from helpers import invoke

from foal_pipe.store import write_store

NAMES = ["café", "猫", "naïve"]


def _run(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    X = rng.normal(size=(60, 5)) + 2.0 * y[:, None]
    store = write_store(tmp_path / "s.zarr", (X, y), (X[::2], y[::2]), NAMES)
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 8,
                  "--gamma", 1).exit_code == 0
    return tmp_path / "run", X[::2], y[::2]


def test_evaluate_writes_utf8_in_an_ascii_locale(tmp_path):
    run, _, y = _run(tmp_path)
    ascii_locale = {"PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONIOENCODING": ""}
    done = subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", "evaluate", "--run", str(run),
                           "--no-plots"], capture_output=True, timeout=300, env=os.environ | ascii_locale)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    ev = run / "eval"
    assert "café".encode() in (ev / "summary.md").read_bytes()
    rows = list(csv.reader(io.StringIO((ev / "confusion_matrix.csv").read_bytes().decode("utf-8"), newline="")))
    assert rows[0] == ["true_class", *NAMES] and [r[0] for r in rows[1:]] == NAMES
    assert sum(int(v) for r in rows[1:] for v in r[1:]) == y.size  # every test row counted once
    accuracy = list(csv.DictReader(io.StringIO((ev / "class_accuracy.csv").read_bytes().decode("utf-8"), newline="")))
    assert [r["name"] for r in accuracy] == NAMES
