"""One boundary's sampled leave-one-out by each route (issue 31): ``G``'s eigenvectors (``eigh``, then ``H V``) against
the tridiagonal form (``dsytrd``, the reflectors, a recurrence per gamma for the leverages), on one BLAS thread,
for the widths and sample sizes where :func:`foal_pipe.core.leaveoneout.sample_needs_vectors` chooses between them.

Each case sums the Gram matrix of ``--rows`` ReLU-expanded rows (``relu(X R)``, Gaussian ``X`` of 256 features), then
times, per route and ``--repeats`` times, interleaved: the factorisation (:meth:`RidgeStatistics.factor`), the path,
the sample's coordinates and the zoom of `learn --gamma auto` (LOO accuracy, ties by LOO MSE) or of `sweep` (both
curves) over the default grid. The routes' choices must agree (they are the same numbers up to float64 rounding).

Usage: python benchmarks/loo_route_bench.py [--cases 3000:4096,5000:1024,5000:4096] [--classes 100] [--repeats 3]
           [--rows 12000] [--json benchmarks/results/loo_route_bench.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from _runner import finish, header
from threadpoolctl import threadpool_limits

from foal_pipe.core.gammasearch import PER_DECADE, best_point, search_grid, zoom
from foal_pipe.core.leaveoneout import SampledLeaveOneOut, sample_needs_vectors
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID, RidgeStatistics
from foal_pipe.protocol.solvers import LOO_RULES


def boundary(stats: RidgeStatistics, H: np.ndarray, labels: np.ndarray, vectors: bool, names: tuple[str, ...]) -> dict:
    """One boundary by one route: seconds per step and each criterion's chosen gamma."""
    fine = search_grid(DEFAULT_GAMMA_GRID, PER_DECADE)
    steps: dict[str, float] = {}
    start = time.perf_counter()
    factored = stats.factor(vectors)
    steps["factor"] = time.perf_counter() - start
    start = time.perf_counter()
    path = stats.gamma_path(vectors, factored)
    loo = SampledLeaveOneOut(path, fine, H.shape[0])
    loo.add(H, labels)
    steps["coordinates"] = time.perf_counter() - start
    start = time.perf_counter()
    rules = {name: LOO_RULES[name] for name in names}
    points, curves = zoom(fine.size, np.searchsorted(fine, np.asarray(DEFAULT_GAMMA_GRID)), loo.evaluate, rules)
    steps["zoom"] = time.perf_counter() - start
    steps["total"] = sum(steps.values())
    chosen = {}
    for name, (larger, tie) in rules.items():
        at = points[name]
        chosen[name] = float(fine[at][best_point(curves[name][at], larger, None if tie is None else curves[tie][at])])
    return {"steps": steps, "chosen": chosen, "evaluated": int(np.isfinite(curves[names[0]]).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="3000:4096,5000:1024,5000:4096", help="D:sample pairs, comma-separated")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--rows", type=int, default=12_000, help="rows summed into the Gram matrix")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header(bench="loo_route", rows=args.rows, classes=args.classes, repeats=args.repeats, threads=1)
    rng = np.random.default_rng(0)
    cases = []
    for case in args.cases.split(","):
        D, m = map(int, case.split(":"))
        X = rng.standard_normal((args.rows, 256)).astype(np.float32)
        labels = rng.integers(0, args.classes, args.rows)
        X += 0.15 * rng.standard_normal((args.classes, 256)).astype(np.float32)[labels]
        H = np.maximum(X @ rng.standard_normal((256, D)).astype(np.float32) / 16, 0).astype(np.float64)
        stats = RidgeStatistics.from_batch(H, labels)
        sample = rng.choice(args.rows, m, replace=False)
        runs: dict[str, list[dict]] = {}
        with threadpool_limits(1):
            for _ in range(args.repeats):
                for command, names in (("auto", ("loo_accuracy",)), ("sweep", ("loo", "loo_accuracy"))):
                    for route, vectors in (("eigenvectors", True), ("tridiagonal", False)):
                        got = boundary(stats, H[sample], labels[sample], vectors, names)
                        runs.setdefault(f"{command}:{route}", []).append(got)
                        print(f"D {D} m {m} {command:<5} {route:<12} " + " ".join(
                            f"{k} {v:.2f}" for k, v in got["steps"].items()) + f"  chosen {got['chosen']}", flush=True)
        summary = {key: {"median_s": {step: statistics.median(r["steps"][step] for r in rs) for step in rs[0]["steps"]},
                         "chosen": rs[0]["chosen"], "evaluated": rs[0]["evaluated"]} for key, rs in runs.items()}
        cases.append({"dim": D, "sample": m, "policy_uses_vectors": sample_needs_vectors(m, D, 1), "runs": summary})
    results["cases"] = cases
    finish(results, args.json)


if __name__ == "__main__":
    main()
