"""foal-pipe: F-OAL as a feature cache plus an exact recursive-least-squares learner.

The public names are imported on first use, so that ``import foal_pipe.cli`` (and ``foal-pipe --help``) does
not pay for scikit-learn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from foal_pipe.errors import FoalPipeError

if TYPE_CHECKING:
    from foal_pipe.classifier import AnalyticClassifier
    from foal_pipe.deploy import DeployedModel, load_model
    from foal_pipe.projection import SmoothProjection

__version__ = "0.1.0"
__all__ = ["AnalyticClassifier", "DeployedModel", "FoalPipeError", "SmoothProjection", "__version__", "load_model"]

_LAZY = {"AnalyticClassifier": "foal_pipe.classifier", "DeployedModel": "foal_pipe.deploy",
         "load_model": "foal_pipe.deploy", "SmoothProjection": "foal_pipe.projection"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'foal_pipe' has no attribute {name!r}")
