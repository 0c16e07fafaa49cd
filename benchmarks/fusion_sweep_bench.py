"""Benchmark `sweep --fusions` (issue 13, requirement 5): a 3-fusion x 13-gamma sweep against one `learn`.

One blocks store (the shape of ViT-S/16's: d 384, 12 blocks, float16 blocks; synthetic class clusters in every
block, so accuracies mean something), and whole `foal-pipe` subprocesses run round-robin (so load from other
processes hits every command alike), each `--repeats` times; medians, and ratios to `learn --fusion mean-cls`
of the same run. BLAS and OpenMP run on one thread in every subprocess (the machine is shared; see
selection_bench.py). The commands:

* `learn --fusion mean-cls` (gamma 1): the baseline, one fusion, one gamma;
* `sweep --fusion mean-cls` (13 gammas, LOO): one fusion's sweep, what the per-fusion loop ran three times;
* `sweep --fusions mean-cls,last,mean:7-12` (13 gammas, LOO at every boundary, and with `--no-loo`).

Usage: python benchmarks/fusion_sweep_bench.py [--rows 12000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # inherited by every foal-pipe subprocess

from _runner import finish, header, medians, round_robin  # noqa: E402

from foal_pipe.store import write_store  # noqa: E402
from foal_pipe.store.blockfusion import FinalNorm, fuse  # noqa: E402

DIM, BLOCKS, CLASSES, TASKS, D, CHUNK = 384, 12, 50, 10, 500, 1024
GRID = "1e-4,1e-3,1e-2,1e-1,0.3,1,3,10,30,100,300,1000,1e4"  # 13 gammas (sweep's default before the one grid)
FUSIONS = "mean-cls,last,mean:7-12"
BASE = "learn --fusion mean-cls"
COMMANDS = {
    BASE: ["learn", "--fusion", "mean-cls", "--gamma", "1"],
    "sweep --fusion mean-cls (13 gammas, LOO)": ["sweep", "--fusion", "mean-cls", "--gammas", GRID],
    "sweep --fusions (3 x 13, LOO)": ["sweep", "--fusions", FUSIONS, "--gammas", GRID],
    "sweep --fusions --no-loo (3 x 13, GCV)": ["sweep", "--fusions", FUSIONS, "--gammas", GRID, "--no-loo"],
}


def make_blocks_store(path: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """Class clusters in every block (each block its own means, later blocks more separated), float16 blocks,
    a LayerNorm final norm; the features are the mean-cls fusion, as `extract --keep-blocks` would store."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, size=(CLASSES, BLOCKS, DIM)) * np.linspace(0.2, 1.0, BLOCKS)[None, :, None]
    norm = FinalNorm("layernorm", 1e-6, rng.uniform(0.5, 1.5, DIM).astype(np.float32),
                     rng.uniform(-0.5, 0.5, DIM).astype(np.float32))
    splits = []
    for n in (n_train, n_test):
        y = rng.integers(0, CLASSES, size=n)
        blocks = (means[y] + rng.normal(0, 3.0, size=(n, BLOCKS, DIM))).astype(np.float16)
        splits.append((blocks, y))
    (btr, ytr), (bte, yte) = splits
    encoder = {"name": "synthetic-vit-s", "fusion": "mean-cls", "image_size": 0, "normalize": False}
    return write_store(path, (fuse(btr, "mean-cls", norm), ytr), (fuse(bte, "mean-cls", norm), yte),
                       [f"class{i}" for i in range(CLASSES)], dataset="synthetic", encoder=encoder, chunk_rows=CHUNK,
                       blocks=(btr, bte), norm=norm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--test-rows", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header(store={"train_rows": args.rows, "test_rows": args.test_rows, "dim": DIM, "blocks": BLOCKS,
                            "blocks_dtype": "float16", "classes": CLASSES, "tasks": TASKS, "D": D, "chunk_rows": CHUNK})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_blocks_store(tmp / "blocks.zarr", args.rows, args.test_rows)
        common = ["--features", str(store), "--tasks", str(TASKS), "--projection-dim", str(D), "--backend", "numpy"]
        runs = round_robin(COMMANDS, common, tmp, args.repeats)
        outcomes = {}
        for i, name in enumerate(COMMANDS):
            out = tmp / f"out{i}"
            if (out / "sweep.json").exists():
                report = json.loads((out / "sweep.json").read_text())
                outcomes[name] = {"best": report.get("best"), "best_test": report.get("best_test"),
                                  "best_gamma": report["best_gamma"],
                                  "per_fusion": {e["fusion"]: {"best_gamma": e["best_gamma"], "A_avg": next(
                                      r["A_avg"] for r in e["results"] if r["gamma"] == e["best_gamma"])}
                                      for e in report.get("fusions", [])}}
            else:
                outcomes[name] = {"A_avg": json.loads((out / "metrics.json").read_text())["A_avg"]}
    for name, summary in medians(runs, BASE).items():
        results[name] = {**summary, **outcomes[name]}
    finish(results, args.json)


if __name__ == "__main__":
    main()
