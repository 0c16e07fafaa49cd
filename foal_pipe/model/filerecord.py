"""What a loaded model file records beside its state (class names, encoder provenance, the stores learned, the
projection's matrix and activation, ...), kept by :class:`~foal_pipe.model.classifier.AnalyticClassifier` so that a
model loaded, continued (or merged) and saved loses none of it, and none of it stops being true."""

from __future__ import annotations

import unicodedata
from typing import Any, NamedTuple

import numpy as np

from foal_pipe.errors import FoalPipeError, clipped
from foal_pipe.model.ridgemodel import INPUT_NAMES


class FileRecord(NamedTuple):
    """A loaded file's metadata (less what the model sets itself), its projection, the rows seen when it was loaded
    and the classes it held then (its ``class_names`` name them):
    :meth:`AnalyticClassifier.save <foal_pipe.model.classifier.AnalyticClassifier.save>` writes it again, unless
    ``written`` is False (the classifier of a :class:`~foal_pipe.model.deploy.DeployedModel`, which writes its own
    metadata): then it serves merges only, to compare the files' class names."""

    metadata: dict[str, Any]
    projection: np.ndarray | None
    n_samples: int
    classes: np.ndarray | None = None
    written: bool = True

    def same_projection(self, other: FileRecord) -> bool:
        """Whether two files may record one projection: the same matrix and activation, or one file holds none (no
        figure to tell them apart by)."""
        mine, theirs = self.projection, other.projection
        if mine is None or theirs is None:
            return True
        return (mine.shape == theirs.shape and mine.dtype == theirs.dtype and bool(np.array_equal(mine, theirs))
                and self.metadata.get("activation", "sigmoid") == other.metadata.get("activation", "sigmoid"))

    def joined(self, other: FileRecord, classes: np.ndarray) -> FileRecord:
        """The record of a merge of this file's learner with ``other``'s, whose classes are ``classes``: the stores
        and data both learned (continuing on either is refused: its rows would count twice), the rows both learned
        outside stores and both loaded, and every class's name. Refused where both learned one store (its rows would
        count twice), the files name one label id differently (one file's rows would join another class's column)
        or record other encoders (their features are not alike). Other keys: the file's that holds the projection
        (its activation and input names with it), else this one's, each key missing there taken from the other."""
        encoders = self.metadata.get("encoder"), other.metadata.get("encoder")
        if None not in encoders and encoders[0] != encoders[1]:
            raise FoalPipeError(f"cannot merge learners of model files of other encoders ({clipped(repr(encoders[0]))} "
                                f"and {clipped(repr(encoders[1]))}): their sums are of different features; merge "
                                "learners of one encoder")
        learned = {key: (self.metadata.get(key, []), other.metadata.get(key, [])) for key in ("learned_from", "learned_data")}
        if twice := [i for mine, theirs in learned.values() for i in mine if i in theirs]:
            raise FoalPipeError(f"cannot merge: both model files learned the store {twice[0][:16]}... (its rows would "
                                "count twice); merge learners of different stores")
        base, rest = (other, self) if self.projection is None and other.projection is not None else (self, other)
        metadata = {**rest.metadata, **base.metadata}
        names = [_names_by_id(record) for record in (self, other)]
        if names[0] is not None and names[1] is not None:
            _check_names_agree(names[0], names[1])
        known = {**(names[1] or {}), **(names[0] or {})}
        named = classes
        if known:  # a class no file names leaves the list short (save asks for class_names=); the ids named are kept
            named = np.asarray([label for label in classes.tolist() if label in known], dtype=classes.dtype)
            metadata["class_names"] = [known[label] for label in named.tolist()]
        for key, (mine, theirs) in learned.items():
            if mine or theirs:
                metadata[key] = [*mine, *theirs]
        if outside := int(self.metadata.get("rows_outside_stores", 0)) + int(other.metadata.get("rows_outside_stores", 0)):
            metadata["rows_outside_stores"] = outside
        return FileRecord(metadata, base.projection, self.n_samples + other.n_samples, named,
                          self.written or other.written)

    def kept(self, given: dict[str, Any], projection: Any, n_classes: int, n_samples: int) -> dict[str, Any]:
        """The recorded metadata under ``given`` (``save``'s keywords win; a ``projection`` given records its own
        activation, an ``activation`` that contradicts the recorded projection's is refused), the rows learned since
        the load added to ``rows_outside_stores`` (no store identity records them); class names that no longer fit
        the classes (``partial_fit`` added some) refused rather than dropped."""
        kept = dict(self.metadata)
        if projection is not None:  # it records its own
            kept.pop("activation", None)
            kept.pop(INPUT_NAMES, None)
        elif self.projection is not None:
            activation = kept.setdefault("activation", "sigmoid")  # a version-1 file's, as load_model reads it
            if given.get("activation", activation) != activation:
                raise FoalPipeError(f"activation={given['activation']!r} contradicts the loaded projection's activation "
                                    f"{activation!r}; drop activation= (the projection's is recorded)")
        if outside := int(kept.get("rows_outside_stores", 0)) + n_samples - self.n_samples:
            kept["rows_outside_stores"] = outside
        names = kept.get("class_names")
        if "class_names" not in given and isinstance(names, list) and len(names) != n_classes:
            raise FoalPipeError(f"the loaded model file named {len(names)} classes, but the model has {n_classes} now "
                                "(partial_fit or a merge added classes); pass class_names= with one name per class of "
                                "classes_")
        return {**kept, **given}


def _check_names_agree(mine: dict[Any, str], theirs: dict[Any, str]) -> None:
    """Refuse a merge of files that name one label id as two classes, or one class at two label ids: one file's rows
    would be added to another class's column, or one class's rows split over two."""
    fix = "learn the rows of one by name into the other (DeployedModel.partial_fit with class names)"
    for label in set(mine).intersection(theirs):
        if _nfc(mine[label]) != _nfc(theirs[label]):
            raise FoalPipeError(f"cannot merge: label {label!r} is class {mine[label]!r} in one model file and "
                                f"{theirs[label]!r} in the other, so one file's rows would be added to another class; {fix}")
    ids = {_nfc(name): label for label, name in mine.items()}
    for label, name in theirs.items():
        if ids.get(_nfc(name), label) != label:
            raise FoalPipeError(f"cannot merge: class {name!r} is label {ids[_nfc(name)]!r} in one model file and "
                                f"{label!r} in the other, so its rows would be split over two classes; {fix}")


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def _names_by_id(record: FileRecord) -> dict[Any, str] | None:
    """The class name of each label id ``record`` names (one per class it held when loaded, or, a merge's, per class
    a file named): None where it names none, or its names do not fit those classes."""
    names = record.metadata.get("class_names")
    if record.classes is None or not isinstance(names, list) or len(names) != record.classes.size:
        return None
    return dict(zip(record.classes.tolist(), names))
