"""Whose job checking a DataFrame's column names is: a :class:`~foal_pipe.model.deploy.DeployedModel` checks its
features' columns itself, then passes its classifier rows it computed (the activations), which carry no names;
scikit-learn would warn of them at every call to a classifier fitted on a DataFrame. Kept apart from the estimators'
input checks, so that the command line's models use it without importing scikit-learn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from foal_pipe.errors import FoalPipeError, clipped

_CHECKED: ContextVar[bool] = ContextVar("columns_checked", default=False)


@contextmanager
def columns_checked() -> Iterator[None]:
    """Within it (this thread or task), a classifier checks NumPy rows as it checks device arrays: their shape and
    finiteness, no column names asked of them."""
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def columns_were_checked() -> bool:
    """Whether the rows come from within :func:`columns_checked`."""
    return _CHECKED.get()


def check_frame_columns(columns: Any, names: Any) -> None:
    """Refuse a DataFrame's ``columns`` unless they are, in order, the strings ``names`` (None: nothing to check) a
    model was fitted on: its values would be read by position, each column standing in for another."""
    if names is None:
        return
    given, names = list(columns), list(names)
    if not all(isinstance(c, str) for c in given):  # scikit-learn: a TypeError for mixed names, a warning for others
        raise FoalPipeError(f"the features' columns are named {clipped(repr(given), 40)}, not by the strings the "
                            f"model was fitted on; select them by name, features[{clipped(repr(names))}], or pass "
                            "the values in that order as an array")
    if given != names:
        at = next((i for i, (a, b) in enumerate(zip(given, names)) if a != b), min(len(given), len(names)))
        raise FoalPipeError(f"the features' columns differ from those the model was fitted on at position {at} "
                            f"({clipped(repr(given[at:at + 3]), 40)} against {clipped(repr(names[at:at + 3]), 40)}); "
                            f"select them in the model's order, features[{clipped(repr(names))}]")
