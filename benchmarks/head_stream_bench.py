"""A head estimator fed a stream of small ``partial_fit`` calls: the seconds of ``--calls`` calls of ``--rows`` rows
and one prediction after them, and of the same calls with a prediction after each, per head, for each source tree.

Each (tree, head) runs in a fresh interpreter with the tree first on ``sys.path``, trees interleaved round by round,
medians over ``--repeats``; the predictions of every tree are compared (they must be equal, to the bit):

    python benchmarks/head_stream_bench.py --trees /tmp/before,. --out benchmarks/results/head_stream_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _runner import add_trees_option, finish, header, tree_rounds

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
from foal_pipe.model.headestimator import head_classifier

head, dim, classes, calls, rows = sys.argv[1], *map(int, sys.argv[2:6])
rng = np.random.default_rng(0)
X0, y0 = rng.normal(size=(20 * classes, dim)), np.arange(20 * classes) % classes
batches = [(rng.normal(size=(rows, dim)), rng.integers(0, classes, rows)) for _ in range(calls)]
probe = rng.normal(size=(200, dim))
out, digest = {}, hashlib.sha256()
for each in (False, True):
    est = head_classifier(head).fit(X0, y0)
    start = time.perf_counter()
    for X, y in batches:
        est.partial_fit(X, y)
        if each:
            digest.update(est.predict(X).tobytes())
    digest.update(est.class_scores(probe).tobytes())
    out["predict_each" if each else "predict_once"] = time.perf_counter() - start
out["sha256"] = digest.hexdigest()
print(json.dumps(out))
"""


def run(tree: Path, head: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-c", CHILD, head, *(str(v) for v in (args.dim, args.classes, args.calls, args.rows))]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trees_option(parser)
    parser.add_argument("--heads", default="ncm,slda,fecam,balanced,dual")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    heads = args.heads.split(",")
    results = header(settings={k: v for k, v in vars(args).items() if k != "out"}, heads={})
    raw: dict[str, dict[str, list[dict]]] = {h: {t: [] for t in trees} for h in heads}
    for tree, timed in tree_rounds(trees, args.repeats):
        for head in heads:
            result = run(Path(tree), head, args)
            if timed:
                raw[head][tree].append(result)
    for head in heads:
        row = {t: {k: statistics.median(r[k] for r in raw[head][t]) for k in ("predict_once", "predict_each")}
               for t in trees}
        digests = {r["sha256"] for t in trees for r in raw[head][t]}
        results["heads"][head] = {"trees": row, "identical_predictions": len(digests) == 1}
    finish(results, args.out)


if __name__ == "__main__":
    main()
