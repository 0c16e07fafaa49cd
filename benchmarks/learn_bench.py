"""Benchmark `foal-pipe learn` / `sweep` against a plain NumPy implementation of the paper's equations.

Measured side by side in one run on a synthetic store (default 50,000 x 768 float32, 100 classes,
10 tasks, D = 1000, batch 10):

* `foal-pipe learn` (subprocess: wall time incl. start-up, peak RSS), median of --repeats;
* the baseline: the paper's per-batch Woodbury step in float64 NumPy, as written (W preallocated for
  all classes, K = (I + X R X^T)^-1, R <- R - R X^T K X R, W <- W + R X^T (Y - X W)), evaluated after
  every task like learn;
* `foal-pipe sweep --no-loo` over 13 gammas (subprocess), median of --repeats (selection_bench.py measures
  the leave-one-out sweep and `learn --gamma auto`);
* exactness: learn's W against the closed-form ridge solution over every training row;
* peak RSS of `learn` on a --big-rows store (default 500,000 rows) to show memory does not grow with N.

Usage: python benchmarks/learn_bench.py [--rows 50000] [--big-rows 500000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from _runner import run_cli
from synthetic import DIM, N_CLASSES, make_store

D, TASKS, BATCH = 1000, 10, 10
GAMMAS = "1e-4,1e-3,1e-2,1e-1,0.3,1,3,10,30,100,300,1000,1e4"


def baseline(store: Path, seed: int = 0) -> tuple[float, list[list[float]]]:
    """The paper's equations in plain float64 NumPy, one Woodbury step per batch of 10."""
    start = time.perf_counter()
    group = zarr.open_group(str(store), mode="r")
    Xtr, ytr = np.asarray(group["train/features"][:]), np.asarray(group["train/labels"][:])
    Xte, yte = np.asarray(group["test/features"][:]), np.asarray(group["test/labels"][:])
    rng = np.random.default_rng(seed)
    order = rng.permutation(N_CLASSES)
    tasks = [order[t * 10 : (t + 1) * 10] for t in range(TASKS)]
    P = np.random.default_rng(seed).uniform(-1 / np.sqrt(DIM), 1 / np.sqrt(DIM), size=(DIM, D))
    R, W = np.eye(D), np.zeros((D, N_CLASSES))
    acc = []
    for t, task in enumerate(tasks):
        idx = np.flatnonzero(np.isin(ytr, task))
        rng.shuffle(idx)
        for b in range(0, idx.size, BATCH):
            rows = idx[b : b + BATCH]
            X = 1 / (1 + np.exp(-(Xtr[rows].astype(np.float64) @ P)))
            Y = np.eye(N_CLASSES)[ytr[rows]]
            K = np.linalg.inv(np.eye(X.shape[0]) + X @ R @ X.T)
            R = R - R @ X.T @ K @ X @ R
            W = W + R @ X.T @ (Y - X @ W)
        row = []
        for j in range(t + 1):
            sel = np.isin(yte, tasks[j])
            scores = (1 / (1 + np.exp(-(Xte[sel].astype(np.float64) @ P)))) @ W
            row.append(float(np.mean(np.argmax(scores, axis=1) == yte[sel])))
        acc.append(row)
    return time.perf_counter() - start, acc


def closed_form_error(store: Path, run: Path) -> float:
    """max |W_learn - W_ridge| / max |W_ridge| over every training row the stream saw."""
    from safetensors.numpy import load_file

    model = load_file(str(run / "model.safetensors"))
    metrics = json.loads((run / "metrics.json").read_text())
    group = zarr.open_group(str(store), mode="r")
    y = np.asarray(group["train/labels"][:])
    seen = np.flatnonzero(np.isin(y, [c for t in metrics["tasks"] for c in t]))
    G, Q = np.zeros((D, D)), np.zeros((D, model["classes"].size))
    for lo in range(0, seen.size, 8192):
        rows = seen[lo : lo + 8192]
        X = np.asarray(group["train/features"].get_orthogonal_selection((rows, slice(None)))).astype(np.float64)
        H = 1 / (1 + np.exp(-(X @ model["projection"])))
        G += H.T @ H
        Q += H.T @ (y[rows][:, None] == model["classes"][None, :])
    W = np.linalg.solve(G + metrics["gamma"] * np.eye(D), Q)
    return float(np.abs(model["W"] - W).max() / np.abs(W).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--big-rows", type=int, default=500_000, help="0 skips the memory run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_store(tmp / "bench.zarr", args.rows, args.test_rows)
        common = ["--features", str(store), "--tasks", str(TASKS), "--batch-size", str(BATCH),
                  "--projection-dim", str(D), "--seed", "0", "--backend", "numpy"]
        learn = [run_cli(["learn", *common, "--out", str(tmp / "run")]) for _ in range(args.repeats)]
        sweep = [run_cli(["sweep", *common, "--out", str(tmp / "sweep"), "--gammas", GAMMAS, "--no-loo"])
                 for _ in range(args.repeats)]
        rls = run_cli(["learn", *common, "--out", str(tmp / "run-rls"), "--engine", "rls"])
        f32 = run_cli(["learn", *common, "--out", str(tmp / "run-f32"), "--dtype", "float32"])
        base_s, base_acc = baseline(store)
        ours = json.loads((tmp / "run" / "metrics.json").read_text())
        t_learn = statistics.median(r.seconds for r in learn)
        t_sweep = statistics.median(r.seconds for r in sweep)
        results.update(
            rows=args.rows, learn_s=t_learn, learn_rss_mib=max(r.peak_rss_mib for r in learn),
            learn_all_s=[r.seconds for r in learn],
            sweep_s=t_sweep, sweep_all_s=[r.seconds for r in sweep], sweep_over_learn=t_sweep / t_learn,
            rls_engine_s=rls.seconds, float32_s=f32.seconds, baseline_s=base_s, speedup=base_s / t_learn,
            closed_form_rel_err=closed_form_error(store, tmp / "run"),
            closed_form_rel_err_rls=closed_form_error(store, tmp / "run-rls"),
            closed_form_rel_err_float32=closed_form_error(store, tmp / "run-f32"),
            A_last_learn=ours["A_last"], A_last_baseline=float(np.mean(base_acc[-1])),
        )
        (tmp / "bench.zarr").rename(tmp / "done.zarr")
        if args.big_rows:
            big = make_store(tmp / "big.zarr", args.big_rows, 1000)
            big_run = run_cli(["learn", "--features", str(big), "--out", str(tmp / "big-run"), "--tasks", str(TASKS),
                               "--projection-dim", str(D), "--backend", "numpy"])
            results.update(big_rows=args.big_rows, big_learn_s=big_run.seconds, big_learn_rss_mib=big_run.peak_rss_mib)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
