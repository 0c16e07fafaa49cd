"""Gamma selection by evidence and its cost (issue 23): the refined search's selectors, and `--gamma auto` vs `--gamma 1`.

``evidence``: one `foal-pipe sweep` (with the leave-one-out pass) per configuration DATASET:D:ACTIVATION:INIT
gives, from the one walk, every criterion's refined choice at every boundary (LOO MSE, GCV, LOO accuracy) and the
test accuracy of the models so chosen (``selections`` in sweep.json): the selectors compared on the same stream.
``auto``: `learn --gamma auto` per configuration and `--selects` item: its choices' test accuracy and cost.
``pair``: `learn --gamma 1` and `learn --gamma auto --select S` (each S given) run interleaved (round-robin)
``--repeats`` times at one width; medians of wall and CPU seconds, ratios to `--gamma 1`, A_last of each.
Every child runs with ``--threads`` BLAS threads (`_runner.blas_env`); results are merged into --json after
every run, so partial runs are kept.

Usage: python benchmarks/gamma_select_bench.py evidence --stores fm=/tmp/fm.zarr,digits=/tmp/digits.zarr
           --configs fm:1000:sigmoid:uniform,fm:1000:relu:normal [--tasks 5]
       python benchmarks/gamma_select_bench.py pair --store /tmp/fm.zarr --dim 3000 --activation relu
           --init normal --selects gcv [--repeats 3] [--tasks 5]
           (--selects loo_accuracy@4096: leave-one-out accuracy on 4,096 sampled rows, `--loo-sample 4096`)
       python benchmarks/gamma_select_bench.py table   (the evidence of --json as a Markdown table)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _runner import blas_env, run_cli

RESULTS = Path(__file__).with_name("results") / "gamma_select_bench.json"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _save(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def _model_args(dim: int, activation: str, init: str, tasks: int) -> list[str]:
    return ["--tasks", str(tasks), "--projection-dim", str(dim), "--activation", activation, "--projection-init", init,
            "--backend", "numpy"]


def evidence(args: argparse.Namespace, env: dict[str, str], results: dict) -> None:
    stores = dict(item.split("=", 1) for item in args.stores.split(","))
    runs = results.setdefault("evidence", {})
    for config in args.configs.split(","):
        dataset, dim, activation, init = config.split(":")
        with tempfile.TemporaryDirectory() as tmp:
            out, load, started = Path(tmp) / "sweep", os.getloadavg(), _now()
            run = run_cli(["sweep", "--features", stores[dataset], "--out", str(out),
                           *_model_args(int(dim), activation, init, args.tasks)], env)
            report = json.loads((out / "sweep.json").read_text())
            timings = json.loads((out / "timings.json").read_text())
        oracle = max(report["results"], key=lambda r: r["A_last"])
        runs[config] = {
            "started": started, "load_start": list(load), "load_end": list(os.getloadavg()),
            "wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2), "peak_rss_mib": round(run.peak_rss_mib),
            "timings": timings, "n_train_seen": report["n_train_seen"],
            "selections": {s["criterion"]: {k: s[k] for k in ("A_last", "A_avg", "F", "gammas_selected", "at_edge")}
                           for s in report["selections"]},
            "decade_choice": {"loo": report["best_gamma"], "test_A_avg": report["best_gamma_test"]},
            "decade_oracle_A_last": {"gamma": oracle["gamma"], "A_last": oracle["A_last"]},
            "decades": {f"{r['gamma']:g}": {"A_last": r["A_last"], "A_avg": r["A_avg"]} for r in report["results"]},
        }
        print(json.dumps({config: {k: (v["A_last"], v["A_avg"], v["gammas_selected"])
                                   for k, v in runs[config]["selections"].items()}}), flush=True)
        _save(results, args.json)


def auto(args: argparse.Namespace, env: dict[str, str], results: dict) -> None:
    """`learn --gamma auto --select S` (each S of --selects, CRITERION@M for --loo-sample M) per configuration of
    --configs: the test accuracy of its choices, to set beside the evidence's exact selections."""
    stores = dict(item.split("=", 1) for item in args.stores.split(","))
    runs = results.setdefault("auto", {})
    for config in args.configs.split(","):
        dataset, dim, activation, init = config.split(":")
        for select in args.selects.split(","):
            name, extra = _auto(select)
            with tempfile.TemporaryDirectory() as tmp:
                out, load, started = Path(tmp) / "out", os.getloadavg(), _now()
                run = run_cli(["learn", "--features", stores[dataset], "--out", str(out), *extra,
                               *_model_args(int(dim), activation, init, args.tasks)], env)
                metrics = json.loads((out / "metrics.json").read_text())
                timings = json.loads((out / "timings.json").read_text())
            search = metrics["gamma_search"]
            runs.setdefault(config, {})[name] = {
                "started": started, "load_start": list(load), "load_end": list(os.getloadavg()),
                "wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2),
                "peak_rss_mib": round(run.peak_rss_mib), "A_last": metrics["A_last"], "A_avg": metrics["A_avg"],
                "gammas_selected": metrics["gammas_selected"], "timings": timings,
                "sample": {k: search[k] for k in ("loo_sample", "sample_rows", "sample_eps", "sample_delta") if k in search}}
            print(f"{config} {name}: A_last {100 * metrics['A_last']:.2f} A_avg {100 * metrics['A_avg']:.2f} cpu "
                  f"{run.cpu_seconds:.1f} s gammas {metrics['gammas_selected']}", flush=True)
            _save(results, args.json)


def _auto(select: str) -> tuple[str, list[str]]:
    """A `--selects` item: CRITERION, or CRITERION@M for leave-one-out on M sampled rows (`--loo-sample M`)."""
    criterion, _, sample = select.partition("@")
    extra = ["--select", criterion] + (["--loo-sample", sample] if sample else [])
    return "learn --gamma auto " + " ".join(extra), ["--gamma", "auto", *extra]


def pair(args: argparse.Namespace, env: dict[str, str], results: dict) -> None:
    commands = {"learn --gamma 1": ["--gamma", "1"], **dict(_auto(s) for s in args.selects.split(","))}
    common = ["--features", args.store, *_model_args(args.dim, args.activation, args.init, args.tasks)]
    key = f"D={args.dim} {args.activation} {args.init}"
    entry = results.setdefault("pair", {}).setdefault(key, {"runs": {name: [] for name in commands}})
    entry.update(started=_now(), load_start=list(os.getloadavg()), repeats=args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, extra in commands.items():
                out = Path(tmp) / "out"
                run = run_cli(["learn", *common, *extra, "--out", str(out)], env)
                metrics = json.loads((out / "metrics.json").read_text())
                entry["runs"][name].append({
                    "wall_s": round(run.seconds, 2), "cpu_s": round(run.cpu_seconds, 2),
                    "peak_rss_mib": round(run.peak_rss_mib), "A_last": metrics["A_last"], "A_avg": metrics["A_avg"],
                    "gammas_selected": metrics.get("gammas_selected"),
                    "timings": json.loads((out / "timings.json").read_text())})
                print(f"{name:<40} wall {run.seconds:7.1f} s  cpu {run.cpu_seconds:7.1f} s  A_last "
                      f"{100 * metrics['A_last']:.2f}", flush=True)
                entry["load_end"] = list(os.getloadavg())
                _save(results, args.json)
    base = {k: statistics.median(r[k] for r in entry["runs"]["learn --gamma 1"]) for k in ("wall_s", "cpu_s")}
    entry["medians"] = {name: {**{k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")},
                               **{f"{k}_ratio": statistics.median(r[k] for r in rs) / base[k] for k in ("wall_s", "cpu_s")}}
                        for name, rs in entry["runs"].items()}
    print(json.dumps(entry["medians"], indent=1))
    _save(results, args.json)


SHORT = {"loo": "LOO MSE", "gcv": "GCV", "loo_accuracy": "LOO acc"}


def table(args: argparse.Namespace, env: dict[str, str], results: dict) -> None:
    """The evidence as a Markdown table, and each selector's count of configurations where it is best or tied."""
    wins = {name: [0, 0] for name in SHORT}
    print("| configuration | " + " | ".join(f"{v} A_last / A_avg % (gamma at the last boundary)" for v in SHORT.values())
          + " | decade oracle A_last % | CPU s |")
    print("|---|" + "---:|" * (len(SHORT) + 2))
    for config, run in results.get("evidence", {}).items():
        sel = {name: {**s, **{k: round(100 * s[k], 2) / 100 for k in ("A_last", "A_avg")}}  # equal as printed: tied
               for name, s in run["selections"].items()}
        best = [max(s[k] for s in sel.values()) for k in ("A_last", "A_avg")]
        cells = []
        for name in SHORT:
            s = sel[name]
            marks = [s[k] == b for k, b in zip(("A_last", "A_avg"), best)]
            for i, m in enumerate(marks):
                wins[name][i] += m
            text = [f"**{100 * s[k]:.2f}**" if m else f"{100 * s[k]:.2f}" for k, m in zip(("A_last", "A_avg"), marks)]
            cells.append(f"{text[0]} / {text[1]} ({s['gammas_selected'][-1]:.3g})")
        oracle = run["decade_oracle_A_last"]
        print(f"| {config} | " + " | ".join(cells) + f" | {100 * oracle['A_last']:.2f} ({oracle['gamma']:g}) | "
              f"{run['cpu_s']:.0f} |")
    print("\nbest or tied (A_last, A_avg): " + ", ".join(f"{SHORT[n]} {w[0]}, {w[1]}" for n, w in wins.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("evidence", "pair", "auto", "table"))
    parser.add_argument("--stores", default="", help="evidence: NAME=PATH,... of feature stores")
    parser.add_argument("--configs", default="", help="evidence: DATASET:D:ACTIVATION:INIT,...")
    parser.add_argument("--store", default="", help="pair: the feature store")
    parser.add_argument("--dim", type=int, default=3000)
    parser.add_argument("--activation", default="relu")
    parser.add_argument("--init", default="normal")
    parser.add_argument("--selects", default="gcv", help="pair: the --select values of `--gamma auto`; "
                        "CRITERION@M adds --loo-sample M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads of every subprocess")
    parser.add_argument("--json", type=Path, default=RESULTS, help="results file, merged into when it exists")
    args = parser.parse_args()
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.update(threads=args.threads, machine=f"{os.cpu_count()} cores")
    if args.mode == "table":
        table(args, {}, json.loads(args.json.read_text()))
        return
    {"evidence": evidence, "pair": pair, "auto": auto}[args.mode](args, blas_env(args.threads), results)


if __name__ == "__main__":
    main()
