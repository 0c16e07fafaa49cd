"""Byte-identity harness: the sha256 of every output of a fixed list of CLI runs, for one source tree.

A refactoring that must not change ridge's (or any head's) outputs is checked by running this on the tree before
and after it and diffing the two JSON files:

    python benchmarks/identity_check.py --tree /work/main --out before.json
    python benchmarks/identity_check.py --tree . --out after.json
    python benchmarks/identity_check.py --compare before.json after.json

Each tree runs in its own process with the tree first on ``sys.path``; the store (a small blocks store of
Gaussian classes, written with ``write_store``), a second plain store for the continuations, and every run live
in one temp directory that is deleted after.
Files left out: ``timings.json`` (wall-clock seconds). Nothing else the runs write holds a time or the temp path:
``metrics.json``/``sweep.json`` record the store's path as given on the command line, which is relative here (the
runs execute inside the temp directory), and the model files record the store's generation hash, not a path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = ("timings.json",)

COMMON = ("--tasks", "3", "--projection-dim", "40", "--batch-size", "16")
#: name -> CLI arguments (``{S}``: the store, ``{R}``: the runs folder; a run's output is ``{R}/<name>``).
VARIANTS: dict[str, tuple[str, ...]] = {
    "learn": ("learn", *COMMON),
    "learn-gamma-auto": ("learn", *COMMON, "--gamma", "auto"),
    "learn-gamma-auto-gcv": ("learn", *COMMON, "--gamma", "auto", "--select", "gcv"),
    "learn-engine-rls": ("learn", *COMMON, "--engine", "rls"),
    "learn-order-seeds": ("learn", *COMMON, "--order-seeds", "0,1"),
    "learn-fusion": ("learn", *COMMON, "--fusion", "mean:1-2"),
    "learn-eval-every": ("learn", *COMMON, "--eval-every", "50"),
    "learn-float32": ("learn", *COMMON, "--dtype", "float32"),
    "learn-si-blurry": ("learn", *COMMON, "--stream", "si-blurry"),
    "learn-head-ncm": ("learn", *COMMON, "--head", "ncm"),
    "learn-head-slda": ("learn", *COMMON, "--head", "slda"),
    "learn-head-fecam": ("learn", *COMMON, "--head", "fecam"),
    "learn-head-cosine": ("learn", *COMMON, "--head", "cosine"),
    "learn-head-balanced": ("learn", *COMMON, "--head", "balanced"),
    "learn-head-dual": ("learn", *COMMON, "--head", "dual"),
    "learn-head-slda-relu": ("learn", *COMMON, "--head", "slda", "--activation", "relu"),
    "continue-ridge": ("learn", "--features", "b.zarr", "--tasks", "2", "--init-model", "{R}/learn/model.safetensors",
                       "--eval-features", "{S}"),
    "continue-ncm": ("learn", "--features", "b.zarr", "--tasks", "2",
                     "--init-model", "{R}/learn-head-ncm/model.safetensors"),
    "sweep": ("sweep", *COMMON, "--gammas", "0.1,1,10"),
    "sweep-fusions": ("sweep", *COMMON, "--gammas", "0.1,1,10", "--fusions", "last,mean:1-2"),
    "sweep-heads": ("sweep", *COMMON, "--gammas", "0.1,1,10", "--heads", "ridge,ncm,slda"),
    "sweep-order-seeds": ("sweep", *COMMON, "--gammas", "0.1,1", "--order-seeds", "0,1"),
    "slda-oas": ("learn", *COMMON, "--head", "slda", "--shrinkage", "oas"),
    "fecam-opts": ("learn", *COMMON, "--head", "fecam", "--shrinkage", "0.5", "--shrinkage-offdiag", "0.3"),
    "dual-opts": ("learn", *COMMON, "--head", "dual", "--compensation", "0.7", "--gamma-comp", "2", "--gamma", "0.5"),
    "balanced-gamma": ("learn", *COMMON, "--head", "balanced", "--gamma", "0.5"),
    "slda-orders": ("learn", *COMMON, "--head", "slda", "--shrinkage", "0.25", "--order-seeds", "0,1"),
    "sweep-heads-opts": ("sweep", *COMMON, "--gammas", "0.1,1", "--heads", "ridge,slda,fecam,dual", "--shrinkage", "0.25",
                         "--compensation", "0.5"),
    "sweep-heads-orders": ("sweep", *COMMON, "--gammas", "0.1,1", "--heads", "ridge,slda,dual", "--shrinkage", "0.25",
                           "--order-seeds", "0,1"),
    "table": ("table", "--tasks", "3", "--projection-dim", "16", "--order-seeds", "0,1", "--heads", "ridge,slda,fecam,dual",
              "--shrinkage", "0.25", "--compensation", "0.5", "--gamma", "1"),
    "table-auto": ("table", "--tasks", "3", "--projection-dim", "16", "--order-seeds", "0", "--heads", "ridge,ncm,balanced",
                   "--gamma", "auto"),
    "continue-slda": ("learn", "--features", "b.zarr", "--tasks", "2", "--init-model", "{R}/slda-oas/model.safetensors",
                      "--shrinkage", "oas"),
    "continue-dual": ("learn", "--features", "b.zarr", "--tasks", "2", "--init-model", "{R}/dual-opts/model.safetensors",
                      "--batch-size", "16"),
}
#: Commands on a run made above: name -> arguments (``predict`` writes a CSV, ``evaluate`` a folder).
AFTER: dict[str, tuple[str, ...]] = {
    "predict-ridge": ("predict", "--model", "{R}/learn/model.safetensors", "--features", "{S}",
                      "--out", "{R}/predict-ridge/predictions.csv"),
    "predict-slda": ("predict", "--model", "{R}/learn-head-slda/model.safetensors", "--features", "{S}",
                     "--out", "{R}/predict-slda/predictions.csv"),
    "evaluate-ridge": ("evaluate", "--run", "{R}/learn", "--out", "{R}/evaluate-ridge", "--no-plots"),
    "evaluate-fecam": ("evaluate", "--run", "{R}/learn-head-fecam", "--out", "{R}/evaluate-fecam", "--no-plots"),
    "predict-dual": ("predict", "--model", "{R}/dual-opts/model.safetensors", "--features", "{S}",
                     "--out", "{R}/predict-dual/predictions.csv"),
}


def _store(path: Path) -> None:
    import numpy as np

    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    n_classes, blocks, dim = 9, 3, 12
    means = rng.normal(size=(n_classes, dim))
    y = rng.integers(0, n_classes, 600)
    tokens = (means[y, None, :] + 1.5 * rng.normal(size=(600, blocks, dim))).astype(np.float32)
    names = [f"c{i}" for i in range(n_classes)]
    write_store(path / "s.zarr", (tokens[:450, -1], y[:450]), (tokens[450:, -1], y[450:]), names,
                chunk_rows=64, blocks=(tokens[:450], tokens[450:]))
    # the continuation's store: three new classes and two known ones, in another order
    y = rng.integers(0, 5, 200)
    x = (rng.normal(size=(5, dim))[y] + 1.5 * rng.normal(size=(200, dim))).astype(np.float32)
    write_store(path / "b.zarr", (x[:150], y[:150]), (x[150:], y[150:]), ["n0", "c3", "n1", "c0", "n2"], chunk_rows=64)


def _worker(out: Path) -> None:
    """Run every variant in this process (the tree is first on sys.path) and write {relative path: sha256}."""
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    runner = CliRunner()
    hashes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        _store(Path("."))
        for name, args in [*VARIANTS.items(), *AFTER.items()]:
            argv = [a.format(S="s.zarr", R="runs") for a in args]
            if name in VARIANTS:
                store = () if "--features" in argv else ("--features", "s.zarr")
                argv = [argv[0], *store, "--out", f"runs/{name}", *argv[1:]]
            Path("runs", name).mkdir(parents=True, exist_ok=True)
            result = runner.invoke(app, argv)
            if result.exit_code != 0:
                hashes[f"{name}/EXIT"] = f"{result.exit_code}: {result.output.strip()[-300:]}"
        for path in sorted(Path("runs").rglob("*")):
            if path.is_file() and path.name not in SKIP:
                hashes[path.relative_to("runs").as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    out.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")


def _compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = sorted(k for k in left.keys() & right.keys() if left[k] != right[k])
    only = sorted(left.keys() ^ right.keys())
    print(f"{len(VARIANTS) + len(AFTER)} variants, {len(left.keys() & right.keys())} files compared: "
          f"{len(differ)} differ, {len(only)} in one only")
    for key in differ + only:
        print(f"  {key}: {left.get(key)} != {right.get(key)}")
    return 1 if differ or only else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="the source tree (its foal_pipe/ is imported)")
    parser.add_argument("--out", type=Path, help="where to write the hashes (JSON)")
    parser.add_argument("--compare", type=Path, nargs=2, help="two hash files to compare")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        return _compare(*args.compare)
    if args.worker:
        _worker(args.out.resolve())
        return 0
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve()), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, __file__, "--worker", "--out", str(args.out.resolve())], env=env,
                          check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
