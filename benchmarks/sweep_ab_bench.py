"""Before and after, side by side: `learn --gamma 1`, `learn --gamma auto`, `sweep`, `sweep --no-loo` and `learn
--dtype float32` (``learn32``) with two source trees (``--baseline`` against this checkout, each through
``PYTHONPATH``), interleaved in one run.

Each round runs every command with the baseline tree, then with this one, for each ``--threads`` setting (``default``:
the machine's BLAS threads, nothing pinned; a number: every BLAS/OpenMP pool set to it); medians over ``--repeats``
rounds, each median's ratio to the same tree's `learn --gamma 1`, after/before per command, the child's CPU seconds,
each step's median (``timings.json``) and the load average before and after. Stores as ``benchmarks/synthetic.py``
makes them: ``narrow`` (20,000 x 256, 4,000 test rows, D = 600) or ``wide`` (50,000 x 768, 10,000 test rows,
D = 1000); 100 classes, 10 tasks, sigmoid.

Usage: python benchmarks/sweep_ab_bench.py --baseline /work/main [--store narrow] [--only learn,sweep]
           [--threads default,1] [--repeats 3] [--store-dir DIR] [--json benchmarks/results/sweep_ab_narrow.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from _runner import blas_env, finish, header, run_cli
from sweep_cost_bench import COMMANDS
from synthetic import make_store

HERE = Path(__file__).resolve().parents[1]
STORES = {"narrow": (20_000, 4_000, 256, 600), "wide": (50_000, 10_000, 768, 1000)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the source tree to compare against")
    parser.add_argument("--store", choices=sorted(STORES), default="narrow")
    parser.add_argument("--only", default=",".join(COMMANDS), help="which commands, comma-separated (learn first)")
    parser.add_argument("--threads", default="default,1", help="BLAS thread settings, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store-dir", type=Path, default=None, help="keep (and reuse) the store here")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = args.only.split(",")
    if names[0] != "learn":
        parser.error("--only must start with learn: the ratios are to it")
    rows, test_rows, features, dim = STORES[args.store]
    trees = {"before": args.baseline.resolve(), "after": HERE}
    results = header(bench="sweep_ab", store=args.store, rows=rows, test_rows=test_rows, features=features,
                     projection_dim=dim, classes=100, tasks=10, repeats=args.repeats,
                     trees={k: str(v) for k, v in trees.items()})
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store = (args.store_dir or Path(tmp)) / f"{args.store}.zarr"
        if not store.exists():
            make_store(store, rows, test_rows, n_classes=100, dim=features)
        common = ["--features", str(store), "--tasks", "10", "--projection-dim", str(dim), "--backend", "numpy"]
        runs: dict[str, list[tuple[float, float, dict]]] = {}
        for _ in range(args.repeats):
            for threads in args.threads.split(","):
                base = os.environ if threads == "default" else blas_env(int(threads))
                for name in names:
                    for tree, path in trees.items():
                        env = {**base, "PYTHONPATH": str(path)}
                        out = Path(tmp) / f"out-{tree}-{name}"
                        run = run_cli([*COMMANDS[name], *common, "--out", str(out)], env)
                        steps = json.loads((out / "timings.json").read_text())
                        runs.setdefault(f"{threads}:{name}:{tree}", []).append((run.seconds, run.cpu_seconds, steps))
                        print(f"threads {threads:<8} {name:<10} {tree:<7} {run.seconds:7.2f} s "
                              f"({run.cpu_seconds:.2f} CPU s)", flush=True)
        summary: dict[str, dict] = {}
        for key, rs in runs.items():
            threads, name, tree = key.split(":")
            learn = statistics.median(r[0] for r in runs[f"{threads}:learn:{tree}"])
            median = statistics.median(r[0] for r in rs)
            steps = {step: statistics.median(r[2].get(step, 0.0) for r in rs) for step in rs[0][2]
                     if isinstance(rs[0][2][step], float)}
            summary[key] = {"median_s": median, "all_s": [r[0] for r in rs], "cpu_s": [r[1] for r in rs],
                            "ratio_to_learn": median / learn, "median_steps_s": steps}
        for key, entry in summary.items():
            if key.endswith(":after"):
                entry["after_over_before"] = entry["median_s"] / summary[key[: -len("after")] + "before"]["median_s"]
        results["runs"] = summary
    finish(results, args.json)


if __name__ == "__main__":
    main()
