"""foal-pipe: F-OAL as a feature cache plus an exact recursive-least-squares learner.

The public names are imported on first use (here and in the subpackages that re-export names, through
:func:`~foal_pipe.lazy.lazy_names`), so that ``import foal_pipe.cli`` (and ``foal-pipe --help``) does not pay for
scikit-learn or zarr. This module is the facade, above every layer (tests/test_imports.py): nothing in the package
imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foal_pipe.blasenv import blas_environment
from foal_pipe.cupyenv import cupy_environment
from foal_pipe.errors import FoalPipeError
from foal_pipe.lazy import lazy_names
from foal_pipe.version import __version__

cupy_environment()  # before anything imports CuPy, as zarr does (foal_pipe/cupyenv.py)
blas_environment()  # before anything loads OpenBLAS (foal_pipe/blasenv.py)

if TYPE_CHECKING:
    from foal_pipe.model.classifier import AnalyticClassifier
    from foal_pipe.model.deploy import DeployedModel, load_model
    from foal_pipe.model.headestimator import head_classifier
    from foal_pipe.model.projection import SmoothProjection


__all__ = ["AnalyticClassifier", "DeployedModel", "FoalPipeError", "SmoothProjection", "__version__", "head_classifier",
           "load_model"]

__getattr__ = lazy_names(__name__, {"foal_pipe.model.classifier": ["AnalyticClassifier"],
                                    "foal_pipe.model.deploy": ["DeployedModel", "load_model"],
                                    "foal_pipe.model.projection": ["SmoothProjection"],
                                    "foal_pipe.model.headestimator": ["head_classifier"]})
