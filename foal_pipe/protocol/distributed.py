"""``--scheduler dask`` for ``learn``/``sweep --engine gram``: the Gram statistics summed on a Dask cluster.

Dask (``pip install 'foal-pipe[dist]'``) does the scheduling, data movement and fault tolerance; this module
only says what each task computes. :func:`dask_statistics` sums the
:class:`~foal_pipe.core.statistics.RidgeStatistics` of the train rows of every task in one pass over the store
(``learn`` then adds them in stream order). The features are read with :func:`dask.array.from_zarr` in blocks
aligned to the store's chunks; each block task projects its rows and returns their statistics per task; partials are
added pairwise on the workers as they finish (preferably two held by the same worker, so little
moves), and only the total comes back. The sums are the same as the single-process pass (to rounding,
~1e-13), so the weights and metrics are too. The per-batch RLS path is sequential and stays local.
This module takes a store path, arrays, a projection and statistics: it knows nothing of ``learn``.

Workers read the store themselves, so its path must be visible to every worker (a shared
filesystem, or an object store mounted on every node). They read it through the opened store's checked Zarr
store (:class:`~foal_pipe.store.chunks.StrictLocalStore`, pickled with its chunk records), so a chunk that is
missing, moved or not a regular file fails its task as it would fail a local read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from foal_pipe.cluster import n_workers, require_distributed
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import REEXTRACT, BadChunkFile, MissingChunk, check_finite, damage_reason

if TYPE_CHECKING:
    from distributed import Client

#: Upper bound on the feature bytes one Gram task reads at once (a block of whole store chunks).
BLOCK_BYTES = 64 * 2**20
#: Aim for at least this many blocks per worker, so a slow or lost worker costs little.
BLOCKS_PER_WORKER = 4


def block_rows(n_rows: int, dim: int, itemsize: int, chunk_rows: int, workers: int) -> int:
    """Rows per Gram block: whole store chunks, at most ``BLOCK_BYTES`` of features, and at least
    ``BLOCKS_PER_WORKER`` blocks per worker when the split is large enough."""
    by_bytes = max(1, BLOCK_BYTES // max(1, chunk_rows * dim * itemsize))
    by_balance = max(1, math.ceil(n_rows / (chunk_rows * workers * BLOCKS_PER_WORKER)))
    return chunk_rows * min(by_bytes, by_balance)


def block_statistics(
    X: np.ndarray, first_row: int, groups: np.ndarray, n_groups: int, labels: np.ndarray, projection: Expansion,
    step: int,
) -> list[RidgeStatistics | None]:
    """The statistics of one block's rows per group (``groups``: each row's group, -1 for none; None for a group
    without rows), each group's rows projected ``step`` at a time."""
    X = np.asarray(X)
    check_finite(X, "train", first_row)
    totals: list[RidgeStatistics | None] = [None] * n_groups
    for g in np.unique(groups[groups >= 0]).tolist():
        mine = np.flatnonzero(groups == g)
        for lo in range(0, mine.size, step):
            keep = mine[lo : lo + step]
            part = RidgeStatistics.from_batch(projection.transform(X[keep]), labels[keep])
            totals[g] = part if totals[g] is None else totals[g] + part
    return totals


def add_statistics(a: list[RidgeStatistics | None], b: list[RidgeStatistics | None]) -> list[RidgeStatistics | None]:
    """The group-wise sum of two partials, as new arrays (inputs held by Dask are never modified)."""
    return [y if x is None else x if y is None else x + y for x, y in zip(a, b)]


def reduce_as_completed(
    client: Client, futures: list[Any], combine: Callable[[Any, Any], Any], advance: Callable[[Any], None]
) -> Any:
    """Combine futures pairwise on the workers as they finish; ``advance(future)`` for each input.

    A finished partial waits for another one held by the same worker, so the combining task needs no
    transfer; only the last partial of each worker moves. Returns the future of the total. A task that
    failed raises its error here at once.
    """
    from distributed import as_completed

    inputs = {f.key for f in futures}
    waiting: dict[Any, Any] = {}  # worker address -> a finished partial held there
    queue = as_completed(futures)
    for future in queue:
        if future.status == "error":
            future.result()  # re-raises the task's exception
        if future.key in inputs:
            advance(future)
        holders = client.who_has([future]).get(future.key) or [None]
        other = waiting.pop(holders[0], None)
        if other is None and queue.is_empty() and waiting:  # nothing left to pair with here: cross workers
            other = waiting.pop(next(iter(waiting)))
        if other is None:
            waiting[holders[0]] = future
        else:
            queue.add(client.submit(combine, other, future, pure=False))
    (last,) = waiting.values()
    return last


def dask_statistics(
    client: Client,
    path: str,
    groups: np.ndarray,
    n_groups: int,
    labels: np.ndarray,
    projection: Any,
    step: int,
    advance: Callable[[int], None] = lambda n: None,
) -> list[RidgeStatistics]:
    """The :class:`RidgeStatistics` of each group of train rows (``groups``: every row's group, -1 for none),
    computed on the cluster in one pass over the store.

    ``path`` is the store (visible to every worker), ``labels`` the train labels, ``projection`` a fitted
    :class:`~foal_pipe.core.expansion.Expansion` (or its future, scattered once by the caller), ``step`` the rows projected at
    once; ``advance(n)`` reports rows done.
    """
    require_distributed()
    import dask
    import dask.array as da

    from foal_pipe.store import open_store

    features = open_store(path).train.features
    n_rows, dim = (int(n) for n in features.shape)
    chunk_rows = int(features.chunks[0])
    rows = block_rows(n_rows, dim, features.dtype.itemsize, chunk_rows, n_workers(client))
    X = da.from_zarr(features, chunks=(rows, dim))
    stat = dask.delayed(block_statistics, pure=True)
    blocks, sizes = [], []
    for i, block in enumerate(X.to_delayed().ravel()):
        lo, hi = i * rows, min((i + 1) * rows, n_rows)
        count = int(np.count_nonzero(groups[lo:hi] >= 0))
        if count:
            blocks.append(stat(block, lo, groups[lo:hi], n_groups, labels[lo:hi], projection, step))
            sizes.append(count)
    if not blocks:
        raise FoalPipeError("no train rows were selected for the Dask statistics; check the task split")
    futures = client.compute(blocks)
    size_of = {f.key: n for f, n in zip(futures, sizes)}
    try:
        totals = reduce_as_completed(client, futures, add_statistics, lambda f: advance(size_of[f.key])).result()
    except (MissingChunk, BadChunkFile) as exc:  # raised on a worker by the checked read of one chunk file
        raise FoalPipeError(f"{path}: chunk file {exc.args[0].split(':')[0]} is {damage_reason(exc)}; {REEXTRACT}") from None
    expected = np.bincount(groups[groups >= 0], minlength=n_groups)
    got = np.array([0 if t is None else t.n for t in totals])
    if not np.array_equal(got, expected) or any(t is None for t in totals):
        raise FoalPipeError(f"dask returned statistics for {int(got.sum())} of {int(expected.sum())} rows; re-run the command")
    return totals


def read_chunks(path: str, fusion: str | None, fusion_norm: bool, split: str, starts: list[int]) -> dict[int, Any]:
    """On a worker: the stored chunks of a split that start at ``starts`` (:meth:`~foal_pipe.store.Split.read_raw`,
    checked as a local read is), the store opened once for them, with the run's ``fusion``."""
    from foal_pipe.store import open_store

    source = open_store(path, fusion, fusion_norm).split(split)
    step, n = int(source.chunk_rows), int(source.n_rows)
    return {lo: source.read_raw(lo, min(lo + step, n)) for lo in starts}


class ClusterSplit:
    """A split whose chunks the cluster reads and decodes (``--scheduler dask`` with a head other than ridge), read
    like the local split it wraps (:class:`~foal_pipe.protocol.rowcache.GroupedRows` calls :meth:`read_raw` chunk
    by chunk, in order, on a few threads): the chunks are asked for in blocks of ``block`` chunks, ``ahead`` blocks
    ahead of the one read, and each block is let go once its chunks are taken. The bytes are those of a local read."""

    def __init__(self, split: Any, client: Client, path: str, fusion: str | None, fusion_norm: bool, name: str,
                 starts: list[int], block: int, ahead: int = 2) -> None:
        import threading

        self._split, self._client = split, client
        self._where = (path, fusion, fusion_norm, name)
        self._blocks = [starts[i : i + block] for i in range(0, len(starts), block)]
        self._block_of = {lo: b for b, chunk in enumerate(self._blocks) for lo in chunk}
        self._left = [len(chunk) for chunk in self._blocks]
        self._futures: dict[int, Any] = {}
        self._ahead = ahead
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # labels, dim, features, chunk_rows, n_rows, rows_of: the local split's
        return getattr(self._split, name)

    def read_raw(self, lo: int, hi: int) -> np.ndarray:
        b = self._block_of[lo]
        with self._lock:
            for k in range(b, min(b + 1 + self._ahead, len(self._blocks))):
                if k not in self._futures and self._left[k]:
                    self._futures[k] = self._client.submit(read_chunks, *self._where, self._blocks[k], pure=False)
            future = self._futures[b]
        try:
            raw = future.result()[lo]
        except (MissingChunk, BadChunkFile) as exc:  # raised on a worker by the checked read of one chunk file
            raise FoalPipeError(f"{self._where[0]}: chunk file {exc.args[0].split(':')[0]} is {damage_reason(exc)}; "
                                f"{REEXTRACT}") from None
        with self._lock:
            self._left[b] -= 1
            if not self._left[b]:
                self._futures.pop(b).release()
        return raw
