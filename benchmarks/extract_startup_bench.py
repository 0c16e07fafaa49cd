"""What `foal-pipe extract` costs besides the images: a small extraction as a command, start-up included.

A ViT-B/16 checkpoint (`vit_base_patch16_224`, 86 M parameters, 343 MB as safetensors, random weights) over
--images random 32 px images (half train, half test, an HDF5 file) at 32 px (`--model-kwargs img_size=32`): the
checkpoint is as large as a real one while the encoding is light (5 tokens a block), so the command's seconds are
mostly start-up: imports, hashing and loading the checkpoint, starting the loader workers. Each source tree of
--trees (default: this one) runs the command --repeats times into a fresh store, the trees interleaved (load from
other processes hits them alike), after one round that warms the file cache: median wall and CPU seconds, and
the run log's ``seconds`` (inside :func:`run_extract` after the store was prepared). Recorded checkpoint hashes
go to a temporary folder (``FOAL_PIPE_CACHE_DIR``), removed after.

Usage: python benchmarks/extract_startup_bench.py [--images 2000] [--repeats 5] [--workers 2] [--trees A,B]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
from _runner import add_trees_option, finish, run_cli, tree_rounds


def _inputs(tmp: Path, images: int) -> tuple[Path, Path]:
    """The HDF5 images and the ViT-B/16 checkpoint (random weights, seed 0)."""
    import h5py
    import timm
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    data = tmp / "images.h5"
    with h5py.File(data, "w") as f:
        for split in ("train", "test"):
            f[f"{split}/images"] = rng.integers(0, 256, (images // 2, 32, 32, 3), dtype=np.uint8)
            f[f"{split}/labels"] = rng.integers(0, 10, images // 2)
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, num_classes=0)
    checkpoint = tmp / "vit_b16.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    return data, checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="loader workers (--workers of the command)")
    parser.add_argument("--images", type=int, default=2_000, help="images in all (half train, half test)")
    add_trees_option(parser)
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    load_start = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="extract_startup_"))
    try:
        data, checkpoint = _inputs(tmp, opts.images)
        store = tmp / "store.zarr"
        args = ["extract", "--dataset", "hdf5", "--data-dir", str(data), "--model", "vit_base_patch16_224",
                "--checkpoint", str(checkpoint), "--model-kwargs", "img_size=32", "--image-size", "32",
                "--device", "cpu", "--batch-size", "100", "--workers", str(opts.workers), "--out", str(store)]
        trees = opts.trees.split(",")
        runs: dict[str, list[tuple[float, float, float]]] = {tree: [] for tree in trees}
        for tree, timed in tree_rounds(trees, opts.repeats):
            shutil.rmtree(store, ignore_errors=True)
            store.with_name(store.name + ".log.json").unlink(missing_ok=True)
            run = run_cli(args, env={**os.environ, "PYTHONPATH": tree, "FOAL_PIPE_CACHE_DIR": str(tmp / "cache")})
            if timed:
                log = json.loads(store.with_name(store.name + ".log.json").read_text())
                runs[tree].append((run.seconds, run.cpu_seconds, log["runs"][-1]["seconds"]))
                print(f"{tree}: {run.seconds:.2f} s wall, {run.cpu_seconds:.2f} s CPU", flush=True)
        result = {"command": "foal-pipe " + " ".join(args), "images": opts.images,
                  "checkpoint_bytes": checkpoint.stat().st_size, "repeats": opts.repeats,
                  "trees": {tree: {"wall_s": statistics.median(r[0] for r in rs),
                                   "cpu_s": statistics.median(r[1] for r in rs),
                                   "in_run_extract_s": statistics.median(r[2] for r in rs)} for tree, rs in runs.items()}}
        result["load_start"] = load_start
        finish(result, opts.json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
