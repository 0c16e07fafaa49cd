"""Seconds of building a checkpoint's model (``weights.load_model`` of a ``--checkpoint``: read, hash, build,
load), in source trees side by side, e.g. a baseline checkout against this one.

A ViT-B/16 checkpoint (``vit_base_patch16_224``, random weights, seed 0, 343 MB as safetensors, as
``benchmarks/gpu_check.py`` writes it). Each run is a fresh process that imports foal_pipe from a tree, describes
the encoder (as ``extract`` does before loading) and times its first ``load_model``, as ``extract`` pays it; then
it hashes every tensor of the model (names, dtypes, shapes, bytes), so the trees' models can be compared bit for
bit. The trees are interleaved, --repeats rounds after one that warms the file cache; the median is reported.
Recorded checkpoint hashes go to a temporary folder (``FOAL_PIPE_CACHE_DIR``), removed after.

Usage: python benchmarks/checkpoint_model_bench.py [--repeats 5] [--trees A,B] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _runner import add_trees_option, save, tree_rounds

MODEL = "vit_base_patch16_224"
CHILD = """
import hashlib, json, sys, time
import foal_pipe
from foal_pipe.encoders import EncoderConfig, build_encoder, weights
encoder = build_encoder(EncoderConfig(sys.argv[1], checkpoint=sys.argv[2]))
start = time.perf_counter()
model = weights.load_model(encoder.arch, encoder.weights, encoder.name)
seconds = time.perf_counter() - start
digest = hashlib.sha256(f"training={model.training}".encode())
for name, value in [*model.named_parameters(), *model.named_buffers()]:
    digest.update(f"{name} {value.dtype} {tuple(value.shape)} {value.stride()} {value.requires_grad}".encode())
    digest.update(value.detach().numpy().tobytes())
print(json.dumps({"seconds": seconds, "sha256": digest.hexdigest(), "tree": foal_pipe.__file__}))
"""


def _checkpoint(path: Path) -> None:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_trees_option(parser)
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    load_start = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="checkpoint_model_"))
    try:
        path = tmp / "checkpoint.safetensors"
        _checkpoint(path)
        trees = opts.trees.split(",")
        runs: dict[str, list[dict]] = {tree: [] for tree in trees}
        for tree, timed in tree_rounds(trees, opts.repeats):
            env = {**os.environ, "PYTHONPATH": tree, "FOAL_PIPE_CACHE_DIR": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
            done = subprocess.run([sys.executable, "-c", CHILD, MODEL, str(path)], env=env, check=True, cwd=tmp,
                                  capture_output=True, text=True)
            run = json.loads(done.stdout.splitlines()[-1])
            if timed:
                runs[tree].append(run)
                print(f"{tree}: {run['seconds']:.3f} s (foal_pipe from {run['tree']})", flush=True)
        result = {"model": MODEL, "checkpoint_bytes": path.stat().st_size, "repeats": opts.repeats,
                  "seconds": {tree: [r["seconds"] for r in rs] for tree, rs in runs.items()},
                  "median_seconds": {tree: statistics.median(r["seconds"] for r in rs) for tree, rs in runs.items()},
                  "tensor_sha256": {tree: sorted({r["sha256"] for r in rs}) for tree, rs in runs.items()},
                  "load_average": [load_start, os.getloadavg()[0]]}
        print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
        save(result, opts.json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
