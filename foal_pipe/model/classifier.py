"""AnalyticClassifier: an exact online ridge classifier, a scikit-learn estimator with ``partial_fit``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device
from sklearn.base import BaseEstimator, ClassifierMixin

from foal_pipe.core.backend import backend_of, dtype_name, get_namespace, resolve_dtype, to_numpy
from foal_pipe.core.engines import (
    DEFAULT_ENGINE,
    GramEngine,
    check_engine_dtype,
    checked_weights,
    grow_classes,
    locked,
    owner_lock,
)
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.gammasearch import PER_DECADE
from foal_pipe.core.scoring import Ties, among_classes, best_of
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError, InputTypeError, MissingAttribute, param
from foal_pipe.model.filerecord import FileRecord
from foal_pipe.model.fittedparams import check_fitted_params, new_engine
from foal_pipe.model.labels import check_label_kinds
from foal_pipe.model.modelfile import read_model
from foal_pipe.model.projection import NotFitted, SmoothProjection
from foal_pipe.model.ridgeinput import UserErrors, batch_labels, state_array, task_classes, validated
from foal_pipe.model.ridgemodel import (
    SET_BY_MODEL,
    RidgeFace,
    RidgeModel,
    check_metadata,
    finite_scores,
    identity_names,
    ridge_projection,
)
from foal_pipe.model.stateviews import OwnState, read_only, read_only_statistics, row_major

#: scikit-learn's ``check_estimator`` checks that AnalyticClassifier fails on purpose, with the reason
#: (passed as ``expected_failed_checks``; the tests hold the list to at most 3).
SKLEARN_EXPECTED_FAILURES: dict[str, str] = {}

#: Where pickles of a loaded classifier written before the twenty-ninth stop find its file record.
_FileRecord = FileRecord

#: Fitted state that :meth:`AnalyticClassifier.fit` clears before learning again.
_FITTED = ("_engine", "_dtype", "_fitted_with", "_rowless", "_recorded", "classes_", "n_features_in_",
           "feature_names_in_", "n_samples_seen_")
#: The parameters the fitted state is built with: ``set_params`` changes them for the next ``fit`` only.
_STATE_PARAMS = ("gamma", "engine", "dtype", "backend", "gamma_grid", "per_decade")


class AnalyticClassifier(UserErrors, RidgeFace, OwnState, ClassifierMixin, BaseEstimator):
    """Linear classifier on activations, fitted to one-hot labels by exact online ridge regression.

    After every ``partial_fit`` call the weights equal the closed-form ridge solution
    ``(H^T H + gamma I)^-1 H^T Y`` over all samples seen so far, whatever the batch sizes or order.
    ``fit`` is a fresh start followed by one ``partial_fit``.

    Unlike scikit-learn, ``classes_`` grows: a class first seen in a later call gets a zero column in
    ``W`` inserted where it sorts. ``R`` (or ``G``) depends only on the features, so this stays exact.

    Parameters
    ----------
    gamma : float or "auto", default=1.0
        Ridge regularisation (``R0 = I / gamma``); must be > 0. ``"auto"`` (gram engine) picks, at every
        solve, the gamma with the least generalised cross-validation score among ``per_decade`` log-spaced points
        per decade of ``gamma_grid``'s range (:func:`~foal_pipe.core.gammasearch.search_grid`): computed from
        the statistics alone, with no past sample (a warning flags a choice where GCV is unreliable).
        ``foal-pipe learn --gamma auto`` can also use exact leave-one-out, because it re-reads the rows.
    engine : {"gram", "rls"}, default="gram"
        ``"rls"``: the paper's per-batch Woodbury recursion (float64; its weights checked when used against the exact
        solve of sums kept beside it, :class:`~foal_pipe.core.engines.RLSEngine`). ``"gram"``: accumulate ``H^T H`` and
        ``H^T Y`` (a :class:`~foal_pipe.core.statistics.RidgeStatistics`) and solve when the weights are needed
        (the same solution, much faster on CPU).
    dtype : {"float64", "float32"}, default="float64"
        Dtype of the state. float32 halves the memory of the sums; the gram engine still solves in float64
        and refuses a gamma below the float32 resolution of its sums.
    backend : {"auto", "numpy", "cupy", "torch"}, default="numpy"
        Array namespace for the state (torch: on CUDA when available, else the CPU); ``auto``: CuPy if it
        sees a GPU, else torch on CUDA, else NumPy. Inputs may be host arrays or arrays of the backend;
        labels, classes and counts stay host NumPy arrays.
    gamma_grid : sequence of float or None, default=None
        The range of ``gamma="auto"``'s search (its least and greatest values); None: 1e-4 ... 1e8.
    per_decade : int, default=8
        ``gamma="auto"``'s log-spaced points per decade of that range, besides the grid's own (0: the grid's only), as
        ``foal-pipe learn --per-decade`` sets them; a model file records it beside the grid.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Sorted labels seen so far; column ``k`` of ``weights_`` scores ``classes_[k]``.
    weights_ : ndarray of shape (n_features_in_, n_classes)
        The paper's ``W`` (D x C), as a read-only NumPy array (it may be the state itself: copy it to change it).
    coef_ : ndarray of shape (n_classes, n_features_in_)
        ``weights_.T``, scikit-learn's orientation.
    gamma_ : float
        The gamma of ``weights_`` (the chosen one when ``gamma="auto"``).
    statistics_ : RidgeStatistics
        The gram engine's sums ``G``, ``Q`` (read-only), classes and row counts.
    n_features_in_ : int
    n_samples_seen_ : int

    Threads: ``fit``, ``partial_fit``, the lazy solve and ``save`` hold the estimator's lock; a reader takes the
    weights, ``classes_`` and the classes with rows together under it and scores outside it, so a read beside a
    ``partial_fit`` in another thread gives the model before or after that call, never a mix.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> H, y = rng.random((20, 5)), np.repeat([3, 7], 10)
    >>> clf = AnalyticClassifier(gamma=1.0).partial_fit(H[:10], y[:10]).partial_fit(H[10:], y[10:])
    >>> clf.classes_.tolist()
    [3, 7]
    """

    def __init__(
        self,
        *,
        gamma: float | str = 1.0,
        engine: str = DEFAULT_ENGINE,
        dtype: str = "float64",
        backend: str = "numpy",
        gamma_grid: Sequence[float] | None = None,
        per_decade: int = PER_DECADE,
    ) -> None:
        self.gamma = gamma
        self.engine = engine
        self.dtype = dtype
        self.backend = backend
        self.gamma_grid = gamma_grid
        self.per_decade = per_decade

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "_engine")

    def __getstate__(self) -> dict[str, Any]:
        """scikit-learn's state, with the lazy solve done (gram) or the recursion verified (rls) first, under the lock:
        a prediction does not change the pickle, and an rls pickle holds sums, not the rows of its pending batches.
        A model whose solve is refused is refused by pickling, with the same line."""
        with owner_lock(self):
            if self.__sklearn_is_fitted__():
                self._engine.weights()
            return super().__getstate__()

    def _start(self, n_features: int, label_dtype: np.dtype) -> None:
        """A fresh engine for ``n_features`` features, the parameters it is built with recorded: ``gamma_``, ``save``
        and later ``partial_fit`` calls use those, whatever ``set_params`` sets later."""
        fitted = {name: getattr(self, name) for name in _STATE_PARAMS}
        self._engine, self._dtype = new_engine(n_features, **fitted)
        self.classes_ = np.empty(0, dtype=label_dtype)
        self._rowless = self.classes_  # labels of classes_ declared by partial_fit's classes= that have no rows yet
        self.n_samples_seen_ = 0
        self._fitted_with = fitted

    def _state_array(self, X: Any, dtype: Any = None) -> Any:
        """``X`` in the state's namespace and device, in the state's dtype (or ``dtype``), refused if not finite."""
        return state_array(X, self._fitted_with["backend"], self._engine.template, dtype)

    def fit(self, X: Any, y: Any) -> AnalyticClassifier:
        """Forget everything learned, then :meth:`partial_fit` on ``(X, y)``."""
        with owner_lock(self):
            self._forget()
            return self.partial_fit(X, y)

    def _forget(self) -> None:
        for name in _FITTED:
            self.__dict__.pop(name, None)

    @locked
    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> AnalyticClassifier:
        """Absorb one batch of activations ``X`` (n, D) with labels ``y`` (n,). Returns ``self``.

        ``classes``: labels to add now (zero columns until their rows come); labels may also appear later. The
        state keeps the ``gamma``, ``engine``, ``dtype``, ``backend`` and ``gamma_grid`` it was fitted with: a call
        after ``set_params`` changed one is refused (:meth:`fit` starts afresh with the new value).
        """
        first = not self.__sklearn_is_fitted__()
        if not first:
            check_fitted_params(self, self._fitted_with)
        before = getattr(self, "classes_", None)
        try:
            X, y = validated(self, X, y, reset=first)
            y, labels = batch_labels(y, classes)
            if first:
                check_engine_dtype(self.engine, resolve_dtype(self.dtype).name)
                self._start(int(X.shape[1]), y.dtype)
                before = self.classes_
            else:
                check_label_kinds(self.classes_, labels)
            X = self._state_array(X)
            self._add_classes(labels)
            self._engine.update(X, y, self.classes_)
        except BaseException:
            if first:  # a refused first batch leaves the estimator unfitted, as it was (n_features_in_ included)
                self._forget()
            elif self.classes_ is not before:  # nor does a later one add its classes (zero columns that would score)
                assert before is not None  # a fitted estimator has classes_
                self._engine.restore_classes(before, self.classes_)
                self.classes_ = before
            raise
        assert before is not None  # the classes_ before this batch: _start set them on the first
        self._rowless = np.setdiff1d(np.union1d(self._without_rows(), np.setdiff1d(self.classes_, before)), y)
        self.n_samples_seen_ += int(X.shape[0])
        return self

    def _without_rows(self) -> np.ndarray:
        """The labels of ``classes_`` that have no rows (declared by ``partial_fit``'s ``classes``): never predicted."""
        return getattr(self, "_rowless", self.classes_[:0])  # a pickle of a version that did not track them: none

    def _add_classes(self, labels: np.ndarray) -> None:
        self.classes_ = grow_classes(self._engine, self.classes_, labels)

    @property
    def statistics_(self) -> RidgeStatistics:
        """The sufficient statistics (gram engine only; the RLS recursion keeps ``R`` and ``W`` instead)."""
        with owner_lock(self):  # G, Q and n of one moment: a partial_fit in another thread adds to them in turn
            self._check_fitted()
            if not isinstance(self._engine, GramEngine):
                raise MissingAttribute("only the gram engine keeps sufficient statistics; use engine='gram'")
            # handed out read-only: a write into G or Q would move the weights unseen
            return read_only_statistics(self._engine.statistics)

    @property
    def gamma_(self) -> float:
        """The gamma of the fitted state (GCV's choice for ``gamma="auto"``), whatever ``set_params`` set since."""
        with owner_lock(self):
            self._check_fitted()
            gamma = self._fitted_with["gamma"]
            return self._gram().solution()[0] if gamma == "auto" else float(gamma)

    def _gram(self) -> GramEngine:
        """The engine of a ``gamma="auto"`` state, which only the gram engine fits (``_start`` refuses the others)."""
        assert isinstance(self._engine, GramEngine)
        return self._engine

    def merge(self, other: AnalyticClassifier) -> AnalyticClassifier:
        """A new ``gram`` classifier holding the samples of both: the statistics simply add.

        This is how per-task or per-worker statistics are combined; the result is exactly the classifier
        that saw both streams, with this one's fitted gamma, dtype and grid. Only the ``gram`` engine keeps
        additive state.
        """
        if not isinstance(other, AnalyticClassifier):
            raise InputTypeError(f"merge takes an AnalyticClassifier, got {type(other).__name__}")
        self._check_fitted()
        if not other.__sklearn_is_fitted__():
            raise NotFitted(f"cannot merge an unfitted {type(other).__name__}; fit or partial_fit it first")
        mine = self._fitted_with
        if mine["engine"] != "gram" or other._fitted_with["engine"] != "gram":
            raise FoalPipeError("only gram classifiers can be merged; use engine='gram'")
        if other.n_features_in_ != self.n_features_in_:
            raise FoalPipeError("cannot merge classifiers fitted on different feature dimensions")
        check_label_kinds(self.classes_, other.classes_, (
            "cannot merge a classifier of labels of kind {new} into one of labels of kind {old}; use one kind of label "
            "(integer ids or names)"))
        names = [getattr(c, "feature_names_in_", None) for c in (self, other)]
        if names[0] is not None and names[1] is not None and list(names[0]) != list(names[1]):
            raise FoalPipeError("cannot merge classifiers fitted on other feature names or another column order (the sums "
                                "of different columns would be added); fit both on the same columns in the same order")
        records = [getattr(c, "_recorded", None) for c in (self, other)]
        if records[0] is not None and records[1] is not None and not records[0].same_projection(records[1]):
            raise FoalPipeError("cannot merge classifiers loaded from model files of different projections (or "
                                "activations): their sums are of different features; merge learners of one projection")
        merged = AnalyticClassifier.from_statistics(
            self.statistics_ + other.statistics_, gamma=mine["gamma"], dtype=mine["dtype"], gamma_grid=mine["gamma_grid"],
            per_decade=mine["per_decade"])
        with_rows = np.union1d(np.setdiff1d(self.classes_, self._without_rows()),
                               np.setdiff1d(other.classes_, other._without_rows()))
        merged._rowless = np.setdiff1d(merged.classes_, with_rows)  # known even where the counts are not
        known = names[0] if names[0] is not None else names[1]
        if known is not None:  # as the learner that saw both streams keeps the named one's columns
            merged.feature_names_in_ = known
        if records[0] is not None and records[1] is not None:  # both files' stores, rows and names saved again
            merged._recorded = records[0].joined(records[1], merged.classes_)
        elif (record := records[0] or records[1]) is not None:  # its projection and names saved again; the other
            merged._recorded = record  # learner's rows count as rows outside its stores
        return merged

    @classmethod
    def from_statistics(
        cls,
        statistics: RidgeStatistics,
        *,
        gamma: float | str = 1.0,
        dtype: str | None = None,
        gamma_grid: Sequence[float] | None = None,
        per_decade: int = PER_DECADE,
    ) -> AnalyticClassifier:
        """A ``gram`` classifier holding sums computed elsewhere (Dask workers, the learn walk, a merge).

        The result equals a classifier that saw those samples; dtype defaults to the statistics' own,
        the backend is that of their arrays. Statistics of no class (no labelled row) are refused: such a
        classifier could predict nothing.
        """
        if np.asarray(statistics.classes).size == 0:
            raise FoalPipeError("the statistics hold no class (no labelled row), so a classifier of them could predict "
                                "nothing; add labelled rows first")
        dtype = dtype or dtype_name(statistics.dtype)
        clf = cls(gamma=gamma, engine="gram", dtype=dtype, backend=backend_of(statistics.G), gamma_grid=gamma_grid,
                  per_decade=per_decade)
        xp = array_namespace(statistics.G)
        if statistics.counts is not None and statistics.classes.size:
            rowless = xp.asarray(np.flatnonzero(statistics.counts == 0), device=device(statistics.Q))
            if rowless.shape[0] and bool(xp.any(xp.take(statistics.Q, rowless, axis=1) != 0)):
                raise FoalPipeError("the statistics count no row of a class whose column of Q is not zero (a row of a "
                                    "class adds to its column); pass the counts of the rows summed into Q")
        # copies: the caller's arrays stay the caller's (an in-place add to them would move this classifier unseen)
        state = {"G": xp.asarray(statistics.G, copy=True), "Q": xp.asarray(statistics.Q, copy=True)}
        if statistics.counts is not None:
            state["counts"] = statistics.counts
        if statistics.rounding is not None or dtype != dtype_name(statistics.dtype):  # a cast keeps what rounded them
            state["rounding"] = statistics.counted_rounding()
        return clf._restore(state, statistics.classes, statistics.n, statistics.dim)

    def _restore(self, state: dict[str, Any], classes: np.ndarray, n_samples: int, dim: int) -> AnalyticClassifier:
        """Set a fresh classifier's engine state, classes and sample count (load, sums computed elsewhere)."""
        classes = np.asarray(classes).ravel()
        self._start(dim, classes.dtype)
        self.n_features_in_ = dim
        self.classes_ = classes
        counts = state.get("counts")
        self._rowless = classes[:0] if counts is None else classes[np.asarray(counts) == 0]
        self._engine.load_state(state, classes, n_samples)
        self.n_samples_seen_ = int(n_samples)
        return self

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFitted(f"this {type(self).__name__} is not fitted yet; call fit or partial_fit first")

    def _weights(self) -> Any:
        """Weights in the state's namespace, row-major, refused when not finite (an ill-conditioned float32 recursion)."""
        with owner_lock(self):  # the lazy solve, kept for the state it solved
            self._check_fitted()
            return row_major(checked_weights(self._engine.weights()))

    @property
    def weights_(self) -> np.ndarray:
        """``W`` read-only: on NumPy it may be the state itself (the recursion's ``W``, a row-major solution), which a
        write through it would corrupt."""
        return read_only(to_numpy(self._weights()))

    @property
    def coef_(self) -> np.ndarray:
        return self.weights_.T

    def class_scores(self, X: Any) -> np.ndarray:
        """Scores ``X @ W``, shape (n_samples, n_classes), columns in ``classes_`` order: float64 products of
        ``X`` and the weights (solved in float64), whatever the state dtype; refused where they overflow. What
        :meth:`predict` ranks (over the classes with rows), and, unlike :meth:`decision_function`, one column per
        class with two classes too."""
        return self.scores_with_ties(X)[0]

    def scores_with_ties(self, X: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray]]:
        """:meth:`class_scores`, and the weights' :class:`~foal_pipe.core.scoring.Ties` with the float64 rows, with
        which :meth:`predict` refuses rows whose top two scores lie within their float64 rounding."""
        return self._scored(X)[:2]

    def _scored(self, X: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray], np.ndarray, np.ndarray]:
        """:meth:`scores_with_ties`, with the ``classes_`` and the classes without rows of the same model: taken
        together under the lock (a ``partial_fit`` in another thread changes them one by one), scored outside it."""
        with owner_lock(self):
            self._check_fitted()
            X, _ = validated(self, X)
            W = self._weights()
            xp = get_namespace(self._fitted_with["backend"])
            X, W = self._state_array(X, xp.float64), xp.asarray(W, dtype=xp.float64)
            drift, classes, rowless = self._engine.drift, self.classes_, self._without_rows()
        with np.errstate(over="ignore", invalid="ignore"):  # refused by finite_scores, without a warning first
            scores = finite_scores(to_numpy(X @ W))
        return scores, (Ties.of(W, drift=drift), X), classes, rowless

    def decision_function(self, X: Any) -> np.ndarray:
        """:meth:`class_scores`, -inf for a class without rows, which :meth:`predict` never picks (it is ``classes_[argmax]``);
        with two classes, scikit-learn's (n_samples,) margin ``score[:, 1] - score[:, 0]`` (> 0: ``classes_[1]``)."""
        scores, _, classes, rowless = self._scored(X)
        scores[:, ~_seen(classes, rowless)] = -np.inf
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict(self, X: Any, classes: Any = None) -> np.ndarray:
        """The class with the highest score among the classes seen so far (F-OAL's rule): those of ``classes_``
        with rows, not one that ``partial_fit``'s ``classes`` declared and no row has reached yet.

        ``classes``: every label of the task (the published code's rule): the argmax then runs over those labels,
        a label never seen scoring 0, so it wins a row where every seen class scores below 0.
        """
        scores, (ties, rows), known, rowless = self._scored(X)
        classes = task_classes(classes, known)
        seen = _seen(known, rowless)  # a class declared without rows is never predicted, so a task's labels may leave it out
        among = among_classes(known[seen], classes)
        return best_of(scores[:, seen], known[seen], among, (ties.columns(seen), rows))[0]

    @locked  # the state, classes and rows of one model
    def save(self, path: str | Path, projection: SmoothProjection | Expansion | None = None, **metadata: Any) -> Path:
        """Write the full state (engine state, ``W``, ``classes``, optional projection) as a model file.

        Extra keyword arguments are stored as JSON metadata (foal_pipe/model/modelfile.py lists the known keys); with
        ``projection``, its ``activation`` is recorded (an ``activation=`` that contradicts it is refused), so that
        :func:`~foal_pipe.model.deploy.load_model` rebuilds the same projection.
        :meth:`load` restores a classifier that keeps learning exactly as if the stream had never been
        interrupted; what its file records beside the state (class names, encoder provenance, the projection, ...) is
        written again, the keywords given replacing it (:meth:`fit` forgets it with the rows).
        """
        self._check_fitted()
        check_metadata(metadata, self.classes_.size)
        recorded: FileRecord | None = getattr(self, "_recorded", None)
        if recorded is not None and not recorded.written:  # a DeployedModel's classifier: the model writes its own
            recorded = None
        if recorded is not None:
            metadata = recorded.kept(metadata, projection, int(self.classes_.size), self.n_samples_seen_)
        fitted = self._fitted_with
        state = self._engine.state()
        rowless = self._without_rows()
        if rowless.size and "counts" not in state:
            raise FoalPipeError(f"class {rowless.tolist()[0]!r} was declared (partial_fit's classes=) but has no rows, which "
                                f"a model file of this {fitted['engine']} state cannot record; give it rows first, or "
                                f"learn with {param('engine', 'gram')} (its row counts record it)")
        grid = self._gram().grid if fitted["gamma"] == "auto" else None  # with the chosen gamma: a loaded one keeps choosing
        matrix, metadata = ridge_projection(projection, metadata)
        if matrix is None and recorded is not None:
            matrix = recorded.projection
        names = getattr(self, "feature_names_in_", None)  # a DataFrame's columns: a loaded model checks them as this one
        model = RidgeModel(state, self.weights_, self.classes_, self.gamma_, fitted["engine"], self._dtype.name,
                           self.n_samples_seen_, grid, fitted["per_decade"], None if names is None else tuple(names))
        return model.save(path, matrix, **metadata)

    @classmethod
    def load(cls, path: str | Path, backend: str = "numpy") -> AnalyticClassifier:
        """Restore a classifier written by :meth:`save`, validated (safetensors only: nothing is unpickled); the file
        is read by :meth:`RidgeModel.from_file <foal_pipe.model.ridgemodel.RidgeModel.from_file>`. What it records
        beside the state is kept for :meth:`save`, so a model loaded, continued and saved loses none of it."""
        tensors, meta = read_model(path)
        return cls.loaded_from(path, tensors, meta, backend)

    @classmethod
    def loaded_from(cls, path: str | Path, tensors: dict[str, np.ndarray], meta: dict[str, Any],
                    backend: str = "numpy", written: bool = True) -> AnalyticClassifier:
        """:meth:`load`'s classifier of a model file read already (``tensors``, ``meta``: ``read_model``'s), which
        :func:`~foal_pipe.model.deploy.load_model` shares: its columns checked and its record kept alike (``written``:
        :class:`~foal_pipe.model.filerecord.FileRecord`'s)."""
        model = RidgeModel.from_file(path, tensors, meta)
        clf = cls.from_model(model, backend)
        names = model.feature_names or identity_names(tensors.get("projection"), meta)
        if names is not None:  # checked as the saved estimator checked them
            clf.feature_names_in_ = np.asarray(names, dtype=object)
        clf._recorded = FileRecord({k: v for k, v in meta.items() if k not in SET_BY_MODEL}, tensors.get("projection"),
                                   clf.n_samples_seen_, clf.classes_.copy(), written)
        return clf

    @classmethod
    def from_model(cls, model: RidgeModel, backend: str = "numpy") -> AnalyticClassifier:
        """The classifier of a loaded :class:`~foal_pipe.model.ridgemodel.RidgeModel` (:meth:`load`'s)."""
        auto = model.gamma_grid is not None
        clf = cls(gamma="auto" if auto else model.gamma, engine=model.engine, dtype=model.dtype, backend=backend,
                  gamma_grid=model.gamma_grid, per_decade=model.per_decade)
        clf._restore(dict(model.state), model.classes, model.n_samples, int(model.weights.shape[0]))
        if isinstance(clf._engine, GramEngine):  # the weights as saved: no solve, the same bits on any machine
            clf._engine.keep_solution(model.gamma, model.weights)
        return clf


def _seen(classes: np.ndarray, rowless: np.ndarray) -> np.ndarray:
    """Which of ``classes`` have rows (are not ``rowless``), those predicted; refused where none has."""
    if (seen := ~np.isin(classes, rowless)).any():
        return seen
    raise FoalPipeError("no class of classes_ has rows yet (partial_fit's classes= only declared them), so there is no "
                        "class seen to predict; partial_fit labelled rows first")
