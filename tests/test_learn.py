"""`foal-pipe learn`, `sweep` and `predict` on stores built here with zarr: numbers against hand computations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import (
    DIM,
    N_CLASSES,
    assert_clean_error,
    assert_one_line_error,
    assert_same_matrix,
    build_store,
    invoke,
    learn,
    read,
)
from safetensors.numpy import load_file

from foal_pipe.core.metrics import summarize
from foal_pipe.protocol.stream import build_stream


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("store") / "blobs.zarr")


def hand_accuracy(store: Path, metrics: dict, P: np.ndarray, gamma: float, mask_unseen=True, drop_last=False):
    """Independent re-computation: closed-form ridge after each task, argmax on the test rows of each task."""
    Xtr, ytr, Xte, yte = read(store)
    stream = build_stream(ytr, N_CLASSES, metrics["n_tasks"], metrics["batch_size"], metrics["seed"], drop_last=drop_last,
                          drop_remainder=metrics.get("drop_remainder", False))
    assert stream.tasks == metrics["tasks"]
    act = lambda X: 1 / (1 + np.exp(-(X.astype(np.float64) @ P)))  # noqa: E731
    acc, weights = [], []
    for i in range(len(stream.tasks)):
        rows = np.concatenate(stream.rows[: i + 1])
        seen = np.array(sorted(c for t in stream.tasks[: i + 1] for c in t))
        H = act(Xtr[rows])
        W = np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ (ytr[rows][:, None] == seen[None, :]))
        weights.append((seen, W))
        row = []
        for task in stream.tasks[: i + 1]:
            sel = np.isin(yte, task)
            scores = act(Xte[sel]) @ W
            if mask_unseen:
                pred = seen[scores.argmax(1)]
            else:
                full = np.zeros((scores.shape[0], N_CLASSES))
                full[:, seen] = scores
                pred = full.argmax(1)
            row.append(float(np.mean(pred == yte[sel])))
        acc.append(row)
    return acc, weights


@pytest.mark.parametrize("engine", ["gram", "rls"])
@pytest.mark.parametrize("batch", [1, 7, 10, 64])
def test_learn_equals_closed_form_and_hand_metrics(tmp_path, store, engine, batch):
    metrics, model = learn(store, tmp_path / "run", "--engine", engine, batch=batch, gamma=0.5)
    acc, weights = hand_accuracy(store, metrics, model["projection"], 0.5)
    assert_same_matrix(metrics["accuracy_matrix"], acc)
    seen, W = weights[-1]
    np.testing.assert_array_equal(model["classes"], seen)
    assert np.abs(model["W"] - W).max() / np.abs(W).max() < 1e-9
    expected = summarize(acc)
    for key in ("A_avg", "A_last", "F", "F_published_code", "A_steps"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-12)
    assert 0.3 < metrics["A_last"] < 1.0  # a real, imperfect classifier: the comparison above is not vacuous
    assert metrics["engine"] == engine and metrics["n_train_seen"] == 600
    assert all(len(row) == i + 1 for i, row in enumerate(metrics["accuracy_matrix"]))


def test_outputs_and_provenance(tmp_path, store):
    metrics, model = learn(store, tmp_path / "run")
    for key in ("A_avg", "A_last", "F", "F_published_code", "accuracy_matrix", "tasks", "gamma", "projection_dim",
                "batch_size", "seed", "engine", "backend", "dtype", "n_train_seen", "encoder", "activation"):
        assert key in metrics, key
    assert "seconds" not in metrics  # wall-clock times live in timings.json, not in a pipeline output
    timings = json.loads((tmp_path / "run" / "timings.json").read_text())
    # rounded to milliseconds: a tiny store's solve or test step may read 0.0
    assert timings["total"] > 0 and all(timings["total"] >= timings[step] >= 0 for step in ("solve", "test", "gram"))
    assert metrics["encoder"]["name"] == "synthetic" and metrics["backend"] == "numpy" and metrics["dtype"] == "float64"
    assert model["W"].dtype == np.float64 and model["W"].shape == (48, N_CLASSES)
    assert model["projection"].shape == (DIM, 48) and model["classes"].dtype == np.int64
    from safetensors import safe_open

    with safe_open(str(tmp_path / "run" / "model.safetensors"), "numpy") as f:
        meta = f.metadata()
    assert float(meta["gamma"]) == 1.0 and json.loads(meta["dataset"]) == "blobs"
    assert json.loads(meta["activation"]) == "sigmoid"
    assert json.loads(meta["encoder"])["name"] == "synthetic"
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no temp files left


def test_seed_changes_order_but_run_is_reproducible(tmp_path, store):
    a, _ = learn(store, tmp_path / "a")
    b, _ = learn(store, tmp_path / "b")
    assert a["accuracy_matrix"] == b["accuracy_matrix"] and a["tasks"] == b["tasks"]
    c = invoke("learn", "--features", store, "--out", tmp_path / "c", "--tasks", 4, "--projection-dim", 48, "--seed", 4)
    assert c.exit_code == 0, c.output
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["tasks"] != a["tasks"]


def test_drop_last_and_no_mask_unseen(tmp_path, store):
    metrics, model = learn(store, tmp_path / "run", "--drop-last", "--no-mask-unseen", batch=7)
    acc, _ = hand_accuracy(store, metrics, model["projection"], 1.0, mask_unseen=False, drop_last=True)
    assert_same_matrix(metrics["accuracy_matrix"], acc)
    full_rows = build_stream(read(store)[1], N_CLASSES, 4, 7, 3).rows
    assert metrics["n_train_seen"] == sum(len(r) - len(r) % 7 for r in full_rows) < 600
    assert metrics["drop_last"] is True and metrics["mask_unseen"] is False


def test_drop_remainder_drops_the_leftover_classes_with_a_warning(tmp_path, store):
    """The published code's split: every task C // T classes of the seeded permutation, the rest dropped."""
    result = invoke("learn", "--features", store, "--out", tmp_path / "r", "--tasks", 5, "--projection-dim", 32,
                    "--drop-remainder")
    assert result.exit_code == 0, result.output
    assert "--drop-remainder drops 2 classes" in result.output
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    order = np.random.default_rng(0).permutation(N_CLASSES).tolist()
    assert metrics["tasks"] == [sorted(order[2 * t : 2 * t + 2]) for t in range(5)]
    assert metrics["dropped_classes"] == sorted(order[10:]) and metrics["drop_remainder"] is True
    assert metrics["n_train_seen"] < 600


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_uneven_tasks_stream_every_class_exactly(tmp_path, store, engine):
    """12 classes in 5 tasks: 3, 3, 2, 2, 2 classes, every train row streamed, still the closed form."""
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 5, "--projection-dim", 48,
                    "--gamma", 0.5, "--seed", 3, "--backend", "numpy", "--engine", engine)
    assert result.exit_code == 0, result.output
    assert ("note: 12 classes do not split evenly into 5 tasks: tasks 1-2 have 3 classes, tasks 3-5 have 2 classes "
            "(--drop-remainder drops the 2 classes left over instead") in " ".join(result.output.split())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    model = load_file(str(tmp_path / "run" / "model.safetensors"))
    order = np.random.default_rng(3).permutation(N_CLASSES).tolist()
    assert metrics["tasks"] == [sorted(order[a:b]) for a, b in [(0, 3), (3, 6), (6, 8), (8, 10), (10, 12)]]
    assert metrics["dropped_classes"] == [] and metrics["drop_remainder"] is False
    assert metrics["n_train_seen"] == 600 and model["classes"].tolist() == list(range(N_CLASSES))
    acc, weights = hand_accuracy(store, metrics, model["projection"], 0.5)
    assert_same_matrix(metrics["accuracy_matrix"], acc)
    assert np.abs(model["W"] - weights[-1][1]).max() / np.abs(weights[-1][1]).max() < 1e-9


def test_eight_classes_in_five_tasks_train_on_all_eight(tmp_path):
    from foal_pipe.store import write_store

    rng = np.random.default_rng(1)
    y_train, y_test = np.arange(8).repeat(9), np.arange(8).repeat(3)
    write_store(tmp_path / "eight.zarr", (rng.normal(size=(72, 6)), y_train), (rng.normal(size=(24, 6)), y_test),
                [f"k{i}" for i in range(8)], dataset="eight")
    base = ["learn", "--features", tmp_path / "eight.zarr", "--projection-dim", 16]
    assert invoke(*base, "--out", tmp_path / "five", "--tasks", 5).exit_code == 0
    five = json.loads((tmp_path / "five" / "metrics.json").read_text())
    assert [len(t) for t in five["tasks"]] == [2, 2, 2, 1, 1]
    assert sorted(c for t in five["tasks"] for c in t) == list(range(8)) and five["dropped_classes"] == []
    assert five["n_train_seen"] == 72 and five["n_test"] == 24
    default = invoke(*base, "--out", tmp_path / "default")  # no --tasks: 10 tasks, at most one per class
    assert default.exit_code == 0, default.output
    assert json.loads((tmp_path / "default" / "metrics.json").read_text())["n_tasks"] == 8
    assert_one_line_error(invoke(*base, "--out", tmp_path / "nine", "--tasks", 9),
                          "--tasks 9 is larger than the number of classes (8); use --tasks 8 or fewer")


def test_class_order_file(tmp_path, store):
    order = [[11, 0, 5], [3, 4], [1, 2, 6, 7, 8, 9, 10]]
    path = tmp_path / "order.json"
    path.write_text(json.dumps(order))
    metrics, model = learn(store, tmp_path / "run", "--class-order", str(path), tasks=3)
    assert metrics["tasks"] == order and len(metrics["accuracy_matrix"]) == 3
    assert sorted(model["classes"].tolist()) == list(range(N_CLASSES))
    # another --tasks was ignored in silence: the file's split is the run's
    refused = invoke("learn", "--features", store, "--out", tmp_path / "no", "--class-order", path, "--tasks", 4)
    assert_one_line_error(refused, f"--tasks 4 conflicts with --class-order {path}, which lists 3 tasks; drop --tasks")


def test_sweep_equals_learn_for_every_gamma(tmp_path, store):
    gammas = [1e-3, 0.1, 1.0, 10.0]
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--gammas", ",".join(map(str, gammas)),
                    "--tasks", 4, "--projection-dim", 48, "--seed", 3, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "best gamma" in result.output and "oracle" in result.output
    report = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert report["gammas"] == gammas
    for r in report["results"]:
        metrics, _ = learn(store, tmp_path / f"g{r['gamma']}", gamma=r["gamma"])
        assert_same_matrix(r["accuracy_matrix"], metrics["accuracy_matrix"])
        assert r["A_avg"] == pytest.approx(metrics["A_avg"], abs=1e-12)
        assert len(r["gcv"]) == len(r["loo_accuracy"]) == len(r["loo_mse"]) == 4
    assert report["selected_by"] == "loo"
    last_mse = [r["loo_mse"][-1] for r in report["results"]]
    assert report["best_gamma"] == gammas[int(np.argmin(last_mse))]
    assert report["best_gamma_test"] == max(report["results"], key=lambda r: r["A_avg"])["gamma"]
    assert len({r["A_avg"] for r in report["results"]}) > 1  # gamma matters on this data
    assert "seconds" not in report and json.loads((tmp_path / "sw" / "timings.json").read_text())["loo"] > 0


def test_sweep_weights_equal_closed_form_at_every_boundary(store):
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.learners.gram import GramLearner
    from foal_pipe.protocol.run import prepare
    from foal_pipe.protocol.solvers import ManyGammas
    from foal_pipe.protocol.walk import walk

    gammas = [0.01, 3.0]
    run = prepare(store, StreamConfig(tasks=4, seed=3), ModelConfig(projection_dim=48), EvaluationConfig(),
                  ExecutionConfig(backend="numpy"), n_models=2)
    boundaries = walk(run, [GramLearner(run, {None: ManyGammas(gammas, loo=False, choose=None)})])[0].boundaries
    metrics = {"n_tasks": 4, "batch_size": 10, "seed": 3, "tasks": run.stream.tasks}
    for gamma_index, gamma in enumerate(gammas):
        _, weights = hand_accuracy(store, metrics, run.projection.components_, gamma)
        for b, (seen, W) in zip(boundaries, weights, strict=True):
            np.testing.assert_array_equal(b.classes, seen)
            assert np.abs(b.W[:, gamma_index, :] - W).max() / np.abs(W).max() < 1e-9


def test_predict(tmp_path, store):
    _, model = learn(store, tmp_path / "run")
    out = tmp_path / "pred.csv"
    result = invoke("predict", "--model", tmp_path / "run" / "model.safetensors", "--features", store, "--out", out)
    assert result.exit_code == 0, result.output
    _, _, Xte, yte = read(store)
    expected = model["classes"][(1 / (1 + np.exp(-(Xte.astype(np.float64) @ model["projection"]))) @ model["W"]).argmax(1)]
    rows = out.read_text().splitlines()
    assert rows[0] == "row,predicted_class,predicted_name,score,true_class,true_name"
    got = np.array([int(r.split(",")[1]) for r in rows[1:]])
    np.testing.assert_array_equal(got, expected)
    assert f"accuracy {100 * np.mean(expected == yte):.2f}%" in result.output


def test_learn_path_does_not_import_torch(tmp_path, store):
    code = (
        "import sys; from foal_pipe.cli import app; "
        f"app(['learn','--features',{str(store)!r},'--out',{str(tmp_path / 'r')!r},'--tasks','2',"
        "'--projection-dim','8'], standalone_mode=False); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def _bad_store(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "bad.zarr"
    if kind == "missing":
        return tmp_path / "nope.zarr"
    if kind == "not-a-store":
        path.mkdir()
        (path / "readme.txt").write_text("hello")
        return path
    if kind == "incomplete":
        return build_store(path, complete=False)
    if kind == "version":
        return build_store(path, attrs={"format_version": 99})
    if kind == "format":
        return build_store(path, attrs={"format": "something-else"})
    if kind == "dims":
        return build_store(path, test_dim=DIM + 1)
    if kind in ("nan", "labels"):
        build_store(path)
        g = zarr.open_group(str(path), mode="r+")
        if kind == "nan":
            x = np.asarray(g["test/features"][:])
            x[137, 3] = np.inf
            g["test/features"][:] = x
        else:
            y = np.asarray(g["train/labels"][:])
            y[5] = N_CLASSES
            g["train/labels"][:] = y
        return path
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "does not exist"),
        ("not-a-store", "not a"),
        ("incomplete", "not complete"),
        ("version", "format_version 99"),
        ("format", "is not a foal-pipe feature store"),
        ("dims", "train features have 16 dimensions but test features have 17"),
        ("nan", "test/features has NaN or inf values (first bad row: 137)"),
        ("labels", "label 12 at row 5, outside [0, 12)"),
    ],
)
def test_bad_stores(tmp_path, kind, message):
    store = _bad_store(tmp_path, kind)
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 8)
    assert_clean_error(result, message, out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gamma", "0"], "gamma must be a positive number"),
        (["--gamma", "-1"], "gamma must be a positive number"),
        (["--tasks", "13"], "--tasks 13 is larger than the number of classes (12)"),
        (["--projection-dim", "-1"], "--projection-dim must be at least 0"),
        (["--engine", "rls", "--dtype", "float32"], "use --engine gram (its float32 sums are solved in float64 and checked)"),
        (["--engine", "rls", "--gamma", "1e-320"], "underflows in float64"),
        (["--gamma", "abc"], "neither a number nor 'auto'"),
        (["--gamma", "auto", "--engine", "rls"], "--gamma auto needs --engine gram"),
        (["--gamma-grid", "1,x"], "--gamma-grid '1,x' is not a comma-separated list"),
        (["--gamma", "auto", "--gamma-grid", "0,1"], "--gamma-grid lists 0; a gamma is a positive number"),
    ],
)
def test_bad_settings(tmp_path, store, args, message):
    out = tmp_path / "out"
    base = ["--features", store, "--out", out, "--tasks", 2, "--projection-dim", 8]
    kv = dict(zip(base[::2], base[1::2])) | dict(zip(args[::2], args[1::2]))
    result = invoke("learn", *[x for pair in kv.items() for x in pair])
    if args[1] in ("abc", "1,x"):  # text that is not of the option's type: a usage error (tests/test_usage_exit_codes.py)
        assert result.exit_code == 2 and message in result.output and not out.exists(), result.output
    else:
        assert_clean_error(result, message, out)


def test_learn_never_offers_to_choose_on_the_test_split(tmp_path, store):
    """--select test is sweep's oracle; learn lists (and takes) loo and gcv only."""
    from test_console import _help_rows

    assert "<loo|gcv|loo_accuracy>" in _help_rows("learn")["--select"]
    assert "<loo| gcv| loo_accuracy| test>" in _help_rows("sweep")["--select"]  # a long list: wraps between values
    result = invoke("learn", "--features", store, "--out", tmp_path / "out", "--gamma", "auto", "--select", "test")
    assert result.exit_code == 2 and "'test' is not one of 'loo', 'gcv'" in " ".join(result.output.replace("│", "").split())
    assert not (tmp_path / "out").exists()


def test_one_task_and_one_gamma_are_singular(tmp_path, store):
    learned = invoke("learn", "--features", store, "--out", tmp_path / "l", "--tasks", 1, "--projection-dim", 8)
    assert learned.exit_code == 0 and "(1 task, 600 rows," in learned.output, learned.output
    swept = invoke("sweep", "--features", store, "--out", tmp_path / "s", "--tasks", 1, "--projection-dim", 8,
                   "--gammas", "1")
    assert swept.exit_code == 0 and "(1 task, D=8)" in swept.output and "1 gamma in " in swept.output, swept.output


def test_bad_sweep_and_predict_inputs(tmp_path, store):
    out = tmp_path / "out"
    usage = invoke("sweep", "--features", store, "--out", out, "--gammas", "1,abc")  # text that reads as no numbers
    assert usage.exit_code == 2 and "not a comma-separated" in usage.output and not out.exists(), usage.output
    assert_clean_error(invoke("sweep", "--features", store, "--out", out, "--gammas", "1,0"), "positive number", out)
    assert_clean_error(
        invoke("predict", "--model", tmp_path / "none.safetensors", "--features", store), "does not exist", out
    )
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a model")
    assert_clean_error(invoke("predict", "--model", bogus, "--features", store), "not a safetensors model", out)


def test_bad_class_order(tmp_path, store):
    for content, message in (("[[0, 1], [1]]", "more than one place"), ("[[0, 99]]", "label 99"), ("{", "not valid JSON")):
        path = tmp_path / "order.json"
        path.write_text(content)
        out = tmp_path / "out"
        result = invoke("learn", "--features", store, "--out", out, "--class-order", path, "--projection-dim", 8)
        assert_clean_error(result, message, out)


@pytest.mark.parametrize(("option", "value"), [("--engine", "sgd"), ("--backend", "tpu"), ("--activation", "tanh"),
                                             ("--dtype", "float16"), ("--projection-init", "xavier")])
def test_values_outside_an_options_fixed_set_are_refused_by_the_cli(tmp_path, store, option, value):
    """Options with a fixed set of values (listed in --help) refuse anything else before any work."""
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, option, value)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and f"Invalid value for '{option}'" in result.output
    assert not out.exists()


def test_backend_cupy_without_cupy_is_refused(tmp_path, store, monkeypatch):
    import foal_pipe.core.backend as backend

    monkeypatch.setattr(backend, "_cupy", lambda: None)  # as on a machine without CuPy or without a GPU
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--backend", "cupy", "--projection-dim", 8, "--tasks", 2)
    assert_clean_error(result, "pip install -e '.[gpu]'", out)
    auto = invoke("learn", "--features", store, "--out", out, "--backend", "auto", "--projection-dim", 8, "--tasks", 2)
    assert auto.exit_code == 0, auto.output
    assert json.loads((out / "metrics.json").read_text())["backend"] == "numpy"


def test_task_without_test_rows_is_refused_before_training(tmp_path):
    store = build_store(tmp_path / "s.zarr")
    g = zarr.open_group(str(store), mode="r+")
    y = np.asarray(g["test/labels"][:])
    g["test/labels"][:] = np.where(y == 11, 10, y)
    order = tmp_path / "order.json"
    order.write_text(json.dumps([[11], list(range(11))]))
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--class-order", order, "--projection-dim", 8)
    assert_clean_error(result, "task 1 (classes 11) has no test rows", out)
