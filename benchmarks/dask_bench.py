"""Benchmark ``--scheduler dask``: 1 vs 2 Dask worker processes on this machine.

* ``gram``: the Gram statistics of ``learn``/``sweep`` (projection + sigmoid + per-task ``H^T H`` and
  ``H^T Y``) on a synthetic 500,000 x 768 float32 store (100 classes, 10 tasks, D = 1000), written chunk
  by chunk. Timed: the single-process pass (``--scheduler local``, NumPy's BLAS free to use every core)
  and the Dask pass on an already running LocalCluster of 1 and of 2 single-threaded workers; cluster
  start-up is timed apart. The Dask statistics are checked against the local ones.
* ``extract``: ``foal-pipe extract`` of ``digits`` through timm's vit_tiny_patch16_224 (random weights, at
  64 and 224 px by default), single process (default settings) vs ``--scheduler dask`` with a LocalCluster of 1 and
  of 2 workers; wall time of the command, cluster start-up and model loading included (what a user waits for).

Medians of ``--repeats`` runs. Results are printed as JSON, kept in benchmarks/results/dask_bench.json
(merged with earlier parts) and written as the ``## dask`` section of benchmarks/RESULTS.md (replacing an
older one).

Usage: python benchmarks/dask_bench.py [gram|extract|all] [--rows 500000] [--repeats 3] [--store PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from synthetic import DIM, N_CLASSES, make_store

D = 1000
TINY_VIT = "vit_tiny_patch16_224"
RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> dict[str, str]:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    import dask

    return {"cpu": model, "nproc": str(os.cpu_count()), "date": time.strftime("%Y-%m-%d"), "dask": dask.__version__}


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(round(time.perf_counter() - start, 2))
    return statistics.median(times), times, out


def bench_gram(store: Path, repeats: int) -> dict:
    """The Gram statistics of every train row: one process vs LocalClusters of 1 and 2 workers."""
    from distributed import Client, LocalCluster

    from foal_pipe.core.statistics import RidgeStatistics
    from foal_pipe.model.projection import SmoothProjection
    from foal_pipe.protocol.distributed import dask_statistics
    from foal_pipe.store import open_store

    train = open_store(store).train
    projection = SmoothProjection(n_components=D, random_state=0).fit(np.zeros((1, DIM)))
    everything = np.zeros(train.n_rows, dtype=np.int64)  # one group: every row

    def local() -> RidgeStatistics:
        total = RidgeStatistics.empty(D)
        for lo, X in train.iter_chunks():
            total += RidgeStatistics.from_batch(projection.transform(X), train.labels[lo : lo + len(X)])
        return total

    out: dict = {"rows": train.n_rows, "dim": DIM, "D": D, "classes": N_CLASSES}
    median, runs, ref = timed(local, repeats)
    out["local"] = {"median_s": median, "runs_s": runs}
    print(f"gram local: {median:.1f} s {runs}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    for workers in (1, 2):
        start = time.perf_counter()
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                          silence_logs=50) as cluster, Client(cluster) as client:
            startup = time.perf_counter() - start
            median, runs, got = timed(
                lambda: dask_statistics(client, str(store), everything, 1, train.labels, projection, train.chunk_rows)[0],
                repeats)
        err = max(float(np.abs(ref.G - got.G).max()), float(np.abs(ref.Q - got.Q).max()))
        out[f"dask_{workers}"] = {"median_s": median, "runs_s": runs, "cluster_startup_s": round(startup, 2),
                                  "max_abs_diff_vs_local": err}
        print(f"gram dask x{workers}: {median:.1f} s {runs}, startup {startup:.1f} s, diff {err:.2e}, "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    out["speedup_2_vs_1"] = round(out["dask_1"]["median_s"] / out["dask_2"]["median_s"], 2)
    out["finished"] = finished()
    return out


def finished() -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M %Z')}, load average {os.getloadavg()[0]:.1f}"


def tiny_vit_checkpoint(path: Path, image_size: int) -> Path:
    """timm's vit_tiny_patch16_224 (12 blocks, dim 192) at ``image_size`` px with seeded random weights."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(TINY_VIT, pretrained=False, img_size=image_size)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def bench_extract(work: Path, repeats: int, image_size: int) -> dict:
    """`foal-pipe extract` of digits with a tiny ViT: single process vs LocalClusters of 1 and 2 workers."""
    exe = str(Path(sys.executable).with_name("foal-pipe"))
    work = work / f"extract-{image_size}"
    work.mkdir()
    ckpt = tiny_vit_checkpoint(work / "vit_tiny.safetensors", image_size)
    args = ["--model", TINY_VIT, "--image-size", str(image_size), "--device", "cpu", "--chunk-rows", "128"]
    base = ["extract", "--dataset", "digits", "--checkpoint", str(ckpt), *args]

    def run(extra: list[str], name: str) -> float:
        out = work / f"{name}.zarr"
        start = time.perf_counter()
        proc = subprocess.run([exe, *base, "--out", str(out), *extra], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"extract {extra} failed:\n{proc.stderr}")
        return round(seconds, 2)

    out: dict = {"dataset": "digits (1,797 images)", "args": " ".join(args) + " (random weights)"}
    for name, extra in (("local", []),
                        ("dask_1", ["--scheduler", "dask", "--workers", "1"]),
                        ("dask_2", ["--scheduler", "dask", "--workers", "2"])):
        runs = []
        for i in range(repeats):
            runs.append(run(extra, f"{name}-{i}"))
            print(f"extract {name}: {runs[-1]} s (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
        out[name] = {"median_s": statistics.median(runs), "runs_s": runs}
    ref = zarr.open_group(str(work / "local-0.zarr"), mode="r")
    for name in ("dask_1", "dask_2"):
        got = zarr.open_group(str(work / f"{name}-0.zarr"), mode="r")
        out[name]["identical_to_local"] = all(
            np.array_equal(np.asarray(ref[k][:]), np.asarray(got[k][:]))
            for k in ("train/features", "train/labels", "test/features", "test/labels")
        )
    out["speedup_2_vs_1"] = round(out["dask_1"]["median_s"] / out["dask_2"]["median_s"], 2)
    out["finished"] = finished()
    return out



def write_section(results: dict) -> None:
    """Replace (or append) the ``## dask`` section of RESULTS.md."""
    m = results["machine"]
    lines = ["## dask", "",
             f"`python benchmarks/dask_bench.py` on {m['cpu']}, nproc {m['nproc']}, dask {m['dask']}. "
             "Medians of the runs listed; workers are processes with one thread each.", ""]
    if "gram" in results:
        g = results["gram"]
        tasks = f"{g['tasks']} tasks, " if "tasks" in g else ""  # since one read per walk: every row in one group
        lines += [f"### Gram statistics, {g['rows']:,} x {g['dim']} float32 store, {g['classes']} classes, "
                  f"{tasks}D = {g['D']}", "",
                  "| run | seconds (median) | runs | cluster start-up s | max abs diff vs local |",
                  "|---|---:|---|---:|---:|",
                  f"| single process (`--scheduler local`, BLAS on all cores) | {g['local']['median_s']:.1f} | "
                  f"{g['local']['runs_s']} | - | - |"]
        for w in (1, 2):
            r = g[f"dask_{w}"]
            lines.append(f"| dask, {w} worker{'s' if w > 1 else ''} | {r['median_s']:.1f} | {r['runs_s']} | "
                         f"{r['cluster_startup_s']:.1f} | {r['max_abs_diff_vs_local']:.1e} |")
        lines += ["", f"2 vs 1 workers: {g['speedup_2_vs_1']:.2f}x. Finished {g.get('finished', '?')}.", ""]
    for e in results.get("extract", []):
        lines += [f"### Extraction, {e['dataset']}, `{e['args']}`", "",
                  "Wall time of the whole command: cluster start-up and each worker's imports and model loading "
                  "included. The single process uses its defaults (one DataLoader worker, torch on every core).", "",
                  "| run | seconds (median) | runs | store identical to single process |", "|---|---:|---|---|",
                  f"| single process | {e['local']['median_s']:.1f} | {e['local']['runs_s']} | - |"]
        for w in (1, 2):
            r = e[f"dask_{w}"]
            lines.append(f"| dask, {w} worker{'s' if w > 1 else ''} | {r['median_s']:.1f} | {r['runs_s']} | "
                         f"{'yes' if r['identical_to_local'] else 'NO'} |")
        lines += ["", f"2 vs 1 workers: {e['speedup_2_vs_1']:.2f}x. Finished {e.get('finished', '?')}.", ""]
    lines += ["How to read these: the single process already uses both cores (multi-threaded BLAS, torch intra-op "
              "threads plus a DataLoader worker), while each Dask worker is one single-threaded process, so on a "
              "2-core machine Dask can at best match it; the 1 vs 2 worker ratio is the scaling that carries over "
              "to more cores, GPUs and nodes. Extraction pays a fixed cost per run (worker processes start, import "
              "torch and timm, load the model), which dominates on small inputs. The machine is shared, so single "
              "runs can be slowed by other jobs: look at the spread of the runs.", ""]
    section = "\n".join(lines)
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(r"^## dask\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="all", choices=("gram", "extract", "all"))
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image-sizes", type=lambda t: [int(v) for v in t.split(",")], default=[64, 224],
                        help="input sides of the tiny ViT for extract, comma-separated (64: start-up dominates; "
                        "224, the model's own size: encoding dominates)")
    parser.add_argument("--store", type=Path, default=None, help="reuse (or create) the synthetic store here")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.what in ("gram", "all"):
            store = args.store or tmp / "synthetic.zarr"
            if not (store / "zarr.json").exists():
                start = time.perf_counter()
                make_store(store, args.rows, 10_000, noise=2.0)
                print(f"wrote {store} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            results["gram"] = bench_gram(store, args.repeats)
        if args.what in ("extract", "all"):
            results["extract"] = [bench_extract(tmp, args.repeats, size) for size in args.image_sizes]
    print(json.dumps(results, indent=2))
    if not args.no_write:
        previous = {}
        marker = RESULTS.parent / "results" / "dask_bench.json"
        marker.parent.mkdir(exist_ok=True)
        if marker.exists():
            previous = json.loads(marker.read_text())
        merged = {**previous, **results}
        marker.write_text(json.dumps(merged, indent=2) + "\n")
        write_section(merged)


if __name__ == "__main__":
    main()
