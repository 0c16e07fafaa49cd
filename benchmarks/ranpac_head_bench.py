"""RanPAC's head beside foal-pipe's `learn --gamma auto`, on one store, one BLAS thread, interleaved (issue 31: "D =
5000 ... in less CPU than RanPAC's 160.6 s (run its head beside yours if you can; its code is public)").

RanPAC's head as its published code runs it (RanPAC.py, ``replace_fc`` and ``optimise_ridge_parameter``), in torch
float32 on the CPU: per task, ``H = relu(X W_rand)`` with ``W_rand ~ N(0, 1)``, ``Q += H^T Y``, ``G += H^T H``; the
ridge is chosen on *that task's* rows by an 80:20 hold-out (the first 80% fit, the rest scored by MSE) over
``10^-8 .. 10^8`` with one ``torch.linalg.solve`` each, then ``W = solve(G + ridge I, Q)``; after each task the test
rows of the classes seen are scored (argmax over the seen classes). The stream is foal-pipe's (the same tasks, the
same row order); the features are the store's. Both run in subprocesses with one thread (``_runner.blas_env(1)``
and ``torch.set_num_threads(1)``); CPU seconds are each child's user + system time.

Usage: python benchmarks/ranpac_head_bench.py --store /tmp/fm.zarr [--dim 5000] [--tasks 5] [--repeats 1]
           [--ours "--gamma auto --loo-sample 1024"] [--json benchmarks/results/ranpac_head_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _runner import blas_env, finish, header, run_cli


def ranpac(store: str, dim: int, tasks: int, seed: int) -> dict:
    """RanPAC's head over the store's stream, in this process: A_last and the per-task ridges."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import zarr

    from foal_pipe.protocol.stream import build_stream

    torch.set_num_threads(1)
    group = zarr.open_group(store, mode="r")
    Xtr, ytr = np.asarray(group["train/features"][:]), np.asarray(group["train/labels"][:])
    Xte, yte = np.asarray(group["test/features"][:]), np.asarray(group["test/labels"][:])
    n_classes = int(max(ytr.max(), yte.max())) + 1
    stream = build_stream(ytr, n_classes, tasks, 10, seed)
    torch.manual_seed(seed)
    W_rand = torch.randn(Xtr.shape[1], dim)
    G, Q = torch.zeros(dim, dim), torch.zeros(dim, n_classes)
    position = {c: i for i, c in enumerate(c for task in stream.tasks for c in task)}  # output units in stream order
    ridges, accuracies, seen = [], [], []
    for task, rows in zip(stream.tasks, stream.rows):
        seen += task
        H = F.relu(torch.from_numpy(Xtr[rows]).float() @ W_rand)
        Y = F.one_hot(torch.tensor([position[int(c)] for c in ytr[rows]]), n_classes).float()
        Q += H.T @ Y
        G += H.T @ H
        grid = 10.0 ** np.arange(-8, 9)
        fit = int(H.shape[0] * 0.8)
        Q_val, G_val = H[:fit].T @ Y[:fit], H[:fit].T @ H[:fit]
        losses = [F.mse_loss(H[fit:] @ torch.linalg.solve(G_val + r * torch.eye(dim), Q_val), Y[fit:]).item()
                  for r in grid]
        ridge = float(grid[int(np.argmin(losses))])
        W = torch.linalg.solve(G + ridge * torch.eye(dim), Q)[:, : len(seen)]
        test = np.flatnonzero(np.isin(yte, seen))
        scores = F.relu(torch.from_numpy(Xte[test]).float() @ W_rand) @ W
        predicted = np.asarray(seen)[[int(i) for i in scores.argmax(dim=1)]]
        ridges.append(ridge)
        accuracies.append(float(np.mean(predicted == yte[test])))
    return {"A_last": accuracies[-1], "ridges": ridges, "accuracy_after_each_task": accuracies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--dim", type=int, default=5000)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ours", default="--gamma auto", help="foal-pipe learn's options beside the stream's")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(ranpac(args.store, args.dim, args.tasks, args.seed)))
        return
    env = blas_env(1)
    results = header(bench="ranpac_head", store=args.store, dim=args.dim, tasks=args.tasks, threads=1, ours=args.ours)
    runs: dict[str, list[dict]] = {"ranpac": [], "ours": []}
    ours = ["learn", "--features", args.store, "--tasks", str(args.tasks), "--projection-dim", str(args.dim),
            "--activation", "relu", "--projection-init", "normal", "--backend", "numpy", *shlex.split(args.ours)]
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for _ in range(args.repeats):
            start = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run([sys.executable, __file__, "--child", "--store", args.store, "--dim", str(args.dim),
                                   "--tasks", str(args.tasks), "--seed", str(args.seed)], env=env, check=True,
                                  capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            runs["ranpac"].append({"wall_s": round(time.perf_counter() - start, 2), "cpu_s": round(cpu, 2),
                                   **json.loads(done.stdout.strip().splitlines()[-1])})
            print(f"RanPAC's head  wall {runs['ranpac'][-1]['wall_s']:7.1f} s  cpu {cpu:7.1f} s  A_last "
                  f"{100 * runs['ranpac'][-1]['A_last']:.2f}", flush=True)
            out = Path(tmp) / "ours"
            run = run_cli([*ours, "--out", str(out)], env)
            metrics = json.loads((out / "metrics.json").read_text())
            runs["ours"].append({"wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2),
                                 "A_last": metrics["A_last"], "gammas_selected": metrics.get("gammas_selected"),
                                 "timings": json.loads((out / "timings.json").read_text())})
            print(f"foal-pipe      wall {run.seconds:7.1f} s  cpu {run.cpu_seconds:7.1f} s  A_last "
                  f"{100 * metrics['A_last']:.2f}", flush=True)
    results["runs"] = runs
    results["medians"] = {name: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "A_last")}
                          for name, rs in runs.items()}
    results["cpu_ratio_ours_to_ranpac"] = results["medians"]["ours"]["cpu_s"] / results["medians"]["ranpac"]["cpu_s"]
    results["load"] = os.getloadavg()
    finish(results, args.json)


if __name__ == "__main__":
    main()
