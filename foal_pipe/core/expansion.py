"""The smooth projection's arithmetic, free of scikit-learn: the matrix, its draw and ``activation(X @ P)``.

:class:`~foal_pipe.model.projection.SmoothProjection` (the scikit-learn estimator of the Python API) holds one;
the command line's walks use one directly, so ``learn`` and ``sweep`` start without importing scikit-learn.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_array_api_obj, is_numpy_array

from foal_pipe.core.activations import ACTIVATIONS, BIASED, INITS, ROUNDED_AT_ZERO, check_activation
from foal_pipe.core.backend import as_dtype, default_device
from foal_pipe.errors import FoalPipeError, param


def check_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy float dtype: the activations are real numbers, so an integer dtype is refused."""
    try:
        checked = np.dtype(dtype)
    except TypeError:
        checked = None
    if checked is None or checked.kind != "f":
        raise FoalPipeError(f"projection dtype {dtype!r} is not a float dtype; pass {param('dtype', 'float64')} or "
                            f"{param('dtype', 'float32')}")
    return checked


def _check_components(n_components: Any) -> int:
    """``n_components`` as an int >= 0, a boolean or a fraction refused rather than truncated."""
    try:
        if isinstance(n_components, (bool, np.bool_)):
            raise TypeError
        number = operator.index(n_components)
    except TypeError:
        raise FoalPipeError(f"projection dimension must be a whole number, got {n_components!r}; pass e.g. "
                            f"{param('n_components', 1000)} (0: none)") from None
    if number < 0:
        raise FoalPipeError(f"projection dimension must be at least 0, got {n_components}; pass e.g. 1000 (0: none)")
    return number


def _generator(random_state: Any) -> np.random.Generator:
    """NumPy's generator of ``random_state`` (an int >= 0, a Generator or None), refused in one line otherwise."""
    try:
        if isinstance(random_state, (bool, np.bool_, float, np.floating)):
            raise TypeError
        return np.random.default_rng(random_state)
    except (TypeError, ValueError):
        raise FoalPipeError(f"random_state must be a whole number >= 0, a numpy Generator or None, got "
                            f"{random_state!r:.40}; pass e.g. {param('random_state', 0)}") from None


@dataclass(frozen=True, eq=False)
class Expansion:
    """A fixed d x D matrix ``components_`` and an activation; ``transform`` gives ``activation(X @ P)`` in the
    matrix's dtype (``activation(X @ P + b)`` for an activation of :data:`~foal_pipe.core.activations.BIASED`, with
    ``bias_`` b). ``is_identity``: no projection (``components_`` is the identity), so the product is skipped."""

    components_: np.ndarray
    activation: str
    is_identity: bool = False
    _device: dict[str, Any] = field(default_factory=dict, repr=False)  # the matrix on each namespace and device
    bias_: np.ndarray | None = None
    feature_names_in_: np.ndarray | None = field(default=None, repr=False)  # a saved model's (DeployedModel checks them)

    @classmethod
    def draw(cls, n_features: int, n_components: int, init: str, activation: str,
             random_state: int | np.random.Generator | None, dtype: str | np.dtype) -> Expansion:
        """A random ``n_features`` x ``n_components`` matrix (0 components: the identity) drawn from ``random_state``:
        ``uniform`` is U(-1/sqrt(d), 1/sqrt(d)), PyTorch's ``nn.Linear`` default; ``normal`` N(0, 1/(3d)), the same
        variance."""
        n_components = _check_components(n_components)
        dtype = check_dtype(dtype)
        if init not in INITS:
            raise FoalPipeError(f"unknown projection init {init!r}; choose one of {', '.join(INITS)}")
        check_activation(activation)
        if n_components == 0:
            if activation in BIASED:
                raise FoalPipeError(f"activation {activation!r} is random Fourier features of a projection; pass a "
                                    "projection dimension above 0 (e.g. 5000)")
            return cls(np.asarray(np.eye(n_features), dtype=dtype), activation, is_identity=True)
        rng = _generator(random_state)
        bound = 1.0 / np.sqrt(n_features)
        shape = (n_features, n_components)
        if init == "uniform":
            matrix = rng.uniform(-bound, bound, size=shape)
        else:
            matrix = rng.normal(0.0, bound / np.sqrt(3.0), size=shape)
        bias = rng.uniform(0.0, 2 * np.pi, size=shape[1]) if activation in BIASED else None  # after the matrix
        return cls(np.asarray(matrix, dtype=dtype), activation, bias_=None if bias is None else bias.astype(dtype))

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, activation: str = "sigmoid", dtype: str | np.dtype = "float64",
                    bias: np.ndarray | None = None) -> Expansion:
        """A given d x D matrix (a saved model's), and its bias where the activation takes one: always multiplied,
        even when it is the identity."""
        check_activation(activation)
        dtype = check_dtype(dtype)
        if (activation in BIASED) != (bias is not None):
            problem = "needs the projection's bias" if bias is None else "takes no projection bias"
            raise FoalPipeError(f"activation {activation!r} {problem}; pass the projection and bias the model was "
                                "learned with")
        if bias is not None and np.shape(bias) != (np.shape(matrix)[1],):
            raise FoalPipeError(f"the projection bias has shape {np.shape(bias)} but the projection has "
                                f"{np.shape(matrix)[1]} columns; pass one bias per column")
        return cls(np.asarray(matrix, dtype=dtype), activation,
                   bias_=None if bias is None else np.asarray(bias, dtype=dtype))

    def __getstate__(self) -> dict[str, Any]:
        """The matrix and activation without the per-device cache: a pickle needs no GPU library to load, and its
        bytes do not depend on where the expansion has computed."""
        return {**self.__dict__, "_device": {}}

    @property
    def n_features_in_(self) -> int:
        return int(self.components_.shape[0])

    def transform(self, X: Any, xp: Any = None, check: bool = True) -> Any:
        """``activation(X @ P)`` of 2-D ``X`` (rows of a store, which refuses NaN and inf as it reads them);
        ``xp`` (an array namespace) computes on its device, default: that of ``X``; ``check``: :meth:`apply`'s."""
        if getattr(X, "ndim", None) != 2 or X.shape[1] != self.n_features_in_:
            raise FoalPipeError(
                f"features of shape {tuple(getattr(X, 'shape', ()))} do not fit the projection, which expects "
                f"(rows, {self.n_features_in_}); use features from the same encoder as the model"
            )
        return self.apply(X, xp, check)

    def apply(self, X: Any, xp: Any = None, check: bool = True) -> Any:
        """:meth:`transform` of ``X`` already checked; the matrix is cached on each namespace and device it meets.
        ``check``: refuse rows that differ, all erased (:meth:`_check_erased`); False where the caller checks them
        in other blocks (:mod:`foal_pipe.protocol.erasedrows`)."""
        host = is_numpy_array(X) or not is_array_api_obj(X)
        xp = xp or array_namespace(X)
        where = default_device(xp) if host else device(X)
        X = as_dtype(X, xp, getattr(xp, self.components_.dtype.name), where)
        key = f"{xp.__name__} {where}"
        if self.is_identity:
            Z = xp.asarray(X, copy=True)
        else:
            matrix = self._device.get(key)
            if matrix is None:
                matrix = self._device[key] = xp.asarray(self.components_, device=where)
            Z = X @ matrix
            if self.bias_ is not None:
                bias = self._device.get(key + " bias")
                if bias is None:
                    bias = self._device[key + " bias"] = xp.asarray(self.bias_, device=where)
                Z += bias[None, :]
        H = ACTIVATIONS[self.activation](Z)
        if check and self.activation in ROUNDED_AT_ZERO and H.shape[0] > 1:
            self._check_erased(X, H, xp, where)
        return H

    def at_zero(self, xp: Any, where: Any) -> Any:
        """``(1, D)``: the activations of the origin's row (the bias's, with one) in ``xp`` on ``where``, cached there:
        the value every activation of a row the activation erases takes (:meth:`_check_erased`,
        :class:`~foal_pipe.protocol.erasedrows.ErasedRows`)."""
        key = f"{xp.__name__} {where} zero"
        zero = self._device.get(key)
        if zero is None:
            origin = xp.zeros((1, self.components_.shape[1]), dtype=getattr(xp, self.components_.dtype.name),
                              device=where)
            if self.bias_ is not None:
                origin += xp.asarray(self.bias_, device=where)[None, :]
            zero = self._device[key] = ACTIVATIONS[self.activation](origin)
        return zero

    def _check_erased(self, X: Any, H: Any, xp: Any, where: Any) -> None:
        """Refuse rows ``X`` that differ while every one of their activations ``H`` is the activation's value at 0
        (``sigmoid``'s 0.5): each ``x P`` lies within the activation's rounding of 0 (below 2^-54 for the sigmoid), so
        nothing of the rows' differences is left and rounding, not the data, would decide the result (a store of
        features near 1e-30). Features that are merely small keep a few digits and pass; so do rows that are all
        equal, or exactly 0. A real encoder's rows (or pixels) are never all that close to 0 while differing unless
        the whole store is. On the usual path this costs one row's comparison (the first row is not at 0)."""
        zero = self.at_zero(xp, where)
        if not bool(xp.all(H[:1, :] == zero)) or not bool(xp.all(zero == H)) or not bool(xp.any(X[:1, :] != X)):
            return
        raise erased_error(self.activation, H.shape[0], float(xp.max(xp.abs(X))))


def erased_error(activation: str, n_rows: int, scale: float) -> FoalPipeError:
    """The refusal of ``n_rows`` rows that differ, of largest feature ``scale``, whose every activation is the value
    at 0 (:meth:`Expansion.apply`)."""
    return FoalPipeError(
        f"the {activation} activations of {n_rows} rows that differ all equal its value at 0 exactly: "
        f"features of scale {scale:.3g} project below the activation's rounding, so nothing of their differences "
        f"is left; rescale the features to about unit scale (e.g. keep the fusion's final norm), or use "
        f"{param('activation', 'relu')} or {param('n_components', 0)} (ridge on the raw features)")
