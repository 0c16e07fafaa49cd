"""Benchmark `learn --order-seeds` (5 class orders from one pass) against 5 separate `learn --order-seed` runs.

Measured side by side in one run on the synthetic store (default 50,000 x 768 float32 train rows, 10,000
test rows, 100 classes, 10 tasks, D = 1000, gamma 1): wall time and peak RSS of each `foal-pipe` subprocess,
medians of --repeats; the per-class statistics' size; and that each order's accuracy matrix equals its
separate run's.

``--baseline DIR`` runs the one-pass command and the one `learn` on that source tree too (its ``PYTHONPATH``),
interleaved, for before/after side by side; ``--no-separate`` skips the separate runs (the ratio to one `learn`
only); ``--dim``, ``--projection-dim`` and ``--seeds`` give other cases (issue 31's: 20,000 x 256, D = 600, 3 orders);
``--gamma auto`` runs every command with gamma chosen at every boundary (the default leave-one-out on a sample).

Usage: python benchmarks/orders_bench.py [--rows 50000] [--dim 768] [--projection-dim 1000] [--seeds 0,1,2,3,4]
       [--repeats 3] [--threads 2] [--gamma 1] [--baseline DIR] [--no-separate] [--json out.json]
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

TASKS = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads of every subprocess")
    parser.add_argument("--dim", type=int, default=768, help="feature width of the synthetic store")
    parser.add_argument("--projection-dim", type=int, default=1000)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="the class orders of the one-pass run")
    parser.add_argument("--gamma", default="1", help="every command's --gamma (a number, or auto)")
    parser.add_argument("--baseline", type=Path, default=None, help="a foal-pipe source tree run beside this one")
    parser.add_argument("--no-separate", action="store_true", help="skip the separate --order-seed runs")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("results") / "orders_bench.json")
    a = parser.parse_args()
    env = blas_env(a.threads)
    seeds = tuple(int(s) for s in a.seeds.split(","))
    D = a.projection_dim
    baseline = None if a.baseline is None else {**env, "PYTHONPATH": str(a.baseline)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_store(tmp / "s.zarr", a.rows, a.rows // 5, dim=a.dim)
        common = ["--features", str(store), "--tasks", str(TASKS), "--projection-dim", str(D), "--gamma", a.gamma,
                  "--backend", "numpy"]
        many, one, separate, learn = [], [], [], []
        before: dict[str, list] = {"many": [], "learn": [], "timings": []}
        loads = []
        for r in range(a.repeats):  # interleaved, so load changes hit both alike
            loads.append(os.getloadavg()[0])
            many.append(run_cli(["learn", *common, "--out", str(tmp / "many"), "--order-seeds",
                                 ",".join(map(str, seeds))], env))
            learn.append(run_cli(["learn", *common, "--out", str(tmp / "learn"), "--order-seed", str(seeds[0])], env))
            if baseline is not None:
                before["many"].append(run_cli(["learn", *common, "--out", str(tmp / "many-before"), "--order-seeds",
                                               ",".join(map(str, seeds))], baseline))
                before["timings"].append(json.loads((tmp / "many-before" / "timings.json").read_text()))
                before["learn"].append(run_cli(["learn", *common, "--out", str(tmp / "learn-before"), "--order-seed",
                                                str(seeds[0])], baseline))
            runs = [] if a.no_separate else [
                run_cli(["learn", *common, "--out", str(tmp / f"one-{s}"), "--order-seed", str(s)], env) for s in seeds]
            one += runs
            if runs:
                separate.append((sum(r.seconds for r in runs), max(r.peak_rss_mib for r in runs)))
            print(f"repeat {r}: {len(seeds)} orders one pass {many[-1].seconds:.2f} s, one learn {learn[-1].seconds:.2f} s"
                  + (f", before {before['many'][-1].seconds:.2f} s / {before['learn'][-1].seconds:.2f} s" if baseline else ""),
                  flush=True)
        metrics = json.loads((tmp / "many" / "metrics.json").read_text())
        worst = 0.0
        for entry in metrics["orders"] if one else ():
            ref = json.loads((tmp / f"one-{entry['order_seed']}" / "metrics.json").read_text())["accuracy_matrix"]
            worst = max(worst, max(abs(x - y) for r1, r2 in zip(entry["accuracy_matrix"], ref) for x, y in zip(r1, r2)))
        if baseline is not None:  # the same outputs before and after
            same = all((tmp / "many" / f).read_bytes() == (tmp / "many-before" / f).read_bytes()
                       for f in ("metrics.json", "model.safetensors"))
        timings = json.loads((tmp / "many" / "timings.json").read_text())
    med = lambda xs: statistics.median(xs)  # noqa: E731
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or platform.machine(),
        "nproc": os.cpu_count(), "threads": a.threads, "gamma": a.gamma, "rows": a.rows, "dim": a.dim,
        "classes": N_CLASSES, "D": D, "tasks": TASKS, "orders": len(seeds), "repeats": a.repeats, "load_before_each_round": loads,
        "median_learn_s": round(med([r.seconds for r in learn]), 2),
        "ratio_one_pass_to_learn": round(med([r.seconds for r in many]) / med([r.seconds for r in learn]), 2),
        **({} if baseline is None else {
            "baseline": str(a.baseline), "before_one_pass_s": [round(r.seconds, 2) for r in before["many"]],
            "before_learn_s": [round(r.seconds, 2) for r in before["learn"]],
            "before_ratio_one_pass_to_learn": round(med([r.seconds for r in before["many"]])
                                                    / med([r.seconds for r in before["learn"]]), 2),
            "before_timings_last": before["timings"][-1], "outputs_identical_to_baseline": same}),
        "one_pass_s": [round(r.seconds, 2) for r in many], "one_run_s": [round(r.seconds, 2) for r in one],
        "separate_s": [round(t, 2) for t, _ in separate],
        "median_one_pass_s": round(med([r.seconds for r in many]), 2),
        **({} if not one else {
            "median_one_run_s": round(med([r.seconds for r in one]), 2),
            "median_separate_s": round(med([t for t, _ in separate]), 2),
            "ratio_one_pass_to_one_run": round(med([r.seconds for r in many]) / med([r.seconds for r in one]), 2),
            "ratio_separate_to_one_pass": round(med([t for t, _ in separate]) / med([r.seconds for r in many]), 2),
            "peak_rss_one_run_mib": round(med([r.peak_rss_mib for r in one]))}),
        "peak_rss_one_pass_mib": round(med([r.peak_rss_mib for r in many])),
        "class_statistics_mib": round(N_CLASSES * (D * D + D) * 8 / 2**20),
        "max_abs_accuracy_difference": worst, "one_pass_timings_last": timings,
        "A_avg_mean_std": [metrics["mean"]["A_avg"], metrics["std"]["A_avg"]],
    }
    print(json.dumps(result, indent=1))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
