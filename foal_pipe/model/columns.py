"""Whose job checking a DataFrame's column names is: a :class:`~foal_pipe.model.deploy.DeployedModel` checks its
features' columns itself, then passes its classifier rows it computed (the activations), which carry no names;
scikit-learn would warn of them at every call to a classifier fitted on a DataFrame. Kept apart from the estimators'
input checks, so that the command line's models use it without importing scikit-learn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
