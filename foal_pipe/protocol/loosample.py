"""Which rows leave-one-out scores at each task boundary when it scores a sample (``learn --loo-sample M``).

Every walk position gets a fixed random rank, drawn from the seed; at the boundary that ends at walk row ``e``
the sample is the ``M`` rows of ``[0, e)`` with the least ranks: uniform without replacement among the rows
seen (not stratified by class, so :func:`~foal_pipe.core.leaveoneout.sample_bound` applies as it is). A row
once out of the sample never re-enters it, so the rows to keep are the union of the boundaries' samples,
about ``M (1 + 1/2 + ... + 1/T)`` for T equal tasks, not every row.
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
    """The sampled walk positions (sorted) at every task boundary; ``size`` is the requested ``M``."""

    size: int
    boundaries: tuple[np.ndarray, ...]

    @classmethod
    def draw(cls, task_sizes: Sequence[int], size: int, seed: int) -> RowSample:
        ends = np.cumsum(np.asarray(task_sizes, dtype=np.int64))
        n = int(ends[-1]) if ends.size else 0
        ranks = np.random.default_rng([seed, SAMPLE_STREAM]).permutation(n)
        out = []
        for end in ends.tolist():
            if size >= end:
                out.append(np.arange(end, dtype=np.int64))
            else:
                seen = ranks[:end]
                out.append(np.flatnonzero(seen <= np.partition(seen, size - 1)[size - 1]).astype(np.int64))
        return cls(size, tuple(out))

    @property
    def kept(self) -> np.ndarray:
        """Every walk position sampled at some boundary: the rows whose activations the walk keeps."""
        return np.unique(np.concatenate(self.boundaries)) if self.boundaries else np.zeros(0, dtype=np.int64)

    def bound(self, k: int, seen: int, n_gammas: int) -> float:
        """Boundary ``k``'s :func:`sample_bound` (0 where the sample is every one of the ``seen`` rows)."""
        rows = self.boundaries[k].size
        return 0.0 if rows >= seen else sample_bound(rows, n_gammas)
