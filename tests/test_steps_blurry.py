"""``evaluate``'s steps.csv of a Si-Blurry run: a[i][i] is A_i itself there and a[i][0] the accuracy on the classes
seen in task 1, so the columns say so (``task_1_classes``), not "newest task" and "first task"."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import build_store, invoke


def test_a_blurry_runs_steps_name_what_they_hold(tmp_path):
    store = build_store(tmp_path / "a.zarr")
    run = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", run, "--stream", "si-blurry", "--tasks", "3",
                    "--projection-dim", "20", "--seed", "3", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    result = invoke("evaluate", "--run", run, "--out", tmp_path / "eval")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "eval" / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    matrix = json.loads((run / "metrics.json").read_text())["accuracy_matrix"]
    assert list(rows[0]) == ["step", "A_i", "task_1_classes"]
    # the CSV holds 4 decimals
    assert [float(r["A_i"]) for r in rows] == pytest.approx([100 * row[i] for i, row in enumerate(matrix)], abs=1e-4)
    assert [float(r["task_1_classes"]) for r in rows] == pytest.approx([100 * row[0] for row in matrix], abs=1e-4)
