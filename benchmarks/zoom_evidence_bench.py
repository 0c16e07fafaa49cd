"""Does leave-one-out's zoom choose as the full refined search does (issue 31)? `learn --gamma auto` per
configuration, twice in this process: as shipped (the zoom) and with the zoom started from every point of the
refined grid (so it evaluates all of them and takes their best: the search before the zoom). Recorded per
configuration and criterion: each run's gammas at every boundary, the points evaluated, the criterion's value at
the choice (``value``: the same sample in both runs, so comparable), A_last and A_avg on the test split, and the
wall seconds.

Usage: python benchmarks/zoom_evidence_bench.py --stores fm=/tmp/fm.zarr,digits=/tmp/digits.zarr
           --configs fm:1000:sigmoid,digits:3000:relu [--selects loo_accuracy,loo] [--tasks 5]
           [--json benchmarks/results/zoom_evidence_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from foal_pipe.cli import app
from foal_pipe.core import gammasearch
from foal_pipe.protocol import solvers


def full_search(size: int, start: Any, evaluate: Any, rules: Any) -> Any:
    """The zoom started from every point: every refined gamma evaluated, the best of them chosen."""
    return gammasearch.zoom(size, np.arange(size), evaluate, rules)


def learn(store: str, dim: int, activation: str, select: str, tasks: int, full: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(solvers, "zoom", full_search if full else solvers.zoom):
        started = time.perf_counter()
        app(["learn", "--features", store, "--out", tmp, "--tasks", str(tasks), "--projection-dim", str(dim),
             "--activation", activation, "--gamma", "auto", "--select", select, "--backend", "numpy"],
            standalone_mode=False)
        seconds = time.perf_counter() - started
        metrics = json.loads((Path(tmp) / "metrics.json").read_text())
    search = metrics["gamma_search"]
    evaluated = search.get("evaluated", [list(range(len(search["gammas"])))] * len(search["values"]))
    chosen = [values[[search["gammas"][i] for i in at].index(g)] for values, at, g in
              zip(search["values"], evaluated, metrics["gammas_selected"])]
    return {"gammas_selected": metrics["gammas_selected"], "points": [len(e) for e in evaluated], "value": chosen,
            "A_last": metrics["A_last"], "A_avg": metrics["A_avg"], "wall_s": round(seconds, 2),
            "refined_points": len(search["gammas"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", required=True)
    parser.add_argument("--configs", required=True)
    parser.add_argument("--selects", default="loo_accuracy")
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("results") / "zoom_evidence_bench.json")
    args = parser.parse_args()
    stores = dict(item.split("=", 1) for item in args.stores.split(","))
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.setdefault("runs", {})
    for config in args.configs.split(","):
        dataset, dim, activation = config.split(":")
        for select in args.selects.split(","):
            load = os.getloadavg()[0]
            entry = {mode: learn(stores[dataset], int(dim), activation, select, args.tasks, mode == "full")
                     for mode in ("zoom", "full")}
            entry.update(same=entry["zoom"]["gammas_selected"] == entry["full"]["gammas_selected"],
                         load_start=load, load_end=os.getloadavg()[0],
                         date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            results["runs"][f"{config}:{select}"] = entry
            z, f = entry["zoom"], entry["full"]
            print(f"{config} {select}: zoom {z['gammas_selected']} A_last {100 * z['A_last']:.2f} ({z['points']} pts, "
                  f"{z['wall_s']} s) | full {f['gammas_selected']} A_last {100 * f['A_last']:.2f} ({f['wall_s']} s)",
                  flush=True)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
