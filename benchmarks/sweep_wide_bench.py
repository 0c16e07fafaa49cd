"""Issue 31's bars on the narrow store (20,000 x 256, 100 classes, 10 tasks), at the machine's default BLAS threads:
`sweep` (13 gammas, leave-one-out on the default sample) and `learn --order-seeds 0,1,2` against one `learn
--gamma 1` at D = 600, then `learn --gamma auto` against `--gamma 1` with a ReLU expansion to D = 3000.

Each group runs round-robin (``--repeats`` rounds for D = 600, ``--wide-repeats`` for D = 3000); medians of wall
time, the ratio to the group's `learn`, the median run's ``timings.json`` and the load average before and after.

Usage: python benchmarks/sweep_wide_bench.py [--repeats 3] [--wide-repeats 1] [--json benchmarks/results/sweep_wide_rest.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _runner import finish, header, medians, round_robin
from synthetic import make_store

NARROW = {
    "learn": ["learn", "--gamma", "1", "--projection-dim", "600"],
    "sweep": ["sweep", "--projection-dim", "600"],
    "orders": ["learn", "--gamma", "1", "--projection-dim", "600", "--order-seeds", "0,1,2"],
}
WIDE = {
    "learn": ["learn", "--gamma", "1", "--projection-dim", "3000", "--activation", "relu"],
    "auto": ["learn", "--gamma", "auto", "--projection-dim", "3000", "--activation", "relu"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wide-repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header(bench="sweep_wide", rows=20_000, test_rows=4_000, features=256, classes=100, tasks=10,
                     threads="default")
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store = make_store(Path(tmp) / "store.zarr", 20_000, 4_000, n_classes=100, dim=256)
        common = ["--features", str(store), "--tasks", "10", "--backend", "numpy"]
        results["d600"] = medians(round_robin(NARROW, common, Path(tmp), args.repeats), "learn")
        results["relu3000"] = medians(round_robin(WIDE, common, Path(tmp), args.wide_repeats), "learn")
    finish(results, args.json)


if __name__ == "__main__":
    main()
