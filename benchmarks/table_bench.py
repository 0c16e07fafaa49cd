"""Benchmark `foal-pipe table` (2 stores x 3 heads x 2 task counts x 2 class orders = 24 runs, each store read
once) against the 24 separate `learn --head H --order-seed S --tasks T` it replaces.

Both sides are `foal-pipe` subprocesses on the same synthetic stores with the table's defaults (ridge's gamma
`auto` by leave-one-out accuracy on the training rows); wall time and CPU time (user + system, less sensitive to
other jobs' load) of every subprocess, interleaved over --repeats, medians; and that every run of the table has
the accuracy matrix of its separate run.

Usage: python benchmarks/table_bench.py [--rows 20000] [--dim 384] [--classes 20] [--gamma auto] [--select gcv] [--repeats 2]
[--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _runner import blas_env, header, run_cli
from synthetic import make_store

HEADS, SEEDS, TASKS, D = ("ridge", "ncm", "slda"), (0, 1), (5, 10), 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--gamma", default="auto", help="the table's --gamma (and ridge's separate learn's)")
    parser.add_argument("--select", default=None, help="with --gamma auto: the criterion (default: learn's)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads of every subprocess")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("results") / "table_bench.json")
    a = parser.parse_args()
    env = blas_env(a.threads)
    select = ["--select", a.select] if a.select else []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stores = [make_store(tmp / f"s{i}.zarr", a.rows, a.rows // 5, seed=i, dim=a.dim,
                             n_classes=a.classes) for i in range(2)]
        table_cmd = ["table", *(x for s in stores for x in ("--features", str(s))), "--heads", ",".join(HEADS),
                     "--order-seeds", ",".join(map(str, SEEDS)), "--tasks", ",".join(map(str, TASKS)),
                     "--projection-dim", str(D), "--gamma", a.gamma, *select, "--backend", "numpy", "--out", str(tmp / "table")]
        tables, separates = [], []
        for r in range(a.repeats):  # interleaved, so load changes hit both alike
            tables.append(run_cli(table_cmd, env))
            runs = []
            for s in stores:
                for head in HEADS:
                    extra = ["--gamma", a.gamma, *select, "--projection-dim", str(D)] if head == "ridge" else []
                    for t in TASKS:
                        for seed in SEEDS:
                            out = tmp / f"{s.stem}-{head}-{t}-{seed}"
                            runs.append(run_cli(["learn", "--features", str(s), "--head", head, "--tasks", str(t),
                                                 "--order-seed", str(seed), "--backend", "numpy", *extra,
                                                 "--out", str(out)], env))
            separates.append((sum(x.seconds for x in runs), sum(x.cpu_seconds for x in runs)))
            print(f"repeat {r}: table {tables[-1].seconds:.2f} s wall / {tables[-1].cpu_seconds:.2f} s CPU; 24 separate "
                  f"{separates[-1][0]:.2f} s wall / {separates[-1][1]:.2f} s CPU", flush=True)
        doc = json.loads((tmp / "table" / "table.json").read_text())
        equal = all(
            run["accuracy_matrix"] == json.loads((tmp / f"{Path(run['store']).stem}-{run['head']}-{run['tasks']}-"
                                                  f"{run['order_seed']}" / "metrics.json").read_text())["accuracy_matrix"]
            for run in doc["runs"])
    med = statistics.median
    result = {
        **header(gamma=a.gamma, select=a.select, classes=a.classes, threads=a.threads, rows=a.rows,
                 test_rows=a.rows // 5, dim=a.dim, D=D, heads=list(HEADS), order_seeds=list(SEEDS),
                 tasks=list(TASKS), runs=len(doc["runs"]), repeats=a.repeats),
        "table_wall_s": [t.seconds for t in tables], "table_cpu_s": [t.cpu_seconds for t in tables],
        "separate_wall_s": [s for s, _ in separates], "separate_cpu_s": [c for _, c in separates],
        "ratio_wall": med(t.seconds for t in tables) / med(s for s, _ in separates),
        "ratio_cpu": med(t.cpu_seconds for t in tables) / med(c for _, c in separates),
        "accuracy_matrices_equal": equal,
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio_wall", "ratio_cpu", "accuracy_matrices_equal")}))


if __name__ == "__main__":
    main()
