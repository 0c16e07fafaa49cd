"""`foal-pipe evaluate` / `summary` and the paper table, on hand-made runs (no store, no learner needed)."""

from __future__ import annotations

import csv
import json
import re
import struct
import zlib
from pathlib import Path

import pytest
from helpers import (
    A_AVG,
    A_LAST,
    A_STEPS,
    F_PUBLISHED,
    HAND,
    MATRIX,
    PAPER_ENCODER,
    PIXELS,
    TASKS,
    F,
    make_metrics,
    make_run,
    shifted,
)
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.core.metrics import summarize
from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.report import evaluate, read_metrics, read_sweep, select
from foal_pipe.report.paper import TABLE2, match_paper, paper_row

runner = CliRunner()


#: The hand-made cifar100 run's A_avg and A_last: every entry of its 10-task accuracy matrix (F 0); that matrix and its
#: numbers.
PAPER_ACC = 0.9
PAPER = {"accuracy_matrix": [[PAPER_ACC] * (i + 1) for i in range(10)], "A_avg": PAPER_ACC, "A_last": PAPER_ACC, "F": 0.0,
         "F_published_code": 0.0, "A_steps": [PAPER_ACC] * 10}


def make_sweep(dataset="digits", encoder=PIXELS, base=HAND, gammas=(1e-3, 1e-1, 1.0, 10.0, 100.0, 1e-2)) -> dict:
    """A sweep as written before GCV and LOO: gamma k (in the order listed) has ``base``'s matrix raised by 0.01 k
    (:func:`shifted`), so ``best_gamma`` by test A_avg is the last gamma listed here."""
    results = [{"gamma": g, **shifted(base, k)} for k, g in enumerate(gammas)]
    n_tasks = len(base["accuracy_matrix"])
    return {"gammas": list(gammas), "best_gamma": gammas[-1], "results": results, "tasks": TASKS[:n_tasks],
            "n_tasks": n_tasks, "projection_dim": 1000, "batch_size": 10, "seed": 0, "dataset": dataset,
            "encoder": encoder, "seconds": 2.0}


def pct(base: dict, k: int) -> list[str]:
    """The summary's A_avg, A_last and F cells (%) of the result of :func:`shifted` ``(base, k)``."""
    numbers = shifted(base, k)
    return [f"{100 * numbers[key]:.2f}" for key in ("A_avg", "A_last", "F")]


GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def new_sweep(selected_by="loo", best=1.0, loo=True, low=None, **kwargs) -> dict:
    """A sweep with GCV and LOO per task boundary (the stats helper's schema): test A_avg rises with gamma (gamma k of
    :data:`GRID` has :data:`MATRIX` raised by 0.01 k; the oracle is 100); GCV and LOO MSE are lowest and LOO accuracy
    highest at gamma ``low`` (default: ``best``, so that its criterion chooses it; 1 where test A_avg chooses)."""
    low = low if low is not None else 1.0 if selected_by == "test" else best
    centre = GRID.index(low)
    sweep = make_sweep(gammas=GRID, **kwargs)
    for k, r in enumerate(sweep["results"]):
        off = abs(k - centre)
        r["gcv"] = [0.9, 0.8, 0.5 + 0.1 * off]
        r["loo_accuracy"] = [0.95, 0.9, 0.88 - 0.02 * off] if loo else None
        r["loo_mse"] = [0.05, 0.07, 0.1 + 0.01 * off] if loo else None
    sweep.pop("seconds")
    sweep.update(best_gamma=best, best_gamma_test=100.0, selected_by=selected_by)
    return sweep


def png_chunks(path: Path) -> list[tuple[bytes, bytes]]:
    """``(type, data)`` of every chunk of a PNG file, CRCs checked."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        chunks.append((kind, body))
        pos += 12 + length
    return chunks


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
    """A cifar100 run with the paper's settings and data (50,000 / 10,000 rows of 768 features): 10 tasks, each
    accuracy :data:`PAPER_ACC`."""
    settings = {"dataset": "cifar100", "encoder": PAPER_ENCODER, "n_tasks": 10, "tasks": [[k] for k in range(10)],
                "n_train_seen": 50_000, "n_test": 10_000, **PAPER}
    return make_metrics(**{**settings, **overrides})


def test_match_paper_requires_the_papers_settings():
    assert match_paper(make_metrics()) is None  # digits: not in Table 2
    match = match_paper(paper_metrics())
    assert match.comparable and match.row.title == "CIFAR-100"
    other = match_paper(LearnMetrics.from_dict(paper_metrics(head="balanced", head_options={"gamma": 1.0})))
    assert other.differences == ("head balanced (paper: F-OAL's ridge)",)  # the paper's numbers are ridge's
    off = match_paper(paper_metrics(gamma=0.1, batch_size=32))
    assert not off.comparable
    assert off.differences == ("gamma 0.1 (paper 1)", "batch size 32 (paper 10)")
    assert match_paper(paper_metrics(gamma=0.1), ignore=("gamma",)).comparable
    assert match_paper(paper_metrics(gamma="auto")).differences == ("gamma auto (paper 1)",)
    assert not match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, name="vit_small_patch16_224"))).comparable
    assert not match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, fusion="last"))).comparable
    # Tiny-ImageNet: 10 tasks, 100,000 / 10,000 rows
    assert not match_paper(paper_metrics(dataset="tiny-imagenet")).comparable
    assert match_paper(paper_metrics(dataset="tiny-imagenet", n_train_seen=100_000)).comparable


def test_match_paper_requires_the_papers_data():
    """Dataset, encoder, row counts and feature dimension must all match before a match is claimed."""
    assert match_paper(paper_metrics(n_train_seen=49_990)).differences == ("train rows 49,990 (paper 50,000)",)
    assert match_paper(paper_metrics(n_test=1_000)).differences == ("test rows 1,000 (paper 10,000)",)
    no_count = {k: v for k, v in paper_metrics().items() if k != "n_test"}
    assert match_paper(no_count).differences == ("test rows not recorded (paper 10,000)",)
    assert match_paper(paper_metrics(feature_dim=384)).differences == ("feature dimension 384 (paper 768)",)
    no_dim = paper_metrics(encoder={k: v for k, v in PAPER_ENCODER.items() if k != "dim"})
    assert match_paper(no_dim).differences == ("feature dimension not recorded (paper 768)",)
    assert match_paper(paper_metrics(feature_dim=768)).comparable
    # where the appendix gives only per-class averages, no match can be claimed
    core50 = match_paper(paper_metrics(dataset="core50", n_tasks=9))
    assert not core50.comparable and all("no exact count for CORe50" in d for d in core50.differences)
    assert [row.dataset for row in TABLE2 if row.n_train is not None] == ["cifar100", "dtd", "tinyimagenet"]


def test_match_paper_on_dtd_needs_the_published_split():
    """DTD's 47 classes in 10 tasks: the paper streams 40 (the published code drops 7); foal-pipe's default
    streams all 47 in tasks of 5 and 4, which the comparison names with the flag that gives the paper's data."""
    dropped = paper_metrics(dataset="dtd", tasks=[[4 * t + k for k in range(4)] for t in range(10)],
                            n_train_seen=1_600, n_test=1_600, drop_remainder=True)
    assert match_paper(dropped).comparable
    kept = paper_metrics(dataset="dtd", tasks=[list(range(5))] * 7 + [list(range(4))] * 3, n_train_seen=1_880,
                         n_test=1_880, drop_remainder=False)
    hint = "; the published code drops the classes left over by an even split: --drop-remainder)"
    assert match_paper(kept).differences == ("train rows 1,880 (paper 1,600" + hint, "test rows 1,880 (paper 1,600" + hint)


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
    # an old sweep: chosen by test A_avg, highest at gamma 0.01 (listed last: its matrix raised by 0.05)
    assert json.loads((out / "scores.json").read_text()) == pytest.approx(
        {"A_avg": A_AVG, "A_last": A_LAST, "F": F, "F_published_code": F_PUBLISHED,
         "sweep_selected_gamma": 0.01, "sweep_selected_A_avg": A_AVG + 0.05,
         "sweep_oracle_gamma": 0.01, "sweep_oracle_A_avg": A_AVG + 0.05})
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
    assert "no `digits` column" in text and text.startswith("# F-OAL run: run (digits)\n")
    assert f"Selected gamma: 0.01, by test A_avg (old sweep) (test A_avg {100 * (A_AVG + 0.05):.2f}%)" in text
    assert "predates GCV and leave-one-out" in text and "The test-set oracle would pick" not in text
    assert f"From `{run / 'sweep.json'}`.\n" in text  # no GCV or LOO in an old sweep
    for name in ("accuracy_matrix.png", "steps.png", "weight_norms.png", "gamma.png"):
        assert f"({name})" in text


def test_summary_shows_the_papers_numbers_when_settings_match(tmp_path):
    sweep = make_sweep(dataset="cifar100", encoder=PAPER_ENCODER, base=PAPER)
    sweep.update(tasks=[[k] for k in range(10)], n_train_seen=50_000, n_test=10_000)
    run = make_run(tmp_path / "run", paper_metrics(), sweep=sweep)
    ev = evaluate(run)
    assert ev.paper.comparable and not ev.warnings
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text, "A_avg (%)") == [f"{100 * PAPER_ACC:.2f}", "91.1", f"{100 * PAPER_ACC - 91.1:+.1f}"]
    assert summary_value(text, "A_last (%)")[1] == "86.5"
    assert summary_value(text, "F (%)")[1] == "5.5"
    # the appendix's gamma table beside the sweep: gamma 1e-3 -> 87.2, gamma 100 -> 91.1
    assert summary_value(text, "0.001")[-2:] == ["87.2", ""]
    assert summary_value(text, "0.01")[-2:] == ["90.3", "selected, test oracle"]  # an old sweep: by test A_avg
    assert summary_value(text, "0.01")[:3] == pct(PAPER, 5) == ["95.00", "95.00", "0.00"]
    assert summary_value(text, "100")[-2] == "91.1"
    assert "normalize True (published code: False)" in text  # departures from the published code are listed


def test_summary_says_why_a_run_is_not_compared(tmp_path):
    run = make_run(tmp_path / "run", paper_metrics(gamma=0.1))
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text, "A_avg (%)") == [f"{100 * PAPER_ACC:.2f}"]  # no paper column
    assert "Not compared with the paper's CIFAR-100 column" in text and "gamma 0.1 (paper 1)" in text


def test_summary_claims_no_match_when_the_data_differ(tmp_path):
    run = make_run(tmp_path / "run", paper_metrics(n_test=9_000))
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text, "A_avg (%)") == [f"{100 * PAPER_ACC:.2f}"]
    assert "this run differs in test rows 9,000 (paper 10,000)." in text


def test_inconsistent_metrics_are_reported_not_hidden(tmp_path):
    run = make_run(tmp_path / "run", make_metrics(A_avg=0.5), model=False)
    ev = evaluate(run)
    assert len(ev.warnings) == 1 and "A_avg in metrics.json is 0.500000" in ev.warnings[0]
    text = (run / "eval" / "summary.md").read_text()
    assert "**Warning:** A_avg in metrics.json" in text
    assert summary_value(text, "A_avg (%)") == [f"{100 * A_AVG:.2f}"]  # the matrix's number, the stored one warned of


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
    sweep_dir = tmp_path / "elsewhere"
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
        (json.dumps(make_metrics(tasks=[[3, "7"]])), "no list of lists of label ids under 'tasks'"),
        (json.dumps(make_metrics(task_names=[["a", "b"], ["c"], ["d", "e"]])), "'task_names' should name the classes"),
        (json.dumps(make_metrics(eval_features=[{"features": "a.zarr", "n_test": 3, "accuracy": 1.5,
                                                 "unknown_class_rows": 0}])),
         "eval_features[0] has no number in [0, 1] under 'accuracy'"),
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
    assert "is not a safetensors model" in _error(runner.invoke(app, ["evaluate", "--run", str(run)]))
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
    assert out.count(f"{100 * A_AVG:.2f}") == 1 and f"{100 * A_LAST:.2f}" in out and f"{100 * PAPER_ACC:.2f}" in out
    assert "91.1 / 86.5 / 5.5" in out  # the comparable cifar100 run
    # the old sweep's gamma, chosen by test A_avg (listed last), and its A_avg
    assert re.search(r"0\.01\*\s+" + r"\s+".join(map(re.escape, pct(HAND, 5))), out) and "of 6 by test A_avg (old sweep)" in out
    # two sweeps chosen alike: the footnote states the grid and criterion once
    (tmp_path / "runs" / "cifar-sweep").mkdir()
    (tmp_path / "runs" / "cifar-sweep" / "sweep.json").write_text(json.dumps(make_sweep()))
    two = runner.invoke(app, ["summary", str(tmp_path / "runs")], env={"COLUMNS": "220"})
    assert two.exit_code == 0 and "(of 6 by test A_avg (old sweep)) and its test numbers" in two.output, two.output
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
    assert metrics.accuracy_matrix == MATRIX


def test_docs_evaluation_example_runs(tmp_path, monkeypatch, capsys):
    page = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "foal_pipe.report" in block)
    make_run(tmp_path / "runs" / "digits")
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    printed = capsys.readouterr().out.splitlines()
    assert "summary.md" in printed[0] and printed[1] == "None" and printed[2] == "91.1"
    assert (tmp_path / "runs/digits/eval/weight_norms.png").exists()


# --------------------------------------------------------------------------------------------------
# Byte-stable, atomic output


def test_evaluate_twice_gives_identical_bytes(tmp_path):
    """DVC hashes the outputs: the same run must give the same bytes, PNGs included."""
    run = make_run(tmp_path / "run", make_metrics(gamma="auto", gammas_selected=[0.1, 1.0, 1.0], selected_by="loo"),
                   sweep=new_sweep())
    first = {f.name: f.read_bytes() for f in evaluate(run).files}
    again = evaluate(run).files
    assert {f.name: f.read_bytes() for f in again} == first
    other = evaluate(run, out=tmp_path / "other").files  # a fresh directory, another process state
    assert {f.name: f.read_bytes() for f in other} == first
    assert {name for name in first if name.endswith(".png")} == {
        "accuracy_matrix.png", "steps.png", "weight_norms.png", "gamma.png"}
    for name in ("accuracy_matrix.png", "gamma.png"):
        kinds = [kind for kind, _ in png_chunks(run / "eval" / name)]
        assert b"tIME" not in kinds
        assert not [body for kind, body in png_chunks(run / "eval" / name) if kind == b"tEXt" and b"Software" in body]
    assert not list(run.glob(".eval.tmp-*")), "temporary directories left behind"


def test_failed_evaluation_leaves_the_previous_one(tmp_path, monkeypatch):
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.report import evaluation

    run = make_run(tmp_path / "run", sweep=new_sweep())
    before = {f.name: f.read_bytes() for f in evaluate(run).files}
    (run / "metrics.json").write_text(json.dumps(make_metrics(A_avg=0.5)))

    def broken(*args, **kwargs):
        raise FoalPipeError("disk full")

    monkeypatch.setattr(evaluation, "plot_gamma", broken)
    with pytest.raises(FoalPipeError, match="disk full"):
        evaluate(run)
    assert {p.name: p.read_bytes() for p in (run / "eval").iterdir()} == before
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []


# --------------------------------------------------------------------------------------------------
# Finding the sweep


def test_evaluate_finds_the_pipelines_sweep_beside_the_run(tmp_path):
    run = make_run(tmp_path / "runs" / "digits")
    (tmp_path / "runs" / "digits-sweep").mkdir()
    (tmp_path / "runs" / "digits-sweep" / "sweep.json").write_text(json.dumps(new_sweep()))
    ev = evaluate(run)
    assert ev.run.sweep_path == tmp_path / "runs" / "digits-sweep" / "sweep.json" and not ev.notes
    assert "gamma.png" in {f.name for f in ev.files}
    assert f"From `{tmp_path / 'runs' / 'digits-sweep' / 'sweep.json'}`" in (run / "eval" / "summary.md").read_text()
    # RUN/sweep.json comes first when both exist
    (run / "sweep.json").write_text(json.dumps(make_sweep()))
    assert evaluate(run).run.sweep_path == run / "sweep.json"


def test_evaluate_says_when_no_sweep_is_found(tmp_path):
    run = make_run(tmp_path / "runs" / "digits", sweep=make_sweep())
    evaluate(run)
    assert (run / "eval" / "gamma.png").exists()
    (run / "sweep.json").unlink()
    ev = evaluate(run)
    assert len(ev.notes) == 1
    note = ev.notes[0]
    assert str(run / "sweep.json") in note and str(tmp_path / "runs" / "digits-sweep" / "sweep.json") in note
    assert not (run / "eval" / "gamma.png").exists() and not (run / "eval" / "gamma.csv").exists()
    assert note in (run / "eval" / "summary.md").read_text()
    result = runner.invoke(app, ["evaluate", "--run", str(run)])
    assert result.exit_code == 0, result.output
    assert "Note: No gamma sweep found" in result.output


# --------------------------------------------------------------------------------------------------
# What metrics.json may hold: with or without wall times, gamma "auto"


def test_metrics_with_or_without_seconds_evaluate_alike(tmp_path):
    a = evaluate(make_run(tmp_path / "a" / "run", make_metrics(), model=False), out=tmp_path / "ea")
    b = evaluate(make_run(tmp_path / "b" / "run", make_metrics(seconds=3.5), model=False), out=tmp_path / "eb")
    text_a = (a.out / "summary.md").read_text().replace(str(tmp_path / "a"), "DIR")
    text_b = (b.out / "summary.md").read_text().replace(str(tmp_path / "b"), "DIR")
    assert text_a == text_b and " s " not in text_a  # no wall time in the summary: it would change every run


def test_gamma_auto_is_shown_with_the_gammas_chosen(tmp_path):
    metrics = make_metrics(gamma="auto", gammas_selected=[0.01, 1.0, 100.0], selected_by="gcv")
    run = make_run(tmp_path / "runs" / "auto", metrics, model=False)
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert text.startswith("# F-OAL run: auto (digits)\n")  # the run's name, and its dataset
    assert "gamma=auto" in text
    assert "by GCV (generalised cross-validation, from the Gram statistics alone): T1 0.01, T2 1, T3 100." in text
    result = runner.invoke(app, ["summary", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert re.search(r"\s3\s+disjoint\s+1000\s+auto\s+" + re.escape(f"{100 * A_AVG:.2f}"), result.output), result.output


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gamma": "big"}, "has no number > 0 or \"auto\" under 'gamma' (found \"big\")"),
        ({"gamma": -1}, "has no number > 0 or \"auto\" under 'gamma' (found -1)"),
        ({"gamma": "auto"}, "'gammas_selected' is not a list of 3 positive numbers"),
        ({"gamma": "auto", "gammas_selected": [1.0, 1.0]}, "not a list of 3 positive numbers"),
    ],
)
def test_bad_gamma_in_metrics_is_refused(tmp_path, overrides, message):
    (tmp_path / "metrics.json").write_text(json.dumps(make_metrics(**overrides)))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_metrics(tmp_path)


# --------------------------------------------------------------------------------------------------
# The sweep's choice of gamma (GCV, leave-one-out, the test oracle)


def test_selected_gamma_and_criteria_in_summary_scores_and_csv(tmp_path):
    run = make_run(tmp_path / "run", sweep=new_sweep())
    assert not evaluate(run).warnings  # the sweep's numbers are its matrices'
    out = run / "eval"
    text = (out / "summary.md").read_text()
    assert pct(HAND, 3) == ["89.39", "84.67", "15.00"]  # MATRIX's 86.39, 81.67 and 15.00, A_avg and A_last + 3 points
    by_gamma = {r["gamma"]: r for r in new_sweep()["results"]}
    assert f"Selected gamma: 1, by leave-one-out MSE on the training rows seen (test A_avg {100 * (A_AVG + 0.03):.2f}%)." in text
    assert f"The test-set oracle would pick 100 (test A_avg {100 * (A_AVG + 0.05):.2f}%)" in text
    assert "**Note:**" not in text  # gamma 1 is inside the grid
    # the table: GCV, LOO accuracy and LOO MSE at the last boundary; the choices marked
    table = text.split("## Gamma sweep")[1]
    assert summary_value(table, "1") == [*pct(HAND, 3), "0.5", "88.00", "0.1", "selected"]
    assert summary_value(table, "100") == [*pct(HAND, 5), "0.7", "84.00", "0.12", "test oracle"]
    assert summary_value(table, "0.001")[-1] == ""
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["sweep_selected_gamma"], scores["sweep_oracle_gamma"]) == (1.0, 100.0)
    assert scores["sweep_selected_A_avg"] == pytest.approx(by_gamma[1.0]["A_avg"])
    assert scores["sweep_oracle_A_avg"] == pytest.approx(by_gamma[100.0]["A_avg"])
    rows = {float(r["gamma"]): r for r in csv.DictReader((out / "gamma.csv").open())}
    for g, r in by_gamma.items():
        assert float(rows[g]["gcv"]) == pytest.approx(r["gcv"][-1])
        assert float(rows[g]["loo_accuracy"]) == pytest.approx(100 * r["loo_accuracy"][-1])
        assert float(rows[g]["loo_mse"]) == pytest.approx(r["loo_mse"][-1])


@pytest.mark.parametrize(
    ("selected_by", "best", "criterion"),
    [
        ("loo", 1.0, "by leave-one-out MSE on the training rows seen"),
        ("gcv", 0.1, "by GCV (generalised cross-validation, from the Gram statistics alone)"),
        ("test", 100.0, "by test A_avg (an oracle: it peeks at the test split)"),
    ],
)
def test_summary_names_the_criterion(tmp_path, selected_by, best, criterion):
    run = make_run(tmp_path / "run", model=False, sweep=new_sweep(selected_by=selected_by, best=best))
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert f"Selected gamma: {best:g}, {criterion}" in text
    assert ("The test-set oracle would pick" in text) == (selected_by != "test")
    assert select(read_sweep(run / "sweep.json")).gamma == best


@pytest.mark.parametrize(("best", "edge"), [(1e-3, "smallest"), (100.0, "largest"), (10.0, None)])
def test_a_choice_at_the_edge_of_the_grid_is_flagged(tmp_path, best, edge):
    run = make_run(tmp_path / "run", model=False, sweep=new_sweep(selected_by="gcv", best=best))
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert select(read_sweep(run / "sweep.json")).at_edge == edge
    if edge:
        assert f"**Note:** the selected gamma is the {edge} in the grid" in text
    else:
        assert "**Note:**" not in text


def test_sweep_without_leave_one_out(tmp_path):
    """`sweep --no-loo` writes null LOO lists: GCV is still shown, LOO cells are empty."""
    run = make_run(tmp_path / "run", model=False, sweep=new_sweep(selected_by="gcv", best=1.0, loo=False))
    ev = evaluate(run)
    assert "gamma.png" in {f.name for f in ev.files}
    text = (run / "eval" / "summary.md").read_text()
    assert summary_value(text.split("## Gamma sweep")[1], "1") == [*pct(HAND, 3), "0.5", "-", "-", "selected"]
    rows = list(csv.DictReader((run / "eval" / "gamma.csv").open()))
    assert {r["loo_accuracy"] for r in rows} == {""} and all(r["gcv"] for r in rows)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"selected_by": "magic"}, "has no criterion (loo, gcv, loo_accuracy, test) under 'selected_by' (found \"magic\")"),
        ({"best_gamma": 3.0}, "'best_gamma' 3.0 is not one of the gammas"),
        ({"best_gamma_test": "x"}, "has no number under 'best_gamma_test' (found \"x\")"),
    ],
)
def test_bad_sweep_selection_is_refused(tmp_path, change, message):
    (tmp_path / "sweep.json").write_text(json.dumps({**new_sweep(), **change}))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_sweep(tmp_path)


def test_bad_sweep_criterion_values_are_refused(tmp_path):
    sweep = new_sweep()
    sweep["results"][2]["gcv"] = 0.5
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    with pytest.raises(ValueError, match=r"results\[2\] has no list of numbers or nulls .* under 'gcv'"):
        read_sweep(tmp_path)


def test_gamma_plot_shows_test_accuracy_gcv_and_loo_with_the_choice(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from foal_pipe.report import load_run, plots

    figures = []

    def capture(path, size, paint):
        fig = Figure(figsize=size)
        paint(fig)
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "draw", capture)
    sweep = new_sweep(best=1e-3)  # at the edge
    run = load_run(make_run(tmp_path / "run", model=False, sweep=sweep))
    plots.plot_gamma(run, tmp_path / "gamma.png", None)
    left, right = figures[0].axes
    assert left.get_xscale() == "log"
    lines = {line.get_label(): line for line in left.get_lines()}
    gammas = [r["gamma"] for r in sweep["results"]]
    assert list(lines["test A_avg"].get_xdata()) == gammas
    assert list(lines["test A_avg"].get_ydata()) == pytest.approx([100 * r["A_avg"] for r in sweep["results"]])
    loo = lines["LOO accuracy (train rows seen)"]
    assert list(loo.get_ydata()) == pytest.approx([100 * r["loo_accuracy"][-1] for r in sweep["results"]])
    assert list(lines["selected γ = 0.001 (LOO MSE)"].get_xdata()) == [1e-3, 1e-3]
    assert list(lines["test oracle γ = 100"].get_xdata()) == [100.0, 100.0]
    (gcv,) = right.get_lines()
    assert gcv.get_label() == "GCV, last task (right axis)"
    assert list(gcv.get_ydata()) == pytest.approx([r["gcv"][-1] for r in sweep["results"]])
    assert "selected γ is the smallest tried" in left.get_title()
    legend = [text.get_text() for text in figures[0].legends[0].get_texts()]
    assert "GCV, last task (right axis)" in legend and "selected γ = 0.001 (LOO MSE)" in legend


def test_cli_summary_shows_the_selected_gamma_and_timings(tmp_path):
    make_run(tmp_path / "runs" / "digits", model=False)
    (tmp_path / "runs" / "digits" / "timings.json").write_text(json.dumps({"phases": {"train": 1.0}, "total": 2.5}))
    (tmp_path / "runs" / "digits-sweep").mkdir()
    (tmp_path / "runs" / "digits-sweep" / "sweep.json").write_text(json.dumps(new_sweep()))
    result = runner.invoke(app, ["summary", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert re.search(r"\s1\*\s+" + r"\s+".join(map(re.escape, pct(HAND, 3))), result.output), result.output
    assert "of 6 by LOO MSE" in result.output
    assert re.search(rf"{100 * A_AVG:.2f}\s+{100 * A_LAST:.2f}\s+{100 * F:.2f}\s+-\s+2\.5", result.output), result.output


def test_summary_warns_of_stored_numbers_the_matrix_contradicts(tmp_path):
    """summary shows a run's stored A_avg; when the accuracy matrix gives another, it says so (as evaluate does)."""
    make_run(tmp_path / "runs" / "ok", model=False)
    edited = make_run(tmp_path / "runs" / "edited", model=False)
    metrics = json.loads((edited / "metrics.json").read_text())
    metrics["A_avg"] = 0.5
    (edited / "metrics.json").write_text(json.dumps(metrics))
    result = runner.invoke(app, ["summary", str(tmp_path / "runs")], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"A_avg in metrics.json is 0.500000 but the accuracy matrix gives {A_AVG:.6f}" in text
    assert text.count("Warning:") == 1 and "edited" in text.split("Warning:")[1]
