"""A saved model put to work: predict from features or images, keep learning, save again (``load_model``).

The model file holds everything needed (foal_pipe/model/modelfile.py): the learner state, the projection, the
activation, the class names and the store's encoder provenance. :class:`DeployedModel` wraps them so that an
engineer can predict on new images and absorb new labelled rows, including rows of classes never seen,
without retraining: the ridge statistics simply grow, so the result stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.projection import SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract.encoding import BATCH_SIZE, build_recorded_encoder, encode_images
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.modelfile import read_model


class DeployedModel:
    """A loaded model: ``classifier`` (an :class:`AnalyticClassifier` that keeps learning), ``projection``,
    ``class_names`` (one per column of ``W``, in ``classifier.classes_`` order) and ``encoder_spec`` (the
    provenance of the store it was trained on: what :meth:`predict_images` rebuilds)."""

    def __init__(self, classifier: AnalyticClassifier, projection: SmoothProjection, class_names: Sequence[str],
                 encoder_spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> None:
        self.classifier = classifier
        self.projection = projection
        self.class_names = list(class_names)
        self.encoder_spec = encoder_spec
        self.metadata = dict(metadata or {})
        self._encoder: Any = None

    # ------------------------------------------------------------------ predicting
    def activations(self, features: Any) -> np.ndarray:
        """``activation(features @ P)``: what the classifier scores."""
        return self.projection.transform(np.asarray(features, dtype=self.projection.components_.dtype))

    def scores(self, features: Any) -> np.ndarray:
        """``activation(features @ P) @ W``, shape (n, n_classes), columns in ``classifier.classes_`` order
        (:meth:`AnalyticClassifier.class_scores <foal_pipe.model.classifier.AnalyticClassifier.class_scores>`)."""
        return self.classifier.class_scores(self.activations(features))

    def predict(self, features: Any, classes: Any = None) -> np.ndarray:
        """The label id with the highest score for each row of ``features`` (n, d), among the classes the model
        has seen, or among ``classes`` (:meth:`AnalyticClassifier.predict
        <foal_pipe.model.classifier.AnalyticClassifier.predict>`)."""
        return self.classifier.predict(self.activations(features), classes)

    def predict_names(self, features: Any) -> list[str]:
        """The class name with the highest score for each row."""
        names = dict(zip(self.classifier.classes_.tolist(), self.class_names))
        return [names[label] for label in self.predict(features).tolist()]

    def encoder(self, checkpoint: str | Path | None = None, device: str = "cpu") -> Any:
        """The encoder of the training store, rebuilt from ``encoder_spec`` and loaded (once, then cached)."""
        if self._encoder is None:
            self._encoder = build_recorded_encoder(self.encoder_spec, checkpoint, device)
        return self._encoder

    def encode_images(self, images: Any, checkpoint: str | Path | None = None, batch_size: int = BATCH_SIZE) -> np.ndarray:
        """Features of images: paths (files) or uint8 arrays ``(n, 3, s, s)``, encoded ``batch_size`` at a time."""
        return encode_images(self.encoder(checkpoint), images, batch_size)

    def predict_images(self, images: Any, checkpoint: str | Path | None = None) -> np.ndarray:
        """Label ids for images (paths or uint8 arrays), encoded as the training store's images were."""
        return self.predict(self.encode_images(images, checkpoint))

    # ------------------------------------------------------------------ learning
    def label_ids(self, names: Sequence[str]) -> np.ndarray:
        """Label ids for class names: a known name keeps its id, a new one gets the next id beyond the model's
        (in order of first appearance); :meth:`partial_fit` records the new names."""
        ids = {name: int(c) for name, c in zip(self.class_names, self.classifier.classes_.tolist(), strict=True)}
        nxt = int(self.classifier.classes_.max()) + 1 if self.classifier.classes_.size else 0
        out = np.empty(len(names), dtype=np.int64)
        for i, name in enumerate(names):
            if name not in ids:
                ids[name], nxt = nxt, nxt + 1
            out[i] = ids[name]
        return out

    def partial_fit(self, features: Any, labels: Any) -> DeployedModel:
        """Absorb labelled rows: ``labels`` are class names (strings) or label ids. Exact: the result equals the
        model trained on its old rows and these together. Returns ``self``."""
        labels = np.asarray(labels)
        if labels.dtype.kind in "UO":
            names = [str(v) for v in labels.tolist()]
            ids = self.label_ids(names)
            known = dict(zip(ids.tolist(), names))
        else:
            ids = labels.astype(np.int64)
            known = {}
        old = dict(zip(self.classifier.classes_.tolist(), self.class_names, strict=True))
        for label in np.setdiff1d(ids, self.classifier.classes_).tolist():
            if label not in known:
                raise FoalPipeError(f"label id {label} is new to the model and has no name; pass class names "
                                    "(strings) as labels for new classes")
            old[label] = known[label]
        self.classifier.partial_fit(self.activations(features), ids)
        self.class_names = [old[c] for c in self.classifier.classes_.tolist()]
        return self

    def save(self, path: str | Path) -> Path:
        """Write the model file (state, projection, class names, encoder provenance); :func:`load_model` reads it."""
        extra = {k: v for k, v in self.metadata.items()
                 if k not in ("format", "format_version", "gamma", "engine", "dtype", "n_samples_seen", "gamma_grid")}
        extra.update(class_names=self.class_names, activation=self.projection.activation)
        if self.encoder_spec is not None:
            extra["encoder"] = self.encoder_spec
        return self.classifier.save(path, projection=self.projection, **extra)


def load_model(path: str | Path) -> DeployedModel:
    """Read a model file written by ``foal-pipe learn`` (or :meth:`DeployedModel.save`), validated; nothing is
    unpickled. A model without class names names its classes by their ids."""
    tensors, meta = read_model(path, names=("W", "classes", "projection"))
    if "projection" not in tensors:
        raise FoalPipeError(f"{path} has no 'projection' tensor; pass the model.safetensors that learn wrote")
    classifier = AnalyticClassifier.load(path)
    projection = SmoothProjection.from_matrix(tensors["projection"], activation=meta.get("activation", "sigmoid"))
    names = meta.get("class_names") or [str(c) for c in classifier.classes_.tolist()]
    return DeployedModel(classifier, projection, names, meta.get("encoder"), meta)
