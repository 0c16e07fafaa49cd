"""Benchmark `learn --order-seeds` (5 class orders from one pass) against 5 separate `learn --order-seed` runs.

Measured side by side in one run on the synthetic store (default 50,000 x 768 float32 train rows, 10,000
test rows, 100 classes, 10 tasks, D = 1000, gamma 1): wall time and peak RSS of each `foal-pipe` subprocess,
medians of --repeats; the per-class statistics' size; and that each order's accuracy matrix equals its
separate run's.

Usage: python benchmarks/orders_bench.py [--rows 50000] [--repeats 3] [--threads 2] [--json out.json]
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

from _runner import blas_env, run_cli
from synthetic import N_CLASSES, make_store

D, TASKS, SEEDS = 1000, 10, (0, 1, 2, 3, 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads of every subprocess")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("results") / "orders_bench.json")
    a = parser.parse_args()
    env = blas_env(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_store(tmp / "s.zarr", a.rows, a.rows // 5)
        common = ["--features", str(store), "--tasks", str(TASKS), "--projection-dim", str(D), "--gamma", "1",
                  "--backend", "numpy"]
        many, one, separate = [], [], []
        for r in range(a.repeats):  # interleaved, so load changes hit both alike
            many.append(run_cli(["learn", *common, "--out", str(tmp / "many"), "--order-seeds",
                                 ",".join(map(str, SEEDS))], env))
            runs = [run_cli(["learn", *common, "--out", str(tmp / f"one-{s}"), "--order-seed", str(s)], env)
                    for s in SEEDS]
            one += runs
            separate.append((sum(r.seconds for r in runs), max(r.peak_rss_mib for r in runs)))
            print(f"repeat {r}: 5 orders one pass {many[-1].seconds:.2f} s, 5 separate {separate[-1][0]:.2f} s", flush=True)
        metrics = json.loads((tmp / "many" / "metrics.json").read_text())
        worst = 0.0
        for entry in metrics["orders"]:
            ref = json.loads((tmp / f"one-{entry['order_seed']}" / "metrics.json").read_text())["accuracy_matrix"]
            worst = max(worst, max(abs(x - y) for r1, r2 in zip(entry["accuracy_matrix"], ref) for x, y in zip(r1, r2)))
        timings = json.loads((tmp / "many" / "timings.json").read_text())
    med = lambda xs: statistics.median(xs)  # noqa: E731
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or platform.machine(),
        "nproc": os.cpu_count(), "threads": a.threads, "rows": a.rows, "classes": N_CLASSES, "D": D, "tasks": TASKS,
        "orders": len(SEEDS), "repeats": a.repeats,
        "one_pass_s": [round(r.seconds, 2) for r in many], "one_run_s": [round(r.seconds, 2) for r in one],
        "separate_s": [round(t, 2) for t, _ in separate],
        "median_one_pass_s": round(med([r.seconds for r in many]), 2),
        "median_one_run_s": round(med([r.seconds for r in one]), 2),
        "median_separate_s": round(med([t for t, _ in separate]), 2),
        "ratio_one_pass_to_one_run": round(med([r.seconds for r in many]) / med([r.seconds for r in one]), 2),
        "ratio_separate_to_one_pass": round(med([t for t, _ in separate]) / med([r.seconds for r in many]), 2),
        "peak_rss_one_pass_mib": round(med([r.peak_rss_mib for r in many])),
        "peak_rss_one_run_mib": round(med([r.peak_rss_mib for r in one])),
        "class_statistics_mib": round(N_CLASSES * (D * D + D) * 8 / 2**20),
        "max_abs_accuracy_difference": worst, "one_pass_timings_last": timings,
        "A_avg_mean_std": [metrics["mean"]["A_avg"], metrics["std"]["A_avg"]],
    }
    print(json.dumps(result, indent=1))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
