"""`foal-pipe evaluate` on learned runs: per-class accuracy and the confusion matrix from the run's store, and a
continued model's reports keyed by its own classes."""

from __future__ import annotations

import csv
import io
import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.model.deploy import load_model
from foal_pipe.model.predict import predict_split
from foal_pipe.report import evaluate
from foal_pipe.store import open_store, write_store

runner = CliRunner()
NAMES = ["ant", "bee", "cow", "dog", "emu", "fox"]


def store(path, names, n_per_class, rng, dim=8, test_every=3):
    y = np.repeat(np.arange(len(names)), n_per_class)
    x = rng.normal(size=(y.size, dim)) + y[:, None] * 0.25
    return write_store(path, (x, y), (x[::test_every], y[::test_every]), list(names), chunk_rows=7, dtype="float64")


def learn(*args):
    result = runner.invoke(app, ["learn", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads((args[args.index("--out") + 1] / "metrics.json").read_text())


def read_csv(path):
    return list(csv.DictReader(path.open()))


@pytest.fixture
def run(tmp_path):
    features = store(tmp_path / "a.zarr", NAMES, 12, np.random.default_rng(0))
    metrics = learn("--features", features, "--out", tmp_path / "run", "--tasks", 3, "--projection-dim", 40)
    return tmp_path / "run", features, metrics


def test_per_class_accuracy_and_confusion_agree_with_learn_and_predict(run):
    path, features, metrics = run
    ev = evaluate(path)
    out = path / "eval"
    assert {"class_accuracy.csv", "confusion_matrix.csv", "confusion_matrix.png"} <= {f.name for f in ev.files}
    rows = read_csv(out / "class_accuracy.csv")
    stream = [label for task in metrics["tasks"] for label in task]
    assert [int(r["class"]) for r in rows] == stream  # stream order, by the model's label ids
    assert [r["name"] for r in rows] == [NAMES[c] for c in stream]
    assert [int(r["task"]) for r in rows] == [t + 1 for t, task in enumerate(metrics["tasks"]) for _ in task]
    # what `predict` gives for the store's test split, class by class
    pred = predict_split(path / "model.safetensors", features)
    for r in rows:
        mine = pred.true == int(r["class"])
        assert int(r["test_rows"]) == mine.sum() and int(r["correct"]) == (pred.predicted[mine] == pred.true[mine]).sum()
        assert float(r["accuracy"]) == pytest.approx(100 * int(r["correct"]) / int(r["test_rows"]), rel=1e-5)
    # summed over each task's classes: the last row of learn's accuracy matrix
    for t, accuracy in enumerate(metrics["accuracy_matrix"][-1]):
        mine = [r for r in rows if int(r["task"]) == t + 1]
        assert sum(int(r["correct"]) for r in mine) / sum(int(r["test_rows"]) for r in mine) == pytest.approx(accuracy)
    confusion = list(csv.reader((out / "confusion_matrix.csv").open()))
    assert confusion[0] == ["true_class", *[r["name"] for r in rows]]
    counts = np.array([[int(v) for v in line[1:]] for line in confusion[1:]])
    assert [line[0] for line in confusion[1:]] == [r["name"] for r in rows]
    assert counts.sum(axis=1).tolist() == [int(r["test_rows"]) for r in rows]
    assert np.diag(counts).tolist() == [int(r["correct"]) for r in rows]
    text = (out / "summary.md").read_text()
    assert "## Per-class accuracy" in text and f"The final model on the test split of `{features}`" in text
    first = rows[0]
    assert f"| {first['name']} | 1 | {first['test_rows']} | {float(first['accuracy']):.1f} |" in text
    tasks = "; ".join(f"T{t + 1}: {', '.join(NAMES[c] for c in task)}" for t, task in enumerate(metrics["tasks"]))
    assert f"Classes per task (stream order): {tasks}" in text
    assert "![confusion matrix](confusion_matrix.png)" in text
    again = evaluate(path, out=path / "again")  # byte-stable
    for name in ("class_accuracy.csv", "confusion_matrix.csv", "confusion_matrix.png", "summary.md"):
        assert (path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    assert not [note for note in ev.notes + again.notes if "per-class" in note]


def test_a_store_out_of_reach_is_said_in_one_line_and_its_outputs_removed(run):
    path, features, _ = run
    evaluate(path)
    shutil.move(features, features.with_name("moved.zarr"))
    result = runner.invoke(app, ["evaluate", "--run", str(path)])
    assert result.exit_code == 0, result.output
    note = "Note: The run's feature store could not be read or scored, so no per-class accuracy or confusion matrix"
    assert note in result.output
    text = (path / "eval" / "summary.md").read_text()
    (line,) = [line for line in text.splitlines() if "could not be read" in line]
    assert str(features) in line and "## Per-class accuracy" not in text
    left = {p.name for p in (path / "eval").iterdir()}
    assert not left & {"class_accuracy.csv", "confusion_matrix.csv", "confusion_matrix.png"}


def test_a_store_that_changed_since_learn_is_not_scored(run, tmp_path):
    path, features, _ = run
    shutil.rmtree(features)
    store(features, NAMES, 12, np.random.default_rng(1), test_every=4)  # same classes, other test rows
    ev = evaluate(path)
    assert any("is not the store the run learned from" in note and "re-extracted or replaced" in note
               for note in ev.notes)
    assert "class_accuracy.csv" not in {f.name for f in ev.files}


def test_continued_model_is_reported_by_its_own_classes(tmp_path):
    rng = np.random.default_rng(0)
    a = store(tmp_path / "a.zarr", ["cat", "dog", "emu", "fox"], 9, rng)
    b = store(tmp_path / "b.zarr", ["gnu", "dog", "cat"], 8, rng)  # store ids 0, 1, 2; the model's 4, 1, 0
    learn("--features", a, "--out", tmp_path / "run_a", "--tasks", 2, "--projection-dim", 30)
    metrics = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out",
                    tmp_path / "run_b", "--tasks", 3, "--eval-features", a)
    task_names = metrics["continuation"]["task_names"]
    assert task_names == [[["gnu", "dog", "cat"][c] for c in task] for task in metrics["tasks"]]
    ev = evaluate(tmp_path / "run_b")
    out = ev.out
    task_of = {name: t + 1 for t, names in enumerate(task_names) for name in names}
    norms = read_csv(out / "weight_norms.csv")
    # the classes learned before this stream (emu, fox: only in the first store) come first, then the stream's
    assert [r["name"] for r in norms] == ["emu", "fox", *(n for names in task_names for n in names)]
    assert {r["name"]: r["task"] for r in norms} == {**{n: str(t) for n, t in task_of.items()}, "emu": "", "fox": ""}
    assert {r["name"]: int(r["label"]) for r in norms} == {"cat": 0, "dog": 1, "emu": 2, "fox": 3, "gnu": 4}
    rows = {r["name"]: r for r in read_csv(out / "class_accuracy.csv")}
    assert {n: r["task"] for n, r in rows.items()} == {**{n: str(t) for n, t in task_of.items()}, "emu": "", "fox": ""}
    # emu and fox, learned before this run, are filled from the --eval-features store a (rows 18..35, every third)
    assert {n: int(r["test_rows"]) for n, r in rows.items()} == {"gnu": 3, "dog": 3, "cat": 2, "emu": 3, "fox": 3}
    model = load_model(tmp_path / "run_b" / "model.safetensors")
    test_a = open_store(a).split("test")
    x_a, y_a = np.vstack([X for _, X in test_a.iter_chunks()]), np.asarray(test_a.labels)
    predicted = model.predict(x_a)
    for name, label in (("emu", 2), ("fox", 3)):
        rows_of = y_a == label
        assert int(rows[name]["correct"]) == int((predicted[rows_of] == label).sum())
    text = (out / "summary.md").read_text()
    (old,) = metrics["continuation"]["eval_features"]
    assert "## Other feature stores" in text
    assert f"| `{a}` | {old['n_test']} | {100 * old['accuracy']:.2f} | 0 |" in text
    emu = 100 * int(rows["emu"]["correct"]) / 3
    assert f"| emu | - | 3 | {emu:.1f} |" in text and "Task -: a class the model learned before this run." in text
    assert f"The final model on the test splits of `{b}` and, for the classes learned before this run, of `{a}` " \
           "(`--eval-features`) (14 rows);" in text
    everything = metrics["continuation"]["all_classes"]
    assert f"Every class seen (A_last over all the model's classes, as the literature reads it): " \
           f"{100 * everything['A_last']:.2f} on 20 test rows;" in text
    assert f"The model continued `{tmp_path / 'run_a' / 'model.safetensors'}`" in text


def test_evaluate_cli_lists_the_new_files(run):
    path, _, _ = run
    result = runner.invoke(app, ["evaluate", "--run", str(path), "--no-plots"])
    assert result.exit_code == 0, result.output
    names = result.output.split("files to", 1)[1]
    assert "class_accuracy.csv" in names and "confusion_matrix.csv" in names and "confusion_matrix.png" not in names
    assert io.StringIO((path / "eval" / "confusion_matrix.csv").read_text()).readline().startswith("true_class,")
