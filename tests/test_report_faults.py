"""`evaluate` and `summary` faults found by a hunt, each wrong before its fix.

- A later evaluation without `--eval-every` kept the earlier `anytime.png`/`.csv` beside its new summary.
- Si-Blurry: a recurring class was placed at its last task (per-class table, weight norms), and summary.md and
  steps.png described the matrix as disjoint tasks' (`column j: test set of task j`, a "newest task" curve that is
  A_i again).
- A class with test rows but no training row made `evaluate` claim that the store had changed.
- `--sweep` of another store of the same dataset and encoder (other rows) was taken as the run's gamma curve.
- An unknown `stream` in metrics.json was a KeyError traceback in `evaluate` and `summary`.
- Paths holding `[...]` were read as rich markup: `run[seed=0]` printed as `run`, `a[/b]` a MarkupError traceback
  after the outputs were written (evaluate, summary, learn, sweep).
- `--order-seeds --eval-every`: anytime.png drew the first order's curve under the orders' mean A_auc.
- The paper comparison ignored `--activation` (a ReLU run was called comparable with the paper's sigmoid).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

from foal_pipe.report.paper import match_paper
from foal_pipe.store import write_store

N_CLASSES = 6


def _rows(n: int, seed: int, classes: int = N_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    return (rng.normal(size=(n, 8)) + 1.5 * np.eye(classes, 8)[y] * 2).astype(np.float32), y


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "s.zarr"
    return write_store(path, _rows(600, 0), _rows(180, 1), [f"c{i}" for i in range(N_CLASSES)], chunk_rows=64)


def _learn(store: Path, out: Path, *extra: str) -> Path:
    result = invoke("learn", "--features", store, "--out", out, "--tasks", "3", "--projection-dim", "24", *extra)
    assert result.exit_code == 0, result.output
    return out


def _evaluate(run: Path, *extra: str):
    result = invoke("evaluate", "--run", run, *extra)
    assert result.exit_code == 0, result.output
    return result


def test_a_later_evaluation_leaves_no_anytime_files_of_an_earlier_one(tmp_path, store):
    run = _learn(store, tmp_path / "r", "--eval-every", "100")
    _evaluate(run)
    assert {"anytime.png", "anytime.csv"} <= {p.name for p in (run / "eval").iterdir()}
    _learn(store, run)
    _evaluate(run)
    assert not {"anytime.png", "anytime.csv"} & {p.name for p in (run / "eval").iterdir()}


def test_si_blurry_classes_are_placed_at_their_first_task_and_the_matrix_described_as_seen_classes(tmp_path, store):
    run = _learn(store, tmp_path / "b", "--stream", "si-blurry", "--seed", "1")
    metrics = json.loads((run / "metrics.json").read_text())
    first = {}
    for t, classes in enumerate(metrics["tasks"]):
        for c in classes:
            first.setdefault(c, t + 1)
    assert len(first) < sum(map(len, metrics["tasks"])), "the stream should bring a class again"
    _evaluate(run)
    with open(run / "eval" / "class_accuracy.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {int(r["class"]): int(r["task"]) for r in rows} == first
    assert [int(r["task"]) for r in rows] == sorted(int(r["task"]) for r in rows)
    summary = (run / "eval" / "summary.md").read_text()
    assert "column j: test set of task j" not in summary
    assert "the classes seen by the end of task j" in summary


def test_a_class_without_training_rows_is_not_a_changed_store(tmp_path):
    """Class c5 has test rows but no training row: the run scored them (always wrong) and evaluate counts them."""
    X, y = _rows(300, 0)
    keep = y != 5
    path = write_store(tmp_path / "s.zarr", (X[keep], y[keep]), _rows(120, 1), [f"c{i}" for i in range(N_CLASSES)])
    run = _learn(path, tmp_path / "n")
    result = _evaluate(run)
    assert "store changed" not in result.output, result.output
    with open(run / "eval" / "class_accuracy.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["test_rows"]) for r in rows) == 100  # the 20 rows of c5 are of a class the model lacks
    assert "20 rows of classes the model does not know" in (run / "eval" / "summary.md").read_text()


def test_a_sweep_of_another_store_is_refused_as_the_runs(tmp_path, store):
    other = write_store(tmp_path / "other.zarr", _rows(300, 5), _rows(180, 6), [f"c{i}" for i in range(N_CLASSES)])
    run = _learn(store, tmp_path / "r")
    sweep = invoke("sweep", "--features", other, "--out", tmp_path / "w", "--tasks", "3", "--projection-dim", "24",
                   "--gammas", "0.1,1,10")
    assert sweep.exit_code == 0, sweep.output
    assert_one_line_error(invoke("evaluate", "--run", run, "--sweep", tmp_path / "w"),
                          "its n_train_seen is 300 but the run's metrics.json has 600")


def test_an_unknown_stream_in_metrics_is_one_line(tmp_path, store):
    run = _learn(store, tmp_path / "r")
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "stream": "blurry"}))
    assert_one_line_error(invoke("evaluate", "--run", run), "'stream'", '"blurry"')
    result = invoke("summary", run)
    assert "Traceback" not in result.output and "'stream'" in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("name", ["run[seed=0]", "a[/b]"])
def test_paths_with_brackets_are_printed_as_they_are(tmp_path, store, name):
    run = tmp_path / name
    learned = invoke("learn", "--features", store, "--out", run, "--tasks", "3", "--projection-dim", "24")
    assert learned.exit_code == 0 and f"-> {run}" in " ".join(learned.output.split()), learned.output
    swept = invoke("sweep", "--features", store, "--out", run, "--tasks", "3", "--projection-dim", "24", "--gammas", "1,10")
    assert swept.exit_code == 0 and str(run / "sweep.json") in "".join(swept.output.split()), swept.output
    result = _evaluate(run)
    assert f"to {run / 'eval'}:" in " ".join(result.output.split()), result.output
    listed = invoke("summary", tmp_path)
    assert listed.exit_code == 0 and name in listed.output, listed.output


def test_the_anytime_plot_of_several_orders_draws_each_order(tmp_path, store):
    run = _learn(store, tmp_path / "o", "--order-seeds", "0,1", "--eval-every", "100")
    _evaluate(run)
    metrics = json.loads((run / "metrics.json").read_text())
    with open(run / "eval" / "anytime.csv") as fh:
        rows = list(csv.DictReader(fh))
    for order in metrics["orders"]:
        mine = [float(r["accuracy"]) for r in rows if int(r["order_seed"]) == order["order_seed"]]
        assert mine == pytest.approx([100 * a for a in order["anytime"]["accuracy"]], abs=1e-4)
        assert np.mean(mine) / 100 == pytest.approx(order["A_auc"], abs=1e-6)
    assert np.mean([o["A_auc"] for o in metrics["orders"]]) == pytest.approx(metrics["A_auc"])


def test_the_paper_comparison_names_another_activation():
    metrics = {"dataset": "cifar100", "encoder": {"name": "vit_base_patch16_224.augreg2_in21k_ft_in1k", "fusion": "mean",
                                                   "image_size": 224, "dim": 768},
               "projection_dim": 1000, "gamma": 1.0, "batch_size": 10, "n_tasks": 10, "n_train_seen": 50000,
               "n_test": 10000, "feature_dim": 768}
    assert match_paper(metrics).comparable, match_paper(metrics).differences
    assert not match_paper({**metrics, "activation": "sigmoid"}).differences
    differences = match_paper({**metrics, "activation": "relu"}).differences
    assert differences == ("activation relu (paper sigmoid)",)


def test_per_class_results_of_a_replaced_store_are_not_shown_as_the_runs(tmp_path):
    """A store re-written with the same row counts (here the test labels permuted) scored per class beside the run's
    own A_last, exit 0; its generation id now differs from the model's ``learned_from``: a note, no per-class files."""
    import shutil

    names = [f"c{i}" for i in range(N_CLASSES)]
    train, (x_test, y_test) = _rows(600, 0), _rows(180, 1)
    path = write_store(tmp_path / "s.zarr", train, (x_test, y_test), names)
    run = _learn(path, tmp_path / "r")
    _evaluate(run)
    assert (run / "eval" / "class_accuracy.csv").exists()
    shutil.rmtree(path)
    write_store(path, train, (x_test, np.random.default_rng(3).permutation(y_test)), names)
    result = _evaluate(run)
    text = " ".join(result.output.split())
    assert "is not the store the run learned from" in text and "re-run learn on it" in text, result.output
    assert not (run / "eval" / "class_accuracy.csv").exists()


def test_evaluate_from_another_directory_finds_a_store_recorded_relative(tmp_path, store, monkeypatch):
    """`learn --features s.zarr` records the path as typed; `evaluate` run from elsewhere (a DVC stage, a script)
    dropped the per-class files with exit 0. The store is now looked for above the run too; the files are the same."""
    import shutil

    project = tmp_path / "project"
    shutil.copytree(store, project / "s.zarr")
    monkeypatch.chdir(project)
    run = _learn(Path("s.zarr"), project / "runs" / "r")
    _evaluate(run, "--out", tmp_path / "here")
    monkeypatch.chdir(tmp_path)
    _evaluate(run, "--out", tmp_path / "elsewhere")
    here = {p.name: p.read_bytes() for p in (tmp_path / "here").iterdir()}
    assert "class_accuracy.csv" in here
    assert {p.name: p.read_bytes() for p in (tmp_path / "elsewhere").iterdir()} == here
