"""A ridge model as its file holds it, free of scikit-learn: ``learn`` saves one directly and
:meth:`AnalyticClassifier.save <foal_pipe.model.classifier.AnalyticClassifier.save>` through one, so the ridge
file's tensors and metadata are written in one place (:func:`~foal_pipe.model.modelfile.write_model` checks them),
and read in one (:meth:`RidgeModel.load`, which :meth:`AnalyticClassifier.load
<foal_pipe.model.classifier.AnalyticClassifier.load>` builds on). :class:`SavedRidge` puts a loaded one to work for
``predict``, ``evaluate`` and ``learn --init-model``, so they start without importing scikit-learn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from foal_pipe.core.backend import dtype_name, to_numpy
from foal_pipe.core.engines import ENGINES, check_gamma, checked_weights, saved_sums
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.gammasearch import PER_DECADE, search_grid
from foal_pipe.core.rounding import Rounding
from foal_pipe.core.scoring import Ties, among_classes, best_of
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError, MissingAttribute, clipped
from foal_pipe.heads import probabilities
from foal_pipe.model.modelfile import METADATA, read_model, write_model


@dataclass(frozen=True)
class RidgeModel:
    """An engine's ``state`` (the gram engine's ``G``, ``Q`` and ``counts``, or the recursion's ``R`` and ``W``),
    the ``weights`` solved at ``gamma``, the sorted ``classes``, the state's ``dtype`` and the rows seen;
    ``gamma_grid`` for a model that keeps choosing its gamma (``gamma="auto"``), over ``per_decade`` points a
    decade of its range (recorded beside the grid; files written before lack it, read as the default)."""

    state: Mapping[str, Any]
    weights: Any
    classes: np.ndarray
    gamma: float
    engine: str
    dtype: str
    n_samples: int
    gamma_grid: Sequence[float] | None = None
    per_decade: int = PER_DECADE
    feature_names: Sequence[str] | None = None  # the columns of a DataFrame the estimator was fitted on

    @classmethod
    def solved(cls, statistics: RidgeStatistics, gamma: float, gamma_grid: Sequence[float] | None = None,
               per_decade: int = PER_DECADE) -> RidgeModel:
        """The gram model of ``statistics`` at ``gamma``: its weights solved, refused when not finite; ``gamma_grid``:
        chosen over that grid (``--gamma auto``), so that a continued model keeps choosing."""
        W = to_numpy(checked_weights(statistics.solve(gamma)))
        return cls(statistics.state(), W, statistics.classes, float(gamma), "gram", dtype_name(statistics.dtype),
                   int(statistics.n), None if gamma_grid is None else tuple(gamma_grid), per_decade)

    @classmethod
    def load(cls, path: str | Path) -> RidgeModel:
        """A ridge model file, read and validated by :func:`~foal_pipe.model.modelfile.read_model` (nothing is
        unpickled): the engine's state and the weights as saved (no solve: the same bits on any machine); a
        ``gamma="auto"`` model's grid is checked as the estimator checks it."""
        return cls.from_file(path, *read_model(path))

    @classmethod
    def from_file(cls, path: str | Path, tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> RidgeModel:
        """:meth:`load` of the ``tensors`` and ``meta`` that :func:`~foal_pipe.model.modelfile.read_model` read from
        ``path`` (every tensor), so that a caller who needs the file's other parts reads it once."""
        if "head" in meta:
            raise FoalPipeError(f"{path} is the {meta['head']} head's model file, not a ridge model's; load it with "
                                "foal_pipe.load_model(path)")
        engine, grid, per_decade = meta["engine"], meta.get("gamma_grid"), meta.get("per_decade", PER_DECADE)
        if grid is not None:
            if engine != "gram":
                raise FoalPipeError("gamma='auto' needs engine='gram' (the RLS recursion fixes gamma in R0 = I/gamma)")
            for g in grid:
                check_gamma(g)
            search_grid(grid, per_decade)
        names, d = meta.get("feature_names"), tensors["W"].shape[0]
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)
                                      and len(set(names)) == len(names) == d):
            raise FoalPipeError(f"{path}: metadata 'feature_names' is not {d} distinct strings, one per row of W (the "
                                "columns the estimator was fitted on); the file was edited: train and save the model again")
        kept = (*ENGINES[engine].state_names, "counts", "drift", "G", "Q")  # rls: its checking sums, if kept
        state: dict[str, Any] = {name: a for name, a in tensors.items() if name in kept}
        if "sums_rounding" in meta:  # the sums' rounding (RidgeStatistics.rounding): gram's, or rls's checking sums
            errors, diagonal = meta.get("sums_rounding_errors"), meta.get("sums_rounding_diagonal")
            state["rounding"] = Rounding(float(meta["sums_rounding"]), None if errors is None else np.asarray(errors),
                                         None if diagonal is None else np.asarray(diagonal))
        return cls(state, tensors["W"], tensors["classes"].astype(np.int64), meta["gamma"], engine, meta["dtype"],
                   meta["n_samples_seen"], grid, per_decade, None if names is None else tuple(names))

    def save(self, path: str | Path, projection: np.ndarray | None = None, **metadata: Any) -> Path:
        """Write the model file: the state, ``W`` (float64), ``classes``, the ``projection`` matrix when given, and
        ``metadata`` (foal_pipe/model/modelfile.py lists the known keys) with the settings."""
        if not np.issubdtype(self.classes.dtype, np.integer):
            raise FoalPipeError("only integer class labels can be saved; map labels to integer ids first")
        if self.classes.size and int(self.classes.min()) < 0:
            raise FoalPipeError(f"class label {int(self.classes.min())} is negative, but a model file holds class ids "
                                ">= 0; map the labels to ids 0, 1, ... first")
        if self.classes.dtype.kind == "u" and self.classes.size and int(self.classes.max()) > np.iinfo(np.int64).max:
            raise FoalPipeError(f"class label {int(self.classes.max())} is above 2**63 - 1, the largest id a model file "
                                "holds (int64); map the labels to smaller ids first")
        tensors = {name: to_numpy(a) for name, a in self.state.items() if name != "rounding"}
        if "G" in tensors:
            tensors["G"] = lower_mirrored(tensors["G"])
        tensors["W"] = to_numpy(self.weights).astype(np.float64)
        tensors["classes"] = self.classes.astype(np.int64)
        if projection is not None:
            tensors["projection"] = projection
        settings = {"gamma": float(self.gamma), "engine": self.engine, "dtype": self.dtype,
                    "n_samples_seen": self.n_samples}
        if self.gamma_grid is not None:
            settings["gamma_grid"] = [float(g) for g in self.gamma_grid]
            settings["per_decade"] = int(self.per_decade)
        if self.feature_names is not None:
            settings["feature_names"] = [str(name) for name in self.feature_names]
        rounding = self.state.get("rounding")
        if rounding is not None:
            settings["sums_rounding"] = float(rounding.variance)
            if rounding.errors is not None:
                settings["sums_rounding_errors"] = [float(e) for e in rounding.errors]
            if rounding.diagonal is not None:
                settings["sums_rounding_diagonal"] = [float(e) for e in rounding.diagonal]
        return write_model(path, tensors, {**metadata, **settings})


def lower_mirrored(G: np.ndarray) -> np.ndarray:
    """``G`` with its upper triangle copied from its lower, the triangle the solve factors (NumPy's, CuPy's and torch's
    Cholesky read it): a product ``H^T H`` off NumPy (torch's float32 one at D = 6) stands a rounding from symmetric,
    which the file's check of ``W`` against the whole ``G`` took for an altered file and refused to write. An exactly
    symmetric ``G`` (NumPy's) is written as it is."""
    if G.ndim != 2 or bool((G == G.T).all()):
        return G
    return np.tril(G) + np.tril(G, -1).T


#: Metadata a model file's writer takes from the model itself (its settings, its format and checksum; a head's name,
#: options and rows seen): a ``save(**metadata)`` naming one is refused rather than overwritten (a fixed-gamma
#: model saved with ``gamma_grid=`` read back as ``gamma="auto"``).
SET_BY_MODEL = ("format", "format_version", "checksum", "gamma", "engine", "dtype", "n_samples_seen", "gamma_grid",
                "per_decade", "feature_names", "sums_rounding", "sums_rounding_errors", "sums_rounding_diagonal", "head",
                "head_options")


def check_metadata(metadata: Mapping[str, Any], n_classes: int) -> None:
    """Refuse ``save`` metadata that the model sets itself (:data:`SET_BY_MODEL`), or that a model file's reader would
    refuse (:data:`~foal_pipe.model.modelfile.METADATA`), naming the keyword to correct rather than the file."""
    if taken := [key for key in SET_BY_MODEL if key in metadata]:
        raise FoalPipeError(f"save() sets {', '.join(map(repr, taken))} from the model itself; drop "
                            f"{'it' if len(taken) == 1 else 'them'} from the metadata (set the estimator's parameters "
                            "before fitting instead)")
    for key, value in metadata.items():
        if key in METADATA and (problem := METADATA[key][1](value, n_classes)):
            raise FoalPipeError(f"save()'s {key}={clipped(repr(value))} {problem}; correct it or leave it out")


def finite_scores(scores: np.ndarray) -> np.ndarray:
    """``scores``, refused where a product overflowed float64 (finite rows too large for the weights): an argmax
    of infinities, or of NaN, would answer from ties rather than from the scores."""
    if not np.isfinite(scores).all():
        raise FoalPipeError("the scores of X overflow float64 (inf or NaN): its rows are too large for the model's "
                            "weights; rescale the features to the range the model was trained on")
    return scores


def ridge_projection(projection: Any, metadata: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The matrix a ridge model file stores for ``projection`` (None: none) and ``metadata`` with its ``activation``,
    which :func:`~foal_pipe.model.deploy.load_model` rebuilds it with (an ``activation`` given that contradicts it is
    refused); a ``cos`` projection, whose bias the ridge file does not hold, refused rather than saved without it."""
    if projection is None:
        return None, metadata
    activation = getattr(projection, "activation", None)
    if not isinstance(activation, str):
        raise FoalPipeError(f"projection must be a fitted SmoothProjection, got {type(projection).__name__}; for a "
                            "matrix P pass SmoothProjection.from_matrix(P, activation=...)")
    if getattr(projection, "components_", None) is None:
        raise FoalPipeError(f"the {type(projection).__name__} passed as projection is not fitted; fit it first (it reads "
                            "only the feature count)")
    if getattr(projection, "bias_", None) is not None:
        raise FoalPipeError(f"a ridge model file holds no projection bias, which activation {activation!r} "
                            "needs; save a head's model (`foal-pipe learn --head slda --head-rows activations`) or use "
                            "relu or sigmoid")
    given = metadata.get("activation", activation)
    if given != activation:
        raise FoalPipeError(f"activation={given!r} contradicts the projection's activation {activation!r}; drop "
                            "activation= (the projection's is recorded)")
    return projection.components_, {**with_input_names(projection, metadata), "activation": activation}


#: Model-file metadata: the DataFrame columns the projection was fitted on (its ``feature_names_in_``).
INPUT_NAMES = "projection_feature_names"


def with_input_names(projection: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` with the columns ``projection`` was fitted on (:data:`INPUT_NAMES`; none: left out), so that a
    loaded model refuses a DataFrame of other columns as the projection did; names given that contradict them are
    refused."""
    names = getattr(projection, "feature_names_in_", None)
    names = None if names is None else [str(name) for name in names]
    if INPUT_NAMES in metadata and metadata[INPUT_NAMES] != names:
        raise FoalPipeError(f"{INPUT_NAMES}={clipped(repr(metadata[INPUT_NAMES]))} contradicts the projection's "
                            f"feature_names_in_ ({clipped(repr(names))}); drop {INPUT_NAMES}= (the projection's are "
                            "recorded)")
    kept = {k: v for k, v in metadata.items() if k != INPUT_NAMES}
    return kept if names is None else {**kept, INPUT_NAMES: names}


def is_identity_matrix(matrix: Any) -> bool:
    """Whether a projection matrix is the identity: behind it, the classifier's columns are the model's inputs."""
    P = np.asarray(matrix)  # no D x D identity built to compare with: a wide square projection is large
    return (P.ndim == 2 and P.shape[0] == P.shape[1] and bool((np.diagonal(P) == 1).all())
            and int(np.count_nonzero(P)) == P.shape[0])


def identity_names(matrix: Any, meta: Mapping[str, Any]) -> list[str] | None:
    """The columns a model file records for the features behind an identity ``matrix`` (the identity activation):
    its projection's, or (written by a learner fitted on a DataFrame) its classifier's; None elsewhere."""
    if matrix is None or meta.get("activation", "sigmoid") != "identity" or not is_identity_matrix(matrix):
        return None
    return meta.get(INPUT_NAMES) or meta.get("feature_names")


def restore_input_names(projection: Any, meta: Mapping[str, Any], where: str | Path) -> Any:
    """``projection`` (rebuilt from a model file) with the ``feature_names_in_`` its file records, refused unless
    one distinct string per row of its matrix; behind an identity projection, the classifier's (``feature_names``)
    where the projection records none, so that a DataFrame is checked against the columns the learner saw."""
    names, d = meta.get(INPUT_NAMES), int(projection.components_.shape[0])
    if (names is None and projection.activation == "identity" and getattr(projection, "bias_", None) is None
            and is_identity_matrix(projection.components_)):
        names = meta.get("feature_names")
    if names is None:
        return projection
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names) == d):
        raise FoalPipeError(f"{where}: metadata {INPUT_NAMES!r} is not {d} distinct strings, one per row of the "
                            "projection (the columns it was fitted on); the file was edited: train and save the model again")
    kept = np.asarray(names, dtype=object)
    if isinstance(projection, Expansion):  # frozen
        return replace(projection, feature_names_in_=kept)
    projection.feature_names_in_ = kept
    return projection


class RidgeFace:
    """What :class:`~foal_pipe.model.deploy.DeployedModel` asks of every classifier, as ridge answers it, so a
    deployed model has one path for every head: the head's ``name``, the rows it scores (the projection's
    activations) and how its scores become probabilities (the registry's rule for ridge)."""

    name: ClassVar[str] = "ridge"

    def rows(self, X: np.ndarray, projection: Any) -> np.ndarray:
        """The activations ``projection.transform(X)`` of checked features ``X``: what ridge scores."""
        return projection.transform(X)

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        """Ridge's scores as class shares (:func:`~foal_pipe.heads.base.shares`: clipped at 0, normalised)."""
        return probabilities(self.name, scores)


class SavedRidge(RidgeFace):
    """A :class:`RidgeModel` put to work without scikit-learn, as ``predict``, ``evaluate`` and ``learn --init-model``
    load one: ``classes_``, :meth:`class_scores` and :meth:`predict` give what :meth:`AnalyticClassifier.load
    <foal_pipe.model.classifier.AnalyticClassifier.load>`'s estimator gives, bit for bit, and ``statistics_`` the
    gram sums to continue from. Learning row by row is the estimator's (:func:`~foal_pipe.model.deploy.load_model`)."""

    def __init__(self, model: RidgeModel) -> None:
        self.model = model

    @property
    def classes_(self) -> np.ndarray:
        return self.model.classes

    @property
    def n_samples_seen_(self) -> int:
        return int(self.model.n_samples)

    @property
    def statistics_(self) -> RidgeStatistics:
        """The gram engine's sums in the state dtype (the RLS recursion keeps ``R`` and ``W`` instead)."""
        if self.model.engine != "gram":
            raise MissingAttribute("only the gram engine keeps sufficient statistics; use engine='gram'")
        return saved_sums(self.model.state, self.model.classes, self.model.n_samples, np.empty(0), np.dtype(self.model.dtype))

    def weights(self) -> np.ndarray:
        """``W`` in float64, refused when not finite; the recursion's as its state dtype holds it."""
        W = np.asarray(self.model.weights)
        if self.model.engine == "rls":
            W = W.astype(self.model.dtype)
        return checked_weights(W).astype(np.float64)

    def class_scores(self, rows: Any) -> np.ndarray:
        """Scores ``rows @ W`` in float64, shape (n, n_classes), columns in ``classes_`` order."""
        return self.scores_with_ties(rows)[0]

    def scores_with_ties(self, rows: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray]]:
        """:meth:`class_scores`, and the weights' :class:`~foal_pipe.core.scoring.Ties` with the float64 rows, which
        :meth:`predict` checks the ranking with."""
        W = self.weights()
        X = np.asarray(rows, dtype=np.float64)
        if not np.isfinite(X).all():
            raise FoalPipeError("X contains NaN or inf; check the features (re-extract the store)")
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, without a warning first
            scores = finite_scores(X @ W)
        drift = self.model.state.get("drift")  # an rls model's, as it was saved
        return scores, (Ties.of(W, drift=None if drift is None else np.asarray(drift, dtype=np.float64)), X)

    def predict(self, rows: Any, classes: Any = None) -> np.ndarray:
        """The class of the highest score among ``classes_`` with rows (a class of row count 0, declared to the
        estimator that saved it, is never predicted), or among ``classes``, every label of the task."""
        scores, (ties, kept) = self.scores_with_ties(rows)
        counts = self.model.state.get("counts")
        seen = np.ones(self.classes_.size, dtype=bool) if counts is None else np.asarray(counts) > 0
        if not seen.any():
            raise FoalPipeError("no class of the model has rows (its row counts are all 0), so there is no class seen "
                                "to predict; train it on labelled rows")
        among = among_classes(self.classes_[seen], classes)  # a class without rows is never predicted
        return best_of(scores[:, seen], self.classes_[seen], among, (ties.columns(seen), kept))[0]

    def partial_fit(self, rows: Any, labels: Any) -> SavedRidge:
        raise FoalPipeError("a model loaded with estimators=False only predicts; load it with load_model(path) to keep "
                            "learning")

    def save(self, path: str | Path, projection: Any = None, **metadata: Any) -> Path:
        """Write the model file, with ``projection``'s matrix and activation when given (:meth:`RidgeModel.save`)."""
        check_metadata(metadata, self.classes_.size)
        matrix, metadata = ridge_projection(projection, metadata)
        return self.model.save(path, matrix, **metadata)
