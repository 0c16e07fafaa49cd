"""Which rows leave-one-out scores at each task boundary when it scores a sample (``learn --loo-sample M``).

Every train row of the store gets a fixed random rank, drawn from the seed; at a task boundary the sample is the
``M`` rows seen with the least ranks: uniform without replacement among the rows seen (not stratified by class, so
:func:`~foal_pipe.core.leaveoneout.sample_bound` applies as it is). The sample depends only on which rows have
been seen, not on the order they came in, so boundaries that have seen the same rows (the last boundary of every
class order; a 5-task boundary and the 10-task boundary after the same classes) score the same rows, and
``learn --order-seeds`` and ``table`` can share them. A row once out of the sample never re-enters it, so the rows
to keep are the union of the boundaries' samples, about ``M (1 + 1/2 + ... + 1/T)`` for T equal tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from foal_pipe.core.leaveoneout import sample_bound

#: Rows scored per boundary by default: Hoeffding's bound over 97 gammas is then 0.032 at delta 0.05.
LOO_SAMPLE = 4096
#: Mixed into the seed so that the sample is independent of the projection drawn from the same seed.
SAMPLE_STREAM = 23


@dataclass(frozen=True)
class RowSample:
    """The sampled store rows (sorted) at every task boundary; ``size`` is the requested ``M``."""

    size: int
    boundaries: tuple[np.ndarray, ...]

    @classmethod
    def draw(cls, task_rows: Sequence[np.ndarray], n_rows: int, size: int, seed: int) -> RowSample:
        """The sample of a stream whose task ``k`` adds the store rows ``task_rows[k]``, of a split of ``n_rows``."""
        walk = np.concatenate([np.asarray(r, dtype=np.int64) for r in task_rows]) if task_rows else np.zeros(0, np.int64)
        ranks = np.random.default_rng([seed, SAMPLE_STREAM]).permutation(n_rows)[walk]
        out = []
        for end in np.cumsum([len(r) for r in task_rows]).tolist():  # the rows seen: walk[:end]
            seen, r = walk[:end], ranks[:end]
            out.append(np.sort(seen if size >= end else seen[r <= np.partition(r, size - 1)[size - 1]]))
        return cls(size, tuple(out))

    @property
    def kept(self) -> np.ndarray:
        """Every store row sampled at some boundary: the rows whose activations the walk keeps."""
        return np.unique(np.concatenate(self.boundaries)) if self.boundaries else np.zeros(0, dtype=np.int64)

    def bound(self, k: int, seen: int, n_gammas: int) -> float:
        """Boundary ``k``'s :func:`sample_bound` (0 where the sample is every one of the ``seen`` rows)."""
        rows = self.boundaries[k].size
        return 0.0 if rows >= seen else sample_bound(rows, n_gammas)
