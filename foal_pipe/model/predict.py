"""Predictions from a saved model on a store's split, chunk by chunk, and their CSV form."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from foal_pipe.core.projection import SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model
from foal_pipe.progress import progress_bar
from foal_pipe.store import SPLITS, UNLABELLED, FeatureStore, open_store
from foal_pipe.store.blockfusion import read_time_fusion

#: The CSV's columns: the store row, the predicted label id and its name, the winning score
#: (``sigmoid(x P) @ W`` for that class), and the label id and name the store holds for the row.
COLUMNS = ("row", "predicted_class", "predicted_name", "score", "true_class", "true_name")


@dataclass
class Predictions:
    """One entry per row of a split: ``predicted`` and ``true`` label ids, ``score`` of the prediction."""

    predicted: np.ndarray
    score: np.ndarray
    true: np.ndarray
    names: tuple[str, ...]  # class names indexed by label id

    @property
    def accuracy(self) -> float:
        labelled = self.true != UNLABELLED
        return float((self.predicted == self.true)[labelled].mean()) if labelled.any() else float("nan")

    def write_csv(self, fh: TextIO) -> None:
        """Write :data:`COLUMNS`, one line per row."""
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(COLUMNS)
        names = self.names
        for i, (p, s, t) in enumerate(zip(self.predicted.tolist(), self.score.tolist(), self.true.tolist())):
            writer.writerow([i, p, names[p], repr(s), t, names[t] if 0 <= t < len(names) else ""])


def predict_split(model: str | Path, features: str | Path, split: str = "test") -> Predictions:
    """Predict every row of ``split``; the model is read and validated before the store is opened."""
    if split not in SPLITS:
        raise FoalPipeError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
    tensors, meta = read_model(model, names=("W", "classes", "projection"))
    if "projection" not in tensors:
        raise FoalPipeError(f"{model} has no 'projection' tensor; pass the model.safetensors that learn wrote")
    store = open_store(features, **read_time_fusion(meta.get("encoder")))
    data = store.split(split)
    activation = meta.get("activation", "sigmoid")
    projection = SmoothProjection.from_matrix(tensors["projection"], activation=activation)
    if projection.n_features_in_ != data.dim:
        raise FoalPipeError(
            f"the model expects {projection.n_features_in_}-dimensional features but {features} has {data.dim}; "
            "use a store made with the model's encoder"
        )
    W, classes = tensors["W"], tensors["classes"].astype(np.int64)
    unlabelled = bool(np.all(np.asarray(data.labels) == UNLABELLED))
    _check_matches(meta, classes, store, features, unlabelled)
    predicted = np.empty(data.n_rows, dtype=np.int64)
    score = np.empty(data.n_rows, dtype=np.float64)
    for lo, X in data.iter_chunks():
        scores = projection.transform(X) @ W
        best = np.argmax(scores, axis=1)
        predicted[lo : lo + X.shape[0]] = classes[best]
        score[lo : lo + X.shape[0]] = scores[np.arange(best.size), best]
    store.check_unchanged()
    names = store.classes
    if unlabelled:  # the store's one placeholder class says nothing: name predictions from the model
        model_names = meta.get("class_names") or [str(c) for c in classes.tolist()]
        lookup = dict(zip(classes.tolist(), model_names))
        names = tuple(lookup.get(i, "") for i in range(int(classes.max()) + 1 if classes.size else 0))
    return Predictions(predicted, score, np.asarray(data.labels, dtype=np.int64), names)


def _check_matches(meta: dict, classes: np.ndarray, store: FeatureStore, features: str | Path,
                   unlabelled: bool = False) -> None:
    """Refuse a store whose label ids, class names or encoder differ from those the model was trained on (an
    unlabelled store has no classes to compare)."""
    if not unlabelled:
        _check_classes(meta, classes, store, features)
    encoder, theirs = meta.get("encoder"), store.meta.encoder
    if encoder is not None and encoder != theirs:
        key = next(k for k in sorted(set(encoder) | set(theirs)) if encoder.get(k) != theirs.get(k))
        raise FoalPipeError(
            f"the model was trained on other features: encoder {key!r} is {encoder.get(key)!r} in the model but "
            f"{theirs.get(key)!r} in {features}; use a store extracted with the model's encoder"
        )


#: The image CSV's first columns: the file, the predicted label id and its name, the winning score; then, with
#: ``--top-k K`` (K > 1), ``top{i}_name`` and ``top{i}_score`` for the K best classes.
IMAGE_COLUMNS = ("path", "predicted_class", "predicted_name", "score")


@dataclass
class ImagePredictions:
    """Scores (n, C; columns in ``classes`` order) of the image files that could be read, and those skipped."""

    paths: list[Path]
    scores: np.ndarray
    classes: np.ndarray
    names: list[str]  # one per column
    top_k: int = 1
    skipped: list[str] = field(default_factory=list)

    @property
    def predicted(self) -> np.ndarray:
        return self.classes[np.argmax(self.scores, axis=1)]

    def write_csv(self, fh: TextIO) -> None:
        """Write :data:`IMAGE_COLUMNS` (and the top-k columns), one line per image."""
        writer = csv.writer(fh, lineterminator="\n")
        k = min(self.top_k, len(self.names)) if self.top_k > 1 else 0
        writer.writerow([*IMAGE_COLUMNS, *(f"top{i}_{what}" for i in range(1, k + 1) for what in ("name", "score"))])
        order = np.argsort(-self.scores, axis=1, kind="stable")
        for path, row, ranked in zip(self.paths, self.scores, order):
            best = int(ranked[0])
            top = [v for j in ranked[:k] for v in (self.names[j], repr(float(row[j])))]
            writer.writerow([str(path), int(self.classes[best]), self.names[best], repr(float(row[best])), *top])


def predict_image_files(model: str | Path, images: Sequence[str | Path], checkpoint: str | Path | None = None,
                        top_k: int = 1, skip_bad: bool = False, batch_size: int = 64,
                        device: str = "cpu") -> ImagePredictions:
    """Predict unlabelled image files (files, folders, globs) with the encoder rebuilt from the model's provenance."""
    from foal_pipe.extract.encoding import encode_files, find_images
    from foal_pipe.model.deploy import load_model

    if top_k < 1:
        raise FoalPipeError(f"--top-k must be at least 1, got {top_k}")
    if batch_size < 1:
        raise FoalPipeError(f"--batch-size must be at least 1, got {batch_size}")
    deployed = load_model(model)
    paths = find_images(images)
    encoder = deployed.encoder(checkpoint, device)
    with progress_bar("predict", len(paths), unit="images") as advance:
        encoded = encode_files(encoder, paths, batch_size, skip_bad, advance)
    return ImagePredictions(encoded.paths, deployed.scores(encoded.features), deployed.classifier.classes_,
                            deployed.class_names, top_k, encoded.skipped)


def _check_classes(meta: dict, classes: np.ndarray, store: FeatureStore, features: str | Path) -> None:
    if classes.size and classes.max() >= len(store.classes):
        raise FoalPipeError(
            f"the model predicts label ids up to {int(classes.max())} but {features} has {len(store.classes)} classes; "
            "use a store with the model's classes"
        )
    names = meta.get("class_names")
    for label, name in zip(classes.tolist(), names, strict=True) if names is not None else ():
        if store.classes[label] != name:
            raise FoalPipeError(
                f"label {label} is {name!r} in the model but {store.classes[label]!r} in {features}; "
                "use a store with the model's class order"
            )
