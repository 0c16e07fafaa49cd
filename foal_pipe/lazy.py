"""Names a package imports on first use: ``import foal_pipe.cli`` (and ``foal-pipe --help``) does not pay for
scikit-learn or zarr. In the bottom layer, so every package's ``__init__`` may use it (tests/test_imports.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


def lazy_names(package: str, modules: dict[str, Iterable[str]]) -> Callable[[str], Any]:
    """A package's module ``__getattr__``: each name of ``modules`` (module -> names) imported on first use."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
