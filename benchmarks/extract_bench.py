"""Benchmark `foal-pipe extract`: encoder speed, fused-forward overhead, end-to-end pipeline, store writes.

Measured in one run, every figure a median over --repeats, the forward variants interleaved so that load
from other processes hits them alike:

* model speed (images/s) of timm ViTs with random weights (speed does not depend on the weights) for three
  forward variants on the same input: `plain` = timm's `forward_features` (CLS after the final norm), the
  baseline; `fused` = foal-pipe's fusion (hooks on the blocks, one (B, d) running sum); `intermediates` =
  the same fusion through timm's `forward_intermediates(..., intermediates_only=True)`, which keeps every
  block's (B, L, d) output alive. Overhead = fused time / plain time - 1.
* end-to-end `extract` (DataLoader workers, resize, encode, chunked store writes) on a synthetic in-memory
  dataset of 32x32 images, registered in the dataset registry: steady-state images/s after the first chunk.
* store write throughput: 1024-row chunks of 768-d features through the extractor's own chunk writer, with
  and without recording progress in the attributes after every chunk (what `extract` does).
* on CUDA (when torch sees a GPU, else skipped with a note): ViT-B/16 at 224 px, bf16 autocast, batch 256:
  model images/s per variant, peak GPU memory per variant, end-to-end images/s and peak memory.
  Targets: >= 2,500 images/s on an H100, < 2 GB at batch 256.

Usage: python benchmarks/extract_bench.py [--quick] [--repeats 7] [--models tiny,small] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _runner import save

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "tiny": "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "small": "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "base": "vit_base_patch16_224.augreg2_in21k_ft_in1k",
}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _intermediates_fused(enc: Any, x: Any) -> Any:
    """The same fusion through timm's forward_intermediates (keeps all block outputs)."""
    import torch

    from foal_pipe.encoders.fusion import final_norm
    from foal_pipe.encoders.runtime import autocast

    model = enc.model
    with autocast(enc.device, enc.precision):
        inter = model.forward_intermediates(x, return_prefix_tokens=True, norm=False, output_fmt="NLC",
                                            intermediates_only=True)
        fused = torch.stack([prefix[:, 0].float() for _spatial, prefix in inter]).mean(dim=0)
        return final_norm(model)(fused).float()


def model_speed(arch: str, image_size: int, batch: int, device: str, precision: str, repeats: int) -> dict[str, Any]:
    """Images/s of plain / fused / intermediates forwards on one random batch; peak memory on CUDA."""
    import torch

    from foal_pipe.encoders import EncoderConfig, build_encoder

    enc = build_encoder(EncoderConfig(arch, pretrained=False, image_size=image_size)).load(device, precision)
    images = torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8)
    x = enc.preprocess(images)
    variants = {"plain": enc.plain_features, "fused": enc.features,
                "intermediates": lambda t: _intermediates_fused(enc, t)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    peak: dict[str, float] = {}
    with torch.inference_mode():
        for name, fn in variants.items():  # warm-up, and peak memory per variant
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            fn(x)
            _sync(device)
            if device == "cuda":
                peak[name] = torch.cuda.max_memory_allocated() / 2**20
        for r in range(repeats):
            order = list(variants)[r % 3:] + list(variants)[: r % 3]  # rotate who goes first
            for name in order:
                _sync(device)
                start = time.perf_counter()
                variants[name](x)
                _sync(device)
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    paired = {k: statistics.median(a / b for a, b in zip(times[k], times["plain"])) for k in times}
    out = {
        "model": arch, "image_size": image_size, "batch": batch, "device": device, "precision": precision,
        "repeats": repeats,
        "images_per_s": {k: batch / v for k, v in med.items()},  # from the median time
        "images_per_s_best": {k: batch / v for k, v in best.items()},  # from the fastest repeat
        "fused_overhead_pct": 100 * (med["fused"] / med["plain"] - 1),
        "intermediates_overhead_pct": 100 * (med["intermediates"] / med["plain"] - 1),
        # the fastest repeats (least disturbed by other processes) and the median of per-repeat ratios
        "fused_overhead_best_pct": 100 * (best["fused"] / best["plain"] - 1),
        "intermediates_overhead_best_pct": 100 * (best["intermediates"] / best["plain"] - 1),
        "fused_overhead_paired_pct": 100 * (paired["fused"] - 1),
        "intermediates_overhead_paired_pct": 100 * (paired["intermediates"] - 1),
    }
    if peak:
        out["peak_gpu_mib"] = peak
    return out


class _Timeline:
    """Progress sink recording when each batch finished."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []

    def start(self, split: str, done: int, total: int) -> None:
        pass

    def advance(self, split: str, n: int) -> None:
        self.events.append((time.perf_counter(), n))


def _register_synthetic(n_train: int, n_test: int, side: int = 32) -> None:
    from foal_pipe.datasets import DATASETS, ArraySource, DatasetEntry, DatasetSplits

    def load(data_dir: Path | None, download: bool) -> DatasetSplits:
        rng = np.random.default_rng(0)
        make = lambda n: ArraySource(rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8),  # noqa: E731
                                     rng.integers(0, 100, n), what="synthetic")
        return DatasetSplits("synthetic", [f"c{k}" for k in range(100)], make(n_train), make(n_test),
                             "in memory", side)

    DATASETS["synthetic"] = DatasetEntry(load, "benchmark", "memory", "generated")


def pipeline_speed(arch: str, n_images: int, image_size: int, batch: int, workers: int, device: str,
                   precision: str, chunk_rows: int = 1024) -> dict[str, Any]:
    """End-to-end `run_extract` on synthetic 32x32 images (train = n_images, test = one chunk)."""
    import torch

    from foal_pipe.extract import ExtractSpec, run_extract

    _register_synthetic(n_images, chunk_rows)
    tmp = Path(tempfile.mkdtemp(prefix="extract_bench_"))
    try:
        spec = ExtractSpec(dataset="synthetic", model=arch, pretrained=False, image_size=image_size,
                           out=str(tmp / "s.zarr"), chunk_rows=chunk_rows, batch_size=batch, workers=workers,
                           device=device, precision=precision)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        timeline = _Timeline()
        start = time.perf_counter()
        report = run_extract(spec, progress=timeline)
        wall = time.perf_counter() - start
        # steady state: from the end of the first chunk's batches to the last batch
        done, t0, i0 = 0, None, 0
        for i, (t, n) in enumerate(timeline.events):
            done += n
            if done >= chunk_rows and t0 is None:
                t0, i0 = t, i
        steady_rows = sum(n for _, n in timeline.events[i0 + 1:])
        steady = steady_rows / (timeline.events[-1][0] - t0) if t0 and steady_rows else float("nan")
        out = {"model": arch, "images": n_images + chunk_rows, "image_size": image_size, "batch": batch,
               "workers": workers, "device": report.device, "precision": report.precision, "wall_s": wall,
               "images_per_s_overall": (n_images + chunk_rows) / wall, "images_per_s_steady": steady}
        if device == "cuda":
            out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
            out["peak_gpu_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def store_write_speed(rows: int, dim: int, dtype: str, chunk_rows: int, repeats: int, progress: bool) -> dict[str, Any]:
    """MB/s of chunk writes (plus one progress attribute write per chunk when ``progress``)."""
    from foal_pipe.store import FeatureWriter, StoreMeta, create_skeleton, mark_progress

    rng = np.random.default_rng(0)
    block = rng.standard_normal((chunk_rows, dim)).astype(dtype)  # ViT features are incompressible-ish floats
    secs = []
    for _ in range(repeats):
        tmp = Path(tempfile.mkdtemp(prefix="extract_write_"))
        try:
            labels = {"train": np.zeros(rows, np.int64), "test": np.zeros(1, np.int64)}
            create_skeleton(tmp / "w.zarr", StoreMeta(("a",), "bench", {"name": "bench"}), dim, dtype, chunk_rows,
                            labels)
            writer = FeatureWriter(tmp / "w.zarr", "train")
            start = time.perf_counter()
            for lo in range(0, rows, chunk_rows):
                n = min(chunk_rows, rows - lo)
                writer.write(lo, block[:n])
                if progress:
                    mark_progress(tmp / "w.zarr", "train", lo + n)
            secs.append(time.perf_counter() - start)
            disk = sum(p.stat().st_size for p in (tmp / "w.zarr").rglob("*") if p.is_file())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median(secs)
    raw = rows * dim * np.dtype(dtype).itemsize
    return {"rows": rows, "dim": dim, "dtype": dtype, "chunk_rows": chunk_rows, "progress_attr": progress,
            "seconds": med, "mb_per_s": raw / med / 1e6, "rows_per_s": rows / med, "disk_mb": disk / 1e6}


def machine() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return ""

    import timm
    import torch

    info = {"cpu": sh("lscpu | sed -n 's/^Model name: *//p'"), "nproc": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "loadavg_start": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "date": sh("date -u '+%Y-%m-%d %H:%M UTC'")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", default="tiny,small", help="CPU models among tiny, small, base")
    parser.add_argument("--cpu-batch", type=int, default=16)
    parser.add_argument("--pipeline-images", type=int, default=512, help="CPU end-to-end images (train)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--write-rows", type=int, default=65536)
    parser.add_argument("--gpu-images", type=int, default=50 * 1024, help="CUDA end-to-end images (train)")
    parser.add_argument("--gpu-workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    parser.add_argument("--skip-cpu", action="store_true", help="only the CUDA part (on a GPU machine)")
    parser.add_argument("--json", type=Path, help="also write all results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.models, args.cpu_batch, args.pipeline_images, args.write_rows = 2, "tiny", 4, 64, 4096
        args.gpu_images = 4096

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"machine": machine(), "cpu_models": [], "cpu_pipeline": None, "store_write": [],
                               "gpu": None}
    print(json.dumps(results["machine"]))
    if not args.skip_cpu:
        for key in args.models.split(","):
            r = model_speed(MODELS[key], 224, args.cpu_batch, "cpu", "fp32", args.repeats)
            results["cpu_models"].append(r)
            print(f"cpu {key:5s} 224px b{args.cpu_batch}: " + ", ".join(f"{k} {v:.1f} img/s" for k, v in
                  r["images_per_s"].items()) + f"; fused overhead median {r['fused_overhead_pct']:+.1f}%, best "
                  f"{r['fused_overhead_best_pct']:+.1f}%, paired {r['fused_overhead_paired_pct']:+.1f}%; intermediates "
                  f"median {r['intermediates_overhead_pct']:+.1f}%, best {r['intermediates_overhead_best_pct']:+.1f}%",
                  flush=True)
        r = pipeline_speed(MODELS["tiny"], args.pipeline_images, 224, 32, min(2, os.cpu_count() or 1) - 1, "cpu",
                           "fp32", chunk_rows=256 if not args.quick else 32)
        results["cpu_pipeline"] = r
        print(f"cpu pipeline tiny 224px: {r['images_per_s_steady']:.1f} img/s steady, "
              f"{r['images_per_s_overall']:.1f} overall ({r['wall_s']:.1f} s)", flush=True)
        for dtype in ("float32", "float16"):
            for prog in (False, True):
                w = store_write_speed(args.write_rows, 768, dtype, 1024, max(3, args.repeats // 2), prog)
                results["store_write"].append(w)
                print(f"store write {dtype} progress={prog}: {w['mb_per_s']:.0f} MB/s, {w['rows_per_s']:,.0f} rows/s, "
                      f"{w['disk_mb']:.0f} MB on disk", flush=True)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        gpu: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
        gpu["model"] = model_speed(MODELS["base"], 224, 256, "cuda", "bf16", max(args.repeats, 10))
        print("gpu ViT-B/16 224px bf16 b256: " + ", ".join(f"{k} {v:,.0f} img/s" for k, v in
              gpu["model"]["images_per_s"].items()) + f"; peak MiB {gpu['model']['peak_gpu_mib']}", flush=True)
        gpu["pipeline"] = pipeline_speed(MODELS["base"], args.gpu_images, 224, 256, args.gpu_workers, "cuda", "bf16")
        p = gpu["pipeline"]
        print(f"gpu pipeline ViT-B/16: {p['images_per_s_steady']:,.0f} img/s steady, {p['images_per_s_overall']:,.0f} "
              f"overall, peak {p['peak_gpu_mib']:.0f} MiB allocated / {p['peak_gpu_reserved_mib']:.0f} MiB reserved",
              flush=True)
        results["gpu"] = gpu
    else:
        results["gpu"] = {"skipped": "torch.cuda.is_available() is False: GPU figures not measured on this machine"}
        print("gpu: skipped (no CUDA device visible to torch); GPU figures not measured", flush=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    save(results, args.json)


if __name__ == "__main__":
    main()
