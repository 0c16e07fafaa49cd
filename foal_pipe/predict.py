"""Predictions from a saved model on a store's split, chunk by chunk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from foal_pipe.classifier import read_model
from foal_pipe.errors import FoalPipeError
from foal_pipe.projection import SmoothProjection
from foal_pipe.store import Split, open_store


def predict_split(model: str | Path, features: str | Path, split: str = "test") -> tuple[np.ndarray, Split, tuple[str, ...]]:
    """Predicted label ids for every row of ``split``, the split itself, and the store's class names."""
    if split not in ("train", "test"):
        raise FoalPipeError(f"unknown split {split!r}; choose train or test")
    tensors, meta = read_model(model)
    if "projection" not in tensors:
        raise FoalPipeError(f"{model} has no 'projection' tensor; pass the model.safetensors that learn wrote")
    store = open_store(features)
    data = store.split(split)
    activation = json.loads(meta.get("activation", '"sigmoid"'))  # files written before activations were options
    projection = SmoothProjection.from_matrix(tensors["projection"], activation=activation)
    if projection.n_features_in_ != data.dim:
        raise FoalPipeError(
            f"the model expects {projection.n_features_in_}-dimensional features but {features} has {data.dim}; "
            "use a store made with the model's encoder"
        )
    W, classes = tensors["W"], tensors["classes"]
    if classes.size and classes.max() >= len(store.classes):
        raise FoalPipeError(f"the model predicts label ids up to {int(classes.max())} but {features} has {len(store.classes)} classes")
    pred = np.empty(data.n_rows, dtype=np.int64)
    for lo, X in data.iter_chunks():
        pred[lo : lo + X.shape[0]] = classes[np.argmax(projection.transform(X) @ W, axis=1)]
    return pred, data, store.classes
