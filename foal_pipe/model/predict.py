"""Predictions from a saved model on a store's split, chunk by chunk, and their CSV form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from foal_pipe.core.scoring import best_of
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io.csvrows import CsvRows
from foal_pipe.io.pathtext import path_text
from foal_pipe.progress import progress_bar
from foal_pipe.store import SPLITS, UNLABELLED, FeatureStore

if TYPE_CHECKING:
    from foal_pipe.model.deploy import DeployedModel

#: The CSV's columns: the store row, the predicted label id and its name, the winning score (the head's:
#: ``sigmoid(x P) @ W`` for ridge, minus a squared distance for ncm; docs/cli.md lists them), and the label id and
#: name the store holds for the row.
COLUMNS = ("row", "predicted_class", "predicted_name", "score", "true_class", "true_name")


@dataclass
class Predictions:
    """One entry per row of a split: ``predicted`` and ``true`` label ids, ``score`` of the prediction."""

    predicted: np.ndarray
    score: np.ndarray
    true: np.ndarray
    names: dict[int, str]  # class names by label id: a model's ids may run far beyond its count of classes
    learned: np.ndarray | None = None  # the model's label ids: a row of another class is never predicted right
    unnamed: bool = False  # the model records no class names: its label ids were read as the store's

    @property
    def accuracy(self) -> float:
        """Over every labelled row, a row of a class the model has not learned counted as wrong."""
        labelled = self.true != UNLABELLED
        return float((self.predicted == self.true)[labelled].mean()) if labelled.any() else float("nan")

    def summary(self, split: str) -> str:
        """The line ``predict`` prints: rows, accuracy, and what the accuracy counts (rows of classes the model has
        not learned, a class the run dropped or one new to the store, are counted as wrong and said)."""
        if not self.predicted.size:
            return f"0 rows on {split}"
        if self.accuracy != self.accuracy:
            return f"{self.predicted.size} rows, unlabelled, on {split}"
        labelled = self.true != UNLABELLED
        over = "" if labelled.all() else f" over its {int(labelled.sum()):,} labelled rows"
        line = f"{self.predicted.size} rows, accuracy {100 * self.accuracy:.2f}%{over} on {split}"
        known = labelled if self.learned is None else labelled & np.isin(self.true, self.learned)
        unlearned = int(labelled.sum() - known.sum())
        if unlearned:
            rest = f"{100 * float((self.predicted == self.true)[known].mean()):.2f}% on the other {int(known.sum()):,}" \
                if known.any() else "no other labelled rows"
            line += f" ({unlearned:,} rows of classes the model has not learned count as wrong; {rest})"
        if self.unnamed:
            line += ("; the model records no class names (saved from Python without them), so its label ids were "
                     "read as the store's: set foal_pipe.load_model(...).class_names and save it to match them by name")
        return line

    def write_csv(self, fh: TextIO) -> None:
        """Write :data:`COLUMNS`, one line per row."""
        writer = CsvRows(fh)
        writer.writerow(COLUMNS)
        names = self.names
        for i, (p, s, t) in enumerate(zip(self.predicted.tolist(), self.score.tolist(), self.true.tolist())):
            writer.writerow([i, p, names[p], repr(s), t, names.get(t, "")])


def predict_split(model: str | Path, features: str | Path, split: str = "test") -> Predictions:
    """Predict every row of ``split`` among the model's classes; the model is read and validated before the store
    is opened. The store's classes are matched to the model's by name: the model may know classes the store lacks
    (a model continued on more classes) and the store classes the model never saw (never predicted)."""
    from foal_pipe.model.deploy import load_model, open_model_store

    if split not in SPLITS:
        raise FoalPipeError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
    deployed = load_model(model, estimators=False)
    store = open_model_store(features, deployed.encoder_spec)
    data = store.split(split)
    deployed.check_width(data.dim, features)
    classes = deployed.classifier.classes_
    named = deployed.metadata.get("class_names") is not None
    unlabelled = bool(np.all(np.asarray(data.labels) == UNLABELLED))
    _check_matches(deployed, named and not unlabelled, store, features)
    deployed.check_scoring("predict", data)
    predicted = np.empty(data.n_rows, dtype=np.int64)
    score = np.empty(data.n_rows, dtype=np.float64)
    for lo, X in data.iter_chunks():
        predicted[lo : lo + X.shape[0]], score[lo : lo + X.shape[0]] = deployed.best(X)
    store.check_unchanged()
    # names by label id: the store's, then the model's for the ids beyond them (an unlabelled store's one
    # placeholder class says nothing: all from the model)
    names = {} if unlabelled else dict(enumerate(store.classes))
    names |= {c: name for c, name in zip(classes.tolist(), deployed.class_names) if c not in names}
    return Predictions(predicted, score, np.asarray(data.labels, dtype=np.int64), names, classes,
                       not named and not unlabelled)


def _check_matches(model: DeployedModel, by_name: bool, store: FeatureStore, features: str | Path) -> None:
    """Refuse a store whose encoder differs from the model's, or (``by_name``) whose label ids name other classes
    than the model's (a class the store and the model share must have one label id in both)."""
    from foal_pipe.model.deploy import check_encoder

    if by_name:
        _check_classes(model, store, features)
    check_encoder(model.encoder_spec, store, features, unrecorded_ok=True)


#: The image CSV's first columns: the file, the predicted label id and its name, the winning score; then, with
#: ``--top-k K`` (K > 1), ``top{i}_name`` and ``top{i}_score`` for the 2nd to K-th best classes (the best is
#: ``predicted_name`` and ``score``, not repeated).
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
        """Write :data:`IMAGE_COLUMNS` (and the top-k columns), one line per image; each path as its bytes are, in any
        locale (:func:`~foal_pipe.io.pathtext.path_text`)."""
        writer = CsvRows(fh)
        k = min(self.top_k, len(self.names)) if self.top_k > 1 else 0
        writer.writerow([*IMAGE_COLUMNS, *(f"top{i}_{what}" for i in range(2, k + 1) for what in ("name", "score"))])
        order = np.argsort(-self.scores, axis=1, kind="stable")
        for path, row, ranked in zip(self.paths, self.scores, order):
            best = int(ranked[0])
            top = [v for j in ranked[1:k] for v in (self.names[j], repr(float(row[j])))]
            writer.writerow([path_text(path), int(self.classes[best]), self.names[best], repr(float(row[best])), *top])


def predict_image_files(model: str | Path, images: Sequence[str | Path], checkpoint: str | Path | None = None,
                        top_k: int = 1, skip_bad: bool = False, batch_size: int = 64,
                        device: str = "cpu") -> ImagePredictions:
    """Predict unlabelled image files (files, folders, globs) with the encoder rebuilt from the model's provenance."""
    from foal_pipe.extract.encoding import encode_files, find_images
    from foal_pipe.model.deploy import load_model

    if top_k < 1:
        raise FoalPipeError(f"{param('top_k')} must be at least 1, got {top_k}")
    if batch_size < 1:
        raise FoalPipeError(f"{param('batch_size')} must be at least 1, got {batch_size}")
    deployed = load_model(model, estimators=False)
    if top_k > len(deployed.class_names):
        raise FoalPipeError(f"{param('top_k', top_k)} asks for more classes than the model's {len(deployed.class_names)}; "
                            f"pass {param('top_k', len(deployed.class_names))} or fewer")
    paths = find_images(images)
    encoder = deployed.encoder(checkpoint, device)
    with progress_bar("predict", len(paths), unit="images") as advance:
        encoded = encode_files(encoder, paths, batch_size, skip_bad, advance)
    scores, ties = deployed.classifier.scores_with_ties(deployed.activations(encoded.features))
    best_of(scores, deployed.classifier.classes_, ties=ties)  # refuses images whose scores tie within rounding
    return ImagePredictions(encoded.paths, scores, deployed.classifier.classes_, deployed.class_names, top_k,
                            encoded.skipped)


#: The way out when a store's label ids disagree with the model's (a model continued on another store: its ids follow
#: the model's classes, the store's its own folders), where the CSV's ids would mean two things.
_BY_NAME = ("the CSV's ids would mean two things: predict the store's image files with `predict --images`, or match "
            "classes by name with `evaluate --run` (on a run's own store) or DeployedModel.store_predictions (Python)")


def _check_classes(model: DeployedModel, store: FeatureStore, features: str | Path) -> None:
    """Refuse a store whose label ids name other classes than the model's: names compared in Unicode NFC form, as
    :meth:`DeployedModel.store_predictions` matches them (a class spelled in NFD is the class it prints as)."""
    from foal_pipe.model.deploy import nfc

    ours = dict(zip(model.classifier.classes_.tolist(), model.class_names))
    for label, name in ours.items():
        if label < len(store.classes) and nfc(store.classes[label]) != nfc(name):
            raise FoalPipeError(
                f"label {label} is {name!r} in the model but {store.classes[label]!r} in {features}; {_BY_NAME}")
    label_of = {nfc(name): label for label, name in ours.items()}
    for label, name in enumerate(store.classes):
        if label_of.get(nfc(name), label) != label:
            raise FoalPipeError(f"class {name!r} is label {label_of[nfc(name)]} in the model but {label} in {features}; "
                                f"{_BY_NAME}")
