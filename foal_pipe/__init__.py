"""foal-pipe: F-OAL as a feature cache plus an exact recursive-least-squares learner."""

from foal_pipe.core.projection import SmoothProjection
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.deploy import DeployedModel, load_model

__version__ = "0.1.0"
__all__ = ["AnalyticClassifier", "DeployedModel", "FoalPipeError", "SmoothProjection", "__version__", "load_model"]
