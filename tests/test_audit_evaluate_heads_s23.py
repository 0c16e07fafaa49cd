"""Audit (evh, s23): `foal-pipe evaluate` on runs of heads other than ridge (ncm, balanced, dual, ...).

A ridge gamma sweep (or a `sweep --heads` sweep whose head saw other rows) is accepted for a head's run and its
numbers are reported in the run's summary.md as if they were the run's; the "no sweep" note tells an ncm run to
run a (ridge) gamma sweep; the plots' titles say gamma "?" for every head (balanced's and dual's gamma is recorded);
dual's summary line says "activation identity" while the head scores relu and tanh of the projection.

The passing test covers what nothing else covers: evaluate's scores.json, class_accuracy.csv and the last matrix
row recounted independently from `predict` on every head's model.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_store, runner

from foal_pipe.cli import app

HEADS = ("ridge", "ncm", "slda", "fecam", "cosine", "balanced", "dual")
COMMON = ["--tasks", "3", "--projection-dim", "64"]


def _ok(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-class, 16-dim store (300 train / 120 test rows), one learn run per head (all at D = 64, on the projection's
    activations), a ridge gamma sweep and a `sweep --heads ridge,ncm` of the same store and settings."""
    root = tmp_path_factory.mktemp("evh")
    store = cluster_store(root / "s.zarr", 6, 16, 120, 64, 3, n_train=300)
    for head in HEADS:
        _ok(["learn", "--features", str(store), "--out", str(root / head), "--head", head, *COMMON])
    _ok(["sweep", "--features", str(store), "--out", str(root / "sw"), *COMMON])
    _ok(["sweep", "--features", str(store), "--out", str(root / "sw2"), "--heads", "ridge,ncm", *COMMON])
    return root


def _evaluate(runs: Path, head: str, name: str, *more: str):
    out = runs / "eval" / name
    return runner.invoke(app, ["evaluate", "--run", str(runs / head), "--out", str(out), *more]), out


def _refused(result) -> bool:
    """A one-line refusal (exit 1, ``Error: ...``, no traceback)."""
    return result.exit_code == 1 and result.output.startswith("Error: ") and "Traceback" not in result.output


@pytest.mark.parametrize("head", ["ncm", "cosine", "fecam", "slda"])
def test_ridge_gamma_sweep_is_not_reported_for_a_head_without_gamma(runs: Path, head: str) -> None:
    """`evaluate --run <ncm run> --sweep <ridge sweep>` writes a "Gamma sweep" section ("Selected gamma: 1") and
    gamma.png/gamma.csv into the ncm run's summary: a gamma curve of a head the run did not use, for a head that has
    no gamma. Expected: refused with one line, or no gamma section, plot or CSV."""
    result, out = _evaluate(runs, head, f"{head}-sw", "--sweep", str(runs / "sw"))
    if _refused(result):
        return
    assert result.exit_code == 0, result.output
    text = (out / "summary.md").read_text()
    assert "Gamma sweep" not in text and "Selected gamma" not in text, [x for x in text.splitlines() if "gamma" in x]
    assert not (out / "gamma.png").exists() and not (out / "gamma.csv").exists()


def test_ridge_gamma_sweep_is_not_reported_as_a_balanced_runs_curve(runs: Path) -> None:
    """A balanced run (AIR, its own gamma 1) evaluated with a ridge sweep: summary.md's gamma table marks gamma 1
    "selected" with A_avg 88.52 (ridge's), while the run's own A_avg at gamma 1, above it, is another number: the
    curve is ridge's, not the balanced head's. Expected: refused, or no gamma section claiming the run's gamma."""
    result, out = _evaluate(runs, "balanced", "balanced-sw", "--sweep", str(runs / "sw"))
    if _refused(result):
        return
    assert result.exit_code == 0, result.output
    text = (out / "summary.md").read_text()
    a_avg = json.loads((runs / "balanced" / "metrics.json").read_text())["A_avg"]
    selected = re.search(r"Selected gamma: \S+ .*\(test A_avg ([\d.]+)%\)", text)
    assert selected is None or abs(float(selected.group(1)) - 100 * a_avg) < 0.006, (selected.group(0), a_avg)


def test_heads_sweep_row_of_the_runs_head_is_the_runs(runs: Path) -> None:
    """`evaluate --run <ncm run on activations, D 64> --sweep <sweep --heads ridge,ncm>` is accepted and its "Heads"
    table shows ncm at A_avg 89.99 beside the run's own ncm A_avg 84.96 in the same summary.md, with nothing saying
    the sweep's ncm read the store's features (sweep.json heads.ncm.rows "features") and the run the activations.
    Expected: refused, or the ncm row is the run's own numbers, or it says which rows it scored."""
    result, out = _evaluate(runs, "ncm", "ncm-sw2", "--sweep", str(runs / "sw2"))
    if _refused(result):
        return
    assert result.exit_code == 0, result.output
    text = (out / "summary.md").read_text()
    a_avg = json.loads((runs / "ncm" / "metrics.json").read_text())["A_avg"]
    row = next((line for line in text.splitlines() if line.startswith("| ncm |")), None)
    if row is None:
        return
    shown = float(row.split("|")[2])
    assert abs(shown - 100 * a_avg) < 0.006 or "features" in row, (row, a_avg)


def test_no_sweep_note_does_not_ask_an_ncm_run_for_a_gamma_sweep(runs: Path) -> None:
    """Without a sweep, an ncm run's summary.md says "No gamma sweep found ..., so no gamma plot: run `foal-pipe
    sweep --out RUN-sweep`": following it gives the ridge gamma curve above (auto-found at RUN-sweep). An ncm run has
    no gamma. Expected: no such advice for a head without a gamma."""
    result, out = _evaluate(runs, "ncm", "ncm-plain")
    assert result.exit_code == 0, result.output
    text = (out / "summary.md").read_text()
    assert "foal-pipe sweep" not in text and "no gamma plot" not in text, [x for x in text.splitlines() if "sweep" in x]


@pytest.mark.parametrize("head,expected", [("balanced", "γ=1"), ("dual", "γ=1"), ("ncm", None)])
def test_plot_titles_state_a_heads_gamma(runs: Path, head: str, expected: str | None) -> None:
    """Every plot's title (plots._title) reads ``γ=?`` for every head: metrics.json's ``gamma`` is absent for a head,
    whose gamma (balanced, dual) is in ``head_options``; an ncm run has none, and "?" reads as "not recorded".
    Expected: the head's recorded gamma, and no "γ=?" for a head without one."""
    from foal_pipe.report.discovery import load_run
    from foal_pipe.report.plots import _title

    title = _title(load_run(runs / head))
    assert "γ=?" not in title, title
    if expected is not None:
        assert expected in title, title


def test_dual_summary_does_not_say_identity_activation(runs: Path) -> None:
    """summary.md's settings line of a dual run says "activation identity", but DS-AL scores relu(h) (main stream)
    and tanh(h) (compensation) of the projection h (docs/heads.md). Expected: no "activation identity" for dual (say
    relu/tanh, or leave the activation out)."""
    result, out = _evaluate(runs, "dual", "dual-plain")
    assert result.exit_code == 0, result.output
    line = next(x for x in (out / "summary.md").read_text().splitlines() if x.startswith("Run "))
    assert "activation identity" not in line, line


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("head", HEADS)
def test_head_run_numbers_match_an_independent_recount(runs: Path, head: str) -> None:
    """Passing today; covers what no other test does: for every head, scores.json's A_avg, A_last and F recomputed
    from metrics.json's accuracy matrix, and class_accuracy.csv and the matrix's last row recounted from `predict`."""
    result, out = _evaluate(runs, head, f"{head}-count", "--no-plots")
    assert result.exit_code == 0, result.output
    m = json.loads((runs / head / "metrics.json").read_text())
    a = m["accuracy_matrix"]
    t = len(a)
    steps = [float(np.mean(r)) for r in a]
    forgetting = float(np.mean([max(a[i][j] for i in range(j, t - 1)) - a[-1][j] for j in range(t - 1)]))
    scores = json.loads((out / "scores.json").read_text())
    assert scores["A_avg"] == pytest.approx(np.mean(steps), abs=1e-12)
    assert scores["A_last"] == pytest.approx(steps[-1], abs=1e-12)
    assert scores["F"] == pytest.approx(forgetting, abs=1e-12)
    assert not list(out.glob("*.png"))
    pred = runs / "eval" / f"{head}-pred.csv"
    _ok(["predict", "--model", str(runs / head / "model.safetensors"), "--features", str(runs / "s.zarr"),
         "--out", str(pred)])
    predictions = _rows(pred)
    for row in _rows(out / "class_accuracy.csv"):
        mine = [p for p in predictions if p["true_name"] == row["name"]]
        assert int(row["test_rows"]) == len(mine)
        assert int(row["correct"]) == sum(p["predicted_name"] == row["name"] for p in mine)
    for j, task in enumerate(m["tasks"]):
        mine = [p for p in predictions if int(p["true_class"]) in task]
        assert np.mean([p["predicted_class"] == p["true_class"] for p in mine]) == pytest.approx(a[-1][j], abs=1e-12)
