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
import shutil
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


def _refused_naming_the_sweep(result, out: Path) -> None:
    """One line (exit 1, ``Error: ...``, no traceback) that names --sweep, and nothing written at --out."""
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "--sweep" in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize(("head", "sweep"), [("ncm", "sw"), ("cosine", "sw"), ("fecam", "sw"), ("slda", "sw"),
                                             ("balanced", "sw"), ("ncm", "sw2")])
def test_a_sweep_is_refused_for_a_heads_run(runs: Path, head: str, sweep: str) -> None:
    """A gamma sweep is ridge's curve, and a `sweep --heads` table ran at the sweep's own settings. With a head's run
    they were reported as the run's: ncm, cosine, fecam and slda got a "Selected gamma: 1" section and gamma.png for
    a head without a gamma; balanced was shown ridge's A_avg 88.52 at its own gamma beside its own 88.53; a
    `sweep --heads ridge,ncm` row showed ncm on the store's features, 89.99, beside the run's ncm on activations,
    84.96. Now refused in one line."""
    result, out = _evaluate(runs, head, f"{head}-{sweep}", "--sweep", str(runs / sweep))
    _refused_naming_the_sweep(result, out)


def test_a_sweep_beside_a_heads_run_is_left_out(runs: Path, tmp_path: Path) -> None:
    """A ridge sweep where `evaluate` looks for the run's own (RUN-sweep) was taken as an ncm run's gamma curve."""
    shutil.copytree(runs / "ncm", tmp_path / "ncm")
    shutil.copytree(runs / "sw", tmp_path / "ncm-sweep")
    result = runner.invoke(app, ["evaluate", "--run", str(tmp_path / "ncm"), "--out", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "ev" / "summary.md").read_text()
    assert "Gamma sweep" not in text and "Selected gamma" not in text and "foal-pipe sweep" not in text, text
    assert not (tmp_path / "ev" / "gamma.png").exists()


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
