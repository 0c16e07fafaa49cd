"""Seconds of building a checkpoint's model (``weights._checkpoint_model``: read, hash, build, load): built on
``meta`` and given the file's tensors, against timm's random init + ``load_state_dict`` copy (the same function with
the meta path switched off, as for a model the state dict does not fill).

A ViT-B/16 checkpoint (``vit_base_patch16_224``, random weights, seed 0, 343 MB as safetensors, as
``benchmarks/gpu_check.py`` writes it), the two paths interleaved in one process after one warm-up round of each
(file cache, imports): the median of --repeats, and whether the two models' tensors are equal bit for bit.
Recorded checkpoint hashes go to a temporary folder (``FOAL_PIPE_CACHE_DIR``), removed after.

Usage: python benchmarks/checkpoint_model_bench.py [--repeats 5] [--model vit_base_patch16_224] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _same_bits(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and sa[k].numpy().tobytes() == sb[k].numpy().tobytes() for k in sa)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="checkpoint_model_"))
    os.environ["FOAL_PIPE_CACHE_DIR"] = str(tmp / "cache")
    try:
        import timm
        import torch
        from safetensors.torch import save_file

        from foal_pipe.encoders import EncoderConfig, build_encoder, weights

        torch.manual_seed(0)
        model = timm.create_model(opts.model, pretrained=False)
        path = tmp / "checkpoint.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        del model
        encoder = build_encoder(EncoderConfig(opts.model, checkpoint=str(path)))
        filled_by = weights._filled_by
        paths = {"random init + copy": lambda model, keys: False, "meta + assign": filled_by}
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        load_start = os.getloadavg()[0]
        try:
            for repeat in range(opts.repeats + 1):
                for name, rule in paths.items():
                    weights._filled_by = rule
                    start = time.perf_counter()
                    model = weights.load_model(encoder.arch, encoder.weights, encoder.name)
                    took = time.perf_counter() - start
                    del model
                    if repeat:  # the first round warms the file cache and the imports
                        seconds[name].append(took)
                        print(f"{name}: {took:.3f} s", flush=True)
            built = {}
            for name, rule in paths.items():
                weights._filled_by = rule
                built[name] = weights.load_model(encoder.arch, encoder.weights, encoder.name)
        finally:
            weights._filled_by = filled_by
        medians = {name: statistics.median(values) for name, values in seconds.items()}
        result = {"model": opts.model, "checkpoint_bytes": path.stat().st_size, "repeats": opts.repeats,
                  "torch_threads": torch.get_num_threads(), "seconds": seconds, "medians": medians,
                  "ratio": medians["meta + assign"] / medians["random init + copy"],
                  "bit_identical": _same_bits(*built.values()),
                  "load_average": [load_start, os.getloadavg()[0]]}
        print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
        if opts.json:
            opts.json.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
