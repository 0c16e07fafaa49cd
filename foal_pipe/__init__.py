"""foal-pipe: F-OAL as a feature cache plus an exact recursive-least-squares learner.

The public names are imported on first use (here and in the subpackages that re-export names, through
:func:`lazy_names`), so that ``import foal_pipe.cli`` (and ``foal-pipe --help``) does not pay for scikit-learn
or zarr.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from foal_pipe.errors import FoalPipeError

if TYPE_CHECKING:
    from foal_pipe.core.projection import SmoothProjection
    from foal_pipe.model.classifier import AnalyticClassifier
    from foal_pipe.model.deploy import DeployedModel, load_model
    from foal_pipe.model.headestimator import head_classifier


def lazy_names(package: str, modules: dict[str, Iterable[str]]) -> Callable[[str], Any]:
    """A package's module ``__getattr__``: each name of ``modules`` (module -> names) imported on first use."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

__version__ = "0.1.0"
__all__ = ["AnalyticClassifier", "DeployedModel", "FoalPipeError", "SmoothProjection", "__version__", "head_classifier",
           "load_model"]

__getattr__ = lazy_names(__name__, {"foal_pipe.model.classifier": ["AnalyticClassifier"],
                                    "foal_pipe.model.deploy": ["DeployedModel", "load_model"],
                                    "foal_pipe.core.projection": ["SmoothProjection"],
                                    "foal_pipe.model.headestimator": ["head_classifier"]})
