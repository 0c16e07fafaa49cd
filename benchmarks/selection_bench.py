"""Benchmark gamma selection against one `learn`: sweeps with and without leave-one-out, `learn --gamma auto`.

The leave-one-out commands run twice: with the rows' activations kept in memory (the default within
``--max-memory``) and with them projected again at every boundary (``--max-memory 1MiB``, the earlier code path).
Measured side by side in one run, interleaved (round-robin, so load from other processes hits every command
alike), on the synthetic store (default 50,000 x 768 float32, 100 classes, 10 tasks, D = 1000, batch 10,
`--backend numpy`); each figure is the median wall time of whole `foal-pipe` subprocesses, and the ratio is
to `learn --gamma 1`. The step timings (timings.json) of the median run are recorded too.

Usage: python benchmarks/selection_bench.py [--rows 50000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _runner import finish, header, medians, round_robin
from synthetic import make_store

D, TASKS = 1000, 10
GRID = "1e-4,1e-3,1e-2,1e-1,1,10,100,1e3,1e4,1e5,1e6,1e7,1e8"  # 13 gammas: the default grid (sweep, --gamma auto)
COMMANDS = {
    "learn --gamma 1": ["learn", "--gamma", "1"],
    "sweep --no-loo (13 gammas)": ["sweep", "--gammas", GRID, "--no-loo"],
    "sweep (13 gammas, LOO at every boundary)": ["sweep", "--gammas", GRID],
    "learn --gamma auto --select gcv": ["learn", "--gamma", "auto", "--select", "gcv"],
    "learn --gamma auto (LOO)": ["learn", "--gamma", "auto"],
    # the same two with the activations not kept (--max-memory below their 381 MiB): each boundary reads and
    # projects the rows seen so far again, as before the activations were kept; the same results
    "sweep (LOO), rows projected again": ["sweep", "--gammas", GRID, "--max-memory", "1MiB"],
    "learn --gamma auto (LOO), rows projected again": ["learn", "--gamma", "auto", "--max-memory", "1MiB"],
}
TARGETS = {"sweep --no-loo (13 gammas)": 1.3, "sweep (13 gammas, LOO at every boundary)": 4.0,
           "learn --gamma auto --select gcv": 1.3, "learn --gamma auto (LOO)": 4.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = make_store(tmp / "bench.zarr", args.rows, args.test_rows)
        common = ["--features", str(store), "--tasks", str(TASKS), "--projection-dim", str(D), "--backend", "numpy"]
        runs = round_robin(COMMANDS, common, tmp, args.repeats)
        choices = {}
        for i, name in enumerate(COMMANDS):
            out = tmp / f"out{i}"
            report = json.loads(((out / "sweep.json") if (out / "sweep.json").exists() else out / "metrics.json").read_text())
            choices[name] = {k: report.get(k) for k in ("best_gamma", "best_gamma_test", "selected_by", "gammas_selected",
                                                         "A_avg")}
        outs = {name: tmp / f"out{i}" for i, name in enumerate(COMMANDS)}
        results["identical_files_kept_vs_projected_again"] = {
            kept: all((outs[kept] / f).read_bytes() == (outs[again] / f).read_bytes() for f in files)
            for kept, again, files in (
                ("sweep (13 gammas, LOO at every boundary)", "sweep (LOO), rows projected again", ["sweep.json"]),
                ("learn --gamma auto (LOO)", "learn --gamma auto (LOO), rows projected again",
                 ["metrics.json", "model.safetensors"]),
            )
        }
    for name, summary in medians(runs, "learn --gamma 1").items():
        results[name] = {**summary, "target_ratio": TARGETS.get(name), **choices[name]}
    finish(results, args.json)


if __name__ == "__main__":
    main()
