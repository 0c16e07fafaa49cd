"""metrics.json's keys that must agree with one another: A_auc with its anytime curve (missing: recomputed with a
warning, as the other headline numbers are), the curve's lists with one another, and the task counts (n_tasks,
tasks, gammas_selected) with the accuracy matrix's rows. A hand edit that breaks one was read silently, or died
in an AssertionError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, edited_run, invoke, learn

FIX = "re-run `foal-pipe learn --out DIR` (or `dvc repro`) to write it"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One run with an anytime curve, and one of two class orders with --gamma auto and curves."""
    root = tmp_path_factory.mktemp("crosscheck")
    store = build_store(root / "s.zarr", n_train=600, n_test=240)
    learn(store, root / "e1", "--eval-every", "100")
    learn(store, root / "orders", "--eval-every", "100", "--order-seeds", "0,1", gamma="auto")
    return {"e1": root / "e1", "orders": root / "orders"}


def _edited(runs: dict[str, Path], name: str, tmp_path: Path, edit) -> Path:
    return edited_run(runs[name], tmp_path / name, edit)


def _skipped_by_summary(run: Path, message: str) -> None:
    """``summary`` sets a malformed run aside, saying why, and finds nothing else to list."""
    result = invoke("summary", run)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"Warning: skipped: {run / 'metrics.json'}: {message}; {FIX}" in " ".join(result.output.split())


def _evaluate(run: Path, *extra: str):
    return invoke("evaluate", "--run", run, "--out", run / "ev", *extra)


@pytest.mark.parametrize("how", ["null", "deleted"])
def test_a_missing_a_auc_is_recomputed_from_the_curve_with_a_warning(runs, tmp_path, how):
    def edit(m):
        if how == "null":
            m["A_auc"] = None
        else:
            del m["A_auc"]

    run = _edited(runs, "e1", tmp_path, edit)
    curve = json.loads((runs["e1"] / "metrics.json").read_text())["anytime"]["accuracy"]
    true = float(np.mean(curve))
    result = _evaluate(run)  # with plots: anytime.png's title names A_auc
    assert result.exit_code == 0, result.output
    warning = f"A_auc is missing from metrics.json; the anytime curve gives {true:.6f} (shown)"
    assert warning in " ".join(result.output.split())
    text = (run / "ev" / "summary.md").read_text()
    assert f"**Warning:** {warning}." in text
    assert f"| A_auc (%) | {100 * true:.2f} |" in text
    assert json.loads((run / "ev" / "scores.json").read_text())["A_auc"] == true
    assert (run / "ev" / "anytime.png").is_file()
    listed = invoke("summary", run)
    assert listed.exit_code == 0 and warning in " ".join(listed.output.split()), listed.output


def test_a_missing_a_auc_of_an_order_and_of_the_mean_is_recomputed(runs, tmp_path):
    def edit(m):
        del m["A_auc"], m["orders"][1]["A_auc"]

    run = _edited(runs, "orders", tmp_path, edit)
    stored = json.loads((runs["orders"] / "metrics.json").read_text())
    per_order = [float(np.mean(o["anytime"]["accuracy"])) for o in stored["orders"]]
    seed = stored["orders"][1]["order_seed"]
    result = _evaluate(run)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert f"A_auc of order {seed} is missing from metrics.json; its anytime curve gives {per_order[1]:.6f} (shown)" in output
    assert f"A_auc is missing from metrics.json; the mean over its orders is {sum(per_order) / 2:.6f} (shown)" in output
    scores = json.loads((run / "ev" / "scores.json").read_text())
    assert scores["A_auc"] == pytest.approx(stored["A_auc"], abs=1e-15) == pytest.approx(sum(per_order) / 2, abs=1e-15)


CURVE_EDITS = {
    "one accuracy short": (lambda c: c.update(accuracy=c["accuracy"][:-1]),
                           "anytime has 5 entries under 'accuracy' but 6 points under 'samples_seen'"),
    "one gamma": (lambda c: c.update(gammas=[1.0]), "anytime has 1 entries under 'gammas' but 6 points under 'samples_seen'"),
    "points reversed": (lambda c: c.update(samples_seen=c["samples_seen"][::-1]),
                        "anytime has 'samples_seen' not strictly increasing ([600, 500, 400, 300, 200, 100])"),
    "a point repeated": (lambda c: c.update(samples_seen=[100, 200, 200, 400, 500, 600]),
                         "anytime has 'samples_seen' not strictly increasing ([100, 200, 200, 400, 500, 600])"),
}


@pytest.mark.parametrize("name", CURVE_EDITS)
def test_an_anytime_curve_of_unpaired_lists_is_refused_in_one_line(runs, tmp_path, name):
    edit, message = CURVE_EDITS[name]
    assert json.loads((runs["e1"] / "metrics.json").read_text())["anytime"]["samples_seen"] == [100, 200, 300, 400, 500, 600]
    run = _edited(runs, "e1", tmp_path, lambda m: edit(m["anytime"]))
    assert_one_line_error(_evaluate(run), f"{run / 'metrics.json'}: {message}; {FIX}")
    assert not (run / "ev").exists()
    _skipped_by_summary(run, message)


def test_an_orders_curve_of_unpaired_lists_is_refused_in_one_line(runs, tmp_path):
    run = _edited(runs, "orders", tmp_path, lambda m: m["orders"][1]["anytime"].update(gammas=[1.0, 1.0]))
    assert_one_line_error(_evaluate(run), f"{run / 'metrics.json'}: orders[1]: anytime has 2 entries under 'gammas' but "
                                          f"6 points under 'samples_seen'; {FIX}")


COUNT_EDITS = {
    "n_tasks 7": ("e1", lambda m: m.update(n_tasks=7), "'n_tasks' is 7 but 'accuracy_matrix' has 4 rows (one per task)"),
    "two rows": ("e1", lambda m: m.update(accuracy_matrix=m["accuracy_matrix"][:2]),
                 "'n_tasks' is 4 but 'accuracy_matrix' has 2 rows (one per task)"),
    "two tasks": ("e1", lambda m: m.update(tasks=m["tasks"][:2]),
                  "'tasks' has 2 entries but 'accuracy_matrix' has 4 rows (one per task)"),
    "two tasks, no n_tasks": ("e1", lambda m: (m.update(tasks=m["tasks"][:2]), m.pop("n_tasks")),
                              "'tasks' has 2 entries but 'accuracy_matrix' has 4 rows (one per task)"),
    "an order's tasks": ("orders", lambda m: m["orders"][1].update(tasks=m["orders"][1]["tasks"][:3]),
                         "orders[1]: 'tasks' has 3 entries but 'accuracy_matrix' has 4 rows (one per task)"),
    "an order's rows": ("orders", lambda m: m["orders"][0].update(accuracy_matrix=m["orders"][0]["accuracy_matrix"][:3]),
                        "orders[0]: 'tasks' has 4 entries but 'accuracy_matrix' has 3 rows (one per task)"),
    "an order's gammas": ("orders", lambda m: m["orders"][1].update(gammas_selected=m["orders"][1]["gammas_selected"][:3]),
                          "orders[1]: 'gammas_selected' has 3 entries but 'accuracy_matrix' has 4 rows (one per task)"),
}


@pytest.mark.parametrize("name", COUNT_EDITS)
def test_task_counts_that_disagree_with_the_matrix_are_refused_in_one_line(runs, tmp_path, name):
    which, edit, message = COUNT_EDITS[name]
    run = _edited(runs, which, tmp_path, edit)
    assert_one_line_error(_evaluate(run, "--no-plots"), f"{run / 'metrics.json'}: {message}; {FIX}")
    assert not (run / "ev").exists()
    _skipped_by_summary(run, message)


@pytest.mark.parametrize("name", ["e1", "orders"])
def test_the_runs_learn_wrote_read_without_a_warning(runs, name):
    stored = json.loads((runs[name] / "metrics.json").read_text())
    assert stored["n_tasks"] == len(stored["tasks"]) == len(stored["accuracy_matrix"]) == 4
    result = invoke("evaluate", "--run", runs[name], "--out", runs[name].parent / f"ev-{name}", "--no-plots")
    assert result.exit_code == 0 and "Warning" not in result.output, result.output
