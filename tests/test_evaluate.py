"""`foal-pipe evaluate` / `summary` and the paper table, on hand-made runs (no store, no learner needed)."""

from __future__ import annotations

import csv
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.evaluate import evaluate, read_metrics
from foal_pipe.metrics import summarize
from foal_pipe.paper import PAPER_BACKBONE, TABLE2, match_paper, paper_row

runner = CliRunner()

# A 3-task accuracy matrix and its metrics worked out by hand (paper Eq. 17-18).
MATRIX = [[0.90], [0.80, 0.95], [0.70, 0.85, 0.90]]
A_STEPS = [0.90, 0.875, 2.45 / 3]
A_AVG = (0.90 + 0.875 + 2.45 / 3) / 3
A_LAST = 2.45 / 3
F = ((0.90 - 0.70) + (0.95 - 0.85)) / 2  # best before the last task minus final, tasks 1..T-1
F_PUBLISHED = ((0.90 - 0.70) + (0.95 - 0.85) + 0.0) / 3  # best over all rows, all T tasks
TASKS = [[3, 7], [0, 5], [9, 1]]
PIXELS = {"name": "pixels", "fusion": "none", "token": "none", "image_size": 8, "normalize": False}
PAPER_ENCODER = {"name": PAPER_BACKBONE, "fusion": "mean-cls", "token": "cls", "image_size": 224, "normalize": True}


def make_metrics(**overrides) -> dict:
    metrics = {
        "A_avg": A_AVG, "A_last": A_LAST, "F": F, "F_published_code": F_PUBLISHED, "A_steps": A_STEPS,
        "accuracy_matrix": MATRIX, "tasks": TASKS, "n_tasks": 3, "gamma": 1.0, "projection_dim": 1000,
        "batch_size": 10, "seed": 0, "engine": "gram", "backend": "numpy", "dtype": "float64",
        "n_train_seen": 600, "seconds": 1.25, "dataset": "digits", "encoder": PIXELS, "drop_last": False,
        "mask_unseen": True, "projection_init": "uniform",
    }
    metrics.update(overrides)
    return metrics


def make_run(path: Path, metrics: dict | None = None, model: bool = True, sweep: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(json.dumps(metrics or make_metrics()))
    if model:
        # column k of W belongs to classes[k]; the norm of the column of label c is c + 1
        classes = np.array([0, 1, 3, 5, 7, 9], dtype=np.int64)
        W = np.zeros((4, classes.size))
        W[0] = classes + 1.0
        names = [f"class{c}" for c in range(10)]
        save_file({"W": W, "classes": classes, "projection": np.ones((2, 4))}, str(path / "model.safetensors"),
                  metadata={"gamma": "1.0", "dataset": "digits", "encoder": json.dumps(PIXELS),
                            "classes_names": json.dumps(names)})
    if sweep is not None:
        (path / "sweep.json").write_text(json.dumps(sweep))
    return path


def make_sweep(dataset="digits", encoder=PIXELS, n_tasks=3, gammas=(1e-3, 1e-1, 1.0, 10.0, 100.0, 1e-2)) -> dict:
    results = [
        {"gamma": g, "A_avg": 0.8 + 0.01 * k, "A_last": 0.7 + 0.01 * k, "F": 0.05, "F_published_code": 0.04,
         "accuracy_matrix": MATRIX}
        for k, g in enumerate(gammas)
    ]
    return {"gammas": list(gammas), "best_gamma": gammas[-1], "results": results, "tasks": TASKS[:n_tasks],
            "n_tasks": n_tasks, "projection_dim": 1000, "batch_size": 10, "seed": 0, "dataset": dataset,
            "encoder": encoder, "seconds": 2.0}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def summary_value(text: str, label: str) -> list[str]:
    """The cells after the label in the markdown table row that starts with ``label``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in summary.md:\n{text}")


# --------------------------------------------------------------------------------------------------
# Metrics and paper table


def test_metrics_from_matrix_match_hand_computation():
    got = summarize(MATRIX)
    assert got["A_steps"] == pytest.approx(A_STEPS)
    assert got["A_avg"] == pytest.approx(A_AVG)
    assert got["A_last"] == pytest.approx(A_LAST)
    assert got["F"] == pytest.approx(F)
    assert got["F_published_code"] == pytest.approx(F_PUBLISHED)
    one = summarize([[0.5]])
    assert (one["A_avg"], one["A_last"], one["F"], one["F_published_code"]) == (0.5, 0.5, 0.0, 0.0)


def test_table2_holds_the_papers_f_oal_row():
    got = {row.dataset: (row.A_avg, row.A_last, row.F, row.n_tasks) for row in TABLE2}
    assert got == {
        "cifar100": (91.1, 86.5, 5.5, 10), "core50": (96.3, 92.5, 3.9, 9), "fgvcaircraft": (62.2, 54.0, 10.0, 10),
        "dtd": (82.8, 75.9, 10.1, 10), "tinyimagenet": (91.2, 87.3, 5.0, 10), "country211": (24.4, 17.5, 6.9, 10),
    }
    assert all(len(row.gamma_A_avg) == 6 for row in TABLE2)
    assert paper_row("FGVC-Aircraft") is paper_row("fgvc_aircraft") is paper_row("fgvcaircraft")
    assert paper_row("tiny-imagenet").title == "Tiny-ImageNet"
    assert paper_row("digits") is None


def paper_metrics(**overrides):
    """A cifar100 run with the paper's settings (the accuracy matrix stays the 3-task one)."""
    settings = {"dataset": "cifar100", "encoder": PAPER_ENCODER, "n_tasks": 10, "tasks": [[k] for k in range(10)]}
    return make_metrics(**{**settings, **overrides})


def test_match_paper_requires_the_papers_settings():
    assert match_paper(make_metrics()) is None  # digits: not in Table 2
    match = match_paper(paper_metrics())
    assert match.comparable and match.row.title == "CIFAR-100"
    off = match_paper(paper_metrics(gamma=0.1, batch_size=32))
    assert not off.comparable
    assert off.differences == ("gamma 0.1 (paper 1)", "batch size 32 (paper 10)")
    assert match_paper(paper_metrics(gamma=0.1), ignore=("gamma",)).comparable
    assert not match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, name="vit_small_patch16_224"))).comparable
    assert not match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, fusion="last"))).comparable
    # CORe50 is 9 tasks in the paper
    assert not match_paper(paper_metrics(dataset="core50")).comparable
    assert match_paper(paper_metrics(dataset="core50", n_tasks=9)).comparable


# --------------------------------------------------------------------------------------------------
# evaluate(): files, plots, summary.md


def test_evaluate_writes_valid_plots_and_plot_data(tmp_path):
    run = make_run(tmp_path / "run", sweep=make_sweep())
    ev = evaluate(run)
    out = run / "eval"
    assert ev.out == out and not ev.warnings
    names = {f.name for f in ev.files}
    assert names == {"accuracy_matrix.png", "steps.png", "weight_norms.png", "gamma.png", "accuracy_matrix.csv",
                     "steps.csv", "weight_norms.csv", "gamma.csv", "summary.md", "scores.json"}
    best = max(make_sweep()["results"], key=lambda r: r["A_avg"])
    assert json.loads((out / "scores.json").read_text()) == pytest.approx(
        {"A_avg": A_AVG, "A_last": A_LAST, "F": F, "F_published_code": F_PUBLISHED,
         "sweep_best_gamma": best["gamma"], "sweep_best_A_avg": best["A_avg"]})
    for name in ("accuracy_matrix.png", "steps.png", "weight_norms.png", "gamma.png"):
        width, height = png_size(out / name)
        assert width >= 300 and height >= 250, name
        assert (out / name).stat().st_size > 10_000, f"{name} is suspiciously small"

    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert [int(r["step"]) for r in steps] == [1, 2, 3]
    assert [float(r["A_i"]) for r in steps] == pytest.approx([100 * a for a in A_STEPS], abs=1e-4)
    assert [float(r["newest_task"]) for r in steps] == pytest.approx([90, 95, 90])
    assert [float(r["first_task"]) for r in steps] == pytest.approx([90, 80, 70])

    cells = {(int(r["after_task"]), int(r["task"])): float(r["accuracy"])
             for r in csv.DictReader((out / "accuracy_matrix.csv").open())}
    assert cells == {(i + 1, j + 1): pytest.approx(100 * v) for i, row in enumerate(MATRIX) for j, v in enumerate(row)}

    # classes in stream order (3, 7, 0, 5, 9, 1), coloured by task; norms are label + 1 by construction
    norms = list(csv.DictReader((out / "weight_norms.csv").open()))
    assert [int(r["label"]) for r in norms] == [3, 7, 0, 5, 9, 1]
    assert [int(r["task"]) for r in norms] == [1, 1, 2, 2, 3, 3]
    assert [float(r["norm"]) for r in norms] == pytest.approx([4, 8, 1, 6, 10, 2])
    assert [r["name"] for r in norms] == ["class3", "class7", "class0", "class5", "class9", "class1"]

    gamma = list(csv.DictReader((out / "gamma.csv").open()))
    assert [float(r["gamma"]) for r in gamma] == sorted([1e-3, 1e-1, 1.0, 10.0, 100.0, 1e-2])


def test_summary_numbers_match_metrics_json(tmp_path):
    run = make_run(tmp_path / "run", sweep=make_sweep())
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    for label, key in [("A_avg (%)", "A_avg"), ("A_last (%)", "A_last"), ("F (%)", "F"),
                       ("F, published code (%)", "F_published_code")]:
        (shown,) = summary_value(text, label)
        assert float(shown) == pytest.approx(100 * metrics[key], abs=0.005), label
    for i, row in enumerate(metrics["accuracy_matrix"]):
        cells = summary_value(text, str(i + 1))
        assert [float(c) for c in cells[: i + 1]] == pytest.approx([100 * v for v in row], abs=0.05)
        assert float(cells[-1]) == pytest.approx(100 * A_STEPS[i], abs=0.005)
    assert "no `digits` column" in text
    best = max(make_sweep()["results"], key=lambda r: r["A_avg"])
    assert f"Best gamma by A_avg: {best['gamma']:g} ({100 * best['A_avg']:.2f}%)" in text
    for name in ("accuracy_matrix.png", "steps.png", "weight_norms.png", "gamma.png"):
        assert f"({name})" in text


def test_summary_shows_the_papers_numbers_when_settings_match(tmp_path):
    sweep = make_sweep(dataset="cifar100", encoder=PAPER_ENCODER, n_tasks=10)
    sweep["tasks"] = [[k] for k in range(10)]
    run = make_run(tmp_path / "run", paper_metrics(), sweep=sweep)
    ev = evaluate(run)
    assert ev.paper.comparable
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text, "A_avg (%)") == [f"{100 * A_AVG:.2f}", "91.1", f"{100 * A_AVG - 91.1:+.1f}"]
    assert summary_value(text, "A_last (%)")[1] == "86.5"
    assert summary_value(text, "F (%)")[1] == "5.5"
    # the appendix's gamma table beside the sweep: gamma 1e-3 -> 87.2, gamma 100 -> 91.1
    assert summary_value(text, "0.001")[-1] == "87.2"
    assert summary_value(text, "100")[-1] == "91.1"
    assert "normalize True (published code: False)" in text  # departures from the published code are listed


def test_summary_says_why_a_run_is_not_compared(tmp_path):
    run = make_run(tmp_path / "run", paper_metrics(gamma=0.1))
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text, "A_avg (%)") == [f"{100 * A_AVG:.2f}"]  # no paper column
    assert "Not compared with the paper's CIFAR-100 column" in text and "gamma 0.1 (paper 1)" in text


def test_inconsistent_metrics_are_reported_not_hidden(tmp_path):
    run = make_run(tmp_path / "run", make_metrics(A_avg=0.5), model=False)
    ev = evaluate(run)
    assert len(ev.warnings) == 1 and "A_avg in metrics.json is 0.500000" in ev.warnings[0]
    text = (run / "eval" / "summary.md").read_text()
    assert "**Warning:** A_avg in metrics.json" in text
    assert summary_value(text, "A_avg (%)") == ["50.00"]  # the stored number is shown, beside the warning


def test_optional_inputs_are_optional(tmp_path):
    run = make_run(tmp_path / "run", model=False, sweep=make_sweep())
    evaluate(run, out=tmp_path / "elsewhere")  # an earlier evaluation, with a sweep and plots
    (run / "sweep.json").unlink()
    ev = evaluate(run, out=tmp_path / "elsewhere", plots=False)
    assert {f.name for f in ev.files} == {"steps.csv", "accuracy_matrix.csv", "summary.md", "scores.json"}
    assert not list((tmp_path / "elsewhere").glob("*.png"))  # stale plots are removed, not left to mislead
    assert {p.name for p in (tmp_path / "elsewhere").iterdir()} == {f.name for f in ev.files}
    assert "## Gamma sweep" not in (tmp_path / "elsewhere" / "summary.md").read_text()


# --------------------------------------------------------------------------------------------------
# CLI


def test_cli_evaluate(tmp_path):
    run = make_run(tmp_path / "run")
    sweep_dir = tmp_path / "run-sweep"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.json").write_text(json.dumps(make_sweep()))
    result = runner.invoke(app, ["evaluate", "--run", str(run), "--sweep", str(sweep_dir), "--out",
                                 str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    assert f"A_avg {100 * A_AVG:.2f}" in result.output
    assert (tmp_path / "ev" / "gamma.png").exists() and (tmp_path / "ev" / "weight_norms.png").exists()


def _error(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "has no metrics.json"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "should hold a JSON object"),
        (json.dumps({"A_avg": 0.5}), "has no 'accuracy_matrix'"),
        (json.dumps(make_metrics(accuracy_matrix=[[0.9], [0.8]])), "row 1 of 'accuracy_matrix' should have 2"),
        (json.dumps(make_metrics(accuracy_matrix=[[90.0]])), "outside [0, 1]"),
        (json.dumps(make_metrics(F="high")), "no number under 'F'"),
    ],
)
def test_cli_evaluate_bad_metrics_is_one_line_error(tmp_path, content, message):
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "metrics.json").write_text(content)
    assert message in _error(runner.invoke(app, ["evaluate", "--run", str(run)]))


def test_cli_evaluate_other_bad_inputs(tmp_path):
    assert "does not exist" in _error(runner.invoke(app, ["evaluate", "--run", str(tmp_path / "missing")]))
    run = make_run(tmp_path / "run", model=False)
    (run / "model.safetensors").write_bytes(b"garbage")
    assert "not a readable safetensors model" in _error(runner.invoke(app, ["evaluate", "--run", str(run)]))
    (run / "model.safetensors").unlink()
    (tmp_path / "s.json").write_text(json.dumps({"gammas": [1]}))
    err = _error(runner.invoke(app, ["evaluate", "--run", str(run), "--sweep", str(tmp_path / "s.json")]))
    assert "no 'results' list" in err
    err = _error(runner.invoke(app, ["evaluate", "--run", str(run), "--model", str(tmp_path / "none.safetensors")]))
    assert "does not exist" in err


def test_cli_summary_table(tmp_path):
    make_run(tmp_path / "runs" / "digits", model=False)
    make_run(tmp_path / "runs" / "cifar", paper_metrics(), model=False)
    sweep_dir = tmp_path / "runs" / "digits-sweep"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.json").write_text(json.dumps(make_sweep()))
    result = runner.invoke(app, ["summary", str(tmp_path / "runs")], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count(f"{100 * A_AVG:.2f}") == 2 and f"{100 * A_LAST:.2f}" in out
    assert "91.1 / 86.5 / 5.5" in out  # the comparable cifar100 run
    # the sweep's best gamma (listed last) and its A_avg
    assert re.search(r"0\.01\*\s+85\.00\s+75\.00\s+5\.00", out) and "of 6 tried" in out
    assert "does not exist" in _error(runner.invoke(app, ["summary", str(tmp_path / "nowhere")]))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no metrics.json or sweep.json" in _error(runner.invoke(app, ["summary", str(empty)]))


def test_cli_summary_skips_unreadable_runs_with_a_warning(tmp_path):
    make_run(tmp_path / "good", model=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.json").write_text("{")
    result = runner.invoke(app, ["summary", str(tmp_path)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "Warning: skipped" in result.output and f"{100 * A_AVG:.2f}" in result.output


@pytest.mark.parametrize("command", ["evaluate", "summary"])
def test_every_option_states_its_default(command):
    import typer.main

    params = typer.main.get_command(app).commands[command].params
    assert params
    for param in params:
        text = getattr(param, "help", None) or ""
        assert text, f"{command} {param.name} has no help"
        assert re.search(r"Default|Required", text), f"{command} {param.name}: help does not state its default"


def test_read_metrics_accepts_the_learners_output_keys(tmp_path):
    make_run(tmp_path / "run", model=False)
    metrics = read_metrics(tmp_path / "run")
    assert metrics["accuracy_matrix"] == MATRIX


def test_readme_evaluation_example_runs(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("\n## Python API", 1)[1].split("\n## ", 1)[0]
    code = next(block for block in re.findall(r"```python\n(.*?)```", section, re.S) if "foal_pipe.evaluate" in block)
    make_run(tmp_path / "runs" / "digits")
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    printed = capsys.readouterr().out.splitlines()
    assert "summary.md" in printed[0] and printed[1] == "None" and printed[2] == "91.1"
    assert (tmp_path / "runs/digits/eval/weight_norms.png").exists()
