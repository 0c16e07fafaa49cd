"""Where the time of `learn` and `sweep` goes, step by step (their timings.json), on a synthetic store.

Steps: read (decoding train chunks, once per task), project (the expansion), gram (adding each block's
H^T H and H^T Y), solve (a Cholesky solve per boundary, or an eigendecomposition serving every gamma), loo
(the leave-one-out pass), test (the test pass for every boundary and gamma), write.

Usage: python benchmarks/learn_profile.py [--rows 50000] [--test-rows 10000] [--dim 1000] [--activation sigmoid]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from synthetic import make_store

from foal_pipe.protocol.commands import run_learn, run_sweep
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--activation", default="sigmoid")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(Path(tmp) / "profile.zarr", args.rows, args.test_rows)
        model = ModelConfig(projection_dim=args.dim, activation=args.activation)
        common = (StreamConfig(), model, EvaluationConfig(), ExecutionConfig(backend="numpy"))
        runs = {
            "learn --gamma 1": lambda out: run_learn(store, out, *common, log=print),
            "learn --gamma auto": lambda out: run_learn(store, out, StreamConfig(), ModelConfig(
                projection_dim=args.dim, activation=args.activation, gamma="auto"), *common[2:], log=print),
            "sweep --no-loo": lambda out: run_sweep(store, out, SweepConfig(loo=False), *common, log=print),
            "sweep": lambda out: run_sweep(store, out, SweepConfig(), *common, log=print),
        }
        for i, (name, fn) in enumerate(runs.items()):
            timings = fn(Path(tmp) / f"out{i}").timings
            steps = "  ".join(f"{k} {v:.2f}" for k, v in timings.items() if k != "total")
            print(f"{name:<20} {timings['total']:7.2f} s   {steps}", flush=True)


if __name__ == "__main__":
    main()
