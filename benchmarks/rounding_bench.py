"""How far float32 Gram sums formed by K additions move the weights, against the drift estimate before and after the
sums counted their additions (``RidgeStatistics.rounding``).

The same rows (sigmoid activations of Gaussian classes, ``--rows`` x ``--dim``) are summed in float32 in K equal
blocks (K = 1: one product, as a small store; K = 10: ``learn``'s calibration; K = 300: ImageNet's 1.28M rows in
4,096-row blocks; K = 3,000: a stream of small ``partial_fit`` batches), or the first block's rows K times
("repeated": epochs of one batch), solved in float64 at each gamma, and compared with the float64 closed form of
the same float32 rows. ``estimate``: :func:`~foal_pipe.core.linalg.probed_drift` with
the counted rounding (what the checks take now); ``calibrated``: the same with ``max|G|`` alone (before).

Usage: python benchmarks/rounding_bench.py [--rows 300000] [--dim 200] [--json benchmarks/results/rounding.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _runner import finish, header

from foal_pipe.core.drift import column_scales
from foal_pipe.core.linalg import probed_drift
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--additions", default="1,10,50,300,3000")
    parser.add_argument("--gammas", default="1e-2,1e-1,1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    classes = 10
    labels = rng.integers(0, classes, args.rows)
    X = 2.0 * rng.normal(size=(classes, 8))[labels] + rng.normal(size=(args.rows, 8))
    H = (1.0 / (1.0 + np.exp(-(X @ rng.normal(size=(8, args.dim)))))).astype(np.float32)
    gammas = [float(g) for g in args.gammas.split(",")]
    results = header(bench="rounding", rows=args.rows, dim=args.dim, classes=classes, gammas=gammas)
    results["cases"] = []
    print(f"{'rows':>9} {'K':>6} {'gamma':>7} {'moved':>10} {'estimate':>10} {'calibrated':>10} {'est/moved':>9} "
          f"{'cal/moved':>9}")
    for rows in ("distinct", "repeated"):
        for K in (int(k) for k in args.additions.split(",")):
            if rows == "repeated" and K == 1:
                continue
            # distinct: every row once, in K blocks; repeated: the first block's rows K times (epochs of one batch)
            parts = (list(zip(np.array_split(H, K), np.array_split(labels, K), strict=True)) if rows == "distinct"
                     else [(H[: args.rows // K], labels[: args.rows // K])] * K)
            s = RidgeStatistics.empty(args.dim, dtype=np.float32)
            for part_rows, part_labels in parts:
                s += RidgeStatistics.from_batch(part_rows, part_labels, np.arange(classes))
            every = np.concatenate([p for p, _ in parts]).astype(np.float64)
            exact = RidgeStatistics.from_batch(every, np.concatenate([y for _, y in parts]), np.arange(classes))
            scales = column_scales(s.G)
            for g in gammas:
                closed = exact.solve(g)
                try:
                    W = s.solve(g, drift_checked=True)  # the weights, unchecked but for a factorisation that fails
                except FoalPipeError as exc:
                    results["cases"].append({"rows": rows, "additions": K, "gamma": g, "refused": str(exc)})
                    print(f"{rows:>9} {K:>6} {g:>7g} refused: {str(exc)[:60]}")
                    continue
                moved = float(np.linalg.norm(W - closed) / np.linalg.norm(closed))
                estimate = probed_drift(s.G, g, scales, top=s.rounding_top)
                calibrated = probed_drift(s.G, g, scales)
                reach = s.rounding_top / float(np.abs(s.G).max())
                results["cases"].append({"rows": rows, "additions": K, "gamma": g, "moved": moved, "estimate": estimate,
                                         "calibrated": calibrated, "rounding_top_over_top": reach})
                print(f"{rows:>9} {K:>6} {g:>7g} {moved:>10.3e} {estimate:>10.3e} {calibrated:>10.3e} "
                      f"{estimate / moved:>9.2f} {calibrated / moved:>9.2f}")
    finish(results, args.json)


if __name__ == "__main__":
    main()
