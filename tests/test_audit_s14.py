"""Faults found by the fourteenth stop's audits, each with the behaviour that mends it."""

from __future__ import annotations

import json

from helpers import build_store, invoke

from foal_pipe.core.linalg import drift_refusal


def test_a_drift_just_above_the_limit_is_not_printed_as_the_limit():
    """A float32 drift of 1.004% was printed "about 1% (more than 1%)": shown with the digits that put it above."""
    message = str(drift_refusal(0.05, 0.01004, "float32"))
    assert "move the weights by about 1.004% (more than 1%:" in message
    assert "about 300% (more than 1%" in str(drift_refusal(0.05, 3.0, "float32"))
    assert "about 0.000104 (more than 0.0001:" in str(drift_refusal(0.05, 1.04e-4, "float64"))


def test_summary_group_shows_a_setting_not_recorded_as_a_dash(tmp_path):
    """``summary --group select`` printed Python's ``None`` for runs that record no selection."""
    store = build_store(tmp_path / "s.zarr")
    assert invoke("learn", "--features", store, "--out", tmp_path / "runs" / "a", "--tasks", 2).exit_code == 0
    result = invoke("summary", tmp_path / "runs", "--group", "select,ratios,head")
    assert result.exit_code == 0, result.output
    row = next(line.split() for line in result.output.splitlines() if "ridge" in line)
    assert row[:4] == ["-", "-", "ridge", "1"]
    assert "None" not in result.output


def test_evaluate_of_an_anytime_curve_without_points_draws_no_curve(tmp_path):
    """A hand-edited curve with no points (no A_auc) died in the plot's ``min()`` with a traceback."""
    store = build_store(tmp_path / "s.zarr")
    run = tmp_path / "run"
    assert invoke("learn", "--features", store, "--out", run, "--tasks", 2, "--eval-every", 100).exit_code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["anytime"].update(samples_seen=[], accuracy=[], gammas=[])
    del metrics["A_auc"]
    (run / "metrics.json").write_text(json.dumps(metrics))
    result = invoke("evaluate", "--run", run, "--out", tmp_path / "ev")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "ev" / "anytime.png").exists() and (tmp_path / "ev" / "steps.png").is_file()
