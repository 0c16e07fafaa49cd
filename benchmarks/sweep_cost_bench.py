"""What the honest answers cost beside one `learn` (issue 31): `learn --gamma 1`, `learn --gamma auto` (LOO
accuracy on the default 4,096-row sample), `sweep` (13 gammas, leave-one-out on the same sample), `sweep --no-loo`
(GCV only), `learn --gamma 1 --dtype float32` (``learn32``), on one synthetic store, at the machine's default BLAS
threads (nothing is pinned).

The commands run round-robin ``--repeats`` times (load from other processes hits each alike); medians of wall
time, the ratio of each to `learn --gamma 1`'s median, every run's time and the median run's ``timings.json``,
with the load average before and after. The store (``benchmarks/synthetic.py``: Gaussian class clusters in a
random row order) is written under a temporary folder and deleted afterwards.

Usage: python benchmarks/sweep_cost_bench.py [--rows 50000] [--test-rows 10000] [--features 768] [--classes 100]
           [--projection-dim 1000] [--activation sigmoid] [--tasks 10] [--repeats 3]
           [--only learn,auto,sweep,sweep_gcv,learn32] [--json benchmarks/results/sweep_cost_bench.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _runner import finish, header, medians, round_robin
from synthetic import make_store

COMMANDS = {
    "learn": ["learn", "--gamma", "1"],
    "auto": ["learn", "--gamma", "auto"],
    "sweep": ["sweep"],
    "sweep_gcv": ["sweep", "--no-loo"],
    "learn32": ["learn", "--gamma", "1", "--dtype", "float32"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--projection-dim", type=int, default=1000)
    parser.add_argument("--activation", default="sigmoid")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(COMMANDS), help="which commands, comma-separated (learn first)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = args.only.split(",")
    if names[0] != "learn":
        parser.error("--only must start with learn: the ratios are to it")
    results = header(bench="sweep_cost", rows=args.rows, test_rows=args.test_rows, features=args.features,
                     classes=args.classes, projection_dim=args.projection_dim, activation=args.activation,
                     tasks=args.tasks, repeats=args.repeats, threads="default")
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store = make_store(Path(tmp) / "store.zarr", args.rows, args.test_rows, n_classes=args.classes,
                           dim=args.features)
        common = ["--features", str(store), "--tasks", str(args.tasks), "--projection-dim", str(args.projection_dim),
                  "--activation", args.activation, "--backend", "numpy"]
        runs = round_robin({name: COMMANDS[name] for name in names}, common, Path(tmp), args.repeats)
        results["commands"] = medians(runs, "learn")
    finish(results, args.json)


if __name__ == "__main__":
    main()
