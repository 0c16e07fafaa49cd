"""``learn`` with the foal-pipe code of two source trees side by side (a refactoring's cost, e.g. issue 30's one walk).

Each variant runs as a subprocess with one tree first on ``PYTHONPATH`` and one BLAS thread, the trees interleaved in
every round so that load from other processes hits each alike; reported per variant: the wall and CPU seconds
(children's user + system) of every run, their medians, the ratio B / A, and whether the two trees wrote the same
``metrics.json`` and ``model.safetensors`` bytes. The store is synthetic (:func:`synthetic.make_store`).

Usage: python benchmarks/learn_ab_bench.py --a /work/main --b . [--rows 30000] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic import make_store

VARIANTS = {
    "ridge D=1000": ["--projection-dim", "1000"],
    "slda": ["--head", "slda"],
    "ridge --gamma auto D=500": ["--projection-dim", "500", "--gamma", "auto"],
    "ridge --engine rls D=500": ["--projection-dim", "500", "--engine", "rls"],
}
CLI = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"


def _learn(tree: Path, store: Path, out: Path, extra: list[str]) -> tuple[float, float, bytes]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", CLI, "learn", "--features", str(store), "--out", str(out), "--backend",
                    "numpy", *extra], env=env, check=True, capture_output=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    written = (out / "metrics.json").read_bytes() + (out / "model.safetensors").read_bytes()
    shutil.rmtree(out)
    return wall, cpu, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="tree A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="tree B")
    parser.add_argument("--rows", type=int, default=30000, help="train rows (test rows: a fifth)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    runs: dict[str, dict[str, dict[str, list]]] = {v: {t: {"wall": [], "cpu": [], "bytes": []} for t in trees}
                                                   for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(Path(tmp) / "s.zarr", args.rows, args.rows // 5)
        for _ in range(args.repeats):
            for variant, extra in VARIANTS.items():
                for name, tree in trees.items():
                    wall, cpu, written = _learn(tree, store, Path(tmp) / "out", extra)
                    runs[variant][name]["wall"].append(round(wall, 2))
                    runs[variant][name]["cpu"].append(round(cpu, 2))
                    runs[variant][name]["bytes"].append(written)
    results = {}
    for variant, by_tree in runs.items():
        same = len({b for t in by_tree.values() for b in t["bytes"]}) == 1
        row = {"identical": same}
        for key in ("wall", "cpu"):
            medians = {t: statistics.median(by_tree[t][key]) for t in trees}
            row[key] = {t: by_tree[t][key] for t in trees} | {"ratio": round(medians["B"] / medians["A"], 3)}
        results[variant] = row
        print(variant, json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "rows": args.rows,
                                         "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
