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
    """A loaded file's metadata (less what the model sets itself), its projection and the rows seen when it was
    loaded: :meth:`AnalyticClassifier.save <foal_pipe.model.classifier.AnalyticClassifier.save>` writes it again."""

    metadata: dict[str, Any]
    projection: np.ndarray | None
    n_samples: int

    def same_projection(self, other: FileRecord) -> bool:
        """Whether two files may record one projection: the same matrix and activation, or one file holds none (no
        figure to tell them apart by)."""
        mine, theirs = self.projection, other.projection
        if mine is None or theirs is None:
            return True
        return (mine.shape == theirs.shape and mine.dtype == theirs.dtype and bool(np.array_equal(mine, theirs))
                and self.metadata.get("activation", "sigmoid") == other.metadata.get("activation", "sigmoid"))

    def joined(self, other: FileRecord, mine: np.ndarray, theirs: np.ndarray, classes: np.ndarray) -> FileRecord:
        """The record of a merge of this file's learner (of classes ``mine`` now) with ``other``'s (``theirs``), whose
        classes are ``classes``: the stores both learned (``learned_from``: continuing on either is refused, its rows
        would count twice), the rows both learned outside stores and both loaded, and every class's name. Refused where
        the files name one label id differently (one file's rows would be added to another class's column) or record
        other encoders (their features are not alike); other keys are this file's."""
        encoders = self.metadata.get("encoder"), other.metadata.get("encoder")
        if None not in encoders and encoders[0] != encoders[1]:
            raise FoalPipeError(f"cannot merge learners of model files of other encoders ({clipped(repr(encoders[0]))} "
                                f"and {clipped(repr(encoders[1]))}): their sums are of different features; merge "
                                "learners of one encoder")
        metadata = dict(self.metadata)
        names = [_names_by_id(record, ids) for record, ids in ((self, mine), (other, theirs))]
        if names[0] is not None and names[1] is not None:
            for label in set(names[0]).intersection(names[1]):
                a, b = names[0][label], names[1][label]
                if unicodedata.normalize("NFC", a) != unicodedata.normalize("NFC", b):
                    raise FoalPipeError(f"cannot merge: label {label!r} is class {a!r} in one model file and {b!r} in the "
                                        "other, so one file's rows would be added to another class; learn the rows of one "
                                        "by name into the other (DeployedModel.partial_fit with class names)")
        known = {**(names[1] or {}), **(names[0] or {})}
        if all(label in known for label in classes.tolist()):
            metadata["class_names"] = [known[label] for label in classes.tolist()]
        learned = [*self.metadata.get("learned_from", []), *other.metadata.get("learned_from", [])]
        if learned:
            metadata["learned_from"] = list(dict.fromkeys(learned))
        if outside := int(self.metadata.get("rows_outside_stores", 0)) + int(other.metadata.get("rows_outside_stores", 0)):
            metadata["rows_outside_stores"] = outside
        return FileRecord(metadata, self.projection if self.projection is not None else other.projection,
                          self.n_samples + other.n_samples)

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
                                "(partial_fit added classes); pass class_names= with one name per class of classes_")
        return {**kept, **given}


def _names_by_id(record: FileRecord, classes: np.ndarray) -> dict[Any, str] | None:
    """The class name of each of ``classes`` (a learner's now) that ``record`` names: None where the file names none,
    or its names no longer fit the classes (the learner added classes since)."""
    names = record.metadata.get("class_names")
    if not isinstance(names, list) or len(names) != classes.size:
        return None
    return dict(zip(classes.tolist(), names))
