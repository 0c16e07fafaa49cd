"""`foal-pipe evaluate` audit (second round): an old run's model checked by what both files record, a multi-order
run's per-class table and plot labelled as what they are, summary.md's names escaped, the --out hint, the docs."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import as_old_run, assert_one_line_error
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.model.modelfile import stored_header
from foal_pipe.report import evaluate
from foal_pipe.store import write_store

runner = CliRunner()
DOCS = Path(__file__).resolve().parent.parent / "docs"


def store(path, names, n_per_class, seed=0, dim=8):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(names)), n_per_class)
    x = rng.normal(size=(y.size, dim)) + y[:, None] * 0.25
    return write_store(path, (x, y), (x[::3], y[::3]), list(names), chunk_rows=7, dtype="float64")


def learn(*args) -> dict:
    result = runner.invoke(app, ["learn", "--projection-dim", "20", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads((Path(args[args.index("--out") + 1]) / "metrics.json").read_text())


def as_old(run: Path) -> None:
    """The run's metrics.json as written before ``model_checksum``."""
    as_old_run(run)


def evaluate_cli(*args):
    return runner.invoke(app, ["evaluate", *map(str, args)])


# -- 1. an old run (no model_checksum) is compared with the model file on what both record ---------------------------
@pytest.mark.parametrize("what, other", [("gamma", ("--gamma", "10")), ("head", ("--head", "ncm")),
                                         ("rows", ("--drop-last", "--batch-size", "5"))], ids=["gamma", "head", "rows"])
def test_an_old_run_refuses_a_model_its_record_contradicts(tmp_path, what, other):
    features = store(tmp_path / "a.zarr", list("abcdef"), 12)
    mine = learn("--features", features, "--out", tmp_path / "run", "--tasks", 3)
    learn("--features", features, "--out", tmp_path / "other", "--tasks", 3, *other)
    as_old(tmp_path / "run")
    assert evaluate_cli("--run", tmp_path / "run", "--no-plots").exit_code == 0  # its own model fits
    model = tmp_path / "other" / "model.safetensors"
    meta = stored_header(model)[0]
    expected = {"gamma": lambda: f"gamma {meta['gamma']:g} in the file, {mine['gamma']:g} in the run's metrics.json",
                "head": lambda: "head ncm in the file, ridge in the run's metrics.json",
                "rows": lambda: f"rows learned {meta['n_samples_seen']} in the file, {mine['n_train_seen']} in the "
                                "run's metrics.json"}[what]()
    result = evaluate_cli("--run", tmp_path / "run", "--model", model, "--out", tmp_path / "ev", "--no-plots")
    assert_one_line_error(result, f"{model} is not the model run {tmp_path / 'run'} wrote", expected,
                          "pass the run's own model")
    assert not (tmp_path / "ev").exists()


def test_an_old_continued_run_refuses_the_model_it_continued(tmp_path):
    """A continued run's rows are its model's total: the model it started from has fewer."""
    a = store(tmp_path / "a.zarr", list("abcd"), 9)
    b = store(tmp_path / "b.zarr", list("efg"), 9, seed=1)
    learn("--features", a, "--out", tmp_path / "run_a", "--tasks", 2)
    cont = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out",
                 tmp_path / "run_b", "--tasks", 3)
    as_old(tmp_path / "run_b")
    assert evaluate_cli("--run", tmp_path / "run_b", "--no-plots").exit_code == 0
    before = stored_header(tmp_path / "run_a" / "model.safetensors")[0]["n_samples_seen"]
    result = evaluate_cli("--run", tmp_path / "run_b", "--model", tmp_path / "run_a" / "model.safetensors", "--out",
                          tmp_path / "ev")
    assert_one_line_error(result, f"rows learned {before} in the file, "
                          f"{cont['continuation']['n_samples_seen_total']} in the run's metrics.json")


# -- 2 and 6. a learn --order-seeds run: the first order's model and tasks, said; the published F's spread ------------
NAMES = list("abcdef")


@pytest.fixture(scope="module")
def orders_run(tmp_path_factory):
    """A run of two class orders, evaluated: ``(run directory, its metrics.json)``."""
    tmp = tmp_path_factory.mktemp("orders")
    metrics = learn("--features", store(tmp / "a.zarr", NAMES, 12), "--out", tmp / "run", "--tasks", 3,
                    "--order-seeds", "0,1")
    assert metrics["orders"][0]["tasks"] != metrics["orders"][1]["tasks"]
    evaluate(tmp / "run", plots=False)
    return tmp / "run", metrics


def test_an_order_seeds_run_says_its_model_and_tasks_are_the_first_orders(orders_run):
    run, metrics = orders_run
    first = metrics["orders"][0]
    rows = list(csv.DictReader((run / "eval" / "class_accuracy.csv").open()))
    for t, accuracy in enumerate(first["accuracy_matrix"][-1]):  # the first order's last row, not the mean matrix
        mine = [r for r in rows if int(r["task"]) == t + 1]
        assert {r["name"] for r in mine} == {NAMES[c] for c in first["tasks"][t]}
        assert sum(int(r["correct"]) for r in mine) / sum(int(r["test_rows"]) for r in mine) == pytest.approx(accuracy)
    text = (run / "eval" / "summary.md").read_text()
    tasks = "; ".join(f"T{t + 1}: {', '.join(NAMES[c] for c in task)}" for t, task in enumerate(first["tasks"]))
    assert ("Classes per task (stream order), of the first class order (order seed 0; the matrix above averages each "
            f"task position over the orders, whose tasks hold other classes): {tasks}") in text
    assert "The model is the first class order's (order seed 0): the task column is that order's" in text


def test_an_order_seeds_runs_published_f_has_its_spread(orders_run):
    run, metrics = orders_run
    published = [o["F_published_code"] for o in metrics["orders"]]
    spread = 0.0 if published[0] == published[1] else float(np.std(published))
    text = (run / "eval" / "summary.md").read_text()
    assert f"| F, published code (%) | {100 * metrics['F_published_code']:.2f} ± {100 * spread:.2f} |" in text


def test_an_order_seeds_runs_matrix_plot_is_titled_a_mean(orders_run, monkeypatch, tmp_path):
    from matplotlib.figure import Figure

    from foal_pipe.report import plots
    from foal_pipe.report.discovery import load_run

    titles = []

    def capture(path, size, paint):
        fig = Figure()
        paint(fig)
        titles.append(fig.axes[0].get_title())
        return path

    monkeypatch.setattr(plots, "draw", capture)
    plots.plot_accuracy_matrix(load_run(orders_run[0]), tmp_path / "m.png")
    assert titles[0].startswith("accuracy a[i][j], position-wise mean over 2 class orders\n")


# -- 3. summary.md escapes the Markdown in class names -----------------------------------------------------------------
def cells(line: str) -> list[str]:
    """A Markdown table row's cells, split at the unescaped ``|`` as GFM does, escapes removed."""
    return [re.sub(r"\\(.)", r"\1", c).strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_summary_md_escapes_class_names(tmp_path):
    names = ["a|b", "*g*", "c_d", "_e_"]
    features = store(tmp_path / "odd.zarr", names, 9)
    metrics = learn("--features", features, "--out", tmp_path / "run", "--tasks", 2)
    evaluate(tmp_path / "run", plots=False)
    text = (tmp_path / "run" / "eval" / "summary.md").read_text()
    rows = [cells(line) for line in text.splitlines() if line.startswith("| ") and len(cells(line)) == 4]
    table = {r[0]: r for r in rows if r[0] in names}
    assert set(table) == set(names)  # each name one cell of a 4-cell row
    assert "c_d" in text and "\\_e\\_" in text and "\\*g\\*" in text and "a\\|b" in text
    line = next(line for line in text.splitlines() if line.startswith("Classes per task"))
    shown = line.split(": ", 1)[1]
    expected = "; ".join(f"T{t + 1}: {', '.join(names[c] for c in task)}" for t, task in enumerate(metrics["tasks"]))
    assert re.sub(r"\\(.)", r"\1", shown) == expected and "*g*" not in shown


# -- 4. the --out hint for a directory named by '..' is an --out the command takes -----------------------------------
def test_out_named_by_dots_suggests_an_out_evaluate_accepts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    learn("--features", store(tmp_path / "a.zarr", list("abcd"), 9), "--out", "run", "--tasks", 2)
    result = evaluate_cli("--run", "run", "--out", "run/eval/..", "--no-plots")
    assert_one_line_error(result, "names a directory by '.' or '..'")
    suggested = " ".join(result.output.split()).split("--out ")[-1].rstrip(".")
    again = evaluate_cli("--run", "run", "--out", suggested, "--no-plots")
    assert again.exit_code == 0, again.output
    assert (Path(suggested) / "summary.md").is_file()


# -- 5. the docs say what class_accuracy.csv writes for a class learned before an --init-model run -------------------
def test_docs_say_the_csv_task_of_an_earlier_class_is_empty():
    text = " ".join((DOCS / "evaluate.md").read_text().split())
    assert "(task `-` in `summary.md`, an empty `task` field in `class_accuracy.csv`)" in text
    assert "(task -)" not in text
