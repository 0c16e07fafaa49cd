"""Audit s25 (metric definitions): the reported A_avg, A_last, F, F_published_code, A_auc, per-class counts and the
mean +- std over class orders, recomputed independently from the raw features (nearest class mean of unit rows, closed-
form ridge on the store's features), never through foal_pipe's metric functions (docs/metrics.md, docs/streams.md,
docs/evaluate.md, docs/results-table.md, docs/orders.md; paper section 4.2, Eq. 17-18)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke, read, ref_ncm


def _store(path: Path, n_classes: int = 6, dim: int = 8, seed: int = 0, const_train: bool = False) -> Path:
    """Gaussian classes with unbalanced test rows (class k: 3 + 7k), so a per-task mean and a per-row mean differ;
    ``const_train``: every train row of a class is its centre, so a nearest-class-mean model depends only on which
    classes were seen, not on which of their rows."""
    from foal_pipe.store import write_store

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, dim))
    y = np.repeat(np.arange(n_classes), 40)
    yt = np.concatenate([np.full(3 + 7 * k, k) for k in range(n_classes)])
    x = centres[y] + (0 if const_train else 1.2) * rng.normal(size=(y.size, dim))
    xt = centres[yt] + 1.2 * rng.normal(size=(yt.size, dim))
    return write_store(path, (x, y), (xt, yt), [f"c{k}" for k in range(n_classes)], chunk_rows=32)


def _ok(*args) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def _ncm_pred(x, y, xt, seen):
    keep = np.isin(y, seen)
    classes, scores = ref_ncm(x[keep], y[keep], xt)
    return classes[scores.argmax(1)]


def _ridge_pred(x, y, xt, seen, gamma=1.0):
    keep, C = np.isin(y, seen), int(y.max()) + 1
    X, Y = x[keep].astype(np.float64), np.eye(C)[y[keep]]
    scores = xt @ np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)
    scores[:, [c for c in range(C) if c not in seen]] = -np.inf
    return scores.argmax(1)


def _matrix(store: Path, tasks: list[list[int]], predict) -> list[list[float]]:
    """a[i][j]: accuracy on task j's test rows (pooled within the task) after training through task i."""
    x, y, xt, yt = read(store)
    rows, seen = [], []
    for i, task in enumerate(tasks):
        seen = seen + list(task)
        p = predict(x, y, xt, seen)
        rows.append([float((p[np.isin(yt, t)] == yt[np.isin(yt, t)]).mean()) for t in tasks[: i + 1]])
    return rows


def _by_hand(a: list[list[float]]) -> dict[str, float]:
    """docs/metrics.md's formulas, written out: tasks weighted equally, F over j < T with the max over l in j..T-1."""
    T = len(a)
    steps = [sum(r) / len(r) for r in a]
    F = sum(max(a[i][j] for i in range(j, T - 1)) - a[T - 1][j] for j in range(T - 1)) / (T - 1) if T > 1 else 0.0
    Fp = sum(max(a[i][j] for i in range(j, T)) - a[T - 1][j] for j in range(T)) / T
    return {"A_avg": sum(steps) / T, "A_last": steps[-1], "F": F, "F_published_code": Fp, "steps": steps}


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_output_of_a_disjoint_ncm_run_matches_the_definitions_by_hand(tmp_path):
    """metrics.json, scores.json, steps.csv, accuracy_matrix.csv, summary.md and the console against a brute-force NCM;
    per-class rows and confusion counts against the final predictions (they must sum to the test rows). Angle: the
    numbers recomputed from the features, not from the file's own matrix."""
    store, run = _store(tmp_path / "s.zarr"), tmp_path / "run"
    _ok("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 3, "--seed", 1)
    m = json.loads((run / "metrics.json").read_text())
    a = _matrix(store, m["tasks"], _ncm_pred)
    want = _by_hand(a)
    np.testing.assert_allclose(np.concatenate(m["accuracy_matrix"]), np.concatenate(a), rtol=0, atol=1e-12)
    for k in ("A_avg", "A_last", "F", "F_published_code"):
        assert m[k] == pytest.approx(want[k], abs=1e-12), k
    assert m["A_steps"] == pytest.approx(want["steps"], abs=1e-12)
    x, y, xt, yt = read(store)
    pooled = float((_ncm_pred(x, y, xt, list(range(6))) == yt).mean())
    assert abs(pooled - want["A_last"]) > 1e-3  # the store makes per-task and per-row weighting differ
    out = _ok("evaluate", "--run", run)
    assert f"A_avg {100 * want['A_avg']:.2f}  A_last {100 * want['A_last']:.2f}  F {100 * want['F']:.2f}" in out
    ev = run / "eval"
    scores = json.loads((ev / "scores.json").read_text())
    for k in ("A_avg", "A_last", "F", "F_published_code"):
        assert scores[k] == pytest.approx(want[k], abs=1e-12), k
    steps = _csv(ev / "steps.csv")
    for i, row in enumerate(steps):
        assert float(row["A_i"]) == pytest.approx(100 * want["steps"][i], abs=1e-4)
        assert float(row["newest_task"]) == pytest.approx(100 * a[i][i], abs=1e-4)
        assert float(row["first_task"]) == pytest.approx(100 * a[i][0], abs=1e-4)
    cells = {(int(r["after_task"]), int(r["task"])): float(r["accuracy"]) for r in _csv(ev / "accuracy_matrix.csv")}
    assert cells == {(i + 1, j + 1): pytest.approx(100 * v, abs=1e-4) for i, row in enumerate(a) for j, v in enumerate(row)}
    md = (ev / "summary.md").read_text()
    labels = ("A_avg (%)", "A_avg"), ("A_last (%)", "A_last"), ("F (%)", "F"), ("F, published code (%)", "F_published_code")
    for label, k in labels:
        assert f"| {label} | {100 * want[k]:.2f} |" in md, label
    final = _ncm_pred(x, y, xt, list(range(6)))
    per_class = {int(r["class"]): r for r in _csv(ev / "class_accuracy.csv")}
    assert sum(int(r["test_rows"]) for r in per_class.values()) == yt.size == m["n_test"]
    for c, r in per_class.items():
        assert (int(r["test_rows"]), int(r["correct"])) == ((yt == c).sum(), ((final == c) & (yt == c)).sum())
    confusion = _csv(ev / "confusion_matrix.csv")
    names = [k for k in confusion[0] if k != "true_class"]
    counts = np.array([[int(r[n]) for n in names] for r in confusion])
    ids = [int(n[1:]) for n in names]
    assert counts.sum() == yt.size
    assert counts.tolist() == [[int(((yt == t) & (final == p)).sum()) for p in ids] for t in ids]


def test_orders_table_and_group_give_the_population_std_of_closed_form_ridge(tmp_path):
    """learn --order-seeds, summary.md, table.json/table.md and summary --group: mean and ddof-0 std over three orders of
    closed-form ridge (no projection, gamma 1), each order's matrix recomputed from the features."""
    store = _store(tmp_path / "s.zarr")
    run, tab = tmp_path / "orders", tmp_path / "tab"
    _ok("learn", "--features", store, "--out", run, "--projection-dim", 0, "--gamma", 1, "--tasks", 3, "--order-seeds", "0,1,2")
    m = json.loads((run / "metrics.json").read_text())
    per = []
    for o in m["orders"]:
        a = _matrix(store, o["tasks"], _ridge_pred)
        np.testing.assert_allclose(np.concatenate(o["accuracy_matrix"]), np.concatenate(a), rtol=0, atol=1e-12)
        per.append(_by_hand(a))
    want = {k: (np.mean([p[k] for p in per]), np.std([p[k] for p in per])) for k in ("A_avg", "A_last", "F")}
    assert np.std([p["A_avg"] for p in per], ddof=1) - want["A_avg"][1] > 1e-3  # ddof 0 and 1 tell apart here
    for k, (mean, std) in want.items():
        assert (m[k], m["mean"][k], m["std"][k]) == pytest.approx((mean, mean, std), abs=1e-12), k
    _ok("evaluate", "--run", run)
    md = (run / "eval" / "summary.md").read_text()
    assert f"| A_avg (%) | {100 * want['A_avg'][0]:.2f} ± {100 * want['A_avg'][1]:.2f} |" in md
    _ok("table", "--features", store, "--heads", "ridge", "--order-seeds", "0,1,2", "--tasks", 3, "--gamma", 1,
        "--projection-dim", 0, "--out", tab)
    t = json.loads((tab / "table.json").read_text())
    assert t["std_ddof"] == 0
    (cell,) = t["cells"]
    for k, (mean, std) in want.items():
        assert (cell[k]["mean"], cell[k]["std"]) == pytest.approx((mean, std), abs=1e-12), k
    table_md = (tab / "table.md").read_text()
    for k in ("A_last", "A_avg"):
        assert f"{100 * want[k][0]:.2f} ± {100 * want[k][1]:.2f}" in table_md, k
    for s in (0, 1, 2):
        _ok("learn", "--features", store, "--out", tmp_path / "grp" / f"o{s}", "--projection-dim", 0, "--gamma", 1,
            "--tasks", 3, "--order-seed", s)
    out = _ok("summary", tmp_path / "grp", "--group", "head,tasks")
    assert f"{100 * want['F'][0]:.2f} +- {100 * want['F'][1]:.2f}" in out


def test_si_blurry_numbers_follow_the_class_wise_definitions(tmp_path):
    """docs/streams.md: a[i][j] on the test rows of the classes seen by the end of task j (pooled), A_t = a[t][t], F
    class-wise over the classes seen before the last task. Constant train rows make NCM depend only on the classes seen."""
    store = _store(tmp_path / "b.zarr", n_classes=8, dim=6, seed=2, const_train=True)
    x, y, xt, yt = read(store)
    for seed in (0, 3):
        run = tmp_path / f"b{seed}"
        _ok("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 4, "--stream", "si-blurry", "--seed", seed)
        m = json.loads((run / "metrics.json").read_text())
        seen_by, seen = [], []
        for task in m["tasks"]:
            seen = seen + [c for c in task if c not in seen]
            seen_by.append(seen)
        T = len(seen_by)
        preds = [_ncm_pred(x, y, xt, s) for s in seen_by]
        a = [[float((preds[i][np.isin(yt, seen_by[j])] == yt[np.isin(yt, seen_by[j])]).mean()) for j in range(i + 1)]
             for i in range(T)]
        acc = [{c: float((p[yt == c] == c).mean()) for c in seen_by[-1]} for p in preds]
        first = {c: next(i for i in range(T) if c in seen_by[i]) for c in seen_by[-1]}
        drops = [max(acc[lv][c] for lv in range(first[c], T - 1)) - acc[T - 1][c] for c in seen_by[T - 2]]
        np.testing.assert_allclose(np.concatenate(m["accuracy_matrix"]), np.concatenate(a), rtol=0, atol=1e-12)
        assert m["A_avg"] == pytest.approx(np.mean([a[t][t] for t in range(T)]), abs=1e-12)
        assert m["A_last"] == pytest.approx(a[-1][-1], abs=1e-12)
        assert m["F"] == pytest.approx(np.mean(drops), abs=1e-12)


def test_anytime_points_count_rows_seen_and_score_the_classes_seen(tmp_path):
    """--eval-every 20 on 4 tasks of 80 rows (2 classes each, constant train rows): every point inside task t scores the
    model of task t's end on the test rows of the classes seen (pooled), at 20, 40, ..., 320 rows; A_auc their mean."""
    store, run = _store(tmp_path / "b.zarr", n_classes=8, dim=6, seed=2, const_train=True), tmp_path / "any"
    _ok("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 4, "--eval-every", 20)
    m = json.loads((run / "metrics.json").read_text())
    x, y, xt, yt = read(store)
    ends, seen = [], []
    for task in m["tasks"]:
        seen = seen + task
        ends.append(float((_ncm_pred(x, y, xt, seen)[np.isin(yt, seen)] == yt[np.isin(yt, seen)]).mean()))
    want = [ends[(k - 1) // 80] for k in range(20, 321, 20)]
    assert m["anytime"]["samples_seen"] == list(range(20, 321, 20))
    assert m["anytime"]["accuracy"] == pytest.approx(want, abs=1e-12)
    assert m["A_auc"] == pytest.approx(np.mean(want), abs=1e-12)


def test_sweep_refined_line_over_orders_reports_the_numbers_it_names(tmp_path):
    """Was a fault: `sweep --order-seeds` printed "refined search (last boundary's gamma, test A_last of the chosen models):
    LOO MSE 10 (58.51), ..." under a table whose every row (gamma 0.1, 1, 10) gives A_last 55.89, the mean over the
    orders: the refined line shows the FIRST order's A_last (sweep.json's selections are the first order's,
    docs/orders.md) without saying so, so two console lines disagree about the A_last of gamma 10. Expected: the line
    either names the order it reports (order seed 0) or gives the orders' mean (here 55.89, as every gamma gives)."""
    store = _store(tmp_path / "s.zarr")
    out = _ok("sweep", "--features", store, "--out", tmp_path / "sw", "--projection-dim", 0, "--tasks", 3,
              "--gammas", "0.1,1,10", "--order-seeds", "0,1,2")
    line = " ".join(out.split()).split("refined search")[1].split("gammas in")[0]
    per = [_by_hand(_matrix(store, o["tasks"], _ridge_pred)) for o in
           json.loads((tmp_path / "sw" / "sweep.json").read_text())["orders"]]
    mean_last = f"{100 * np.mean([p['A_last'] for p in per]):.2f}"
    shown = re.findall(r"\((\d+\.\d\d)\)", line)
    assert shown, line
    assert "order" in line or all(v == mean_last for v in shown), (line, mean_last)
