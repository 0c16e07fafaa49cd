"""Smooth projection: a fixed random linear map followed by an activation (paper Eq. 1, "Expansion").

The paper uses a sigmoid to D = 1000; RanPAC-style expansions use a ReLU to D = 10,000; ``identity``
keeps the random features linear. ``n_components=0`` skips the linear map: the activation applies to the
raw features (with ``identity``, ridge on the raw features, the ablation). The arithmetic is
:class:`~foal_pipe.core.expansion.Expansion`'s, which the command line uses without scikit-learn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_array_api_obj, is_numpy_array
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import validate_data

from foal_pipe.core.backend import host_values, plain_values
from foal_pipe.core.expansion import Expansion
from foal_pipe.errors import FoalPipeError, as_user_error, param
from foal_pipe.memory import check_memory


class NotFitted(FoalPipeError, NotFittedError):
    """Raised by a method that needs a fitted estimator (this projection, the classifiers): a FoalPipeError and
    scikit-learn's NotFittedError."""


class SmoothProjection(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Random projection to ``n_components`` dimensions plus an activation; frozen after ``fit``.

    ``fit`` only reads the number of input features, so any batch (the first of a stream) fixes it.
    The default ``uniform`` init is PyTorch's ``nn.Linear`` default, U(-1/sqrt(d), 1/sqrt(d)), which the
    authors' code uses; ``normal`` draws N(0, 1/(3d)), the same variance, as the paper describes.

    Parameters
    ----------
    n_components : int, default=1000
        Output dimension D; 0 means no projection (``components_`` is the identity, D = d).
    init : {"uniform", "normal"}, default="uniform"
    activation : {"sigmoid", "relu", "identity", "cos"}, default="sigmoid"
        Applied to ``X @ components_``; the paper's is the sigmoid. ``cos``: random Fourier features,
        ``sqrt(2 / D) cos(X @ components_ + bias_)`` with ``bias_`` uniform in [0, 2 pi) (KLDA's expansion).
    random_state : int, numpy Generator or None, default=None
        Seed of the projection matrix.
    dtype : str, default="float64"
        Dtype of the matrix and of the activations ``transform`` returns.

    Attributes
    ----------
    components_ : ndarray of shape (n_features_in_, n_components)
        The projection matrix P (d x D); activations are ``activation(X @ P)``.
    bias_ : ndarray of shape (n_components,) or None
        ``cos``'s bias, drawn after P from the same seed; None for the other activations.
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
        *,
        n_components: int = 1000,
        init: str = "uniform",
        activation: str = "sigmoid",
        random_state: int | np.random.Generator | None = None,
        dtype: str = "float64",
    ) -> None:
        self.n_components = n_components
        self.init = init
        self.activation = activation
        self.random_state = random_state
        self.dtype = dtype

    def fit(self, X: Any, y: Any = None) -> SmoothProjection:
        """Draw the matrix for ``X``'s number of features (the values of ``X`` are not used)."""
        try:
            X = validate_data(self, host_values(X), reset=True)
        except (ValueError, TypeError) as exc:
            raise as_user_error(exc) from None
        width = self.n_components
        if isinstance(width, (int, np.integer)) and not isinstance(width, (bool, np.bool_)) and width > 0:
            try:  # drawn in float64, then cast: refused with the figure rather than a MemoryError (or the OOM killer)
                cast = 0 if np.dtype(self.dtype) == np.float64 else np.dtype(self.dtype).itemsize
            except TypeError:
                cast = 0  # the draw refuses the dtype
            check_memory("SmoothProjection.fit", {"the projection matrix": int(X.shape[1]) * int(width) * (8 + cast)},
                         f"pass a smaller {param('n_components')}")
        return self._set(Expansion.draw(int(X.shape[1]), self.n_components, self.init, self.activation,
                                        self.random_state, self.dtype))

    def _set(self, expansion: Expansion) -> SmoothProjection:
        self._expansion = expansion
        self.components_ = expansion.components_
        self.bias_ = expansion.bias_
        self.n_features_in_ = int(self.components_.shape[0])
        self._n_features_out = int(self.components_.shape[1])
        return self

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, activation: str = "sigmoid", dtype: str = "float64",
                    bias: np.ndarray | None = None) -> SmoothProjection:
        """A fitted projection with a given d x D matrix, activation and, for ``cos``, bias (a saved model's)."""
        return cls(n_components=int(matrix.shape[1]), activation=activation, dtype=dtype)._set(
            Expansion.from_matrix(matrix, activation, dtype, bias))

    def _check_fitted(self) -> None:
        """Refuse a projection not fitted yet with :class:`NotFitted`, as the classifiers do."""
        if not hasattr(self, "_expansion"):
            raise NotFitted(f"this {type(self).__name__} is not fitted yet; call fit first (it reads only the feature "
                            "count)")

    @property
    def expansion(self) -> Expansion:
        """The fitted matrix and activation without scikit-learn (what the command line's walks use)."""
        self._check_fitted()
        return self._expansion

    @property
    def is_identity(self) -> bool:
        """No projection: ``components_`` is the identity, so ``transform`` skips the product."""
        return int(self.n_components) == 0

    def transform(self, X: Any, xp: Any = None) -> Any:
        """``activation(X @ P)`` in ``dtype``; ``xp`` (an array namespace) computes on its device (the matrix is
        cached there), default: that of ``X``. NaN and inf are refused, in device arrays too."""
        self._check_fitted()
        host = is_numpy_array(X) or not is_array_api_obj(X)
        if host:
            try:
                X = validate_data(self, X, reset=False)
            except (ValueError, TypeError) as exc:
                raise as_user_error(exc) from None
        else:  # the checks scikit-learn makes of host arrays
            X = plain_values(X)
            d, own = self.n_features_in_, array_namespace(X)
            if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] != d:
                raise FoalPipeError(f"features of shape {tuple(X.shape)} do not fit the projection, which expects (n, {d}) "
                                    "with n >= 1; pass one row per sample (X.reshape(1, -1) for one sample)")
            if own.isdtype(X.dtype, "complex floating"):
                raise FoalPipeError(f"X has complex dtype {X.dtype}, which is not supported; pass real-valued features")
            self._check_device(xp or own, device(X))
            if not own.isdtype(X.dtype, "bool") and not bool(own.all(own.isfinite(X))):  # bool: 0 or 1, as NumPy's
                raise FoalPipeError("X contains NaN or inf; check the features (re-extract the store)")
        return self._expansion.apply(X, xp)

    def _check_device(self, xp: Any, where: Any) -> None:
        """Refuse a device that cannot hold the projection's dtype (array_api_strict's ``no_float64``, as Apple's MPS)."""
        name = self._expansion.components_.dtype.name
        try:
            held = xp.__array_namespace_info__().dtypes(device=where)
        except (AttributeError, TypeError, ValueError):  # a namespace that cannot say: its own error, if any, stands
            return
        if name not in held:
            other = f", or fit the projection with {param('dtype', 'float32')}" if name == "float64" and "float32" in held else ""
            raise FoalPipeError(f"X is on device {where}, which does not hold {name}, the projection's dtype; move X to a "
                                f"device that holds {name}{other}")
