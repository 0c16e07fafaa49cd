"""What sets which blocks run beside a boundary's factorisation (``foal_pipe/protocol/ahead.py``): each step's time on
one BLAS thread, and a factorisation paired with a block's projection after a two-thread product.

Per shape (``--shapes D:d``, 4,096-row blocks, 100 classes): the projection (``X @ P``, the cast and ``tanh``), the
Gram products (:meth:`RidgeStatistics.from_batch`), ``eigh`` and the reduction (:meth:`RidgeStatistics.factor`) on one
BLAS thread, the products on the default threads; from them ``EIGH_COST`` and ``REDUCTION_COST`` in ``D^3`` flops of
the Gram's products on one thread, and ``ELEMENT_COST``, the projection's time beyond its product in flops an
activation. Then the pair (``eigh`` on a second thread while the main one projects a block, both on one BLAS thread)
started right after a two-thread product and after a one-thread one: OpenBLAS's idle thread spins after a two-thread
product for ``2^OPENBLAS_THREAD_TIMEOUT`` cycles (:mod:`foal_pipe.blasenv`) and takes the second thread's core while it
does: each shape runs in a process of its own with OpenBLAS's default (28) and with foal-pipe's (4). Medians of
``--repeats``.

Usage: python benchmarks/ahead_bench.py [--shapes 1000:768,600:256,2000:768] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _runner import finish, header

from foal_pipe.blasenv import OPENBLAS_THREAD_TIMEOUT
from foal_pipe.core.linalg import factor_threads
from foal_pipe.core.statistics import RidgeStatistics

ROWS, CLASSES = 4096, 100


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def shape(D: int, d: int, repeats: int, executor: ThreadPoolExecutor) -> dict:
    rng = np.random.default_rng(0)
    P = rng.normal(size=(d, D)) / np.sqrt(d)
    X = rng.normal(size=(ROWS, d)).astype(np.float32)
    labels = rng.integers(0, CLASSES, ROWS)

    def project() -> np.ndarray:
        H = X.astype(np.float64) @ P
        return np.tanh(H, out=H)

    H = project()
    running = RidgeStatistics.from_batch(H, labels)
    for _ in range(3):  # a boundary's sums: several blocks
        running += RidgeStatistics.from_batch(H + rng.normal(size=H.shape) * 0.1, labels)
    product = lambda: X.astype(np.float64) @ P  # noqa: E731
    with factor_threads(1):
        one = {"projection": median_time(project, repeats), "product": median_time(product, repeats),
               "gram": median_time(lambda: RidgeStatistics.from_batch(H, labels), repeats),
               "eigh": median_time(lambda: running.factor(True), max(1, repeats // 2)),
               "reduction": median_time(lambda: running.factor(False), max(1, repeats // 2))}
    default = {"projection": median_time(project, repeats),
               "gram": median_time(lambda: RidgeStatistics.from_batch(H, labels), repeats)}
    rate = 2.0 * ROWS * D * (D + CLASSES) / one["gram"]  # the Gram's products, flops a second on one thread

    def pair(after_two_threads: bool) -> float:
        if after_two_threads:
            RidgeStatistics.from_batch(H, labels)
        else:
            with factor_threads(1):
                RidgeStatistics.from_batch(H, labels)
        start = time.perf_counter()
        with factor_threads(1):
            job = executor.submit(running.factor, True)
            project()
            job.result()
        return time.perf_counter() - start

    pairs = {name: statistics.median(pair(flag) for _ in range(repeats))
             for name, flag in (("after_two_thread_product", True), ("after_one_thread_product", False))}
    return {"D": D, "d": d, "one_thread_s": one, "default_threads_s": default, "pair_s": pairs,
            "gram_gflops_one_thread": rate / 1e9,
            "eigh_cost": one["eigh"] * rate / D**3, "reduction_cost": one["reduction"] * rate / D**3,
            "element_cost": (one["projection"] - 2.0 * ROWS * D * d / rate) * rate / (ROWS * D)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1000:768,600:256,2000:768", help="D:d pairs, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one shape, in this process: D:d
    args = parser.parse_args()
    if args.child:
        D, d = (int(v) for v in args.child.split(":"))
        with ThreadPoolExecutor(1) as executor:
            print(json.dumps(shape(D, d, args.repeats, executor)))
        return
    results = header(bench="ahead", rows=ROWS, classes=CLASSES, repeats=args.repeats)
    results["shapes"] = []
    for item in args.shapes.split(","):
        for timeout in ("28", OPENBLAS_THREAD_TIMEOUT):
            env = {**os.environ, "OPENBLAS_THREAD_TIMEOUT": timeout}
            proc = subprocess.run([sys.executable, __file__, "--child", item, "--repeats", str(args.repeats)],
                                  env=env, capture_output=True, text=True, check=True)
            r = {"openblas_thread_timeout": int(timeout), **json.loads(proc.stdout.splitlines()[-1])}
            results["shapes"].append(r)
            one, pairs = r["one_thread_s"], r["pair_s"]
            print(f"D {r['D']:5d} d {r['d']:4d} timeout 2^{timeout:>2}: one thread: projection {one['projection']:.3f} s, "
                  f"Gram {one['gram']:.3f} s, eigh {one['eigh']:.3f} s, reduction {one['reduction']:.3f} s | costs: "
                  f"eigh {r['eigh_cost']:.1f}, reduction {r['reduction_cost']:.1f}, element {r['element_cost']:.0f} | "
                  f"eigh beside a projection: {pairs['after_two_thread_product']:.3f} s after a two-thread product, "
                  f"{pairs['after_one_thread_product']:.3f} s after a one-thread one", flush=True)
    finish(results, args.json)


if __name__ == "__main__":
    main()
