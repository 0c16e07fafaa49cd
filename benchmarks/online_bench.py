"""Si-Blurry and anytime evaluation on Fashion-MNIST pixels (60,000 train rows, d = 2,352), D = 1000.

Part 1, accuracy: `learn --stream si-blurry --disjoint-ratio 50 --blurry-ratio 10 --tasks 5 --eval-every 1000`
for each --seed (stream and projection), with a fixed gamma and with --gamma auto: A_auc, A_last, A_avg, F per
seed, then mean and population std.
Part 2, cost: `learn` with and without `--eval-every 1000`, interleaved round-robin (`_runner.round_robin`),
medians and their ratio; on the disjoint stream (today's default), on Si-Blurry, and with --gamma auto.
Every child runs with --threads BLAS threads and this checkout's code (PYTHONPATH), --backend numpy.

Usage: python benchmarks/online_bench.py [--store /tmp/fm.zarr] [--seeds 0,1,2] [--repeats 3] [--threads 1]
       [--json benchmarks/results/online_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from _runner import blas_env, finish, header, medians, round_robin, run_cli, save

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("results") / "online_bench.json"
D, EVERY, TASKS = 1000, 1000, 5
BLURRY = ["--stream", "si-blurry", "--disjoint-ratio", "50", "--blurry-ratio", "10"]


def ensure_store(store: Path, env: dict[str, str]) -> None:
    if not (store / "zarr.json").exists():
        run_cli(["extract", "--dataset", "fashion-mnist", "--model", "pixels", "--out", str(store)], env)


def accuracy(store: Path, tmp: Path, seeds: list[int], gamma: list[str], env: dict[str, str]) -> dict:
    """Part 1 for one gamma setting: each seed's numbers, then mean and std (ddof 0)."""
    runs = []
    for seed in seeds:
        out = tmp / "acc"
        wall = run_cli(["learn", "--features", str(store), "--out", str(out), "--tasks", str(TASKS), "--projection-dim",
                        str(D), *gamma, "--seed", str(seed), "--eval-every", str(EVERY), "--backend", "numpy", *BLURRY],
                       env).seconds
        m = json.loads((out / "metrics.json").read_text())
        runs.append({"seed": seed, "wall_s": round(wall, 2), "tasks": [len(t) for t in m["tasks"]],
                     **{k: m[k] for k in ("A_auc", "A_last", "A_avg", "F")},
                     "gammas_selected": m.get("gammas_selected"), "curve": m["anytime"]["accuracy"]})
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), flush=True)
    summary = {k: {"mean": statistics.fmean(r[k] for r in runs), "std": statistics.pstdev(r[k] for r in runs)}
               for k in ("A_auc", "A_last", "A_avg", "F")}
    return {"gamma": " ".join(gamma), "runs": runs, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/stores/online/fm.zarr"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: accuracy, cost")
    args = parser.parse_args()
    env = {**blas_env(args.threads), "PYTHONPATH": str(ROOT)}
    os.environ.update(env)  # round_robin's children inherit this process's environment
    skip = set(args.skip.split(","))
    results = header(threads=args.threads, D=D, eval_every=EVERY, tasks=TASKS, store=str(args.store),
                     uptime=Path("/proc/loadavg").read_text().strip())
    ensure_store(args.store, env)
    with tempfile.TemporaryDirectory() as tmp:
        if "accuracy" not in skip:
            seeds = [int(s) for s in args.seeds.split(",")]
            results["accuracy"] = [accuracy(args.store, Path(tmp), seeds, gamma, env)
                                   for gamma in (["--gamma", "1"], ["--gamma", "auto", "--select", "gcv"])]
            save(results, args.json)
        if "cost" not in skip:
            base = ["learn", "--features", str(args.store), "--tasks", str(TASKS), "--projection-dim", str(D),
                    "--backend", "numpy", "--seed", "0"]
            every = ["--eval-every", str(EVERY)]
            commands = {
                "disjoint": [*base], "disjoint --eval-every 1000": [*base, *every],
                "si-blurry": [*base, *BLURRY], "si-blurry --eval-every 1000": [*base, *BLURRY, *every],
                "si-blurry auto gcv": [*base, *BLURRY, "--gamma", "auto", "--select", "gcv"],
                "si-blurry auto gcv --eval-every 1000": [*base, *BLURRY, "--gamma", "auto", "--select", "gcv", *every],
                "si-blurry auto loo": [*base, *BLURRY, "--gamma", "auto"],
                "si-blurry auto loo --eval-every 1000": [*base, *BLURRY, "--gamma", "auto", *every],
            }
            runs = round_robin(commands, [], Path(tmp), args.repeats)
            cost = medians(runs, "disjoint")
            for name in commands:
                if name.endswith(" --eval-every 1000"):
                    plain = name.removesuffix(" --eval-every 1000")
                    cost[name]["ratio_to_plain"] = cost[name]["median_s"] / cost[plain]["median_s"]
            results["cost"] = cost
    results["load_end_1_5_15"] = list(os.getloadavg())
    finish(results, args.json)


if __name__ == "__main__":
    main()
