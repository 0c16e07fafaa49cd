"""Benchmark `extract --keep-blocks` (issue 13): what keeping every block's token costs, and what fusing at read
time gives back.

* extraction overhead: whole `run_extract` runs (store creation, loading, resize, forward, chunk writes,
  progress) without and with `--keep-blocks` (float16), interleaved in alternating order so that load from
  other processes hits both; medians, and the median of each pair's ratio. Also the forward alone
  (`features` against `features_and_blocks` on one batch, interleaved), which isolates the hooks and the
  (B, L, d) copy from the store writes.
* store size per row on disk, without blocks, with float16 and with float32 blocks.
* the difference float16 blocks make: features fused at read time from float16 and from float32 blocks
  against the encoder's own fusion (`extract --fusion SPEC`), max abs / max abs, per spec.
* read-time fusion throughput: rows/s of `iter_chunks` over fused splits against plain features.

Models (random weights: speed and rounding do not depend on them): the 4-block 32 px test ViT on digits
(1,797 images; the model costs little, so the store writes weigh most), ViT-Ti/16 and ViT-S/16 at 224 px on
synthetic 32x32 images upsized (the DataLoader of benchmarks/extract_bench.py).

Usage: python benchmarks/blocks_bench.py [--repeats 5] [--models test4,tiny,small] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runner import save  # noqa: E402
from extract_bench import _register_synthetic, machine  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "test4": dict(dataset="digits", model="vit_tiny_patch16_224",
                  model_kwargs=(("depth", 4), ("embed_dim", 32), ("img_size", 32), ("num_heads", 2),
                                ("patch_size", 8)), chunk_rows=256, batch_size=100),
    "tiny": dict(dataset="synthetic", model="vit_tiny_patch16_224", image_size=224, chunk_rows=128, batch_size=32),
    "small": dict(dataset="synthetic", model="vit_small_patch16_224", image_size=224, chunk_rows=128, batch_size=32),
}
SPECS = ("mean-cls", "last", "mean:7-12", "block:6")
SPECS_4 = ("mean-cls", "last", "mean:2-3", "block:2")


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _spec(key: str, out: Path, workers: int, **kw: Any) -> Any:
    from foal_pipe.extract import ExtractSpec

    return ExtractSpec(**{**MODELS[key], "pretrained": False, "out": str(out), "workers": workers, "device": "cpu",
                          **kw})


def extraction(key: str, repeats: int, workers: int, tmp: Path) -> dict[str, Any]:
    """Whole runs without and with --keep-blocks, interleaved; sizes on disk; the last stores are kept."""
    from foal_pipe.extract import run_extract

    times: dict[str, list[float]] = {"features": [], "keep_blocks": []}
    cpu: dict[str, list[float]] = {"features": [], "keep_blocks": []}
    for r in range(repeats + 1):  # the first pair warms caches up and is not counted
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for variant in order:
            out = tmp / f"{key}-{variant}.zarr"
            shutil.rmtree(out, ignore_errors=True)
            spec = _spec(key, out, workers, keep_blocks=variant == "keep_blocks")
            start, start_cpu = time.perf_counter(), time.process_time()
            run_extract(spec)
            if r:
                times[variant].append(time.perf_counter() - start)
                cpu[variant].append(time.process_time() - start_cpu)
    f32 = tmp / f"{key}-keep32.zarr"
    report = run_extract(_spec(key, f32, workers, keep_blocks=True, blocks_dtype="float32"))
    rows = sum(report.rows.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(b / a for a, b in zip(times["features"], times["keep_blocks"]))
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "model": key, "rows": rows, "dim": report.dim, "repeats": repeats, "seconds": times,
        "median_s": med, "overhead_pct_medians": 100 * (med["keep_blocks"] / med["features"] - 1),
        "overhead_pct_paired": 100 * (paired - 1),
        # CPU seconds of this process (the forward, the writes; not the DataLoader workers): less sensitive to
        # other processes on a shared machine than wall time
        "cpu_seconds": cpu, "median_cpu_s": med_cpu,
        "cpu_overhead_pct_medians": 100 * (med_cpu["keep_blocks"] / med_cpu["features"] - 1),
        "bytes_per_row": {"features": _size(tmp / f"{key}-features.zarr") / rows,
                          "keep_blocks_float16": _size(tmp / f"{key}-keep_blocks.zarr") / rows,
                          "keep_blocks_float32": _size(f32) / rows},
    }


def forward(key: str, repeats: int) -> dict[str, Any]:
    """The forward alone: fused features against fused features plus every block's token, one batch."""
    import torch

    from foal_pipe.encoders import EncoderConfig, build_encoder

    cfg = MODELS[key]
    enc = build_encoder(EncoderConfig(cfg["model"], pretrained=False, image_size=cfg.get("image_size"),
                                      model_kwargs=cfg.get("model_kwargs", ()))).load("cpu")
    side = enc.image_size
    x = enc.preprocess(torch.randint(0, 256, (cfg["batch_size"], 3, side, side), dtype=torch.uint8))
    variants = {"features": enc.features, "keep_blocks": enc.features_and_blocks}
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.inference_mode():
        for fn in variants.values():
            fn(x)
        for r in range(repeats * 3):
            for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                start = time.perf_counter()
                variants[name](x)
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(b / a for a, b in zip(times["features"], times["keep_blocks"]))
    return {"model": key, "batch": cfg["batch_size"], "median_s": med,
            "overhead_pct_medians": 100 * (med["keep_blocks"] / med["features"] - 1),
            "overhead_pct_paired": 100 * (paired - 1)}


def rounding(key: str, workers: int, tmp: Path) -> dict[str, Any]:
    """Max abs difference / max abs value of features fused from float16 and float32 blocks, against the
    encoder's own fusion, per spec (test split and train split together)."""
    from foal_pipe.extract import run_extract
    from foal_pipe.store import open_store

    specs = SPECS_4 if key == "test4" else SPECS
    out: dict[str, Any] = {}
    for spec in specs:
        ref_path = tmp / f"{key}-ref-{spec.replace(':', '_')}.zarr"
        run_extract(_spec(key, ref_path, workers, fusion=spec))
        ref = open_store(ref_path)
        out[spec] = {}
        for dtype, path in (("float16", tmp / f"{key}-keep_blocks.zarr"), ("float32", tmp / f"{key}-keep32.zarr")):
            fused = open_store(path, fusion=spec)
            diffs, scale = [], []
            for split in ("train", "test"):
                want = np.asarray(ref.split(split).features[:], dtype=np.float64)
                got = np.concatenate([x for _, x in fused.split(split).iter_chunks()]).astype(np.float64)
                diffs.append(np.abs(got - want).max())
                scale.append(np.abs(want).max())
            out[spec][dtype] = max(diffs) / max(scale)
        shutil.rmtree(ref_path, ignore_errors=True)
    return out


def read_speed(key: str, tmp: Path, repeats: int) -> dict[str, Any]:
    """Rows/s of a full pass over train: plain features, one fusion, and three fusions from one read."""
    from foal_pipe.store import open_store

    path = tmp / f"{key}-keep_blocks.zarr"
    store = open_store(path)
    specs = ["mean-cls", "last", "mean:2-3" if key == "test4" else "mean:7-12"]
    passes = {
        "features": lambda: sum(len(x) for _, x in store.train.iter_chunks()),
        "fused mean-cls": lambda: sum(len(x) for _, x in store.fused("mean-cls").train.iter_chunks()),
        "3 fusions, one read": lambda: sum(len(next(iter(d.values()))) for _, d in
                                           store.fusions(specs)["train"].iter_chunks()),
    }
    times: dict[str, list[float]] = {k: [] for k in passes}
    for _ in range(repeats):
        for name, fn in passes.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    n = store.train.n_rows
    return {k: n / statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="test4,tiny,small")
    parser.add_argument("--images", type=int, default=256, help="synthetic train images (test: one chunk more)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    _register_synthetic(args.images, 128)
    results: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"json": str(args.json)}, "models": []}
    print(json.dumps(results["machine"]), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="blocks_bench_"))
    try:
        for key in args.models.split(","):
            r = {"extraction": extraction(key, args.repeats, args.workers, tmp)}
            e = r["extraction"]
            print(f"{key}: extract {e['median_s']['features']:.2f} s -> {e['median_s']['keep_blocks']:.2f} s with "
                  f"--keep-blocks: {e['overhead_pct_medians']:+.1f}% (paired {e['overhead_pct_paired']:+.1f}%, CPU time "
                  f"{e['cpu_overhead_pct_medians']:+.1f}%); "
                  "bytes/row " + ", ".join(f"{k} {v:,.0f}" for k, v in e["bytes_per_row"].items()), flush=True)
            r["forward"] = forward(key, args.repeats)
            print(f"{key}: forward overhead {r['forward']['overhead_pct_medians']:+.1f}% (paired "
                  f"{r['forward']['overhead_pct_paired']:+.1f}%)", flush=True)
            r["rounding"] = rounding(key, args.workers, tmp)
            print(f"{key}: max|diff|/max|x| vs extract --fusion: " + "; ".join(
                f"{s} f16 {v['float16']:.1e} f32 {v['float32']:.1e}" for s, v in r["rounding"].items()), flush=True)
            r["read_rows_per_s"] = read_speed(key, tmp, args.repeats)
            print(f"{key}: read rows/s " + ", ".join(f"{k} {v:,.0f}" for k, v in r["read_rows_per_s"].items()),
                  flush=True)
            results["models"].append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    save(results, args.json)


if __name__ == "__main__":
    main()
