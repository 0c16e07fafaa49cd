"""Fidelity to the F-OAL paper and to the protocol spec (/work/shared/spec/protocol.md): every default and flag the
spec states, checked by behaviour through the CLI against closed forms written here from the spec, and the
learner's per-batch recursion against the paper's Theorems 3.1-3.2 written independently in NumPy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke
from safetensors.numpy import load_file

from foal_pipe import AnalyticClassifier
from foal_pipe.store import write_store


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _identity(z: np.ndarray) -> np.ndarray:
    return z


def blobs(path: Path, n_classes: int, dim: int, n_train: int, n_test: int, seed: int, offset: float = 0.0,
          noise: float = 1.5) -> Path:
    """Overlapping Gaussian classes (centres N(offset, 1)) as a feature store, rows in a random class order."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(offset, 1.0, size=(n_classes, dim))
    y, yt = rng.integers(0, n_classes, n_train), rng.integers(0, n_classes, n_test)
    x, xt = centres[y] + noise * rng.normal(size=(n_train, dim)), centres[yt] + noise * rng.normal(size=(n_test, dim))
    return write_store(path, (x, y), (xt, yt), [f"c{k}" for k in range(n_classes)], chunk_rows=64)


def store_rows(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from foal_pipe.store import open_store

    store = open_store(path)
    train, test = store.split("train"), store.split("test")
    return (np.asarray(train.features[:], np.float64), np.asarray(train.labels[:]),
            np.asarray(test.features[:], np.float64), np.asarray(test.labels[:]))


def run(store: Path, out: Path, *args: object) -> tuple[dict, dict, str]:
    result = invoke("learn", "--features", store, "--out", out, *args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors")), result.output


def ridge(H: np.ndarray, y: np.ndarray, n_classes: int, gamma: float) -> np.ndarray:
    """The paper's Eq. 4: (H^T H + gamma I)^-1 H^T Y, one column per label id (zero for a label without rows)."""
    Y = np.zeros((y.size, n_classes))
    Y[np.arange(y.size), y] = 1.0
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


def expected_matrix(rows: tuple, tasks: list[list[int]], P: np.ndarray, act, gamma: float, n_classes: int,
                    mask: bool = True) -> list[list[float]]:
    """a[i][j]: accuracy on task j's test rows of the exact ridge over tasks 1..i's training rows; argmax over the
    classes seen (mask) or over every class, an unseen one scoring 0 (the published code)."""
    x, y, xt, yt = rows
    Ht = act(xt @ P)
    matrix = []
    for i in range(len(tasks)):
        seen = sorted(c for task in tasks[: i + 1] for c in task)
        kept = np.isin(y, seen)
        scores = Ht @ ridge(act(x[kept] @ P), y[kept], n_classes, gamma)
        if mask:
            scores[:, np.setdiff1d(np.arange(n_classes), seen)] = -np.inf
        predicted = scores.argmax(axis=1)
        matrix.append([float(np.mean(predicted[np.isin(yt, task)] == yt[np.isin(yt, task)])) for task in tasks[: i + 1]])
    return matrix


def spec_metrics(a: list[list[float]]) -> dict[str, float]:
    """protocol.md section 2: A_avg, A_last, F (paper Eq. 17-18) and the published code's F, from the matrix."""
    T = len(a)
    best_before = [max(a[row][j] for row in range(j, T - 1)) for j in range(T - 1)]
    return {"A_avg": float(np.mean([np.mean(row) for row in a])), "A_last": float(np.mean(a[-1])),
            "F": float(np.mean([best_before[j] - a[-1][j] for j in range(T - 1)])),
            "F_published_code": float(np.mean([max(a[row][j] for row in range(j, T)) - a[-1][j] for j in range(T)]))}


def assert_matrix(got: list[list[float]], want: list[list[float]]) -> None:
    assert [len(r) for r in got] == [len(r) for r in want]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def store12(tmp_path_factory) -> Path:
    return blobs(tmp_path_factory.mktemp("s12") / "s.zarr", n_classes=12, dim=16, n_train=600, n_test=240, seed=0)


@pytest.fixture(scope="module")
def default_run(store12, tmp_path_factory) -> tuple[dict, dict, str]:
    """``learn`` with no option but the store and the output: every default of the spec at once."""
    return run(store12, tmp_path_factory.mktemp("default") / "run")


def test_defaults_are_the_papers_recipe(store12, default_run):
    """gamma 1, D = 1000, sigmoid, uniform U(-1/sqrt(d), 1/sqrt(d)) without bias, float64, batch 10, mask unseen:
    the model's W is the exact ridge of sigmoid(X P) at gamma 1, and each accuracy is its closed form."""
    metrics, model, _ = default_run
    rows = store_rows(store12)
    P = model["projection"]
    d = rows[0].shape[1]
    assert P.shape == (d, 1000) and model["W"].dtype == np.float64
    assert np.abs(P).max() <= 1 / np.sqrt(d) and np.abs(P).max() > 0.99 / np.sqrt(d)
    assert np.var(P) == pytest.approx(1 / (3 * d), rel=0.05) and abs(P.mean()) < 0.01
    assert (metrics["gamma"], metrics["batch_size"], metrics["activation"]) == (1.0, 10, "sigmoid")
    np.testing.assert_allclose(model["W"], ridge(_sigmoid(rows[0] @ P), rows[1], 12, 1.0), rtol=0, atol=1e-9)
    assert metrics["n_train_seen"] == 600  # the last incomplete batch of every task kept
    assert_matrix(metrics["accuracy_matrix"], expected_matrix(rows, metrics["tasks"], P, _sigmoid, 1.0, 12))


def test_metrics_are_the_specs_formulas(default_run):
    metrics, _, _ = default_run
    for name, value in spec_metrics(metrics["accuracy_matrix"]).items():
        assert metrics[name] == pytest.approx(value, abs=1e-12), name


def test_class_order_is_a_seeded_permutation_cut_into_tasks(store12, default_run, tmp_path):
    """10 tasks by default; the classes shuffled (not label order), the same for a seed, another for another seed;
    --order-seed moves the order and keeps the projection, --seed moves both."""
    metrics, model, _ = default_run
    tasks = metrics["tasks"]
    assert len(tasks) == 10 and sorted(c for t in tasks for c in t) == list(range(12))
    assert [c for t in tasks for c in t] != list(range(12))
    same, same_model, _ = run(store12, tmp_path / "same", "--projection-dim", 1000)
    assert same["tasks"] == tasks and np.array_equal(same_model["projection"], model["projection"])
    other, other_model, _ = run(store12, tmp_path / "other", "--order-seed", 1)
    assert other["tasks"] != tasks and np.array_equal(other_model["projection"], model["projection"])
    seed, seed_model, _ = run(store12, tmp_path / "seed", "--seed", 1)
    assert seed["tasks"] == other["tasks"] and not np.array_equal(seed_model["projection"], model["projection"])


def test_leftover_classes_are_kept_by_default_as_issue_20_asks(store12, tmp_path):
    """The spec's default dropped them with a warning; issue 20 (a silent loss of 37.5% of the data) made every class
    streamed, the first C mod T tasks one class larger, with a note; `--drop-remainder` keeps the published split."""
    metrics, _, output = run(store12, tmp_path / "run", "--tasks", 5, "--projection-dim", 0)
    assert [len(t) for t in metrics["tasks"]] == [3, 3, 2, 2, 2] and not metrics.get("dropped_classes")
    assert sorted(c for t in metrics["tasks"] for c in t) == list(range(12))
    assert "note" in output.lower()


@pytest.mark.parametrize("n_classes,n_tasks", [(12, 5), (47, 10)])  # (47, 10): DTD 47 -> 40
def test_drop_remainder_is_the_published_split(tmp_path, n_classes, n_tasks):
    store = blobs(tmp_path / "s.zarr", n_classes=n_classes, dim=8, n_train=20 * n_classes, n_test=6 * n_classes, seed=1)
    metrics, model, output = run(store, tmp_path / "run", "--tasks", n_tasks, "--drop-remainder", "--projection-dim", 40)
    tasks, dropped = metrics["tasks"], metrics["dropped_classes"]
    per = n_classes // n_tasks
    assert [len(t) for t in tasks] == [per] * n_tasks and len(dropped) == n_classes % n_tasks
    assert sorted(dropped + [c for t in tasks for c in t]) == list(range(n_classes))
    assert "warning" in output.lower()
    rows = store_rows(store)
    assert metrics["n_train_seen"] == int(np.isin(rows[1], dropped, invert=True).sum())
    assert_matrix(metrics["accuracy_matrix"],
                  expected_matrix(rows, tasks, model["projection"], _sigmoid, 1.0, n_classes))


def test_drop_last_drops_each_tasks_incomplete_batch(tmp_path):
    """Every class's training rows are one repeated vector, so the ridge depends on the rows kept per class only:
    each task keeps floor(n / 10) * 10 of its n rows, and W is the ridge of exactly those counts."""
    rng = np.random.default_rng(2)
    n_classes, dim = 6, 5
    centres = rng.normal(size=(n_classes, dim))
    y = np.repeat(np.arange(n_classes), [13, 9, 17, 11, 8, 15])
    yt = np.repeat(np.arange(n_classes), 4)
    store = write_store(tmp_path / "s.zarr", (centres[y], y), (centres[yt] + rng.normal(size=(yt.size, dim)), yt),
                        [f"c{k}" for k in range(n_classes)], chunk_rows=16)
    metrics, model, _ = run(store, tmp_path / "run", "--tasks", 3, "--drop-last", "--projection-dim", 20)
    counts = dict(zip(model["classes"].tolist(), model["counts"].tolist(), strict=True))
    available = np.bincount(y, minlength=n_classes)
    for task in metrics["tasks"]:
        n = int(available[task].sum())
        assert sum(counts[c] for c in task) == n - n % 10
    assert all(counts[c] <= available[c] for c in counts)
    kept_y = np.repeat(np.arange(n_classes), [counts.get(c, 0) for c in range(n_classes)])
    stored = store_rows(store)[0][[int(np.flatnonzero(y == c)[0]) for c in range(n_classes)]]  # as stored (float32)
    H = _sigmoid(stored[kept_y] @ model["projection"])
    np.testing.assert_allclose(model["W"], ridge(H, kept_y, n_classes, 1.0)[:, model["classes"]], rtol=0, atol=1e-9)
    assert metrics["n_train_seen"] == kept_y.size < y.size


@pytest.mark.parametrize("n_classes,extra", [(8, ()), (9, ("--drop-remainder",))])
def test_mask_unseen_and_the_published_codes_argmax_over_every_class(tmp_path, n_classes, extra):
    """Default: argmax over the classes seen; --no-mask-unseen: over every class (W preallocated for all, a class
    dropped by --drop-remainder included), the unseen scoring 0, so a row whose seen classes all score below 0 goes
    to an unseen class, always wrong. Ridge on raw features (D = 0) gives such rows; sweep's gamma-1
    row is the same closed form."""
    store = blobs(tmp_path / "s.zarr", n_classes=n_classes, dim=6, n_train=400, n_test=400, seed=3, offset=1.0,
                  noise=2.5)
    rows, P = store_rows(store), np.eye(6)
    common = ("--tasks", 4, "--projection-dim", 0, *extra)
    masked, _, _ = run(store, tmp_path / "masked", *common)
    open_, _, _ = run(store, tmp_path / "open", *common, "--no-mask-unseen")
    assert masked["tasks"] == open_["tasks"] and len(masked["dropped_classes"]) == len(extra)
    want_masked = expected_matrix(rows, masked["tasks"], P, _identity, 1.0, n_classes)
    want_open = expected_matrix(rows, masked["tasks"], P, _identity, 1.0, n_classes, mask=False)
    assert want_masked != want_open  # the store exercises the difference
    assert (want_masked[-1] != want_open[-1]) == bool(extra)  # at the end only a dropped class is unseen
    assert_matrix(masked["accuracy_matrix"], want_masked)
    assert_matrix(open_["accuracy_matrix"], want_open)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sweep", *common, "--no-mask-unseen",
                    "--gammas", "1,10")
    assert result.exit_code == 0, result.output
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert_matrix(next(r for r in sweep["results"] if r["gamma"] == 1.0)["accuracy_matrix"], want_open)


@pytest.mark.parametrize("gamma,batch", [(1.0, 10), (0.1, 1), (10.0, 7)])
def test_rls_engine_on_the_cli_is_the_closed_form(store12, tmp_path, gamma, batch):
    """R0 = I / gamma and the per-batch recursion end, whatever the batch size, at R = (H^T H + gamma I)^-1 and the
    ridge W; each task's accuracies are the closed form's, and the gram engine's."""
    common = ("--tasks", 4, "--projection-dim", 60, "--gamma", gamma, "--batch-size", batch)
    metrics, model, _ = run(store12, tmp_path / "rls", "--engine", "rls", *common)
    gram, _, _ = run(store12, tmp_path / "gram", "--engine", "gram", *common)
    rows = store_rows(store12)
    P = model["projection"]
    H = _sigmoid(rows[0] @ P)
    np.testing.assert_allclose(model["W"], ridge(H, rows[1], 12, gamma), rtol=0, atol=1e-8)
    np.testing.assert_allclose(model["R"], np.linalg.inv(H.T @ H + gamma * np.eye(60)), rtol=0, atol=1e-8)
    assert_matrix(metrics["accuracy_matrix"], expected_matrix(rows, metrics["tasks"], P, _sigmoid, gamma, 12))
    assert_matrix(metrics["accuracy_matrix"], gram["accuracy_matrix"])


def test_normal_projection_init_has_the_uniforms_variance(store12, tmp_path):
    _, model, _ = run(store12, tmp_path / "run", "--projection-init", "normal", "--tasks", 2)
    P, d = model["projection"], 16
    assert np.var(P) == pytest.approx(1 / (3 * d), rel=0.05) and np.abs(P).max() > 1.5 / np.sqrt(d)


def test_core50_split_from_a_class_order_file(tmp_path):
    """CORe50's NC split, 9 tasks of 10 then 8 x 5 classes, has no preset: a --class-order file gives it."""
    store = blobs(tmp_path / "s.zarr", n_classes=50, dim=8, n_train=1000, n_test=300, seed=4)
    order = np.random.default_rng(0).permutation(50).tolist()
    split = [sorted(order[:10])] + [sorted(order[10 + 5 * k : 15 + 5 * k]) for k in range(8)]
    (tmp_path / "order.json").write_text(json.dumps(split))
    metrics, model, _ = run(store, tmp_path / "run", "--class-order", tmp_path / "order.json", "--projection-dim", 30)
    assert metrics["tasks"] == split and metrics["n_tasks"] == 9
    assert_matrix(metrics["accuracy_matrix"],
                  expected_matrix(store_rows(store), split, model["projection"], _sigmoid, 1.0, 50))


# --- the paper's recursion (Theorems 3.1-3.2), batch by batch ------------------------------------------------------


def paper_recursion(batches: list[tuple[np.ndarray, np.ndarray]], gamma: float):
    """Algorithm 1 as printed: R0 = I / gamma, W0 null; per batch R <- R - R X^T (I + X R X^T)^-1 X R, then
    W <- W' + R X^T (Y - X W'), where W' is W with a zero column appended per class first seen in the batch
    (columns in order of first appearance). Yields (R, W, classes in column order) after every batch."""
    D = batches[0][0].shape[1]
    R, W, order = np.eye(D) / gamma, np.zeros((D, 0)), []
    for X, y in batches:
        for c in y:
            if c not in order:
                order.append(int(c))
                W = np.hstack([W, np.zeros((D, 1))])
        Y = np.zeros((y.size, len(order)))
        Y[np.arange(y.size), [order.index(c) for c in y]] = 1.0
        R = R - R @ X.T @ np.linalg.inv(np.eye(X.shape[0]) + X @ R @ X.T) @ X @ R
        W = W + R @ X.T @ (Y - X @ W)
        yield R, W, list(order)


@pytest.mark.parametrize("engine", ["rls", "gram"])
def test_every_batch_equals_the_papers_recursion_and_the_joint_solution(engine):
    rng = np.random.default_rng(5)
    D, gamma = 12, 0.5
    tasks = [[3, 0], [4], [1, 2]]
    batches = []
    for task in tasks:
        n = 27
        y = rng.choice(task, n)
        X = _sigmoid(rng.normal(size=(n, D)) + y[:, None] * 0.3)
        batches += [(X[i : i + 10], y[i : i + 10]) for i in range(0, n, 10)]  # the last batch of a task has 7 rows
    clf = AnalyticClassifier(gamma=gamma, engine=engine, backend="numpy")
    seen_X, seen_y = np.empty((0, D)), np.empty(0, dtype=int)
    for (X, y), (R, W, order) in zip(batches, paper_recursion(batches, gamma), strict=True):
        clf.partial_fit(X, y)
        seen_X, seen_y = np.vstack([seen_X, X]), np.concatenate([seen_y, y])
        columns = [order.index(c) for c in clf.classes_]
        np.testing.assert_allclose(clf.weights_, W[:, columns], rtol=0, atol=1e-10)
        joint = ridge(seen_X, seen_y, 5, gamma)[:, clf.classes_]
        np.testing.assert_allclose(clf.weights_, joint, rtol=0, atol=1e-10)
        np.testing.assert_allclose(R, np.linalg.inv(seen_X.T @ seen_X + gamma * np.eye(D)), rtol=0, atol=1e-10)
        if engine == "rls":
            np.testing.assert_allclose(clf._engine.R, R, rtol=0, atol=1e-10)
