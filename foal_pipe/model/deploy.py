"""A saved model put to work: predict from features or images, keep learning, save again (``load_model``).

The model file holds everything needed (foal_pipe/model/modelfile.py): the learner state, the projection, the
activation, the class names and the store's encoder provenance. :class:`DeployedModel` wraps them so that an
engineer can predict on new images and absorb new labelled rows, including rows of classes never seen,
without retraining: the ridge statistics simply grow, so the result stays exact.
"""

from __future__ import annotations

import numbers
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from foal_pipe.core.backend import as_dtype, get_namespace, host_values
from foal_pipe.core.engines import locked, owner_lock
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.scoring import best_of
from foal_pipe.errors import FoalPipeError, NoBlocks, clipped
from foal_pipe.extract.encoding import BATCH_SIZE, build_recorded_encoder, encode_images, first_difference
from foal_pipe.heads import HEADS
from foal_pipe.model.columns import check_frame_columns, columns_checked
from foal_pipe.model.headmodel import HeadClassifier, load_head
from foal_pipe.model.modelfile import CHECKSUM_FROM, names_problem, read_model, refuse, stored_head
from foal_pipe.model.ridgemodel import INPUT_NAMES, SET_BY_MODEL, RidgeModel, SavedRidge, restore_input_names
from foal_pipe.model.stateviews import OwnState

if TYPE_CHECKING:  # scikit-learn: loaded with the estimators, not by predict, evaluate or learn --init-model
    from foal_pipe.model.classifier import AnalyticClassifier
    from foal_pipe.model.projection import SmoothProjection
    from foal_pipe.store.read import FeatureStore


def open_model_store(path: str | Path, model_encoder: dict[str, Any] | None) -> FeatureStore:
    """The store at ``path`` opened as a model reads it, with the read-time fusion the model was learned on; a store
    without per-block tokens is refused with the fix that holds here (reading it unfused, which the store's own
    refusal offers, is not: the model fixes the fusion)."""
    from foal_pipe.store.blockfusion import read_time_fusion
    from foal_pipe.store.read import open_store

    try:
        return open_store(path, **read_time_fusion(model_encoder))
    except NoBlocks as exc:
        raise FoalPipeError(exc.reason, "the model was learned on that fusion: extract the store again with `foal-pipe "
                            "extract ... --keep-blocks` (the model's encoder and settings)") from None


def check_encoder(model_encoder: dict[str, Any] | None, store: FeatureStore, where: str | Path,
                  unrecorded_ok: bool = False) -> None:
    """Refuse a store whose encoder provenance differs from the model's, naming the encoders if they differ, else
    every setting that differs (the encoder's name alone would say nothing);
    ``unrecorded_ok`` (predicting): a model that records no encoder (saved from Python) takes any store of its width."""
    if model_encoder is None and unrecorded_ok:
        return
    theirs = store.meta.encoder or {}
    if model_encoder is None and theirs:
        raise FoalPipeError(f"the model records no encoder (a model saved from Python), so nothing shows that {where}'s "
                            f"features (encoder {theirs.get('name')!r}) are those it learned; continue a model that "
                            "`foal-pipe learn` wrote from a store of the same encoder")
    ours = model_encoder or {}
    if first_difference(ours, theirs) is None:
        return
    name = ours.get("name")
    if theirs.get("name") != name:
        raise FoalPipeError(f"{where} was extracted with another encoder than the model's: the store's encoder is "
                            f"{theirs.get('name')!r}, the model's {name!r}; extract the new images with the model's encoder")
    keys = [key for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]
    differ = ", ".join(f"{key!r} is {theirs.get(key)!r} in the store but {ours.get(key)!r} in the model" for key in keys)
    wanted = ", ".join(f"{key} {ours.get(key)!r}" for key in keys)
    raise FoalPipeError(f"{where} was extracted with the model's encoder {name!r} but other settings: {differ}; extract the "
                        f"new images with the model's settings ({wanted})")


class DeployedModel(OwnState):
    """A loaded model: ``classifier`` (an :class:`AnalyticClassifier` that keeps learning, or a head's
    :class:`~foal_pipe.model.headmodel.HeadClassifier`), ``projection``, ``class_names`` (one per column of ``W``,
    in ``classifier.classes_`` order) and ``encoder_spec`` (the provenance of the store it was trained on: what
    :meth:`predict_images` rebuilds).

    Threads: :meth:`partial_fit` and :meth:`save` hold the model's lock, and so do the readers that take names or
    classes beside the scores (:meth:`best`, :meth:`predict_names`, :meth:`store_predictions`): none of them sees
    the classifier of one call with the class names of another."""

    _names: list[str]  # class_names: one list object
    _named: np.ndarray  # the classes its names were given for

    def __init__(self, classifier: AnalyticClassifier | SavedRidge | HeadClassifier, projection: SmoothProjection | Expansion,
                 class_names: Sequence[str],
                 encoder_spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> None:
        self.classifier = classifier
        self.projection = projection
        self.class_names = class_names  # checked: one name per class
        self.encoder_spec = encoder_spec
        self.metadata = dict(metadata or {})
        self._encoder: Any = None
        self._rows_given = self._rows_seen()  # partial_fit's rows: those seen beyond these (:attr:`rows_outside_stores`)

    def _rows_seen(self) -> int:
        return int(getattr(self.classifier, "n_samples_seen_", 0) or 0)

    @property
    def rows_outside_stores(self) -> int:
        """The rows :meth:`partial_fit` added, the file's count included: no store identity records them, so
        ``learn --init-model`` warns that nothing shows a store free of them. Rows a refused solve undid are not
        counted (the model's rows seen went back)."""
        recorded = self.metadata.get("rows_outside_stores", 0)
        return (recorded if isinstance(recorded, int) else 0) + self._rows_seen() - self._rows_given

    @property
    def class_names(self) -> list[str]:
        """One name per class of ``classifier.classes_``, in its order: one list, so a name changed in it is kept (and
        saved). A head's refused solve, which undoes its last calls' classes, takes their names out of it."""
        with owner_lock(self):
            names, named, ids = self._names, self._named, self.classifier.classes_
            if ids.size < len(names) == named.size and np.isin(ids, named).all():
                kept = np.isin(named, ids)
                names[:] = [name for name, keep in zip(names, kept.tolist()) if keep]
                self._named = named[kept]
            elif not np.array_equal(ids, named):  # names zipped with other classes would name rows wrongly
                raise FoalPipeError(f"the classifier's classes {clipped(repr(ids.tolist()))} are not those its names were "
                                    f"given for, {clipped(repr(named.tolist()))}; set model.class_names anew")
            return names

    @class_names.setter
    @locked
    def class_names(self, names: Sequence[str]) -> None:
        names, n = list(names), int(self.classifier.classes_.size)
        if len(names) != n:
            raise FoalPipeError(f"class_names has {len(names)} names but the model has {n} classes; pass one name per "
                                "class of classifier.classes_, in its order")
        if problem := names_problem(names, n):  # at once: a name twice would send a labelled row to another class
            raise FoalPipeError(f"class_names {problem}; pass one distinct string per class of classifier.classes_")
        self._names, self._named = names, np.array(self.classifier.classes_)

    @property
    def named(self) -> bool:
        """Whether it names its classes (its file's names, or given since), else shows ids as names (:func:`id_names`)."""
        return self.metadata.get("class_names") is not None or self.class_names != id_names(self.classifier.classes_)

    # ------------------------------------------------------------------ inputs
    def _features(self, features: Any) -> np.ndarray:
        """``features`` as the projection's dtype, refused unless a finite real 2-D array (n >= 1, d columns):
        NumPy would drop imaginary parts and truncate nothing visibly, scikit-learn would raise its own errors."""
        d = int(self.projection.n_features_in_)
        self._check_columns(features)
        if type(features).__module__.startswith("scipy.sparse"):
            raise FoalPipeError(f"features are a SciPy sparse {type(features).__name__}; pass dense rows, "
                                "features.toarray()")
        features = host_values(features, "features")  # a tensor detached, bfloat16 widened; sparse or meta refused
        try:
            X = np.asarray(features)
        except ValueError:  # NumPy refuses ragged nesting
            X = None
        except TypeError:
            raise FoalPipeError(f"features must be a 2-D array of real numbers (n, {d}), but NumPy cannot read a "
                                f"{type(features).__name__} as numbers; pass a NumPy array or a tensor") from None
        if X is not None and X.dtype == object and _numeric_columns(features):  # pandas' nullable Int64, Float64
            X = features.to_numpy(dtype=np.float64, na_value=np.nan)  # a missing value: NaN, refused below
        elif X is not None and X.dtype == object and all(isinstance(v, numbers.Real) for v in X.ravel().tolist()):
            X = X.astype(np.float64)  # an object array of numbers, as the estimators read it
        if X is None or X.dtype.kind not in "iuf":
            what = "rows of unequal length" if X is None else {"c": "complex numbers", "b": "booleans"}.get(
                X.dtype.kind, f"{X.dtype} values")
            raise FoalPipeError(f"features must be a 2-D array of real numbers (n, {d}), but they hold {what}; "
                                "pass the features the model's encoder gives")
        if X.ndim == 2 and X.shape[0] and X.shape[1] != d:
            raise FoalPipeError(f"features have shape {X.shape} but the model expects {d}-dimensional features (n, {d}); "
                                "pass the features of the model's encoder (that of the store it learned)")
        if X.ndim != 2 or X.shape[1] != d or X.shape[0] == 0:
            raise FoalPipeError(f"features have shape {X.shape} but the model expects (n, {d}) with n >= 1; pass one "
                                "row per sample (X.reshape(1, -1) for one sample)")
        finite = np.isfinite(X).all(axis=1)
        if not finite.all():
            raise FoalPipeError(f"features hold NaN or inf (first at row {int(np.flatnonzero(~finite)[0])}); "
                                "check the features (re-extract the store)")
        return as_dtype(X, get_namespace("numpy"), self.projection.components_.dtype, "cpu")

    def _check_columns(self, features: Any) -> None:
        """Refuse a DataFrame whose column names (all strings: scikit-learn's rule) are not, in order, those the model
        was fitted on: its projection's (recorded in the model file), or its classifier's behind the identity. Its
        values would be read by position, each column standing in for another."""
        columns = getattr(features, "columns", None)
        if columns is None:
            return
        check_frame_columns(columns, getattr(self.projection, "feature_names_in_", None))
        if getattr(self.projection, "is_identity", False):  # the classifier reads the same columns: its own, too
            check_frame_columns(columns, getattr(self.classifier, "feature_names_in_", None))

    def _label_ids(self, labels: Any, n_rows: int) -> tuple[np.ndarray, dict[int, str]]:
        """Label ids (int64) and the names of the ids given by name: ``labels`` must be one class name (str) or
        one integer label id per row, never floats (truncated), booleans, complex numbers or a mapping; a tensor of
        ids is read as a NumPy array, as :class:`AnalyticClassifier` reads it."""
        labels = host_values(labels, "labels")
        try:
            shape = None if isinstance(labels, (str, bytes, dict, set)) or labels is None else np.shape(labels)
        except ValueError:  # NumPy refuses ragged nesting
            shape = ()
        if shape is None or len(shape) != 1:
            got = type(labels).__name__ if not shape else f"an array of shape {shape}"
            raise FoalPipeError(f"labels must be a sequence of {n_rows} class names or label ids (one per row), not "
                                f"{got}; pass e.g. ['cat', 'dog', ...] or [3, 5, ...]")
        if shape[0] != n_rows:
            raise FoalPipeError(f"{shape[0]} labels for {n_rows} rows of features; pass one label per row")
        kind = labels.dtype.kind if isinstance(labels, np.ndarray) else "O"
        if kind in "iu":
            return self._int64_ids(labels), {}
        items = labels.tolist() if isinstance(labels, np.ndarray) else list(labels)
        if kind == "U" or all(isinstance(v, str) for v in items):
            ids = self.label_ids(items)
            return ids, dict(zip(ids.tolist()[::-1], items[::-1]))  # a new class's name as first given
        bad = next((v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer))), None)
        if bad is not None:
            what = "a mix of names and ids" if any(isinstance(v, str) for v in items) else f"{bad!r} ({type(bad).__name__})"
            raise FoalPipeError(f"labels must be all class names (strings) or all integer label ids, but they hold "
                                f"{what}; convert them first (ids: labels.astype(int) if they are whole numbers)")
        return self._int64_ids(items), {}

    @staticmethod
    def _int64_ids(ids: Any) -> np.ndarray:
        """Integer label ids as int64, refused beyond its range rather than wrapped (a uint64 id above 2**63 - 1 would
        read as a negative one) or left to NumPy's OverflowError."""
        if isinstance(ids, np.ndarray):  # only a uint64 array holds ids beyond int64
            values = ids.max(initial=0).tolist() if ids.dtype.kind == "u" else 0
        else:
            values = next((int(v) for v in ids if not -(2**63) <= int(v) < 2**63), 0)
        if not -(2**63) <= values < 2**63:
            raise FoalPipeError(f"label id {values} lies outside the int64 range of a model's ids; map the labels to ids "
                                "0, 1, ..., or pass class names")
        return np.asarray(ids).astype(np.int64)

    # ------------------------------------------------------------------ predicting
    def rows(self, X: np.ndarray) -> np.ndarray:
        """What the classifier takes of checked features: ``activation(X @ P)`` (a head: the rows of its space), from
        the projection's matrix (its checks, a DataFrame's columns among them, made by :meth:`_features`)."""
        return self.classifier.rows(X, getattr(self.projection, "expansion", self.projection))

    def activations(self, features: Any) -> np.ndarray:
        """``activation(features @ P)``: what the classifier scores (``features`` checked: a finite real 2-D
        array with the model's feature dimension)."""
        return self.rows(self._features(features))

    @columns_checked()
    def scores(self, features: Any) -> np.ndarray:
        """``activation(features @ P) @ W``, shape (n, n_classes), columns in ``classifier.classes_`` order
        (:meth:`AnalyticClassifier.class_scores <foal_pipe.model.classifier.AnalyticClassifier.class_scores>`)."""
        return self.classifier.class_scores(self.activations(features))

    @columns_checked()
    def best(self, features: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each row's label id of the highest score among ``classifier.classes_`` and that score; a ridge model
        refuses rows whose top two scores tie within their float64 rounding
        (:func:`~foal_pipe.core.scoring.best_of`)."""
        rows = self.activations(features)
        with owner_lock(self):  # the scores and the classes of one model
            scores, ties = self.classifier.scores_with_ties(rows)
            return best_of(scores, self.classifier.classes_, ties=ties)

    @columns_checked()  # the features' columns are checked, not the activations' (they have none)
    def predict(self, features: Any, classes: Any = None) -> np.ndarray:
        """The label id with the highest score for each row of ``features`` (n, d), among the classes the model
        has seen, or among ``classes`` (:meth:`AnalyticClassifier.predict
        <foal_pipe.model.classifier.AnalyticClassifier.predict>`)."""
        return self.classifier.predict(self.activations(features), classes)

    def predict_names(self, features: Any) -> list[str]:
        """The class name with the highest score for each row."""
        labels = self.predict(features).tolist()
        with owner_lock(self):  # names after the prediction: a class predicted stays, its name set by then
            names = dict(zip(self.classifier.classes_.tolist(), self.class_names))
        return [names[label] for label in labels]

    def predict_proba(self, features: Any) -> np.ndarray:
        """Class shares, shape (n, n_classes), columns in ``classifier.classes_`` order, rows summing to 1.

        Ridge regression onto one-hot targets estimates each class's probability by least squares, so its scores
        are clipped at 0 and normalised (a row with no positive score is uniform, so its argmax is the first class,
        not :meth:`predict`'s; elsewhere it is :meth:`predict`'s); the values are not calibrated probabilities. A
        head other than ridge: slda's softmax (the Gaussian posterior under equal priors), balanced's and dual's as
        ridge's; ncm and fecam score distances and refuse.
        """
        return self.classifier.probabilities(self.scores(features))

    def check_width(self, dim: int, where: str | Path) -> None:
        """Refuse features of ``where`` (a store) whose width ``dim`` is not the one the model's projection takes."""
        if dim != self.projection.n_features_in_:
            raise FoalPipeError(f"the model expects {self.projection.n_features_in_}-dimensional features but "
                                f"{where} has {dim}; use a store made with the model's encoder")

    @locked  # every chunk predicted by one model, matched to its classes
    def store_predictions(self, features: str | Path, split: str = "test",
                          command: str = "store_predictions") -> tuple[np.ndarray, np.ndarray]:
        """``(true, predicted)`` label ids of the model for every row of a store's split, its classes matched to
        the model's by name (by label id where the model records no names): ``true`` is -1 for a row of a class the
        model does not know (or an unlabelled row); refused first where a chunk's scores do not fit the machine
        (:meth:`check_scoring`, ``command`` naming the refused).
        The store must come from the model's encoder (a ``learn --fusion`` model's store is fused as it was)."""
        from foal_pipe.store.meta import SPLITS, UNLABELLED

        if split not in SPLITS:
            raise FoalPipeError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
        store = open_model_store(features, self.encoder_spec)
        check_encoder(self.encoder_spec, store, features, unrecorded_ok=True)
        data = store.split(split)
        self.check_width(data.dim, features)
        self.check_scoring(command, data)
        ids = self.classifier.classes_.tolist()
        if self.named:
            known = self._ids_by_name()
            target = np.array([known.get(name, known.get(nfc(name), -1)) for name in store.classes] + [-1], dtype=np.int64)
        else:  # a model that records no names (saved from Python) knows its classes by label id, as `predict` reads it
            target = np.array([k if k in ids else -1 for k in range(len(store.classes))] + [-1], dtype=np.int64)
        labels = np.asarray(data.labels, dtype=np.int64)
        true = target[np.where(labels == UNLABELLED, len(store.classes), labels)]
        predicted = np.empty(data.n_rows, dtype=np.int64)
        for lo, X in data.iter_chunks():
            predicted[lo : lo + X.shape[0]] = self.predict(X)
        store.check_unchanged()
        return true, predicted

    def check_scoring(self, command: str, data: Any) -> int:
        """Refuse, before any row is read, a split (``data``, a store's) whose chunk's scores do not fit the machine
        (:func:`~foal_pipe.memory.check_memory`): a chunk is scored at once, rows x classes float64 with the ties'
        top two (and a head's own temporaries), beside the chunk's rows and their activations."""
        from foal_pipe.memory import TIES_BYTES, check_memory

        rows, classes = min(int(data.n_rows), int(data.chunk_rows)), len(self.classifier.classes_)
        head = self.classifier.name if isinstance(self.classifier, HeadClassifier) else "ridge"
        width = int(np.shape(self.projection.components_)[1])
        parts = {f"a chunk's scores ({rows:,} rows x {classes:,} classes)":
                 rows * classes * (8 + TIES_BYTES + HEADS[head].head.score_bytes),
                 f"a chunk's rows and activations ({rows:,} x {width:,})":
                 rows * (int(data.dim) * int(data.features.dtype.itemsize) + 2 * width * 8)}
        return check_memory(command, parts, "the store's chunks are scored whole: free memory, or score a store written "
                                            "in smaller chunks (extract's --chunk-rows)")

    def encoder(self, checkpoint: str | Path | None = None, device: str = "cpu") -> Any:
        """The encoder of the training store, rebuilt from ``encoder_spec`` and loaded (once, then cached: threads
        asking at once wait for the one load, under the model's lock)."""
        with owner_lock(self):
            if self._encoder is None:
                self._encoder = build_recorded_encoder(self.encoder_spec, checkpoint, device)
            return self._encoder

    def encode_images(self, images: Any, checkpoint: str | Path | None = None, batch_size: int = BATCH_SIZE) -> np.ndarray:
        """Features of images: paths (files) or uint8 arrays ``(n, 3, s, s)``, encoded ``batch_size`` at a time."""
        return encode_images(self.encoder(checkpoint), images, batch_size)

    def predict_images(self, images: Any, checkpoint: str | Path | None = None) -> np.ndarray:
        """Label ids for images (paths or uint8 arrays), encoded as the training store's images were."""
        return self.predict(self.encode_images(images, checkpoint))

    def predict_image_names(self, images: Any, checkpoint: str | Path | None = None) -> list[str]:
        """Class names for images (paths or uint8 arrays), as :meth:`predict_images` predicts them."""
        return self.predict_names(self.encode_images(images, checkpoint))

    # ------------------------------------------------------------------ learning
    def _ids_by_name(self) -> dict[str, int]:
        """The model's label id of each class name, by the name and by its Unicode NFC form (a name typed on macOS,
        whose file names are NFD, is the class of the name it prints as, as a dataset's folders are); an NFC form that
        two of the model's names share is left out, so only their exact names find them."""
        exact = dict(zip(self.class_names, self.classifier.classes_.tolist(), strict=True))
        folded: dict[str, int | None] = {}
        for name, label in exact.items():
            key = nfc(name)
            folded[key] = label if folded.get(key, label) == label else None
        return {**{key: label for key, label in folded.items() if label is not None}, **exact}

    def label_ids(self, names: Sequence[str]) -> np.ndarray:
        """Label ids for class names: a known name keeps its id (a name in another Unicode normalisation too), a new
        one gets the next id beyond the model's (in order of first appearance); :meth:`partial_fit` records the new
        names. Names that differ only in their normalisation are refused together: one name, or two classes (a
        store's) that would merge."""
        if isinstance(names, str) or not all(isinstance(name, str) for name in names):
            raise FoalPipeError(f"label_ids takes a sequence of class names (strings), not {clipped(repr(names))}; pass "
                                "e.g. ['cat', 'dog']")
        with owner_lock(self):  # the names and classes of one model
            ids, known = self._ids_by_name(), self.classifier.classes_
        if known.dtype.kind not in "iu":  # names map to ids; a classifier of other labels takes its own
            raise FoalPipeError(f"this model's classifier learned labels of dtype {known.dtype}, not integer class ids, so "
                                "class names have no ids here; give the classifier its own labels "
                                "(model.classifier.partial_fit(model.activations(X), labels))")
        nxt = int(known.max()) + 1 if known.size else 0
        out = np.empty(len(names), dtype=np.int64)
        spelled: dict[str, str] = {}
        for i, name in enumerate(names):
            if (first := spelled.setdefault(nfc(name), name)) != name:
                raise FoalPipeError(f"the class names hold {ascii(first)} and {ascii(name)}, one name ({nfc(name)!r}) in two "
                                    "Unicode normalisations, which print alike; spell it one way (unicodedata.normalize"
                                    "('NFC', name))")
            label = ids.get(name, ids.get(nfc(name)))
            if label is None:
                label = ids[name] = ids[nfc(name)] = nxt
                nxt += 1
            out[i] = label
        return out

    @locked  # the classifier and its class names change together
    @columns_checked()
    def partial_fit(self, features: Any, labels: Any) -> DeployedModel:
        """Absorb labelled rows: ``labels`` are class names (strings) or label ids. Exact: the result equals the
        model trained on its old rows and these together. Their count adds to :attr:`rows_outside_stores`, which
        :meth:`save` records. Returns ``self``."""
        if problem := names_problem(self.class_names, len(self.class_names)):  # edited in place: before any row is learned
            raise FoalPipeError(f"class_names {problem}; set one distinct string per class of classifier.classes_")
        X = self._features(features)
        ids, known = self._label_ids(labels, X.shape[0])
        old = dict(zip(self.classifier.classes_.tolist(), self.class_names, strict=True))
        for label in np.setdiff1d(ids, self.classifier.classes_).tolist():
            if label not in known:
                raise FoalPipeError(f"label id {label} is new to the model and has no name; pass class names "
                                    "(strings) as labels for new classes")
            old[label] = known[label]
        if isinstance(self.classifier, HeadClassifier):  # names=: its refusals name the class
            # mypy keeps AnalyticClassifier in this narrowing, as its scikit-learn bases are Any (sklearn has no stubs)
            self.classifier.partial_fit(self.rows(X), ids, names=old)  # type: ignore[call-arg]
        else:
            self.classifier.partial_fit(self.rows(X), ids)
        self.class_names = [old[c] for c in self.classifier.classes_.tolist()]
        return self

    @locked
    def save(self, path: str | Path) -> Path:
        """Write the model file (state, projection, class names, encoder provenance); :func:`load_model` reads it.
        A model whose file named no classes, and that was given no names since, is saved without them: the ids
        :func:`load_model` shows as names would otherwise become names, and a store's classes, matched by name, would
        all be unknown to it."""
        extra = {k: v for k, v in self.metadata.items() if k not in (*SET_BY_MODEL, INPUT_NAMES)}  # the projection's own
        extra["activation"] = self.projection.activation
        if self.rows_outside_stores:
            extra["rows_outside_stores"] = self.rows_outside_stores
        if self.named:
            extra["class_names"] = self.class_names
        if self.encoder_spec is not None:
            extra["encoder"] = self.encoder_spec
        return self.classifier.save(path, projection=self.projection, **extra)


def _numeric_columns(frame: Any) -> bool:
    """Whether ``frame`` is a DataFrame whose every column holds numbers (NumPy's or pandas' nullable integer and
    float dtypes, which ``np.asarray`` turns into Python objects)."""
    dtypes = getattr(frame, "dtypes", None)
    return hasattr(frame, "to_numpy") and dtypes is not None and len(dtypes) > 0 and all(
        getattr(dtype, "kind", "O") in "iuf" for dtype in dtypes)


def load_model(path: str | Path, *, estimators: bool = True) -> DeployedModel:
    """Read a model file written by ``foal-pipe learn`` (or :meth:`DeployedModel.save`), validated; nothing is
    unpickled. A model without class names names its classes by their ids. A head other than ridge has a
    :class:`~foal_pipe.model.headmodel.HeadClassifier` as its ``classifier``.

    ``estimators``: a ridge model's ``classifier`` is an :class:`AnalyticClassifier` and the ``projection`` a
    :class:`SmoothProjection` (scikit-learn estimators that keep learning); False: a
    :class:`~foal_pipe.model.ridgemodel.SavedRidge` and an :class:`~foal_pipe.core.expansion.Expansion`, which
    predict the same bits and give their sums to continue from without importing scikit-learn (the command line's)."""
    if stored_head(path) is not None:
        head, head_projection, names, meta = load_head(path, estimators=estimators)
        return DeployedModel(head, head_projection, names, meta.get("encoder"), meta)
    tensors, meta = read_model(path)  # every tensor, once: the projection here, the rest for the classifier
    if "projection" not in tensors:
        raise FoalPipeError(f"{path} has no 'projection' tensor; pass the model.safetensors that learn wrote")
    if "activation" not in meta and meta["format_version"] >= CHECKSUM_FROM:  # a version-1 file: the sigmoid, as then
        raise refuse(str(path), "metadata 'activation' is missing, which a ridge model file with a projection records "
                                f"from version {CHECKSUM_FROM} on")
    activation, dtype = meta.get("activation", "sigmoid"), tensors["projection"].dtype.name  # the run's: no rounding anew
    classifier: AnalyticClassifier | SavedRidge
    projection: SmoothProjection | Expansion
    if estimators:
        from foal_pipe.model.classifier import AnalyticClassifier
        from foal_pipe.model.projection import SmoothProjection

        classifier = AnalyticClassifier.loaded_from(path, tensors, meta, written=False)  # columns and names as its load
        projection = SmoothProjection.from_matrix(tensors["projection"], activation=activation, dtype=dtype)
    else:
        classifier = SavedRidge(RidgeModel.from_file(path, tensors, meta))
        projection = Expansion.from_matrix(tensors["projection"], activation=activation, dtype=dtype)
    projection = restore_input_names(projection, meta, path)
    return DeployedModel(classifier, projection, meta.get("class_names") or id_names(classifier.classes_),
                         meta.get("encoder"), meta)


def nfc(name: str) -> str:
    """``name`` in Unicode NFC form (``foal_pipe.datasets.sources.nfc``, without importing the datasets)."""
    return unicodedata.normalize("NFC", name)


def id_names(classes: np.ndarray) -> list[str]:
    """The names of a model that records none: its label ids as text."""
    return [str(c) for c in classes.tolist()]
