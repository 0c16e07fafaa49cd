"""Time the steps of `learn` and `sweep` in one process (where the time goes), on a synthetic store.

Usage: python benchmarks/learn_profile.py [--rows 50000] [--test-rows 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from synthetic import make_store

from foal_pipe.learn import (
    LearnConfig, accuracy_matrices, gram_boundaries, prepare, sweep_boundaries, task_statistics,
)

GAMMAS = [1e-4, 1e-3, 1e-2, 1e-1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 1e4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(Path(tmp) / "profile.zarr", args.rows, args.test_rows)
        p = prepare(store, LearnConfig(projection_dim=1000, backend="numpy"))

        def step(name, fn):
            start = time.perf_counter()
            out = fn()
            print(f"{name:<32} {time.perf_counter() - start:7.2f} s", flush=True)
            return out

        per_task = step("train pass (Gram statistics)", lambda: task_statistics(p))
        boundaries, _ = step("learn: solves at task ends", lambda: gram_boundaries(per_task))
        step("learn: test pass", lambda: accuracy_matrices(p, boundaries))
        swept = step(f"sweep: eigh + W for {len(GAMMAS)} gammas", lambda: sweep_boundaries(per_task, GAMMAS))
        step("sweep: test pass", lambda: accuracy_matrices(p, swept))


if __name__ == "__main__":
    main()
