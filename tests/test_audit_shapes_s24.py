"""Extreme but legal shapes (two classes, one task, one class per task, D > n, one or two rows per class, features of
dimension 1, float16 stores, 1,000 classes, a batch larger than a task) through learn, sweep, predict and the heads,
each checked against a closed form written here in NumPy: ridge's W = (H^T H + gamma I)^-1 H^T Y over every row seen,
the heads' definitions of docs/heads.md and docs/heads-projected.md, leave-one-out by refitting without each row, and
A_avg, A_last, F as docs/metrics.md defines them. Angle: shapes at the edges, not values; the one fault found is
fecam's refusal of rows that differ only in length (``test_fecam_collinear_rows_message_names_the_normalisation``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, runner
from safetensors.numpy import load_file

from foal_pipe.cli import app
from foal_pipe.store import write_store

SHAPES = {  # name: (classes, dim, train labels or row count, test labels or row count, store dtype)
    "two": (2, 8, 40, 20, "float32"),
    "one_per_task": (6, 8, 60, 30, "float32"),
    "few_rows": (4, 8, [0, 1, 2, 2, 3, 3], [0, 1, 2, 3] * 3, "float32"),
    "one_row": (4, 8, [0, 1, 2, 3], [0, 1, 2, 3], "float32"),
    "dim1": (3, 1, 30, 20, "float32"),
    "f16": (4, 8, 40, 20, "float16"),
    "k1000": (1000, 16, np.repeat(np.arange(1000), 3), np.arange(1000), "float32"),
}


def make(path: Path, name: str, seed: int = 0) -> Path:
    n_classes, dim, train, test, dtype = SHAPES[name]
    rng = np.random.default_rng(seed)
    centres = 2 * rng.normal(size=(n_classes, dim))
    y = rng.integers(0, n_classes, train) if isinstance(train, int) else np.asarray(train)
    yt = rng.integers(0, n_classes, test) if isinstance(test, int) else np.asarray(test)
    x, xt = centres[y] + rng.normal(size=(len(y), dim)), centres[yt] + rng.normal(size=(len(yt), dim))
    return write_store(path / f"{name}.zarr", (x, y), (xt, yt), [f"c{k}" for k in range(n_classes)], chunk_rows=16,
                       dtype=dtype)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {name: make(root, name) for name in SHAPES}


def ok(args: list) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def read_rows(store: Path) -> tuple[np.ndarray, ...]:
    import zarr

    g = zarr.open_group(str(store), mode="r")
    x, y, xt, yt = (np.asarray(g[f"{s}/{k}"][:]) for s in ("train", "test") for k in ("features", "labels"))
    return x.astype(np.float64), y, xt.astype(np.float64), yt


ACT = {"sigmoid": lambda z: 1 / (1 + np.exp(-z)), "identity": lambda z: z, "relu": lambda z: np.maximum(z, 0)}


def metrics_of(a: list[list[float]]) -> dict[str, float]:
    """docs/metrics.md's A_avg, A_last and F, written out."""
    T = len(a)
    steps = [float(np.mean(row)) for row in a]
    F = 0.0 if T == 1 else float(np.mean([max(a[i][j] for i in range(j, T - 1)) - a[T - 1][j] for j in range(T - 1)]))
    return {"A_avg": float(np.mean(steps)), "A_last": steps[-1], "F": F}


def accuracy_row(S: np.ndarray, classes: np.ndarray, seen: list, tasks: list, yt: np.ndarray) -> list[float]:
    S = S.copy()
    S[:, ~np.isin(classes, seen)] = -np.inf
    pred = classes[S.argmax(1)]
    return [float((pred[np.isin(yt, t)] == yt[np.isin(yt, t)]).mean()) for t in tasks]


def ridge_w(H: np.ndarray, y: np.ndarray, classes: np.ndarray, gamma: float) -> np.ndarray:
    Y = (y[:, None] == classes[None, :]).astype(float)
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


def activations(store: Path, model: Path, activation: str) -> tuple[np.ndarray, ...]:
    x, y, xt, yt = read_rows(store)
    P = load_file(str(model)).get("projection")
    f = ACT[activation]
    return (f(x @ P), y, f(xt @ P), yt) if P is not None else (f(x), y, f(xt), yt)


def assert_metrics(m: dict, mat: list) -> None:
    assert m["accuracy_matrix"] == mat
    for key, value in metrics_of(mat).items():
        assert m[key] == pytest.approx(value, abs=1e-12), key


RIDGE = [("two", 2, 30, []), ("two", 1, 30, []), ("one_per_task", 6, 30, []), ("one_row", 4, 200, []),
         ("few_rows", 2, 20, []), ("dim1", 3, 20, []), ("dim1", 3, 0, []), ("f16", 2, 20, []), ("f16", 4, 0, []),
         ("two", 2, 20, ["--batch-size", 1000]), ("few_rows", 2, 20, ["--engine", "rls"]),
         ("dim1", 3, 200, ["--engine", "rls", "--batch-size", 1000]), ("k1000", 10, 100, [])]


@pytest.mark.parametrize(("name", "tasks", "D", "extra"), RIDGE)
def test_learn_and_predict_equal_the_closed_form(stores, tmp_path, name, tasks, D, extra):
    store, out = stores[name], tmp_path / "run"
    ok(["learn", "--features", store, "--out", out, "--tasks", tasks, "--projection-dim", D, *extra])
    m, t = json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors"))
    H, y, Ht, yt = activations(store, out / "model.safetensors", m["activation"])
    classes, seen, mat = t["classes"], [], []
    for i, task in enumerate(m["tasks"]):
        seen += task
        W = ridge_w(H[np.isin(y, seen)], y[np.isin(y, seen)], classes, 1.0)
        mat.append(accuracy_row(Ht @ W, classes, seen, m["tasks"][: i + 1], yt))
    assert np.linalg.norm(t["W"] - W) <= 1e-8 * np.linalg.norm(W)
    assert_metrics(m, mat)
    for split, rows in (("test", Ht), ("train", H)):
        result = runner.invoke(app, ["predict", "--model", str(out / "model.safetensors"), "--features", str(store),
                                     "--split", split])
        assert result.exit_code == 0, result.output
        got = list(csv.DictReader(io.StringIO(result.stdout)))
        S = rows @ W
        assert [int(r["predicted_class"]) for r in got] == classes[S.argmax(1)].tolist()
        np.testing.assert_allclose([float(r["score"]) for r in got], S.max(1), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(("name", "tasks", "D"), [("few_rows", 2, 20), ("one_row", 4, 20), ("dim1", 3, 0), ("two", 1, 30)])
def test_sweep_accuracy_and_leave_one_out_equal_refits(stores, tmp_path, name, tasks, D):
    """Every gamma's matrix and LOO accuracy (a class's only row left out: no model of it, so wrong) by refitting."""
    store = stores[name]
    ok(["learn", "--features", store, "--out", tmp_path / "p", "--tasks", tasks, "--projection-dim", D])
    ok(["sweep", "--features", store, "--out", tmp_path / "s", "--tasks", tasks, "--projection-dim", D,
        "--gammas", "0.01,1,100"])
    s = json.loads((tmp_path / "s" / "sweep.json").read_text())
    H, y, Ht, yt = activations(store, tmp_path / "p" / "model.safetensors", s["activation"])
    classes = np.arange(SHAPES[name][0])
    for r in s["results"]:
        seen, mat, loo = [], [], []
        for i, task in enumerate(s["tasks"]):
            seen += task
            Hs, ys = H[np.isin(y, seen)], y[np.isin(y, seen)]
            mat.append(accuracy_row(Ht @ ridge_w(Hs, ys, classes, r["gamma"]), classes, seen, s["tasks"][: i + 1], yt))
            hits = 0
            for k in range(len(ys)):
                keep = np.arange(len(ys)) != k
                scores = Hs[k:k + 1] @ ridge_w(Hs[keep], ys[keep], classes, r["gamma"])
                hits += accuracy_row(scores, classes, seen, [[int(ys[k])]], ys[k:k + 1])[0] == 1.0
            loo.append(hits / len(ys))
        assert_metrics(r, mat)
        assert r["loo_accuracy"] == pytest.approx(loo, abs=1e-12)


def unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.where(n > 0, n, 1), 0.0)


def head_scores(head, X, y, Xt, classes, seen, opts):
    """docs/heads.md's definitions, over the training rows of the classes seen."""
    X, y = X[np.isin(y, seen)], y[np.isin(y, seen)]
    S, d = np.full((len(Xt), len(classes)), -np.inf), X.shape[1]
    if head == "balanced":
        inv = {c: 1 / (y == c).sum() for c in seen}
        w = {c: inv[c] * len(seen) / sum(inv.values()) for c in seen}
        A, B = opts["gamma"] * np.eye(d), np.zeros((d, len(classes)))
        for k, c in enumerate(classes):
            if c in seen:
                A += w[c] * X[y == c].T @ X[y == c]
                B[:, k] = w[c] * X[y == c].sum(0)
        return Xt @ np.linalg.solve(A, B)
    mus = {c: X[y == c].mean(0) for c in seen}
    if head == "slda":
        R = X - np.array([mus[c] for c in y])
        L = np.linalg.pinv((1 - opts["shrinkage"]) * R.T @ R / len(y) + opts["shrinkage"] * np.eye(d))
    for k, c in enumerate(classes):
        if c not in seen:
            continue
        if head == "ncm":
            S[:, k] = -((unit(Xt) - unit(X[y == c]).mean(0)) ** 2).sum(1)
        elif head == "cosine":
            S[:, k] = Xt @ mus[c] / (np.linalg.norm(Xt, axis=1) * np.linalg.norm(mus[c]))
        elif head == "slda":
            S[:, k] = Xt @ L @ mus[c] - mus[c] @ L @ mus[c] / 2
        elif head == "fecam":
            Z = unit(X[y == c])
            C = np.cov(Z, rowvar=False).reshape(d, d)
            off = C[~np.eye(d, dtype=bool)].mean() if d > 1 else 0.0
            C = C + opts["shrinkage"] * np.diag(C).mean() * np.eye(d) + opts["shrinkage_offdiag"] * off * (1 - np.eye(d))
            C = C / np.outer(np.sqrt(np.diag(C)), np.sqrt(np.diag(C)))
            r = unit(Xt) - Z.mean(0)
            S[:, k] = -np.einsum("ij,jk,ik->i", r, np.linalg.pinv(C), r)
    return S


HEADS = [(h, n, T) for h in ("ncm", "slda", "cosine") for n, T in
         (("two", 1), ("one_per_task", 6), ("few_rows", 2), ("one_row", 4), ("dim1", 3), ("f16", 2), ("k1000", 10))]
HEADS += [("fecam", n, T) for n, T in (("two", 2), ("one_per_task", 6), ("f16", 2), ("k1000", 10))]
HEADS += [("balanced", n, T) for n, T in (("two", 1), ("one_per_task", 6), ("one_row", 4), ("dim1", 3), ("few_rows", 2))]


@pytest.mark.parametrize(("head", "name", "tasks"), HEADS)
def test_heads_equal_their_definitions(stores, tmp_path, head, name, tasks):
    store, out = stores[name], tmp_path / "run"
    extra = ["--projection-dim", 200 if name == "one_row" else 20] if head == "balanced" else []
    ok(["learn", "--features", store, "--out", out, "--tasks", tasks, "--head", head, *extra])
    m, t = json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors"))
    if head == "balanced":
        X, y, Xt, yt = activations(store, out / "model.safetensors", m["activation"])
    else:
        X, y, Xt, yt = read_rows(store)
    seen, mat = [], []
    for i, task in enumerate(m["tasks"]):
        seen += task
        S = head_scores(head, X, y, Xt, t["classes"], seen, m["head_options"])
        mat.append(accuracy_row(S, t["classes"], seen, m["tasks"][: i + 1], yt))
    assert_metrics(m, mat)


@pytest.mark.parametrize(("name", "tasks", "D"), [("two", 1, 30), ("one_per_task", 6, 30), ("one_row", 4, 200),
                                                  ("dim1", 3, 20), ("f16", 2, 20), ("dim1", 3, 0)])
def test_dual_with_one_batch_per_task_equals_its_recursion(stores, tmp_path, name, tasks, D):
    """A batch larger than every task makes DS-AL's recursion one step per task, free of the rows' order."""
    store, out = stores[name], tmp_path / "run"
    ok(["learn", "--features", store, "--out", out, "--tasks", tasks, "--head", "dual", "--projection-dim", D,
        "--batch-size", 100000])
    m, t = json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors"))
    x, y, xt, yt = read_rows(store)
    Z, Zt, cl, n = x @ t["projection"], xt @ t["projection"], t["classes"], t["projection"].shape[1]
    Gm, Gc, Qm, Qc = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, len(cl))), np.zeros((n, len(cl)))
    before, mat = [], []
    for i, task in enumerate(m["tasks"]):
        sel = np.isin(y, task)
        Hm, Hc, Y = np.maximum(Z[sel], 0), np.tanh(Z[sel]), (y[sel][:, None] == cl[None, :]).astype(float)
        Gm, Qm = Gm + Hm.T @ Hm, Qm + Hm.T @ Y
        Wm = np.linalg.solve(Gm + np.eye(n), Qm)
        E = Y - Hm @ Wm
        E[:, np.isin(cl, before)] = 0
        Gc, Qc = Gc + Hc.T @ Hc, Qc + Hc.T @ E
        Wc = np.linalg.solve(Gc + np.eye(n), Qc)
        before += task
        mat.append(accuracy_row(np.maximum(Zt, 0) @ Wm + np.tanh(Zt) @ Wc, cl, before, m["tasks"][: i + 1], yt))
    assert np.linalg.norm(t["W_main"] - Wm) <= 1e-8 * np.linalg.norm(Wm)
    assert np.linalg.norm(t["W_comp"] - Wc) <= 1e-8 * np.linalg.norm(Wc)
    assert_metrics(m, mat)


@pytest.mark.parametrize(("args", "fragment"), [
    (["--eval-every", 1000], "more than the stream's 40 training rows"),
    (["--batch-size", 1000, "--drop-last"], "--drop-last would drop all"),
    (["--head", "dual", "--eval-every", 10], "drop --eval-every"),
])
def test_stream_edges_refuse_in_one_line(stores, tmp_path, args, fragment):
    result = runner.invoke(app, ["learn", "--features", str(stores["two"]), "--out", str(tmp_path / "r"), "--tasks", "2",
                                 "--projection-dim", "20", *[str(a) for a in args]])
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "r").exists()


def test_test_split_without_a_task_refuses_in_one_line(tmp_path):
    rng = np.random.default_rng(1)
    y, yt = np.repeat(np.arange(4), 5), np.array([0, 1] * 3)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(20, 4)), y), (rng.normal(size=(6, 4)), yt),
                        ["a", "b", "c", "d"], chunk_rows=8)
    (tmp_path / "order.json").write_text("[[0, 1], [2, 3]]")
    for command in ("learn", "sweep"):
        result = runner.invoke(app, [command, "--features", str(store), "--out", str(tmp_path / command), "--tasks", "2",
                                     "--class-order", str(tmp_path / "order.json"), "--projection-dim", "10"])
        assert_one_line_error(result, "task 2 (classes 2, 3) has no test rows")


def test_fecam_collinear_rows_message_names_the_normalisation(tmp_path):
    """Fixed: fecam's covariance is of the normalised rows x / ||x||. A class whose rows are positive multiples of one
    another (any class of 1-dimensional features of one sign) is refused as "its training rows are all the same", and
    told to use "rows that vary": its rows do vary, only in length. The message should name the normalisation."""
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 6)
    x = np.where(y == 0, 1.0, -1.0)[:, None] * rng.uniform(1, 5, size=(12, 1))  # 1-dim rows of one sign per class
    store = write_store(tmp_path / "s.zarr", (x, y), (x, y), ["a", "b"], chunk_rows=8)
    assert len(np.unique(x[y == 0])) == 6  # distinct rows; only their x / ||x|| (+1 or -1) coincide
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "r"), "--tasks", "1",
                                 "--head", "fecam"])
    assert_one_line_error(result, "fecam: class 'a'")
    text = " ".join(result.output.split())
    assert "rows are all the same" not in text, text
    assert any(w in text for w in ("normalis", "normaliz", "x / ||x||", "multiples", "direction")), text
