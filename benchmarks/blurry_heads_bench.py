"""Every head under Si-Blurry (issue 25) on Fashion-MNIST pixels: ridge, ncm, slda, fecam, balanced and dual.

The store: heads_bench.py's (60,000 train and 10,000 test images as 784 grey pixels, reused from --store). For
each --seed (the stream and the projection), one `sweep --heads ridge,ncm,slda,fecam,balanced,dual --gammas 1
--no-loo` on `--stream si-blurry --disjoint-ratio 50 --blurry-ratio 10 --tasks 5` (every head from one walk, at
gamma 1 where a head takes one, D = 1000 where it projects) gives A_last, A_avg and F per head; then `learn` (ridge,
gamma 1) with `--eval-every 1000` on the same stream gives ridge's A_auc (the other heads refuse --eval-every).
Per head: each seed's numbers, their mean and population std. Every child runs with --threads BLAS threads,
--backend numpy and this checkout's code (PYTHONPATH).

Usage: python benchmarks/blurry_heads_bench.py [--store /tmp/stores/heads/fm784.zarr] [--seeds 0,1,2]
       [--threads 1] [--json benchmarks/results/blurry_heads_bench.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _runner import blas_env, finish, header, run_cli, save
from heads_bench import ensure_store

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("results") / "blurry_heads_bench.json"
D, EVERY, TASKS = 1000, 1000, 5
HEADS = "ridge,ncm,slda,fecam,balanced,dual"
BLURRY = ["--stream", "si-blurry", "--disjoint-ratio", "50", "--blurry-ratio", "10", "--tasks", str(TASKS),
          "--backend", "numpy", "--projection-dim", str(D)]
FIELDS = ("A_last", "A_avg", "F")


def one_seed(store: Path, tmp: Path, seed: int, env: dict[str, str]) -> dict:
    """The six heads' numbers on one seed's stream, and ridge's A_auc from `learn --eval-every`."""
    out = tmp / f"sweep{seed}"
    sweep = run_cli(["sweep", "--features", str(store), "--out", str(out), "--heads", HEADS, "--gammas", "1",
                     "--no-loo", "--seed", str(seed), *BLURRY], env)
    heads = json.loads((out / "sweep.json").read_text())["heads"]
    learn_out = tmp / f"learn{seed}"
    learn = run_cli(["learn", "--features", str(store), "--out", str(learn_out), "--gamma", "1", "--seed", str(seed),
                     "--eval-every", str(EVERY), *BLURRY], env)
    metrics = json.loads((learn_out / "metrics.json").read_text())
    run = {"seed": seed, "sweep_wall_s": round(sweep.seconds, 1), "sweep_cpu_s": round(sweep.cpu_seconds, 1),
           "learn_wall_s": round(learn.seconds, 1), "tasks": [len(t) for t in metrics["tasks"]],
           "heads": {name: {k: heads[name][k] for k in FIELDS} for name in heads},
           "ridge_learn": {k: metrics[k] for k in ("A_auc", *FIELDS)}}
    print(json.dumps(run), flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/stores/heads/fm784.zarr"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    env = {**blas_env(args.threads), "PYTHONPATH": str(ROOT)}
    results = header(threads=args.threads, D=D, eval_every=EVERY, tasks=TASKS, store=str(args.store),
                     uptime=Path("/proc/loadavg").read_text().strip())
    ensure_store(args.store)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            runs.append(one_seed(args.store, Path(tmp), seed, env))
            save({**results, "runs": runs}, args.json)
    summary = {name: {k: {"mean": statistics.fmean(r["heads"][name][k] for r in runs),
                          "std": statistics.pstdev(r["heads"][name][k] for r in runs)} for k in FIELDS}
               for name in HEADS.split(",")}
    summary["ridge"]["A_auc"] = {"mean": statistics.fmean(r["ridge_learn"]["A_auc"] for r in runs),
                                 "std": statistics.pstdev(r["ridge_learn"]["A_auc"] for r in runs)}
    finish({**results, "runs": runs, "summary": summary}, args.json)


if __name__ == "__main__":
    main()
