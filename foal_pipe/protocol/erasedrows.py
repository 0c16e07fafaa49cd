"""Train rows that the activation erases, judged in the local walk's blocks whatever blocks projected them.

:meth:`~foal_pipe.core.expansion.Expansion.apply` refuses a block of rows that differ while every activation is the
value at 0 (features near 1e-30): nothing of their differences is left. The Dask workers project the store's chunks
and the per-class sums project rows grouped by class, blocks that hold other rows together than a walk's; they
project without that check, report the rows they found erased (:class:`ErasedRows`), and
:func:`check_erased_blocks` refuses them as the walk of the same run would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.activations import ROUNDED_AT_ZERO
from foal_pipe.core.backend import to_numpy
from foal_pipe.core.expansion import Expansion, erased_error


class ErasedRows(NamedTuple):
    """Rows whose every activation is the value at 0 (store indices), each one's mark (a hash of its values as
    projected: equal rows, equal marks) and largest feature. None found: empty arrays."""

    rows: np.ndarray
    marks: np.ndarray
    scales: np.ndarray

    @classmethod
    def of(cls, projection: Expansion, X: Any, H: Any, rows: np.ndarray) -> ErasedRows:
        """Those of the rows ``X`` (store indices ``rows``) whose activations ``H`` (any namespace) the projection
        erased; on usual data one column's comparison, nothing copied to the host but a mask."""
        if projection.activation not in ROUNDED_AT_ZERO or not H.shape[0] or not H.shape[1]:
            return NO_ERASED
        xp = array_namespace(H)
        zero = to_numpy(projection.at_zero(xp, device(H)))
        candidates = np.flatnonzero(to_numpy(H[:, 0] == float(zero[0, 0])))
        if not candidates.size:
            return NO_ERASED
        found = candidates[(to_numpy(xp.take(H, xp.asarray(candidates), axis=0)) == zero).all(axis=1)]
        values = to_numpy(xp.take(X, xp.asarray(found), axis=0)).astype(projection.components_.dtype) + 0.0  # -0.0: 0.0
        marks = [int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little", signed=True)
                 for row in values]
        return cls(np.asarray(rows)[found].astype(np.int64), np.asarray(marks, dtype=np.int64),
                   np.max(np.abs(values), axis=1, initial=0.0).astype(np.float64))

    def __add__(self, other: object) -> ErasedRows:
        if not isinstance(other, ErasedRows):
            return NotImplemented
        return ErasedRows(*(np.concatenate([a, b]) for a, b in zip(self, other)))


NO_ERASED = ErasedRows(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))


def check_erased_blocks(erased: ErasedRows, tasks: Sequence[np.ndarray], block_rows: int, n_rows: int,
                        activation: str) -> None:
    """Refuse the train rows ``erased`` reports as a walk over ``tasks`` (each task's store rows) refuses them: in its
    blocks (each task's rows in storage order, ``block_rows`` at a time: a run's
    :attr:`~foal_pipe.protocol.run.Run.block_rows`), a block whose rows differ while every one's ``activation`` is
    its value at 0. ``n_rows``: the train split's. Nothing to do on usual data (no row erased)."""
    if not erased.rows.size:
        return
    found, marks, scales = np.zeros(n_rows, dtype=bool), np.zeros(n_rows, dtype=np.int64), np.zeros(n_rows)
    found[erased.rows], marks[erased.rows], scales[erased.rows] = True, erased.marks, erased.scales
    for task in tasks:
        ordered = np.sort(task)
        for lo in range(0, ordered.size, block_rows):
            block = ordered[lo : lo + block_rows]
            if block.size > 1 and found[block].all() and (marks[block] != marks[block[0]]).any():
                raise erased_error(activation, block.size, float(scales[block].max()))
