"""Wide expansions on real data: `learn --gamma auto` on Fashion-MNIST pixels for each D x activation.

The pixel store (Debian's `dataset-fashion-mnist` through `extract --model pixels`, d = 2,352) is extracted
once (into --store, reused when it is already there); then each configuration is one whole
`foal-pipe learn --tasks 5 --projection-dim D --activation A --gamma auto --select S --backend numpy`
subprocess, one at a time, with --threads BLAS threads. Recorded per configuration: wall and CPU seconds and
peak RSS of the child (`_runner.run_cli`), A_last, A_avg, F, the gamma selected at each boundary, the step
timings, and the load averages before and after. Results are merged into --json after every run (keyed by
D, activation and criterion), so partial runs are kept and later invocations add to them.

Usage: python benchmarks/fmnist_wide_bench.py [--dims 1000,2000] [--activations sigmoid,relu] [--select loo]
       [--store /tmp/fm.zarr] [--threads 1] [--json benchmarks/results/fmnist_wide_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from _runner import blas_env, run_cli

TASKS = 5
RESULTS = Path(__file__).with_name("results") / "fmnist_wide_bench.json"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _machine() -> str:
    """CPU model (from /proc/cpuinfo where there is one), cores and memory."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{names[0] if names else platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB"


def _commit() -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=Path(__file__).parent,
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def ensure_store(store: Path, env: dict[str, str]) -> dict | None:
    """Extract the pixel store into ``store`` unless it is there; the extraction's measurements, or None."""
    if (store / "zarr.json").exists():
        return None
    run = run_cli(["extract", "--dataset", "fashion-mnist", "--model", "pixels", "--out", str(store)], env)
    return {"seconds": round(run.seconds, 2), "cpu_seconds": round(run.cpu_seconds, 2),
            "peak_rss_mib": round(run.peak_rss_mib)}


def learn(store: Path, out: Path, dim: int, activation: str, select: str, env: dict[str, str]) -> dict:
    """One `learn --gamma auto` subprocess and what it reports."""
    load_start, started = os.getloadavg(), _now()
    run = run_cli(["learn", "--features", str(store), "--out", str(out), "--tasks", str(TASKS), "--projection-dim",
                   str(dim), "--activation", activation, "--gamma", "auto", "--select", select, "--backend", "numpy"],
                  env)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"D": dim, "activation": activation, "select": select, "tasks": TASKS, "started": started,
            "finished": _now(), "load_start": list(load_start), "load_end": list(os.getloadavg()),
            "wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2), "peak_rss_mib": round(run.peak_rss_mib),
            **{k: metrics[k] for k in ("A_last", "A_avg", "F", "gammas_selected", "selected_by", "accuracy_matrix")},
            "timings": json.loads((out / "timings.json").read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="1000,2000,5000,10000", help="comma-separated projection dimensions D")
    parser.add_argument("--activations", default="sigmoid,relu", help="comma-separated activations")
    parser.add_argument("--select", choices=("loo", "gcv"), default="loo", help="--gamma auto's criterion")
    parser.add_argument("--store", type=Path, default=None,
                        help="where the pixel store is or goes (kept); default: a temporary directory")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads of every subprocess")
    parser.add_argument("--json", type=Path, default=RESULTS, help="results file, merged into when it exists")
    args = parser.parse_args()
    env = blas_env(args.threads)
    results = json.loads(args.json.read_text()) if args.json.exists() else {"runs": {}}
    results.update(machine=_machine(),
                   python=platform.python_version(), threads=args.threads, commit=_commit())
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "fm.zarr"
        extracted = ensure_store(store, env)
        if extracted:
            results["extract"] = {**extracted, "date": _now()}
        for dim in map(int, args.dims.split(",")):
            for activation in args.activations.split(","):
                entry = {**learn(store, Path(tmp) / "run", dim, activation, args.select, env), "commit": results["commit"]}
                results["runs"][f"D={dim} {activation} {args.select}"] = entry
                print(json.dumps({k: v for k, v in entry.items() if k not in ("accuracy_matrix", "timings")}),
                      flush=True)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
