"""Broken promises inside the pipeline (not the user's to fix): where the code knows a value is set that its type
leaves optional, it narrows it here once, and a broken promise stops the run instead of giving a wrong result."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def internal_error(what: str) -> AssertionError:
    """The error of a broken promise ``what``: a bug, not a setting."""
    return AssertionError(f"internal error: {what}")


def known(value: T | None, what: str) -> T:
    """``value``, which the caller knows is set (``what`` names it); None is a bug."""
    if value is None:
        raise internal_error(f"{what} is not set")
    return value
