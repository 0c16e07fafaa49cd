"""A ridge model as its file holds it, free of scikit-learn: ``learn`` saves one directly and
:meth:`AnalyticClassifier.save <foal_pipe.model.classifier.AnalyticClassifier.save>` through one, so the ridge
file's tensors and metadata are written in one place (:func:`~foal_pipe.model.modelfile.write_model` checks them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.backend import dtype_name, to_numpy
from foal_pipe.core.engines import checked_weights
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import write_model


@dataclass(frozen=True)
class RidgeModel:
    """An engine's ``state`` (the gram engine's ``G``, ``Q`` and ``counts``, or the recursion's ``R`` and ``W``),
    the ``weights`` solved at ``gamma``, the sorted ``classes``, the state's ``dtype`` and the rows seen;
    ``gamma_grid`` for a model that keeps choosing its gamma (``gamma="auto"``)."""

    state: Mapping[str, Any]
    weights: Any
    classes: np.ndarray
    gamma: float
    engine: str
    dtype: str
    n_samples: int
    gamma_grid: Sequence[float] | None = None

    @classmethod
    def solved(cls, statistics: RidgeStatistics, gamma: float) -> RidgeModel:
        """The gram model of ``statistics`` at ``gamma``: its weights solved, refused when not finite."""
        W = to_numpy(checked_weights(statistics.solve(gamma)))
        return cls(statistics.state(), W, statistics.classes, float(gamma), "gram", dtype_name(statistics.dtype),
                   int(statistics.n))

    def save(self, path: str | Path, projection: np.ndarray | None = None, **metadata: Any) -> Path:
        """Write the model file: the state, ``W`` (float64), ``classes``, the ``projection`` matrix when given, and
        ``metadata`` (foal_pipe/model/modelfile.py lists the known keys) with the settings."""
        if not np.issubdtype(self.classes.dtype, np.integer):
            raise FoalPipeError("only integer class labels can be saved; map labels to integer ids first")
        tensors = {name: to_numpy(a) for name, a in self.state.items()}
        tensors["W"] = to_numpy(self.weights).astype(np.float64)
        tensors["classes"] = self.classes.astype(np.int64)
        if projection is not None:
            tensors["projection"] = projection
        settings = {"gamma": float(self.gamma), "engine": self.engine, "dtype": self.dtype,
                    "n_samples_seen": self.n_samples}
        if self.gamma_grid is not None:
            settings["gamma_grid"] = [float(g) for g in self.gamma_grid]
        return write_model(path, tensors, {**metadata, **settings})
