"""Factorisations on one BLAS thread (foal-pipe's policy for D <= 2048) against the machine's default threads, at
rest and beside busy processes: `learn --gamma auto` (ten eigendecompositions) on one synthetic store (issue 31:
"BLAS threads chosen by measurement at rest and under load").

The policy is ``foal_pipe.core.linalg.SINGLE_THREAD_FACTOR_DIM``, with each boundary's factorisation run ahead beside
the next task's first blocks (``learners.gram.FactorAhead``); `one thread, in place` turns the running ahead off (each
boundary factored where it ends, as before 2026-11-28 09:00 UTC), and `default threads` sets the policy to 0 in the
child (every factorisation then on the default threads, nothing ahead), both through ``python -c``. Each condition
runs the variants interleaved ``--repeats`` times; ``--busy N`` starts N processes spinning in pure Python for the
loaded condition (the load a shared machine sees), stopped afterwards. A run longer than ``--timeout`` seconds is
stopped and recorded as that (a factorisation on two threads beside busy processes can take minutes).

Usage: python benchmarks/factor_threads_bench.py [--rows 50000] [--features 768] [--projection-dim 1000]
           [--repeats 3] [--busy 2] [--timeout 150] [--json benchmarks/results/factor_threads_bench.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _runner import finish, header
from synthetic import make_store

VARIANTS = {
    "one thread (policy)": "",
    "one thread, in place": "import foal_pipe.protocol.ahead as A; A.SINGLE_THREAD_FACTOR_DIM = 0; ",
    "default threads": "import foal_pipe.core.linalg as L; L.SINGLE_THREAD_FACTOR_DIM = 0; ",
}


def timed(prefix: str, args: list[str], timeout: float) -> float:
    code = prefix + "import sys; from foal_pipe.cli import main; sys.argv = ['foal-pipe', *sys.argv[1:]]; main()"
    start = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return float(timeout)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--projection-dim", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--json", type=Path, default=None)
    a = parser.parse_args()
    results = header(bench="factor_threads", rows=a.rows, features=a.features, projection_dim=a.projection_dim,
                     repeats=a.repeats, busy=a.busy, timeout_s=a.timeout, command="learn --gamma auto")
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store = make_store(Path(tmp) / "store.zarr", a.rows, a.rows // 5, n_classes=100, dim=a.features)
        args = ["learn", "--features", str(store), "--tasks", "10", "--projection-dim", str(a.projection_dim),
                "--gamma", "auto", "--backend", "numpy", "--out", str(Path(tmp) / "out")]
        for condition, busy in (("at rest", 0), (f"beside {a.busy} busy processes", a.busy)):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            try:
                times: dict[str, list[float]] = {name: [] for name in VARIANTS}
                for _ in range(a.repeats):
                    for name, prefix in VARIANTS.items():
                        times[name].append(round(timed(prefix, args, a.timeout), 2))
                        print(f"{condition:<28} {name:<22} {times[name][-1]:7.2f} s", flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
            results[condition] = {name: {"all_s": t, "median_s": statistics.median(t)} for name, t in times.items()}
    finish(results, a.json)


if __name__ == "__main__":
    main()
