"""The heads side by side on Fashion-MNIST pixels (issue 22), and one 4-head `sweep --heads` against one `learn`.

The store: Fashion-MNIST's 60,000 train and 10,000 test images as 784 grey pixels in [0, 1] (one channel:
`extract --model pixels` repeats it three times, which triples d, and fecam's per-class d x d work, for nothing),
written once with `foal_pipe.store.write_store` into --store and reused. Then each command is one whole
`foal-pipe` subprocess (`_runner.run_cli`: wall, CPU seconds and the child's peak RSS), every command once per
round, rounds interleaved so that load from other processes hits every command alike, BLAS limited to --threads
threads. Recorded per command: every round's measurements, the medians, A_avg, A_last, F (and sweep.json's heads)
and the load averages. Every walk reads the store once: tests/test_one_read.py counts the decoded chunks of
`sweep --heads ridge,ncm,slda,fecam` and of `learn --head`.

`--set once` runs reading (a) alone (`learn` and the one-gamma 4-head sweep). `--set ratio` runs the 4-head
sweep's two readings against `learn`: (a) `sweep --heads ridge,ncm,slda,fecam
--gammas 1 --no-loo` (every head learned once, as `learn` learns ridge) against `learn`; (b) the default `sweep
--heads` against plain `sweep` (what the heads add to a sweep). `--baseline DIR` runs the head commands on that
source tree too (its `PYTHONPATH`), interleaved with this tree's, for before/after side by side.

Usage: python benchmarks/heads_bench.py [--set features|projected|ratio|once] [--store /tmp/stores/heads/fm784.zarr]
       [--rounds 3] [--threads 1] [--baseline DIR] [--json benchmarks/results/heads_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _runner import blas_env, run_cli

TASKS = 5
COMMON = ["--tasks", str(TASKS), "--backend", "numpy", "--seed", "0"]
HEADS = "ridge,ncm,slda,fecam"
ALL_HEADS = "ridge,ncm,slda,fecam,balanced,dual"
LEARN = "learn ridge (D=1000, gamma 1)"
FEATURE_HEADS = {
    LEARN: ["learn"],
    "learn --head ncm": ["learn", "--head", "ncm"],
    "learn --head slda": ["learn", "--head", "slda"],
    "learn --head slda --shrinkage oas": ["learn", "--head", "slda", "--shrinkage", "oas"],
    "learn --head fecam": ["learn", "--head", "fecam"],
    "sweep (13 gammas, LOO)": ["sweep"],
    f"sweep --heads {HEADS}": ["sweep", "--heads", HEADS],
    f"sweep --heads {HEADS} --gammas 1 --no-loo": ["sweep", "--heads", HEADS, "--gammas", "1", "--no-loo"],
}
#: The heads on the projection (D = 1000, as ridge) and all six heads from one sweep.
PROJECTED_HEADS = {
    LEARN: ["learn"],
    "learn --head balanced": ["learn", "--head", "balanced"],
    "learn --head dual": ["learn", "--head", "dual"],
    f"sweep --heads {ALL_HEADS}": ["sweep", "--heads", ALL_HEADS],
}
#: The two readings of the 4-head sweep against one `learn`: (a) every head learned once at `learn`'s settings (and
#: the same sweep without heads: ridge's one-gamma sweep beside `learn`); (b) what the heads add to the default sweep
#: (13 gammas, leave-one-out).
SWEEP = "sweep (13 gammas, LOO)"
SWEEP_HEADS = f"sweep --heads {HEADS}"
ONCE = f"sweep --heads {HEADS} --gammas 1 --no-loo"
SWEEP_ONCE = "sweep --gammas 1 --no-loo"
RATIO_HEADS = {
    LEARN: ["learn"],
    SWEEP_ONCE: ["sweep", "--gammas", "1", "--no-loo"],
    ONCE: ["sweep", "--heads", HEADS, "--gammas", "1", "--no-loo"],
    SWEEP: ["sweep"],
    SWEEP_HEADS: ["sweep", "--heads", HEADS],
}
#: Reading (a) alone: `learn` and the 4-head sweep at one gamma (with --baseline: before and after side by side).
ONCE_HEADS = {LEARN: ["learn"], ONCE: ["sweep", "--heads", HEADS, "--gammas", "1", "--no-loo"]}
SETS = {"features": FEATURE_HEADS, "projected": PROJECTED_HEADS, "ratio": RATIO_HEADS, "once": ONCE_HEADS}
#: With --baseline: the head commands of the set run again on that source tree (before), beside this one (after).
BASELINE = " [baseline]"


def ensure_store(store: Path) -> None:
    """Write the 784-pixel store unless it is there."""
    if (store / "zarr.json").exists():
        return
    from foal_pipe.datasets.loaders import FASHION_CLASSES, load_fashion_mnist
    from foal_pipe.store import write_store

    splits = load_fashion_mnist(None, download=False)

    def flat(source: Any) -> tuple[np.ndarray, np.ndarray]:
        images = np.asarray(source.images)[source.index]
        return (images.reshape(images.shape[0], -1) / 255.0).astype(np.float32), source.labels[source.index]

    write_store(store, flat(splits.train), flat(splits.test), FASHION_CLASSES, dataset="fashion-mnist",
                encoder={"name": "pixels-grey", "fusion": "none", "image_size": 28, "normalize": False})


def outcome(out: Path) -> dict:
    """A_avg, A_last, F of a learn (metrics.json) or of each head of a sweep (sweep.json)."""
    if (out / "metrics.json").exists():
        m = json.loads((out / "metrics.json").read_text())
        return {k: m[k] for k in ("A_avg", "A_last", "F")}
    s = json.loads((out / "sweep.json").read_text())
    result = {"best_gamma": s["best_gamma"], "best_gamma_test": s["best_gamma_test"]}
    if "heads" in s:
        result["heads"] = {name: {k: h[k] for k in ("A_avg", "A_last", "F", "options")} | {"loo_accuracy": h.get("loo_accuracy")}
                           for name, h in s["heads"].items()}
        result |= {k: s.get(k) for k in ("best_head", "best_head_selected_by", "best_head_test")}
    return result


def with_baseline(commands: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each command that runs a head other than ridge twice: on this tree and, renamed, on --baseline's."""
    heads = {name + BASELINE: cmd for name, cmd in commands.items() if "--heads" in cmd or "--head" in cmd}
    return {**commands, **heads}


def readings(medians: dict[str, dict[str, float]]) -> dict[str, float]:
    """The sweep readings (a) and (b), CPU and wall, where the set has them."""
    pairs = {"(a) 4 heads once / learn": (ONCE, LEARN), "(a) 4 heads once / the same sweep without heads": (ONCE, SWEEP_ONCE),
             "(b) sweep --heads / sweep": (SWEEP_HEADS, SWEEP),
             "sweep --heads / learn": (SWEEP_HEADS, LEARN)}
    pairs |= {f"{name}{BASELINE}": (top + BASELINE, bottom + BASELINE if bottom + BASELINE in medians else bottom)
              for name, (top, bottom) in pairs.items()}
    return {f"{name} ({key})": round(medians[top][key] / medians[bottom][key], 2)
            for name, (top, bottom) in pairs.items() if top in medians and bottom in medians
            for key in ("cpu_s", "wall_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/stores/heads/fm784.zarr"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", choices=sorted(SETS), default="features",
                        help="features: ridge beside ncm, slda, fecam and the 4-head sweep; projected: balanced, dual "
                             "and the 6-head sweep; ratio: readings (a) and (b); once: reading (a) alone")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("results") / "heads_bench.json")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a foal-pipe source tree (e.g. `git archive` of the commit before a change): its head "
                             "commands run too, interleaved, for before/after side by side (default: none)")
    args = parser.parse_args()
    ensure_store(args.store)
    env = blas_env(args.threads)
    commands = SETS[args.set] if args.baseline is None else with_baseline(SETS[args.set])
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    outcomes: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, cmd) in enumerate(commands.items()):
                out = Path(tmp) / f"out{i}"
                load = os.getloadavg()
                given = env if not name.endswith(BASELINE) else {**env, "PYTHONPATH": str(args.baseline)}
                run = run_cli([*cmd, "--features", str(args.store), "--out", str(out), *COMMON], given)
                runs[name].append({"round": r, "wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2),
                                   "peak_rss_mib": round(run.peak_rss_mib), "load_before": [round(v, 2) for v in load],
                                   "timings": json.loads((out / "timings.json").read_text())})
                outcomes[name] = outcome(out)
                print(f"round {r} {name}: {run.seconds:.1f} s, {run.peak_rss_mib:.0f} MiB, load {load[0]:.2f}",
                      flush=True)
    medians = {name: {key: statistics.median(x[key] for x in rs) for key in ("wall_s", "cpu_s", "peak_rss_mib")}
               for name, rs in runs.items()}
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "threads": args.threads,
        "rounds": args.rounds, "tasks": TASKS, "rows": {"train": 60000, "test": 10000, "d": 784},
        "set": args.set, "medians": medians, "outcomes": outcomes, "runs": runs,
        "ratios": {f"{name} / learn ({key})": round(m[key] / medians[LEARN][key], 2)
                   for name, m in medians.items() if name != LEARN for key in ("wall_s", "cpu_s")},
        "readings": readings(medians), "baseline": None if args.baseline is None else str(args.baseline),
        "uptime": os.getloadavg(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"medians": medians, "ratios": report["ratios"], "readings": report["readings"]}, indent=2))


if __name__ == "__main__":
    from foal_pipe.errors import FoalPipeError

    try:
        main()
    except FoalPipeError as exc:  # Fashion-MNIST not installed: the one line that names the fix
        raise SystemExit(f"Error: {exc}") from None
