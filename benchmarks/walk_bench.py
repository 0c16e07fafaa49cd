"""Benchmark what a walk over a store costs against the data it reads, not the stream (issue 21).

Three measurements, each side by side in one run, medians of --repeats, commands interleaved so that load from
other processes hits each alike:

* ``tasks``: ``learn --tasks 100`` against ``learn --tasks 5`` on the same store (default 40,000 x 384 float32,
  100 classes in a random row order, D = 500): the same rows and projection/Gram flops, so the ratio shows what
  the number of tasks costs (target <= 1.2x). What a boundary must do (one solve, the test rows of the tasks
  seen scored) grows with the tasks in any learner, so the floor below runs at 5 and 100 tasks beside it;
* ``floor``: ``learn`` against the floor of any Gram learner on the same store (default 200,000 x 768, 100
  classes, 10 tasks, D = 1000): :func:`floor` reads the store once, projects + sigmoid in 4,096-row blocks,
  accumulates H^T H and H^T Y per task, and does one solve and one test scoring per task, in plain NumPy
  (target <= 1.25x). Both run as subprocesses (start-up included), the floor with only NumPy, SciPy and zarr
  to import; the floor's accuracy matrix must equal ``learn``'s;
* ``imagenet`` (``--imagenet``): the same pair on a synthetic 1,281,167 x 768 float16 store, 1,000 classes,
  10 tasks, D = 2000, with peak RSS (target < 4 GiB, within the floor ratio).

``--compare DIR`` (repeatable) also times ``learn`` with the foal-pipe code of another checkout (e.g. an older
commit in a git worktree) on the ``floor`` store, interleaved with the others; the store is then written by the
first such checkout's ``benchmarks/synthetic.py`` (the same rows), in a format every version reads.

Usage: python benchmarks/walk_bench.py [--repeats 3] [--skip-tasks] [--skip-floor] [--imagenet] [--compare DIR]
       [--json benchmarks/results/walk_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _runner import finish, header, run_cli
from synthetic import make_store

BLOCK = 4096


def stream_of(store: Path, tasks: int, D: int, seed: int) -> tuple:
    """The store's train and test rows and labels, its number of classes, and foal-pipe's stream: the class
    permutation of ``default_rng(seed)`` split evenly into ``tasks``, the projection uniform from
    ``default_rng(seed)``, and the task of each class."""
    import zarr

    group = zarr.open_group(str(store), mode="r")
    X, y = np.asarray(group["train/features"][:]), np.asarray(group["train/labels"][:])
    Xt, yt = np.asarray(group["test/features"][:]), np.asarray(group["test/labels"][:])
    n_classes, d = len(group.attrs["classes"]), X.shape[1]
    split = np.array_split(np.random.default_rng(seed).permutation(n_classes), tasks)
    P = np.random.default_rng(seed).uniform(-1 / np.sqrt(d), 1 / np.sqrt(d), size=(d, D))
    task_of = np.empty(n_classes, dtype=np.int64)
    for t, classes in enumerate(split):
        task_of[classes] = t
    return X, y, Xt, yt, n_classes, split, P, task_of


def floor(store: Path, tasks: int, D: int, seed: int, gamma: float = 1.0) -> list[list[float]]:
    """The floor of a Gram learner: one read of the store, full blocks, one solve and one scoring per task.

    The stream is foal-pipe's (:func:`stream_of`), so the accuracy matrix is comparable to ``learn``'s.
    """
    import scipy.linalg

    X, y, Xt, yt, n_classes, split, P, task_of = stream_of(store, tasks, D, seed)

    def project(rows: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(rows.astype(np.float64) @ P)))

    G, Q = np.zeros((D, D)), np.zeros((D, n_classes))
    test_order = np.argsort(task_of[yt], kind="stable")
    Ht = np.concatenate([project(Xt[test_order[lo : lo + BLOCK]]) for lo in range(0, yt.size, BLOCK)])
    yt, tt = yt[test_order], task_of[yt[test_order]]
    acc = []
    for k in range(tasks):
        rows = np.flatnonzero(task_of[y] == k)
        for lo in range(0, rows.size, BLOCK):
            block = rows[lo : lo + BLOCK]
            H = project(X[block])
            G += H.T @ H
            present = np.unique(y[block])
            Q[:, present] += H.T @ (y[block][:, None] == present[None, :])
        seen = np.sort(np.concatenate(split[: k + 1]))
        W = scipy.linalg.solve(G + gamma * np.eye(D), Q[:, seen], assume_a="pos")
        n = int(np.searchsorted(tt, k, side="right"))
        hit = seen[np.argmax(Ht[:n] @ W, axis=1)] == yt[:n]
        acc.append([float(hit[tt[:n] == j].mean()) for j in range(k + 1)])
    return acc


def boundary_work(store: Path, tasks: int, D: int, seed: int, gamma: float = 1.0) -> float:
    """Seconds of the work every boundary of any exact learner that evaluates after each task must do, and
    nothing else: one Cholesky solve of ``G + gamma I`` for the classes seen (one BLAS thread, as foal-pipe
    factors at this D) and the test rows of the tasks seen multiplied by those weights in float32 (the cheapest
    product; foal-pipe's float32 route), with their argmax. Read, projection and Gram sums are done untimed.

    ``learn --tasks 5`` plus the difference of this work at 100 and 5 tasks is the least ``learn --tasks 100``
    could take with reading, projection and Gram sums perfectly flat in the number of tasks.
    """
    import scipy.linalg
    from threadpoolctl import ThreadpoolController

    X, y, Xt, yt, n_classes, split, P, task_of = stream_of(store, tasks, D, seed)
    order = np.argsort(task_of[yt], kind="stable")
    Ht = (1 / (1 + np.exp(-(Xt[order].astype(np.float64) @ P)))).astype(np.float32)
    ends = np.searchsorted(task_of[yt[order]], np.arange(tasks), side="right")
    G, Q, seconds = np.zeros((D, D)), np.zeros((D, n_classes)), 0.0
    pools = ThreadpoolController()  # found once: each lookup reads /proc/self/maps (3 ms)
    for k in range(tasks):
        rows = np.flatnonzero(task_of[y] == k)
        H = 1 / (1 + np.exp(-(X[rows].astype(np.float64) @ P)))
        G += H.T @ H
        Q[:, split[k]] += H.T @ (y[rows][:, None] == split[k][None, :])
        seen = np.sort(np.concatenate(split[: k + 1]))
        start = time.perf_counter()
        with pools.limit(limits=1, user_api="blas"):
            W = scipy.linalg.cho_solve(scipy.linalg.cho_factor(G + gamma * np.eye(D), check_finite=False), Q[:, seen],
                                       check_finite=False)
        np.argmax(Ht[: ends[k]] @ W.astype(np.float32), axis=1)
        seconds += time.perf_counter() - start
    return seconds


def run_floor(store: Path, tasks: int, D: int, out: Path) -> tuple[float, float]:
    """:func:`floor` in a subprocess (start-up included, like ``learn``): wall seconds and peak RSS (MiB)."""
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); from walk_bench import floor; "
            f"json.dump(floor(__import__('pathlib').Path({str(store)!r}), {tasks}, {D}, 0), open({str(out)!r}, 'w'))")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("the floor failed")
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def learn(store: Path, out: Path, tasks: int, D: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    run = run_cli(["learn", "--features", str(store), "--out", str(out), "--tasks", str(tasks), "--projection-dim",
                   str(D), "--seed", "0", "--backend", "numpy"], env=env)
    return run.seconds, run.peak_rss_mib


def side_by_side(commands: dict[str, callable], repeats: int) -> dict[str, dict]:
    """Every command ``repeats`` times, interleaved: medians of wall time and the peak RSS."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            runs[name].append(command())
            print(f"{name:<24} {runs[name][-1][0]:8.2f} s {runs[name][-1][1]:8.0f} MiB  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    return {name: {"median_s": statistics.median(s for s, _ in rs), "all_s": [round(s, 2) for s, _ in rs],
                   "peak_rss_mib": max(m for _, m in rs)} for name, rs in runs.items()}


def store_by(code: Path | None, path: Path, n_train: int, n_test: int) -> Path:
    """The synthetic store written by this checkout, or by ``code``'s own ``benchmarks/synthetic.py`` (a store
    format older code reads too)."""
    if code is None:
        return make_store(path, n_train, n_test)
    script = (f"import sys; from pathlib import Path; sys.path[:0] = [{str(code / 'benchmarks')!r}, {str(code)!r}]; "
              f"from synthetic import make_store; make_store(Path({str(path)!r}), {n_train}, {n_test})")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": str(code)})
    return path


def floor_pair(tmp: Path, store: Path, tasks: int, D: int, repeats: int, compare: list[Path]) -> dict:
    commands = {"learn": lambda: learn(store, tmp / "run", tasks, D),
                "floor": lambda: run_floor(store, tasks, D, tmp / "floor.json")}
    for i, code in enumerate(compare):
        env = {**os.environ, "PYTHONPATH": str(code)}
        commands[f"learn ({code.name})"] = lambda env=env, i=i: learn(store, tmp / f"run-compare{i}", tasks, D, env)
    result = side_by_side(commands, repeats)
    ours = json.loads((tmp / "run" / "metrics.json").read_text())["accuracy_matrix"]
    theirs = json.loads((tmp / "floor.json").read_text())
    result["learn_over_floor"] = result["learn"]["median_s"] / result["floor"]["median_s"]
    result["same_accuracy_matrix"] = bool(np.allclose(np.concatenate(ours), np.concatenate(theirs), atol=1e-12))
    for code in compare:
        result[f"{code.name}_over_learn"] = result[f"learn ({code.name})"]["median_s"] / result["learn"]["median_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-tasks", action="store_true")
    parser.add_argument("--skip-floor", action="store_true")
    parser.add_argument("--imagenet", action="store_true", help="also the 1,281,167-row float16 store (D = 2000)")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="another checkout's code to time beside (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = header(repeats=args.repeats, blas_threads=os.environ.get("OPENBLAS_NUM_THREADS", "default"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not args.skip_tasks:
            store = make_store(tmp / "tasks.zarr", 40_000, 8_000, dim=384)
            commands = {}
            for t in (5, 100):
                commands[f"learn --tasks {t}"] = lambda t=t: learn(store, tmp / f"t{t}", t, 500)
                commands[f"floor, {t} tasks"] = lambda t=t: run_floor(store, t, 500, tmp / f"floor{t}.json")
            r = side_by_side(commands, args.repeats)
            r["ratio_100_over_5"] = r["learn --tasks 100"]["median_s"] / r["learn --tasks 5"]["median_s"]
            r["floor_ratio_100_over_5"] = r["floor, 100 tasks"]["median_s"] / r["floor, 5 tasks"]["median_s"]
            work = {t: statistics.median(boundary_work(store, t, 500, 0) for _ in range(args.repeats)) for t in (5, 100)}
            r["boundary_work_s"] = {"5 tasks": work[5], "100 tasks": work[100]}
            r["least_ratio_100_over_5"] = (r["learn --tasks 5"]["median_s"] + work[100] - work[5]) / \
                r["learn --tasks 5"]["median_s"]
            results["tasks"] = {"store": "40,000 x 384 float32, 100 classes, D = 500", **r}
        if not args.skip_floor:
            store = store_by(args.compare[0] if args.compare else None, tmp / "floor.zarr", 200_000, 10_000)
            results["floor"] = {"store": "200,000 x 768 float32, 100 classes, 10 tasks, D = 1000",
                                **floor_pair(tmp, store, 10, 1000, args.repeats, args.compare)}
        if args.imagenet:
            store = make_store(tmp / "imagenet.zarr", 1_281_167, 50_000, n_classes=1000, dtype="float16")
            results["imagenet"] = {"store": "1,281,167 x 768 float16, 1,000 classes, 10 tasks, D = 2000",
                                   **floor_pair(tmp, store, 10, 2000, 1, [])}
    finish(results, args.json)


if __name__ == "__main__":
    main()
