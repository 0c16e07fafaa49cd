"""``predict --images`` vs ``extract`` on the same image files (issue 11, requirement 6): the same encoder path.

Both read the files in the main process (``extract --workers 0``), resize with PIL to the encoder's size and
encode in batches of 64 on the CPU; ``extract`` then writes a store, ``predict`` projects and scores with a
saved model. Timed: :func:`foal_pipe.extract.run_extract` (a fresh store each time) and
:func:`foal_pipe.model.predict.predict_image_files` (model load, encoder build, encode, score; no CSV), alternated,
medians of --repeats, with torch and BLAS limited to --threads threads.

Encoders: ``pixels`` at 32 px, and timm's ``vit_tiny_patch16_224`` (12 blocks, 192-dim, random weights) at 64 px.

Usage: python benchmarks/deploy_bench.py [--images 1000] [--repeats 3] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ENCODERS = {
    "pixels 32 px": {"model": "pixels", "image_size": 32},
    "vit_tiny 64 px (12 blocks, random weights)": {"model": "vit_tiny_patch16_224", "pretrained": False,
                                                   "model_kwargs": (("img_size", 64),)},
}


def make_images(root: Path, n: int, classes: int = 4) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("test", classes)):
        for i in range(count):
            folder = root / split / f"c{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
    return root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    from foal_pipe.extract import ExtractSpec, run_extract
    from foal_pipe.model.predict import predict_image_files
    from foal_pipe.protocol.commands import run_learn
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(args.threads):
        root = make_images(Path(tmp) / "images", args.images)
        for label, encoder in ENCODERS.items():
            spec = dict(dataset="imagefolder", data_dir=str(root), device="cpu", workers=0, batch_size=64, **encoder)
            store = Path(tmp) / f"store-{encoder['model']}.zarr"
            run_extract(ExtractSpec(out=str(store), **spec))
            run = Path(tmp) / "run"
            shutil.rmtree(run, ignore_errors=True)
            run_learn(store, run, StreamConfig(tasks=1), ModelConfig(projection_dim=1000), EvaluationConfig(),
                      ExecutionConfig(backend="numpy"), log=lambda _: None)
            times: dict[str, list[float]] = {"extract": [], "predict": []}
            for r in range(args.repeats):
                out = Path(tmp) / f"bench{r}.zarr"
                start = time.perf_counter()
                run_extract(ExtractSpec(out=str(out), **spec))
                times["extract"].append(time.perf_counter() - start)
                shutil.rmtree(out)
                start = time.perf_counter()
                predicted = predict_image_files(run / "model.safetensors", [str(root / "train")], batch_size=64)
                times["predict"].append(time.perf_counter() - start)
                assert len(predicted.paths) == args.images
            med = {k: statistics.median(v) for k, v in times.items()}
            results[label] = {"times": times, "median": med, "ratio_predict_over_extract": med["predict"] / med["extract"],
                              "images_per_s": {k: (args.images + (4 if k == "extract" else 0)) / v
                                               for k, v in med.items()}}
            print(f"{label}: extract {med['extract']:.2f} s, predict --images {med['predict']:.2f} s "
                  f"(ratio {med['predict'] / med['extract']:.3f}); runs {times}")
    info = {"machine": platform.processor() or platform.machine(), "nproc": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "images": args.images, "threads": args.threads, "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": results}
    if args.json:
        args.json.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
