"""AnalyticClassifier: an exact online ridge classifier with scikit-learn's ``partial_fit`` API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.backend import get_namespace, resolve_dtype, to_numpy
from foal_pipe.engines import DEFAULT_ENGINE, ENGINES
from foal_pipe.errors import FoalPipeError
from foal_pipe.modelfile import read_model, write_model
from foal_pipe.projection import SmoothProjection


class AnalyticClassifier:
    """Linear classifier on activations, fitted to one-hot labels by exact online ridge regression.

    After every ``partial_fit`` call the weights equal the closed-form ridge solution
    ``(H^T H + gamma I)^-1 H^T Y`` over all samples seen so far, whatever the batch sizes or order.

    Unlike scikit-learn, ``classes_`` grows: a class first seen in a later call gets a zero column in
    ``W`` inserted where it sorts. ``R`` (or ``G``) depends only on the features, so this stays exact.

    Parameters
    ----------
    gamma : float, default=1.0
        Ridge regularisation (``R0 = I / gamma``); must be > 0.
    engine : {"gram", "rls"}, default="gram"
        ``"rls"``: the paper's per-batch Woodbury recursion. ``"gram"``: accumulate ``H^T H`` and
        ``H^T Y`` and solve when the weights are needed (the same solution, much faster on CPU).
    dtype : {"float64", "float32"}, default="float64"
        Dtype of the state. float32 halves memory but drifts from the exact solution.
    backend : {"auto", "numpy", "cupy"}, default="numpy"
        Array namespace for the state; ``auto`` uses CuPy when a GPU is available.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Sorted labels seen so far; column ``k`` of ``weights_`` scores ``classes_[k]``.
    weights_ : ndarray of shape (n_features_in_, n_classes)
        The paper's ``W`` (D x C), as a NumPy array.
    coef_ : ndarray of shape (n_classes, n_features_in_)
        ``weights_.T``, scikit-learn's orientation.
    n_features_in_ : int
    n_samples_seen_ : int

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
        self, gamma: float = 1.0, engine: str = DEFAULT_ENGINE, dtype: str = "float64", backend: str = "numpy"
    ) -> None:
        self.gamma = gamma
        self.engine = engine
        self.dtype = dtype
        self.backend = backend

    def _start(self, n_features: int) -> None:
        if not np.isfinite(self.gamma) or self.gamma <= 0:
            raise FoalPipeError(f"gamma must be a positive number, got {self.gamma}; try --gamma 1")
        if self.engine not in ENGINES:
            raise FoalPipeError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        self._xp = get_namespace(self.backend)
        self._dtype = resolve_dtype(self.dtype)
        self._engine = ENGINES[self.engine](n_features, float(self.gamma), self._xp, self._dtype)
        self.n_features_in_ = n_features
        self.classes_ = np.empty(0, dtype=np.int64)
        self.n_samples_seen_ = 0

    def _check_X(self, X: Any) -> Any:
        if getattr(X, "ndim", None) != 2:
            raise FoalPipeError(f"X must be 2-D (n_samples, n_features), got shape {getattr(X, 'shape', None)}")
        if hasattr(self, "n_features_in_") and X.shape[1] != self.n_features_in_:
            raise FoalPipeError(
                f"X has {X.shape[1]} features but the classifier was fitted with {self.n_features_in_}; "
                "use activations from the same projection"
            )
        return X

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> AnalyticClassifier:
        """Absorb one batch of activations ``X`` (n, D) with labels ``y`` (n,). Returns ``self``.

        ``classes`` is accepted for scikit-learn compatibility; labels may also appear later.
        """
        X = self._check_X(X)
        y = np.asarray(to_numpy(y)).ravel()
        if y.shape[0] != X.shape[0]:
            raise FoalPipeError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels; pass one label per row")
        if not hasattr(self, "_engine"):
            self._start(int(X.shape[1]))
        xp = self._xp
        X = xp.asarray(X, dtype=self._dtype)
        if not bool(xp.isfinite(X).all()):
            raise FoalPipeError("X contains NaN or inf; check the features (re-extract the store)")
        self._add_classes(np.concatenate([y, np.asarray(classes).ravel()]) if classes is not None else y)
        Y = xp.zeros((X.shape[0], self.classes_.size), dtype=self._dtype)
        Y[xp.arange(X.shape[0]), xp.asarray(np.searchsorted(self.classes_, y))] = 1.0
        self._engine.update(X, Y)
        self.n_samples_seen_ += int(X.shape[0])
        return self

    def _add_classes(self, labels: np.ndarray) -> None:
        new = np.setdiff1d(labels, self.classes_)
        if new.size == 0:
            return
        merged = np.union1d(self.classes_, new)
        self._engine.insert_classes(merged.size, np.searchsorted(merged, self.classes_))
        self.classes_ = merged

    def merge(self, other: AnalyticClassifier) -> AnalyticClassifier:
        """A new ``gram`` classifier holding the samples of both: the statistics simply add.

        This is how per-task or per-worker statistics are combined; the result is exactly the classifier
        that saw both streams. Only the ``gram`` engine keeps additive state.
        """
        self._check_fitted()
        other._check_fitted()
        if self.engine != "gram" or other.engine != "gram":
            raise FoalPipeError("only gram classifiers can be merged; use engine='gram'")
        if other.n_features_in_ != self.n_features_in_:
            raise FoalPipeError("cannot merge classifiers fitted on different feature dimensions")
        xp = self._xp
        classes = np.union1d(self.classes_, other.classes_)
        Q = xp.zeros((self.n_features_in_, classes.size), dtype=self._dtype)
        for part in (self, other):
            Q[:, xp.asarray(np.searchsorted(classes, part.classes_))] += part._engine.Q
        return AnalyticClassifier.from_statistics(
            self._engine.G + other._engine.G, Q, classes, self.n_samples_seen_ + other.n_samples_seen_,
            self.gamma, self.dtype, self.backend,
        )

    @classmethod
    def from_statistics(
        cls,
        G: Any,
        Q: Any,
        classes: Any,
        n_samples: int,
        gamma: float = 1.0,
        dtype: str = "float64",
        backend: str = "numpy",
    ) -> AnalyticClassifier:
        """A ``gram`` classifier holding sums computed elsewhere (for example by Dask workers).

        ``G = H^T H`` has shape (D, D), ``Q = H^T Y`` shape (D, C) with column ``k`` for ``classes[k]``;
        ``classes`` must be sorted and unique. The result equals a classifier that saw those samples.
        """
        classes = np.asarray(classes).ravel()
        if G.ndim != 2 or G.shape[0] != G.shape[1] or Q.shape != (G.shape[0], classes.size):
            raise FoalPipeError(f"G {G.shape} and Q {Q.shape} do not fit {classes.size} classes; expected (D, D) and (D, C)")
        if np.any(classes[1:] <= classes[:-1]):
            raise FoalPipeError("classes must be sorted and unique, matching the columns of Q")
        return cls(gamma, "gram", dtype, backend)._restore({"G": G, "Q": Q}, classes, n_samples, int(G.shape[0]))

    def _restore(self, state: dict[str, Any], classes: np.ndarray, n_samples: int, dim: int) -> AnalyticClassifier:
        """Set a fresh classifier's engine state, classes and sample count (load, sums computed elsewhere)."""
        self._start(dim)
        self.classes_ = classes
        self._engine.load_state(state)
        self.n_samples_seen_ = int(n_samples)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "_engine"):
            raise FoalPipeError("this AnalyticClassifier is not fitted yet; call partial_fit first")

    def _weights(self) -> Any:
        """Weights in the state's namespace, refused when not finite (ill-conditioned float32 state)."""
        self._check_fitted()
        W = self._engine.weights()
        if not bool(self._xp.isfinite(W).all()):
            raise FoalPipeError(
                "the classifier has non-finite weights (ill-conditioned system); use a larger --gamma "
                "or --dtype float64"
            )
        return W

    @property
    def weights_(self) -> np.ndarray:
        return to_numpy(self._weights())

    @property
    def coef_(self) -> np.ndarray:
        return self.weights_.T

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores ``X @ W`` of shape (n_samples, n_classes)."""
        W = self._weights()
        X = self._check_X(X)
        return to_numpy(self._xp.asarray(X, dtype=self._dtype) @ W)

    def predict(self, X: Any) -> np.ndarray:
        """The class with the highest score, among the classes seen so far."""
        scores = self.decision_function(X)
        return self.classes_[np.argmax(scores, axis=1)]

    def score(self, X: Any, y: Any) -> float:
        """Mean accuracy on ``(X, y)``."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def save(self, path: str | Path, projection: SmoothProjection | None = None, **metadata: Any) -> Path:
        """Write the full state (engine state, ``W``, ``classes``, optional projection) as a model file.

        Extra keyword arguments are stored as JSON metadata (foal_pipe/modelfile.py lists the known keys).
        :meth:`load` restores a classifier that keeps learning exactly as if the stream had never been
        interrupted.
        """
        self._check_fitted()
        if not np.issubdtype(self.classes_.dtype, np.integer):
            raise FoalPipeError("only integer class labels can be saved; map labels to integer ids first")
        tensors = {name: to_numpy(a) for name, a in self._engine.state().items()}
        tensors["W"] = self.weights_.astype(np.float64)
        tensors["classes"] = self.classes_.astype(np.int64)
        if projection is not None:
            tensors["projection"] = projection.components_
        state = {"gamma": float(self.gamma), "engine": self.engine, "dtype": self._dtype.name,
                 "n_samples_seen": self.n_samples_seen_}
        return write_model(path, tensors, {**metadata, **state})

    @classmethod
    def load(cls, path: str | Path, backend: str = "numpy") -> AnalyticClassifier:
        """Restore a classifier written by :meth:`save`, validated (safetensors only: nothing is unpickled)."""
        tensors, meta = read_model(path)
        clf = cls(gamma=meta["gamma"], engine=meta["engine"], dtype=meta["dtype"], backend=backend)
        classes = tensors["classes"].astype(np.int64)
        return clf._restore(tensors, classes, meta["n_samples_seen"], int(tensors["W"].shape[0]))
