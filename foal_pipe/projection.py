"""Smooth projection: a fixed random linear map followed by a sigmoid (paper Eq. 1, "Expansion")."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError

INITS = ("uniform", "normal")


def sigmoid(z: Any, xp: ModuleType = np) -> Any:
    """Overflow-free logistic function: 0.5 * (1 + tanh(z / 2))."""
    out = xp.tanh(z * 0.5)
    out += 1.0
    out *= 0.5
    return out


class SmoothProjection:
    """Random projection to ``n_components`` dimensions plus a sigmoid; frozen after ``fit``.

    ``fit`` only reads the number of input features, so any batch (the first of a stream) fixes it.
    The default ``uniform`` init is PyTorch's ``nn.Linear`` default, U(-1/sqrt(d), 1/sqrt(d)), which the
    authors' code uses; ``normal`` draws N(0, 1/(3d)), the same variance, as the paper describes.

    Parameters
    ----------
    n_components : int, default=1000
        Output dimension D.
    init : {"uniform", "normal"}, default="uniform"
    random_state : int, numpy Generator or None, default=None
        Seed of the projection matrix.
    dtype : str, default="float64"
        Dtype of the matrix and of the activations ``transform`` returns.

    Attributes
    ----------
    components_ : ndarray of shape (n_features_in_, n_components)
        The projection matrix P (d x D); activations are ``sigmoid(X @ P)``.
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(4, 8))
    >>> SmoothProjection(n_components=16, random_state=0).fit(X).transform(X).shape
    (4, 16)
    """

    def __init__(
        self,
        n_components: int = 1000,
        init: str = "uniform",
        random_state: int | np.random.Generator | None = None,
        dtype: str = "float64",
    ) -> None:
        self.n_components = n_components
        self.init = init
        self.random_state = random_state
        self.dtype = dtype

    def fit(self, X: Any, y: Any = None) -> SmoothProjection:
        n_features = int(X.shape[1]) if getattr(X, "ndim", 0) == 2 else -1
        if n_features < 1:
            raise FoalPipeError("SmoothProjection.fit needs a 2-D array of shape (n_samples, n_features)")
        if int(self.n_components) < 1:
            raise FoalPipeError(f"projection dimension must be at least 1, got {self.n_components}; pass e.g. 1000")
        if self.init not in INITS:
            raise FoalPipeError(f"unknown projection init {self.init!r}; choose one of {', '.join(INITS)}")
        rng = np.random.default_rng(self.random_state)
        bound = 1.0 / np.sqrt(n_features)
        shape = (n_features, int(self.n_components))
        if self.init == "uniform":
            matrix = rng.uniform(-bound, bound, size=shape)
        else:
            matrix = rng.normal(0.0, bound / np.sqrt(3.0), size=shape)
        return self._set(matrix)

    def _set(self, matrix: np.ndarray) -> SmoothProjection:
        self.components_ = np.asarray(matrix, dtype=self.dtype)
        self.n_features_in_ = int(self.components_.shape[0])
        self._device: dict[str, Any] = {}
        return self

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, dtype: str = "float64") -> SmoothProjection:
        """A fitted projection with a given d x D matrix (used when loading a saved model)."""
        return cls(n_components=int(matrix.shape[1]), dtype=dtype)._set(matrix)

    def transform(self, X: Any, xp: ModuleType = np) -> Any:
        """``sigmoid(X @ P)`` computed in ``dtype`` with namespace ``xp`` (the matrix is cached there)."""
        if not hasattr(self, "components_"):
            raise FoalPipeError("SmoothProjection is not fitted; call fit(X) first")
        if X.shape[-1] != self.n_features_in_:
            raise FoalPipeError(
                f"features have {X.shape[-1]} dimensions but the projection expects {self.n_features_in_}; "
                "use features from the same encoder as the model"
            )
        matrix = self._device.get(xp.__name__)
        if matrix is None:
            matrix = self._device[xp.__name__] = xp.asarray(self.components_)
        return sigmoid(xp.asarray(X, dtype=self.dtype) @ matrix, xp)

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        return self.fit(X).transform(X)
