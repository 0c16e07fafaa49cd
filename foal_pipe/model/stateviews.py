"""The fitted state of an :class:`~foal_pipe.model.classifier.AnalyticClassifier` as its attributes hand it out.

``weights_`` and ``statistics_`` may be the engine's own arrays: a write through them would move the weights unseen,
so NumPy's are handed out as read-only views (no copy) and another namespace's, which has no such flag, as copies.
The weights are laid out row-major as a loaded model's are, so ``X @ W`` gives the same bits in memory as reloaded.
A copy (``copy.copy``) holds an engine of its own, for the same reason.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_torch_array

from foal_pipe.core.statistics import RidgeStatistics


def read_only(array: Any) -> Any:
    """A read-only view of a NumPy array of the state (no copy), a copy of another namespace's (which has no flag)."""
    if not isinstance(array, np.ndarray):
        return array_namespace(array).asarray(array, copy=True)
    view = array.view()
    view.flags.writeable = False
    return view


def row_major(W: Any) -> Any:
    """``W`` in row-major order (the solver's is column-major), the layout of a loaded model's weights: ``X @ W`` then
    takes the same BLAS path, with the same bits, in memory as reloaded (a copy only where the layout differs)."""
    if isinstance(W, np.ndarray):
        return np.ascontiguousarray(W)
    return W.contiguous() if is_torch_array(W) else W


def read_only_statistics(s: RidgeStatistics) -> RidgeStatistics:
    """The gram engine's sums ``s`` with ``G`` and ``Q`` read-only and their classes and counts copied. NumPy's are
    views, so the engine's own arrays are made read-only too: its next update adds into new arrays (the sums' ``+=``
    does so for a read-only array) rather than moving a snapshot handed out, whose ``n`` would no longer fit them."""
    for array in (s.G, s.Q):
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return RidgeStatistics(read_only(s.G), read_only(s.Q), s.classes.copy(), s.n,
                           None if s.counts is None else s.counts.copy(), rounding=s.rounding, symmetric=True)


class OwnState:
    """``copy.copy`` of a fitted estimator (or a deployed model) is one of its own, as its pickle is: a shallow copy
    shared the engine (the classifier), so learning on the copy moved the original's weights but not its
    ``n_samples_seen_`` or ``classes_`` (its ``class_names``: the original could no longer be saved)."""

    def __copy__(self) -> Any:
        return copy.deepcopy(self)
