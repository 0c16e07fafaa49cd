"""Class labels as the estimators take them: which kinds mix (numbers sort together, names with names), labels whose
union would lose ids, and the targets scikit-learn's check refuses, each named with its fix."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from foal_pipe.core.backend import host_values
from foal_pipe.errors import FoalPipeError, as_user_error

#: Label kinds by NumPy dtype kind; ``number`` kinds sort together, so they mix.
_DTYPE_KINDS = {"b": "bool", "i": "int", "u": "int", "f": "float", "U": "str", "S": "bytes"}
_NUMBER_KINDS = ("bool", "int", "float", "number")


def _value_kind(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return type(value).__name__
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    return "int" if isinstance(value, numbers.Integral) else "float" if isinstance(value, numbers.Real) else type(value).__name__


def label_kind(labels: np.ndarray) -> str:
    """The kind of ``labels``: ``int``, ``float``, ``bool``, ``str``, ``bytes`` or, for an object array of values of
    several kinds, ``number`` (all numbers) or them all (``int/str``)."""
    if labels.dtype.kind != "O":
        return _DTYPE_KINDS.get(labels.dtype.kind, labels.dtype.name)
    kinds = sorted({_value_kind(v) for v in set(labels.ravel().tolist())})
    if len(kinds) > 1 and all(k in _NUMBER_KINDS for k in kinds):
        return "number"
    return "/".join(kinds)


def check_label_kinds(before: np.ndarray, labels: np.ndarray, problem: str = (
        "labels of kind {new} after labels of kind {old}; use one kind of label (integer ids or names) in every call, "
        "or call fit to start afresh")) -> None:
    """Refuse ``labels`` of another kind than the labels ``before`` (numbers mix; strings, bytes and numbers do not):
    NumPy cannot sort them together, and ``3`` and ``"3"`` would be two classes. ``problem``: the message, naming
    the ``{new}`` and ``{old}`` kinds."""
    if before.size == 0 or labels.size == 0:
        return
    old, new = label_kind(before), label_kind(labels)
    if old != new and not (old in _NUMBER_KINDS and new in _NUMBER_KINDS):
        raise FoalPipeError(problem.format(new=new, old=old))
    _check_exact_union(before, labels)


def _check_exact_union(before: np.ndarray, labels: np.ndarray) -> None:
    """Refuse integer labels that the dtype NumPy sorts both arrays in (int64 with floats, or with uint64: float64)
    cannot hold exactly: ``2**62`` and ``2**62 + 1`` would become one class."""
    joint = np.result_type(before.dtype, labels.dtype)
    if joint.kind != "f":
        return
    bits = np.finfo(joint).nmant + 1
    for side, other in ((before, labels), (labels, before)):
        if side.dtype.kind in "iu":
            top = max(abs(int(side.min())), abs(int(side.max())))
            if top > 2**bits:
                raise FoalPipeError(
                    f"labels of dtype {side.dtype} (up to {top}) and labels of dtype {other.dtype} sort together only "
                    f"as {joint}, which holds integers exactly only up to 2**{bits}, so distinct ids would merge; pass "
                    "the labels of every call in one integer dtype (e.g. np.int64)")


def _mixed_kinds(labels: np.ndarray) -> FoalPipeError:
    return FoalPipeError(f"y mixes labels of kinds {label_kind(labels)}, which do not sort together; use one kind of label "
                         "(integer ids or names)")


def _check_object_labels(labels: np.ndarray) -> None:
    """Name what scikit-learn calls an "unknown" (continuous-sounding) target in an object array: a missing label,
    labels of several kinds, numbers held as objects, or values that are no labels at all (the last two keep
    scikit-learn's "Unknown label type", which its estimator checks look for)."""
    values = labels.ravel().tolist()
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        raise FoalPipeError(f"y has no label (None) at row {missing[0]}; give every row a label (integer id or "
                            "name), or drop the unlabelled rows")
    kind = label_kind(labels)
    if "/" in kind:
        raise _mixed_kinds(labels)
    if kind in _NUMBER_KINDS:
        raise FoalPipeError(f"Unknown label type: y holds {kind} labels in an object array, which scikit-learn does not take "
                            "as class labels; pass them in a numeric dtype (e.g. np.asarray(y, dtype=np.int64))")
    if values and kind not in ("str", "bytes"):
        raise FoalPipeError(f"Unknown label type: y holds values of type {kind}, which are not class labels; pass integer "
                            "ids or names")


def label_array(values: Any, name: str = "y") -> Any:
    """Labels as the estimators read them: a tensor's values (detached), a memoryview's, and pandas' nullable
    integers or floats without a missing value in their NumPy dtype (scikit-learn would read Int64 ids as float64,
    merging those above 2**53); a set, whose order is arbitrary, refused. Other values as given."""
    if isinstance(values, (set, frozenset)):
        raise FoalPipeError(f"{name} is a set, whose order is arbitrary; pass a list or an array of labels")
    values = host_values(values, name)
    if isinstance(values, memoryview):
        return np.asarray(values)
    kind = getattr(getattr(values, "dtype", None), "numpy_dtype", None)  # pandas' Int64, UInt64, Float64, boolean
    if kind is not None and hasattr(values, "to_numpy") and not bool(np.asarray(values.isna()).any()):
        return values.to_numpy(dtype=kind)
    return values


def check_targets(y: Any) -> None:
    """scikit-learn's check of classification targets, with a missing label (None), labels that do not sort
    together and object arrays it calls "unknown" named with their fix rather than in NumPy's or its words."""
    labels = np.asarray(y)
    if y is not None and labels.dtype.kind == "O":
        _check_object_labels(labels)
    try:
        check_classification_targets(y)
    except TypeError as exc:
        if "not supported between" not in str(exc):
            raise as_user_error(exc) from None
        raise _mixed_kinds(labels) from None
    except ValueError as exc:
        raise as_user_error(exc) from None


#: :func:`check_label_kinds`'s message for ``partial_fit``'s ``classes`` of another kind than ``y``.
CLASSES_KIND_PROBLEM = ("classes= holds labels of kind {new} but y labels of kind {old}; use one kind of label (integer ids "
                        "or names)")


#: :func:`check_label_kinds`'s message for ``predict``'s ``classes`` of another kind than ``classes_``.
PREDICT_CLASSES_PROBLEM = ("classes= holds labels of kind {new} but the classifier's classes_ are of kind {old}; pass the "
                           "task's labels as the classifier was fitted with them")
