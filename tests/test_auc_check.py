"""`evaluate` and `summary` check A_auc (``learn --eval-every``) against the recorded anytime curve, as they check
A_avg, A_last and F against the accuracy matrix: an A_auc raised in metrics.json was shown with no warning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke

from foal_pipe.protocol.ordermeans import mean_std
from foal_pipe.store import write_store

N_CLASSES = 6
RAISE = 0.05


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % N_CLASSES
    return (rng.normal(size=(n, 8)) + 1.5 * np.eye(N_CLASSES, 8)[y]).astype(np.float32), y


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "s.zarr"
    return write_store(path, _rows(600, 0), _rows(180, 1), [f"c{i}" for i in range(N_CLASSES)], chunk_rows=64)


def _learn(store: Path, out: Path, *extra: str) -> dict:
    result = invoke("learn", "--features", store, "--out", out, "--tasks", "3", "--projection-dim", "24",
                    "--eval-every", "100", *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _edit(run: Path, metrics: dict) -> None:
    (run / "metrics.json").write_text(json.dumps(metrics))


def _evaluate(run: Path) -> tuple[str, str, dict]:
    """evaluate's console output (one line per warning), its summary.md and scores.json."""
    result = invoke("evaluate", "--run", run, "--no-plots")
    assert result.exit_code == 0, result.output
    return (" ".join(result.output.split()), (run / "eval" / "summary.md").read_text(),
            json.loads((run / "eval" / "scores.json").read_text()))


def _summary(runs: Path) -> str:
    result = invoke("summary", runs)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _auc_row(summary_md: str) -> str:
    return next(line for line in summary_md.splitlines() if line.startswith("| A_auc (%) |"))


def test_a_raised_a_auc_is_warned_about_and_the_curve_mean_shown(tmp_path, store):
    runs = tmp_path / "runs"
    metrics = _learn(store, runs / "r")
    true = metrics["A_auc"]
    assert true == float(np.mean(metrics["anytime"]["accuracy"]))
    _, text, scores = _evaluate(runs / "r")
    assert "Warning" not in text and scores["A_auc"] == true  # an untouched run: no warning, its A_auc in scores.json
    metrics["A_auc"] = true + RAISE
    _edit(runs / "r", metrics)
    warning = f"A_auc in metrics.json is {true + RAISE:.6f} but the anytime curve gives {true:.6f} (shown)"
    output, text, scores = _evaluate(runs / "r")
    assert f"**Warning:** {warning}." in text
    assert warning in output
    assert _auc_row(text) == f"| A_auc (%) | {100 * true:.2f} |"
    assert scores["A_auc"] == true
    listed = _summary(runs)
    assert warning in listed and listed.count("Warning:") == 1
    assert re.search(rf"{100 * metrics['F']:.2f} {100 * true:.2f} ", listed), listed
    assert f"{100 * (true + RAISE):.2f}" not in listed


def test_a_raised_a_auc_of_an_order_and_of_the_mean_over_orders(tmp_path, store):
    runs = tmp_path / "runs"
    metrics = _learn(store, runs / "o", "--order-seeds", "0,1")
    truths = [float(np.mean(o["anytime"]["accuracy"])) for o in metrics["orders"]]
    assert [o["A_auc"] for o in metrics["orders"]] == truths and truths[0] != truths[1]
    mean, std = mean_std(truths)
    assert metrics["A_auc"] == mean and metrics["std"]["A_auc"] == std
    _, text, scores = _evaluate(runs / "o")
    assert "Warning" not in text and scores["A_auc"] == mean

    # one order's A_auc raised: that order warned about; the mean and std shown are the curves'
    edited = json.loads(json.dumps(metrics))
    edited["orders"][1]["A_auc"] = truths[1] + RAISE
    _edit(runs / "o", edited)
    warning = f"A_auc of order 1 in metrics.json is {truths[1] + RAISE:.6f} but its anytime curve gives {truths[1]:.6f} (shown)"
    output, text, scores = _evaluate(runs / "o")
    assert f"**Warning:** {warning}." in text and warning in output
    assert text.count("**Warning:**") == 1  # the top-level mean is the curves' mean: right as recorded
    assert _auc_row(text) == f"| A_auc (%) | {100 * mean:.2f} ± {100 * std:.2f} |"
    assert scores["A_auc"] == mean
    assert warning in _summary(runs)

    # the top-level mean raised: warned about against the mean over the orders, which is shown
    edited = json.loads(json.dumps(metrics))
    edited["A_auc"] = mean + RAISE
    _edit(runs / "o", edited)
    warning = f"A_auc in metrics.json is {mean + RAISE:.6f} but the mean over its orders is {mean:.6f} (shown)"
    output, text, scores = _evaluate(runs / "o")
    assert f"**Warning:** {warning}." in text and warning in output and text.count("**Warning:**") == 1
    assert _auc_row(text) == f"| A_auc (%) | {100 * mean:.2f} ± {100 * std:.2f} |"
    assert scores["A_auc"] == mean
    listed = _summary(runs)
    assert warning in listed and listed.count("Warning:") == 1
    assert f"{100 * mean:.2f} ± {100 * std:.2f}" in listed and f"{100 * (mean + RAISE):.2f}" not in listed
