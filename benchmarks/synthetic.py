"""Synthetic ViT-like feature stores for the benchmarks, written chunk by chunk (never whole in memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from foal_pipe.store import StoreMeta, complete_store

N_CLASSES, DIM = 100, 768


def make_store(path: Path, n_train: int, n_test: int, chunk: int = 4096, seed: int = 0, noise: float = 8.0,
               n_classes: int = N_CLASSES, dim: int = DIM, dtype: str = "float32") -> Path:
    """Gaussian class clusters (unit-variance means, ``noise`` std) in a complete feature store, rows in a random
    class order (every chunk holds rows of every class), completed by :func:`~foal_pipe.store.complete_store`
    (which writes the chunk records and the generation id): a store of the current format, ``FORMAT_VERSION``."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, size=(n_classes, dim)).astype(np.float32)
    group = zarr.open_group(str(path), mode="w")
    meta = StoreMeta(classes=tuple(f"class{i}" for i in range(n_classes)), dataset="synthetic",
                     encoder={"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False})
    group.attrs.update(meta.to_dict())
    for split, n in (("train", n_train), ("test", n_test)):
        every = {"write_empty_chunks": True}  # a chunk of zeros (all labels 0) is a file too, as the store's writer makes
        feats = group.create_array(f"{split}/features", shape=(n, dim), chunks=(chunk, dim), dtype=dtype, config=every)
        labels = group.create_array(f"{split}/labels", shape=(n,), chunks=(max(n, 1),), dtype="int64", config=every)
        y = rng.integers(0, n_classes, size=n)
        labels[:] = y
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            rows = means[y[lo:hi]] + rng.normal(0, noise, size=(hi - lo, dim)).astype(np.float32)
            feats[lo:hi] = rows.astype(dtype)
    group.attrs["progress"] = {"train": n_train, "test": n_test}
    complete_store(path)
    return path
