"""foal-pipe: F-OAL as a feature cache plus an exact recursive-least-squares learner."""

from foal_pipe.classifier import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.projection import SmoothProjection

__version__ = "0.1.0"
__all__ = ["AnalyticClassifier", "FoalPipeError", "SmoothProjection", "__version__"]
