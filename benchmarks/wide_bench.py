"""Wide expansions in bounded memory: `learn` at large D (ReLU) on the synthetic store, peak RSS and exactness.

For each dtype, one `foal-pipe learn --projection-dim D --activation relu` subprocess (wall and CPU time,
peak RSS from wait4, the step timings of timings.json); then, in this process, the closed-form ridge solution over
every training row, computed independently (float64 Gram matrix in blocks, `numpy.linalg.solve`), against
the saved W (max abs difference / max abs W).

Usage: python benchmarks/wide_bench.py [--dim 10000] [--rows 50000] [--dtypes float64,float32] [--gamma 50] [--json out.json]

Both dtypes run at ``--gamma`` (default 50): float32 sums refuse a gamma at which their rounding would move the
weights by more than 1%, and at D = 10,000 on this store gamma 1 moves them 7.8% at the first task boundary (fewer
rows than D); the memory does not depend on gamma.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import zarr
from _runner import finish, header, run_cli
from synthetic import make_store


def closed_form_error(store: Path, run: Path, block: int = 2048) -> float:
    """max |W_learn - W_ridge| / max |W_ridge|, the ridge solution written out in float64 NumPy."""
    from safetensors.numpy import load_file

    model = load_file(str(run / "model.safetensors"))
    metrics = json.loads((run / "metrics.json").read_text())
    group = zarr.open_group(str(store), mode="r")
    y = np.asarray(group["train/labels"][:])
    seen = np.flatnonzero(np.isin(y, [c for t in metrics["tasks"] for c in t]))
    P = model["projection"].astype(np.float64)
    D = P.shape[1]
    G, Q = np.zeros((D, D)), np.zeros((D, model["classes"].size))
    for lo in range(0, seen.size, block):
        rows = seen[lo : lo + block]
        X = np.asarray(group["train/features"].get_orthogonal_selection((rows, slice(None)))).astype(np.float64)
        H = np.maximum(X @ P, 0.0)
        G += H.T @ H
        Q += H.T @ (y[rows][:, None] == model["classes"][None, :])
    G[np.diag_indices(D)] += metrics["gamma"]
    W = np.linalg.solve(G, Q)
    return float(np.abs(model["W"] - W).max() / np.abs(W).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--gamma", type=float, default=50.0, help="ridge's gamma for every dtype (see the docstring)")
    parser.add_argument("--no-check", action="store_true", help="skip the independent closed-form solution (float64)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header(dim=args.dim, rows=args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_store(tmp / "wide.zarr", args.rows, args.test_rows)
        runs = {}
        for dtype in args.dtypes.split(","):  # every learn first: a child's peak RSS includes this process's at fork
            out = runs[dtype] = tmp / dtype
            run = run_cli(["learn", "--features", str(store), "--out", str(out), "--tasks", "10",
                           "--projection-dim", str(args.dim), "--activation", "relu", "--dtype", dtype,
                           "--gamma", str(args.gamma), "--backend", "numpy"])
            results[dtype] = {"seconds": run.seconds, "cpu_seconds": run.cpu_seconds, "peak_rss_mib": run.peak_rss_mib,
                              "timings": json.loads((out / "timings.json").read_text()),
                              "A_last": json.loads((out / "metrics.json").read_text())["A_last"]}
            print(dtype, json.dumps(results[dtype]), flush=True)
        if not args.no_check and "float64" in runs:  # float32's drift is in RESULTS from learn_bench
            results["float64"]["closed_form_rel_err"] = closed_form_error(store, runs["float64"])
            print("float64 closed-form error", results["float64"]["closed_form_rel_err"], flush=True)
    finish(results, args.json)


if __name__ == "__main__":
    main()
