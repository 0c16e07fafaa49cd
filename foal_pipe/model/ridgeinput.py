"""The rows and labels an :class:`~foal_pipe.model.classifier.AnalyticClassifier` takes, checked, the rows moved to
its state.

Host data goes through scikit-learn's own checks (their messages as the :class:`~foal_pipe.errors.FoalPipeError` the
docs promise); device arrays (CuPy, torch), which scikit-learn would copy to the host, get the same shape, dtype and
finiteness checks here, then join the state's namespace, device and dtype. Labels are refused where they are not
class labels or mix kinds with those declared or fitted. Kept apart from the estimator so its
module holds what the estimator does, not how each input kind is vetted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_array_api_obj, is_numpy_array, is_numpy_namespace
from sklearn.utils.validation import validate_data

from foal_pipe.core.backend import as_dtype, get_namespace, host_values, plain_values, readable_by
from foal_pipe.errors import FoalPipeError, as_user_error
from foal_pipe.model.columns import columns_were_checked
from foal_pipe.model.labels import CLASSES_KIND_PROBLEM, PREDICT_CLASSES_PROBLEM, check_label_kinds, check_targets, label_array


def validated(estimator: Any, X: Any, y: Any = None, reset: bool = False) -> tuple[Any, Any]:
    """scikit-learn's checks for host data; shape and finiteness checks for device arrays (CuPy, torch), and for
    NumPy rows within :func:`~foal_pipe.model.columns.columns_checked`."""
    X, y = plain_values(X), None if y is None else label_array(y)
    host = is_numpy_array(X) or not is_array_api_obj(X)
    if host and not (is_numpy_array(X) and columns_were_checked()):
        try:  # rows in C order: a product's bits would otherwise depend on the layout the rows came in
            if y is None:
                return validate_data(estimator, X, reset=reset, dtype=[np.float64, np.float32], order="C"), None
            return validate_data(estimator, X, y, reset=reset, dtype=[np.float64, np.float32], order="C")
        except (ValueError, TypeError) as exc:  # scikit-learn's words, as the FoalPipeError the docs promise
            raise as_user_error(exc) from None
    if X.ndim != 2:
        raise FoalPipeError(f"X must be 2-D (n_samples, n_features), got shape {tuple(X.shape)}")
    if array_namespace(X).isdtype(X.dtype, "complex floating"):  # as scikit-learn refuses NumPy's
        raise FoalPipeError(f"X has complex dtype {X.dtype}, which is not supported; pass real-valued features")
    if 0 in X.shape:  # as scikit-learn refuses an empty NumPy array
        raise FoalPipeError(f"X has shape {tuple(X.shape)}, but {type(estimator).__name__} needs at least one row and "
                            "one feature; pass a non-empty batch")
    if reset:
        estimator.n_features_in_ = int(X.shape[1])
    elif X.shape[1] != estimator.n_features_in_:
        raise FoalPipeError(
            f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting {estimator.n_features_in_} features "
            "as input; pass rows of the features it was fitted on (from the same encoder and projection)"
        )
    if y is not None:
        y = np.asarray(y).ravel()
        if y.shape[0] != X.shape[0]:
            raise FoalPipeError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels; pass one label per row")
    return X, y


class UserErrors:
    """``score`` as scikit-learn's ``ClassifierMixin`` gives it (mean accuracy), its input errors the one-line
    :class:`FoalPipeError` that ``fit``'s and ``predict``'s are (a ``y`` of another length, NaN labels)."""

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        y = label_array(y)  # read as fit reads it (a tensor that needs a gradient, a memoryview)
        if sample_weight is not None:
            sample_weight = check_sample_weight(sample_weight, np.size(y)).astype(np.float64)
            if not np.isfinite(sample_weight.sum()):  # huge weights overflow the weighted mean: its value is scale-free
                sample_weight = sample_weight / sample_weight.max()
        try:
            with np.errstate(invalid="ignore"):  # NaN labels' cast warns before scikit-learn refuses them
                return float(super().score(X, y, sample_weight))  # type: ignore[misc]
        except (ValueError, TypeError) as exc:
            raise as_user_error(exc) from None


def check_sample_weight(sample_weight: Any, n_labels: int) -> np.ndarray:
    """``score``'s ``sample_weight`` as a NumPy array, refused unless one finite real weight >= 0 per label: a
    negative weight makes the weighted accuracy leave [0, 1] (3.2, or 26001 where the weights nearly cancel) with no
    error from scikit-learn."""
    given = host_values(sample_weight, "sample_weight")
    if np.ndim(given) != 1:
        raise FoalPipeError(f"sample_weight has shape {np.shape(given)}; pass one weight per row, as a 1-D array")
    if (n := np.size(given)) != n_labels:
        raise FoalPipeError(f"sample_weight has {n} value{'s' * (n != 1)} but y has {n_labels} labels; pass one "
                            "weight per row")
    weights = np.asarray(given)
    if weights.dtype.kind not in "biuf":
        raise FoalPipeError(f"sample_weight holds {weights.dtype} values, not numbers; pass one real weight >= 0 per row")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise FoalPipeError("sample_weight holds a negative weight, NaN or inf, which give no weighted accuracy (a "
                            "negative weight can push it outside [0, 1]); pass finite weights >= 0")
    return weights


def state_array(X: Any, backend: str, like: Any, dtype: Any = None) -> Any:
    """``X`` in the namespace of ``backend`` and the device of the state array ``like``, in its dtype (or ``dtype``),
    refused if not finite."""
    xp = get_namespace(backend)
    X = host_values(X) if is_numpy_namespace(xp) else X  # on any device, copied to the host as the heads copy it
    X = xp.asarray(readable_by(X, xp), device=device(like))
    if xp.isdtype(X.dtype, ("real floating", "complex floating")) and not bool(xp.all(xp.isfinite(X))):  # bool, int: finite
        raise FoalPipeError("X contains NaN or inf; check the features (re-extract the store)")
    return as_dtype(X, xp, like.dtype if dtype is None else dtype, device(like))


def batch_labels(y: Any, classes: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """A batch's labels ``y``, checked as class labels, and the labels it adds: ``y`` and ``partial_fit``'s
    ``classes`` (refused where their kinds do not mix with ``y``'s)."""
    check_targets(y)
    y = np.asarray(y)
    if y.dtype.kind == "c":
        raise FoalPipeError("y holds complex numbers, which are not class labels; pass integer ids or names")
    labels = None if classes is None else np.asarray(label_array(classes, "classes=")).ravel()
    if labels is None or labels.size == 0:  # none declared: an empty list's float64 would promote the labels
        return y, y
    with np.errstate(invalid="ignore"):  # scikit-learn's cast of NaN: the check below names it
        check_targets(labels)  # checked as y is: NaN, inf, None and fractional labels are no classes
    check_label_kinds(y, labels, CLASSES_KIND_PROBLEM)
    return y, np.concatenate([y, labels])


def task_classes(classes: Any, fitted: np.ndarray) -> np.ndarray | None:
    """``predict``'s ``classes`` (every label of the task) as an array, refused where it holds None or labels of a
    kind that does not mix with the ``fitted`` classes'; None stays None."""
    if classes is None:
        return None
    classes = np.asarray(label_array(classes, "classes=")).ravel()
    if classes.dtype.kind == "O" and any(c is None for c in classes.tolist()):
        raise FoalPipeError("classes= holds None; pass every label of the task (those of classes_ among them)")
    if classes.size:
        with np.errstate(invalid="ignore"):  # scikit-learn's cast of NaN: the check names it
            check_targets(classes)  # as partial_fit's classes=: NaN, inf and fractional labels are no classes
    check_label_kinds(fitted, classes, PREDICT_CLASSES_PROBLEM)
    return classes
