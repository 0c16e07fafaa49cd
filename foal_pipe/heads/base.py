"""The contract every analytic head follows: a running state over one stream (:class:`Head`) that, at a task end,
gives an exact model of every row added so far (:class:`Scorer`).

The walk (:mod:`foal_pipe.protocol.walk`) reads the train rows once and feeds each head the rows of its
:attr:`Head.space` in stream order, in blocks of any size; ``boundary()`` at every task end must equal a
from-scratch float64 computation of the head's definition on all rows added so far. Heads are built by their
registry entry (:data:`foal_pipe.heads.HEADS`) with their own options as keyword arguments plus ``xp`` (the array
namespace, :mod:`foal_pipe.core.backend`) and ``dim`` (the width of the rows they will be given).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

#: The rows a head is given. ``features``: the store's rows after ``--fusion``; ``activations``: the projected,
#: activated rows ridge's Gram sums; ``projected``: the rows after the projection, before the activation.
SPACES = ("features", "activations", "projected")


class Scorer(Protocol):
    """An exact model at one task boundary: scores over the classes seen so far."""

    classes: np.ndarray  # sorted global class ids seen so far (host NumPy)

    def scores(self, X: Any) -> Any:
        """(n, len(classes)) array in ``X``'s namespace; higher = more likely (argmax predicts)."""
        ...


class ClassColumns(Protocol):
    """A scorer whose column of a class depends on that class's statistics alone (fecam's distances). ``keys[k]``
    names the statistics of ``classes[k]`` (equal keys, equal columns, whichever boundary's scorer holds them), so a
    walk scoring the same rows at every boundary computes each (row, class) column once per change of the class's
    statistics: once in a disjoint stream, again whenever a class gets rows again."""

    classes: np.ndarray
    keys: Sequence[Hashable] | None  # None: no key, score with ``scores``

    def prepare(self, X: Any) -> Any:
        """The rows as :meth:`column` takes them (the same for every scorer of one head)."""
        ...

    def column(self, k: int, prepared: Any) -> Any:
        """Scores of ``classes[k]`` for prepared rows: column ``k`` of :meth:`Scorer.scores`."""
        ...


class Head(Protocol):
    """A head's running state over one stream: rows arrive in stream order, any block size."""

    name: ClassVar[str]
    space: ClassVar[str]  # one of SPACES

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Rows ``X`` ((n, dim) float64 array in namespace ``xp``) labelled with global class ids ``labels``."""
        ...

    def boundary(self) -> Scorer:
        """At a task end: the exact model over all rows added so far."""
        ...


class LeaveOneOut(Protocol):
    """A head that can also score its exact leave-one-out accuracy (``sweep --heads``' training-data criterion):
    after the last boundary the walk passes every row added again, in blocks."""

    def loo_hits(self, X: Any, labels: np.ndarray) -> int:
        """How many of the rows ``X`` (each added before) the model refitted without that row predicts right."""
        ...
