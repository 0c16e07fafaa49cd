"""A head other than ridge put to work from its model file: predict, keep learning, save again.

The model file holds the head's name and options, its scorer's parameters and its sufficient statistics
(:mod:`foal_pipe.heads.state`); :class:`HeadClassifier` stands where :class:`~foal_pipe.model.classifier.AnalyticClassifier`
stands for ridge, so :class:`~foal_pipe.model.deploy.DeployedModel` and ``predict`` work on top of it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import array_api_compat.numpy as xp_numpy
import numpy as np

from foal_pipe.core.backend import host_values, to_numpy
from foal_pipe.core.engines import owner_lock
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.scoring import Ties, best_of
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, Head, Scorer, make_head, probabilities
from foal_pipe.heads.state import export_head, head_file, restore_head, scorer_from
from foal_pipe.model.modelfile import read_model, refuse, write_model
from foal_pipe.model.ondemand import SolvesOnDemand
from foal_pipe.model.ridgemodel import check_metadata, finite_scores, restore_input_names, with_input_names

if TYPE_CHECKING:  # scikit-learn: loaded with the estimators, not by learn, predict, evaluate or learn --init-model
    from foal_pipe.model.projection import SmoothProjection


def head_width(name: str, tensors: Mapping[str, Any]) -> int:
    """The width of the rows the head takes (d or D), read from its scorer's tensors."""
    for key, dims in head_file(name).scorer.items():
        for axis, dim in enumerate(dims):
            if dim in ("d", "D"):
                return int(tensors[key].shape[axis])
    raise AssertionError(f"the {name} head's scorer has no row width")


class HeadClassifier(SolvesOnDemand):
    """A head's model from its file: ``classes_``, :meth:`class_scores` and :meth:`predict` as the run's own scorer
    gives them, and :meth:`partial_fit`, which continues the head's statistics exactly (each call one task).

    As :class:`~foal_pipe.model.headestimator.HeadEstimator`'s, ``partial_fit`` only adds the rows where the head
    :attr:`~foal_pipe.heads.base.HeadBase.solve_on_demand`: the model is solved (and its tensors exported) when a
    prediction, :attr:`tensors` or :meth:`save` first needs it, with the bits a solve after every call gives wherever
    each call's own solve would have succeeded (a call whose own solve would have been refused is kept where later rows
    make the model solvable: the exact solve over every row); a refused solve returns to the last solved model,
    saying how many calls it undid."""

    _STATE = ("_head", "_model", "_tensors", "_classes", "_new_rows", "_names", "n_samples_seen_")
    _names: dict[int, str] = {}  # class id -> name, as partial_fit's callers gave them: a refused solve names the class

    def __init__(self, name: str, options: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                 n_samples_seen: int, space: str | None = None, dtype: str = "float64") -> None:
        self.name, self.options = name, dict(options)
        self.dtype = dtype  # the rows' (``--dtype``): float32 rows are rounded, the statistics stay float64
        self.space = space or HEADS[name].space  # the rows it takes: its own, or the activations (``--head-rows``)
        self._projection = {key: tensors[key] for key in ("projection", "projection_bias") if key in tensors}
        self._tensors: dict[str, np.ndarray] | None = dict(tensors)  # None: not exported since the last solve
        self._model = None  # None: not built from the tensors yet, or calls pending
        self._head = None  # the running state (None: not restored from the tensors yet)
        self._classes = np.asarray(tensors["classes"], dtype=np.int64)
        self._new_rows: dict[int, int] = {}  # while pending: rows of the classes new since the last solve
        self.n_samples_seen_ = int(n_samples_seen)
        self._width = head_width(name, tensors)  # of the rows it takes: checked before any scores or sums

    _width: int | None = None  # None: a pickle from before the width was kept (unchecked)

    def _checked(self, rows: Any) -> np.ndarray:
        """``rows`` as float64 rows of the head's space, refused in one line unless 2-D, of the head's width and
        finite (NumPy's own errors, or a silent score of a 1-D row, otherwise)."""
        X = np.asarray(host_values(rows, "rows"), dtype=np.float64)
        width = self._width
        if X.ndim != 2 or (width is not None and X.shape[1] != width):
            raise FoalPipeError(f"rows have shape {X.shape} but the {self.name} head takes (n, {width}): rows of its "
                                f"space; pass DeployedModel.rows(features), or 2-D rows of {width} values")
        if not np.isfinite(X).all():
            raise FoalPipeError(f"rows hold NaN or inf (first at row {int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])}); "
                                "check the features")
        return X

    def __getstate__(self) -> dict[str, Any]:
        """The model-file tensors of every row so far stand for the running head, rebuilt from them when next needed
        (:meth:`_own_head`): no array namespace module is pickled. Solved first, under the lock: one model."""
        with owner_lock(self):
            tensors = self.tensors
            state = {k: v for k, v in self.__dict__.items() if k not in ("_head", "_model", "_undo")}
            return {**state, "_tensors": tensors, "_head": None, "_model": None}

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """The model-file tensors (:mod:`foal_pipe.heads.state`) of every row so far, exported when first needed."""
        if self._tensors is None:
            model = self.scorer
            self._tensors = {**export_head(self.name, self._head, model), **self._projection}
        return self._tensors

    @property
    def scorer(self) -> Scorer:
        """The model of every row so far: solved once after the last :meth:`partial_fit`, or built from the tensors
        when first needed (a model only written, ``learn --head``, never holds fecam's C Cholesky factors beside its
        C precisions). A refused solve returns to the last solved model and says how many calls it undid."""
        return self._solve()

    def _class_names(self) -> dict[int, str]:
        return self._names

    def _solved_model(self) -> Scorer:
        if self._model is None:
            self._model = scorer_from(self.name, self.tensors, self.options, xp_numpy)
        return self._model

    @property
    def classes_(self) -> np.ndarray:
        return self._classes

    def head(self, xp: Any = xp_numpy) -> Head:
        """A running state of the head holding the file's statistics, in namespace ``xp``."""
        return restore_head(make_head(self.name, self.options, xp, head_width(self.name, self.tensors)),
                            self.name, self.tensors)

    def _own_head(self) -> Head:
        """The solved running state, copied (or restored from copies of the tensors): the rows of a new task go to it,
        leaving the solved one as it was (heads add in place)."""
        if self._head is not None:
            return copy.deepcopy(self._head, {id(xp_numpy): xp_numpy})
        state = {key: np.array(self.tensors[key]) for key in (*head_file(self.name).state, "classes")}
        return restore_head(make_head(self.name, self.options, xp_numpy, head_width(self.name, self.tensors)),
                            self.name, state)

    def class_scores(self, rows: Any) -> np.ndarray:
        """The scorer's scores of the rows of the head's space, (n, n_classes), columns in ``classes_`` order."""
        rows = self._checked(rows)
        with np.errstate(over="ignore", invalid="ignore"):  # refused by finite_scores, without a warning first
            return finite_scores(np.asarray(to_numpy(self.scorer.scores(rows)), dtype=np.float64))

    def scores_with_ties(self, rows: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray] | None]:
        """:meth:`class_scores`, and a linear head's :class:`~foal_pipe.core.scoring.Ties` with the float64 rows
        (balanced's, ridge's); the other heads check their scores' resolution as they solve."""
        rows = self._checked(rows)
        ties = getattr(self.scorer, "ties", None)
        return self.class_scores(rows), None if ties is None else ties(rows)

    def predict(self, rows: Any, classes: Any = None) -> np.ndarray:
        """The class of the highest score among the classes seen (a head scores no others)."""
        if classes is not None:
            raise FoalPipeError(f"the {self.name} head predicts among the classes it has seen; leave out classes")
        scores, ties = self.scores_with_ties(rows)
        return best_of(scores, self.classes_, ties=ties)[0]

    def partial_fit(self, rows: Any, labels: np.ndarray, names: Mapping[int, str] | None = None) -> HeadClassifier:
        """Add rows of the head's space as one more task: the model equals the head fitted on every row so far. A
        class the head cannot fit at the task's end (fecam's of one row) or a batch the head refuses is refused by this
        call, which then changes nothing (the calls since the last solve stay); a head whose boundary ends a task
        (dual) solves here, refused the same way. ``names`` (class id -> name) lets a refusal name the class."""
        labels = np.asarray(host_values(labels, "labels"))
        if labels.dtype.kind not in "iu" or labels.ndim != 1:
            raise FoalPipeError(f"labels must be a 1-D array of integer class ids, got {labels.dtype} of shape "
                                f"{labels.shape}; pass ids (DeployedModel.partial_fit takes class names too)")
        if labels.dtype.kind == "u" and labels.size and int(labels.max()) > np.iinfo(np.int64).max:
            raise FoalPipeError(f"label id {int(labels.max())} lies outside the int64 range of a model's ids; map the "
                                "labels to ids 0, 1, ...")
        labels = labels.astype(np.int64)
        rows = self._checked(rows)
        if rows.shape[0] != labels.size:
            raise FoalPipeError(f"{rows.shape[0]} rows but {labels.size} labels; pass one label per row")
        pending = self._undo
        solved = self._classes if pending is None else pending[0]["_classes"]  # each fitted at its solve
        new_rows = {} if pending is None else dict(self._new_rows)
        fresh, counts = np.unique(labels[~np.isin(labels, solved)], return_counts=True)
        for label, n in zip(fresh.tolist(), counts.tolist()):
            new_rows[label] = new_rows.get(label, 0) + n
        named = {**self._names, **(names or {})}
        HEADS[self.name].head.check_counts([named.get(c, c) for c in sorted(new_rows)], [new_rows[c] for c in sorted(new_rows)])
        head, model, undo = self._take(rows, labels, self._own_head,
                                       not HEADS[self.name].head.solve_on_demand, named)
        self._head, self._tensors, self._new_rows, self._names = head, None, new_rows, named
        self._classes = np.union1d(self._classes, labels).astype(np.int64)
        self.n_samples_seen_ += int(labels.size)
        self._keep(model, undo)
        return self

    def rows(self, X: np.ndarray, projection: SmoothProjection | Expansion) -> np.ndarray:
        """The rows of the head's space for checked features ``X``: the features, the projected rows or the
        activations, computed in the model's dtype and given as float64 (as the walk gives them)."""
        space, dtype = self.space, np.dtype(self.dtype)
        if space == "features":
            return np.asarray(X, dtype=dtype).astype(np.float64, copy=False)
        if space == "projected":
            rows = np.asarray(X, dtype=dtype) @ np.asarray(projection.components_, dtype=dtype)
            return rows.astype(np.float64, copy=False)
        return np.asarray(projection.transform(X), dtype=np.float64)

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        """Class probabilities where the head's scores mean them (:func:`foal_pipe.heads.probabilities`)."""
        return probabilities(self.name, scores)

    def save(self, path: str | Path, projection: SmoothProjection | Expansion | None = None, **metadata: Any) -> Path:
        """Write the model file: the head's tensors and options; the projection where the head takes projected rows,
        its ``activation`` where it takes the activations (other keys as :func:`~foal_pipe.model.modelfile.write_model`
        keeps them)."""
        check_metadata(metadata, self.classes_.size)
        tensors = {key: value for key, value in self.tensors.items() if key not in ("projection", "projection_bias")}
        space = self.space
        if projection is not None and space != "features":
            tensors["projection"] = projection.components_
            if space == "activations" and projection.bias_ is not None:  # cos: random Fourier features
                tensors["projection_bias"] = projection.bias_
        kept = {k: v for k, v in metadata.items() if space == "activations" or k != "activation"}
        if projection is not None and space == "activations":  # what its rows are: load_head rebuilds them with it
            kept.setdefault("activation", projection.activation)
        if projection is not None:  # a head on the features: the columns set on its identity, what load_head gives it
            kept = with_input_names(projection, kept)
        rounded = {"dtype": self.dtype} if self.dtype != "float64" else {}  # float64: the files written before
        return write_model(path, tensors, {**kept, "head": self.name, "head_options": self.options,
                                           "n_samples_seen": self.n_samples_seen_, **rounded})


def _check_activation(activation: Any, bias: bool, name: str, where: str) -> None:
    """Refuse a head file on the activations whose ``activation`` is not recorded (no default could be right for
    every file) or whose bias contradicts it: ``cos`` adds one, no other activation does."""
    if activation is None:
        raise refuse(where, f"metadata 'activation' is missing, which the {name} head's file records: its rows are "
                            "the projection's activations")
    if bias != (activation == "cos"):
        problem = "needs the projection's bias" if activation == "cos" else "takes no projection bias"
        raise refuse(where, f"activation {activation!r} {problem}, but the file holds {'no' if not bias else 'a'} "
                            "tensor 'projection_bias'")


def _identity(d: int, estimators: bool) -> SmoothProjection | Expansion:
    """The features as they are: what a head on the store's features is given."""
    if not estimators:
        return Expansion.draw(d, 0, "uniform", "identity", None, "float64")
    from foal_pipe.model.projection import SmoothProjection

    return SmoothProjection(n_components=0, activation="identity").fit(np.zeros((1, d)))


def load_head(path: str | Path, *, estimators: bool = True
              ) -> tuple[HeadClassifier, SmoothProjection | Expansion, list[str], dict[str, Any]]:
    """A head's model file, validated (nothing is unpickled): its classifier, the projection its rows take (the
    identity for a head on the store's features; an :class:`~foal_pipe.core.expansion.Expansion` without
    ``estimators``), its class names and metadata."""
    tensors, meta = read_model(path)
    name = meta["head"]
    own = HEADS[name].space  # a head on the store's features given the activations keeps the projection (--head-rows)
    space = "activations" if own == "features" and "projection" in tensors else own
    classifier = HeadClassifier(name, meta["head_options"], tensors, meta["n_samples_seen"], space,
                                meta.get("dtype", "float64"))
    if space == "activations":
        _check_activation(meta.get("activation"), "projection_bias" in tensors, name, str(path))
    elif "projection_bias" in tensors:
        raise refuse(str(path), f"tensor 'projection_bias' does not belong to the {name} head on its {space} rows (only "
                                "activation 'cos' adds a bias)")
    if "projection" in tensors:
        activation = meta.get("activation", "identity")  # a head on projected rows (dual): the projection alone
        dtype = tensors["projection"].dtype.name  # the run's (float32 with --dtype float32): saved again as it was
        if estimators:
            from foal_pipe.model.projection import SmoothProjection

            projection: SmoothProjection | Expansion = SmoothProjection.from_matrix(
                tensors["projection"], activation=activation, dtype=dtype, bias=tensors.get("projection_bias"))
        else:
            projection = Expansion.from_matrix(tensors["projection"], activation=activation, dtype=dtype,
                                               bias=tensors.get("projection_bias"))
    else:
        projection = _identity(head_width(name, tensors), estimators)
    projection = restore_input_names(projection, meta, path)
    names = meta.get("class_names") or [str(c) for c in classifier.classes_.tolist()]
    return classifier, projection, names, meta
