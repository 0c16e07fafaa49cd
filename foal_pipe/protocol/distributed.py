"""``--scheduler dask`` for ``learn``/``sweep --engine gram``: the Gram statistics summed on a Dask cluster.

Dask (``pip install -e '.[dist]'``) does the scheduling, data movement and fault tolerance; this module
only says what each task computes. :func:`dask_statistics` sums the
:class:`~foal_pipe.core.statistics.RidgeStatistics` of the train rows of every task in one pass over the store
(``learn`` then adds them in stream order). The features are read with :func:`dask.array.from_zarr` in blocks
of whole store chunks, sized by the store alone (:func:`block_rows`); each block task projects its rows and
returns their statistics per task; the blocks' totals are added on the workers in a fixed pairwise tree over the
block index (all the adding tasks submitted up front), and only the total comes back. The order of every
addition is thus a function of the store -- not of which task finishes first, nor of the number of workers --
so the same command gives the same bytes; the sums equal the single-process pass to rounding (~1e-13 in
float64), so the weights and metrics do too. The per-batch RLS path is sequential and stays local.
This module takes a store path, arrays, a projection and statistics: it knows nothing of ``learn``.

Workers read the store themselves, so its path must be visible to every worker (a shared
filesystem, or an object store mounted on every node). They read it through the opened store's checked Zarr
store (:class:`~foal_pipe.store.chunks.StrictLocalStore`, pickled with its chunk records), so a chunk that is
missing, moved or not a regular file fails its task as it would fail a local read; a chunk that fails to decode
(a checksum mismatch) is then found and named by reading the failed block here with the checked reader. A cluster
that fails under the run (workers or scheduler lost) is one line (:func:`~foal_pipe.cluster.cluster_failure`).
A worker error that does not happen here is checked against what the workers see at the store's path
(:func:`~foal_pipe.store.seen.check_workers_see`): a store they cannot read, or another store there, is said so, not
called damaged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from foal_pipe.cluster import NoWorkers, WorkerWatch, cluster_errors, cluster_failure, cluster_result, require_distributed
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.memory import BASELINE_BYTES
from foal_pipe.protocol.erasedrows import NO_ERASED, ErasedRows
from foal_pipe.store.chunks import REEXTRACT, BadChunkFile, MissingChunk, check_finite, chunk_error, damage_reason
from foal_pipe.store.seen import check_workers_see, store_identity

if TYPE_CHECKING:
    from distributed import Client

T = TypeVar("T")


#: One block's (or a sum's) statistics per group, then the rows it found erased (:class:`ErasedRows`).
Partial = list[Any]

#: Upper bound on the feature bytes one Gram task reads at once (a block of whole store chunks).
BLOCK_BYTES = 64 * 2**20
#: Aim for at least this many blocks, so the workers share the pass and a lost one costs little.
MIN_BLOCKS = 8
#: What to do about workers that do not see the store as this process does.
SEE_FIX = f"mount it there, or use {param('scheduler', 'local')}"


def block_rows(n_rows: int, dim: int, itemsize: int, chunk_rows: int) -> int:
    """Rows per Gram block: whole store chunks, at most ``BLOCK_BYTES`` of features (one chunk at least), and at
    least ``MIN_BLOCKS`` blocks when the split has as many chunks. A function of the store alone, not of the
    cluster, so the blocks' sums, added in the fixed tree of :func:`tree_sum`, give the same bytes on any number
    of workers."""
    by_bytes = max(1, BLOCK_BYTES // max(1, chunk_rows * dim * itemsize))
    by_count = max(1, math.ceil(n_rows / (chunk_rows * MIN_BLOCKS)))
    return chunk_rows * min(by_bytes, by_count)


def gram_pass_bytes(n_rows: int, dim: int, itemsize: int, chunk_rows: int, partial: int, workers: int, step: int,
                    row_bytes: int) -> tuple[int, int]:
    """What :func:`dask_statistics` holds beyond a local run's state, in bytes: ``(client, cluster)``, ``partial``
    being the statistics of every group (what a block task returns and each addition of the tree makes). The client
    receives the total of every group at once (as frames, then arrays: twice ``partial``). The cluster holds the
    tree's unpaired partials (one per level), and per worker the partial it builds or adds and the one it takes in,
    plus one in transfer; and per worker an interpreter, a block of features and ``step`` rows' activations
    (``row_bytes`` each). On 1 and 2 workers this is 15-30% above the measured peaks."""
    rows = block_rows(n_rows, dim, itemsize, chunk_rows)
    blocks = -(-n_rows // rows)
    busy = min(workers, blocks)
    held = int(math.log2(max(1, blocks))) + 2 * busy + 1
    worker = BASELINE_BYTES + rows * dim * itemsize + min(step, rows) * row_bytes
    return 2 * partial, held * partial + busy * worker


def _either(a: T | None, b: T | None, add: Callable[[T, T], T]) -> T | None:
    return a if b is None else b if a is None else add(a, b)


def tree_sum(parts: Iterable[T | None], add: Callable[[T, T], T]) -> T | None:
    """The sum of ``parts`` in a fixed pairwise tree over their index: the node at level ``l``, index ``k`` is
    ``add(left, right)`` of its two halves of ``parts[k 2^l : (k+1) 2^l]``, whatever the count; a None part (or half)
    adds nothing, exactly. So the order of the additions depends on the index alone. Holds O(log n) partial sums."""
    stack: list[tuple[int, T | None]] = []  # (level, node): a binary counter of complete subtrees
    for part in parts:
        level, node = 0, part
        while stack and stack[-1][0] == level:
            node = _either(stack.pop()[1], node, add)
            level += 1
        stack.append((level, node))
    total: T | None = None
    while stack:  # the incomplete right edge, added right to left as the level-by-level tree adds it
        total = _either(stack.pop()[1], total, add)
    return total


def block_statistics(
    X: np.ndarray, first_row: int, groups: np.ndarray, n_groups: int, labels: np.ndarray, projection: Expansion,
    step: int, store: str | None = None,
) -> Partial:
    """On a worker: the statistics of one block's rows per group (``groups``: each row's group, -1 for none; None
    for a group without rows), each group's rows projected ``step`` at a time and added in order, then the rows the
    activation erased (:class:`ErasedRows`, refused by the client in the walk's blocks, not this block's); rows that
    are not finite refused naming ``store`` (as the user named it)."""
    X = np.asarray(X)
    check_finite(X, "train", first_row, root=None if store is None else Path(store))
    totals: Partial = [None] * n_groups
    erased = NO_ERASED
    projection = getattr(projection, "expansion", projection)  # a SmoothProjection's, as its transform computes
    for g in np.unique(groups[groups >= 0]).tolist():
        mine = np.flatnonzero(groups == g)
        for lo in range(0, mine.size, step):
            keep = mine[lo : lo + step]
            H = projection.transform(X[keep], check=False)
            erased = erased + ErasedRows.of(projection, X[keep], H, first_row + keep)
            part = RidgeStatistics.from_batch(H, labels[keep])
            current = totals[g]
            totals[g] = part if current is None else current + part
    return [*totals, erased]


def add_statistics(a: Partial, b: Partial) -> Partial:
    """The group-wise sum of two partials, as new arrays (inputs held by Dask are never modified), and both's
    erased rows."""
    return [y if x is None else x if y is None else x + y for x, y in zip(a, b)]


def reduce_tree(client: Client, futures: list[Any | None], combine: Callable[[Any, Any], Any],
                advance: Callable[[Any], None], failed: list[Any] | None = None) -> Any:
    """Add ``futures`` (None: nothing there) on the workers in the fixed tree of :func:`tree_sum` over their index,
    every adding task submitted now (ahead of the inputs still queued); ``advance(future)`` for each input as it
    finishes. Returns the total's future, finished. The first task that fails raises its error here at once (an
    input's key appended to ``failed`` first). Only the total is held here: each partial is let go once finished, so
    the workers free it when its sum is taken. ``futures`` is emptied (the caller passes a list of its own)."""
    from distributed import as_completed

    adds: list[Any] = []

    def add(a: Any, b: Any) -> Any:
        adds.append(client.submit(combine, a, b, pure=False, priority=1))
        return adds[-1]

    total = tree_sum(futures, add)
    keys = {f.key for f in futures if f is not None}
    queue = as_completed([*(f for f in futures if f is not None), *adds])
    futures.clear()
    adds = []
    for future in queue:
        if future.status != "finished":
            if failed is not None and future.key in keys:
                failed.append(future.key)
            future.result()  # re-raises the task's exception (or the cancellation of a lost cluster)
        if future.key in keys:
            advance(future)
    return total


def dask_statistics(
    client: Client,
    path: str,
    groups: np.ndarray,
    n_groups: int,
    labels: np.ndarray,
    projection: Any,
    step: int,
    advance: Callable[[int], None] = lambda n: None,
    shown: str | Path | None = None,
    erased: Callable[[ErasedRows], None] | None = None,
) -> list[RidgeStatistics]:
    """The :class:`RidgeStatistics` of each group of train rows (``groups``: every row's group, -1 for none),
    computed on the cluster in one pass over the store.

    ``path`` is the store (visible to every worker), ``labels`` the train labels, ``projection`` a fitted
    :class:`~foal_pipe.core.expansion.Expansion` (or its future, scattered once by the caller), ``step`` the rows projected at
    once; ``advance(n)`` reports rows done; ``erased`` is given the rows the activation erased (:class:`ErasedRows`)
    before the sums are returned. A damaged chunk is named (under ``shown``, the store as the user named it:
    ``path`` is resolved for the workers), a lost cluster is one line.
    """
    require_distributed()
    import dask
    import dask.array as da

    from foal_pipe.store import check_same, open_store

    train = open_store(path).train
    features = train.features
    n_rows, dim = (int(n) for n in features.shape)
    chunk_rows = int(features.chunks[0])
    span_of: dict[Any, tuple[int, int]] = {}
    size_of: dict[Any, int] = {}
    failed: list[Any] = []
    try:
        rows = block_rows(n_rows, dim, features.dtype.itemsize, chunk_rows)
        X = da.from_zarr(features, chunks=(rows, dim))
        stat = dask.delayed(block_statistics, pure=True)
        blocks = []
        for i, block in enumerate(X.to_delayed().ravel()):
            lo, hi = i * rows, min((i + 1) * rows, n_rows)
            count = int(np.count_nonzero(groups[lo:hi] >= 0))
            blocks.append((stat(block, lo, groups[lo:hi], n_groups, labels[lo:hi], projection, step, str(shown or path)),
                           lo, hi, count) if count else None)
        if not any(blocks):
            raise FoalPipeError("no train rows were selected for the Dask statistics; check the task split")
        computed = iter(client.compute([b[0] for b in blocks if b is not None]))
        futures = [None if b is None else next(computed) for b in blocks]
        for future, b in zip(futures, blocks):
            if future is not None and b is not None:
                span_of[future.key], size_of[future.key] = (b[1], b[2]), b[3]
        del computed, blocks
        *totals, found = reduce_tree(client, futures, add_statistics, lambda f: advance(size_of.pop(f.key)),
                                     failed).result()
    except FoalPipeError:
        raise
    except cluster_errors() as exc:
        raise cluster_failure(exc) from None
    except Exception as exc:  # a chunk a worker could not read or decode (zarr raises many types): name it from here
        where = train.root if shown is None else Path(shown)
        check_same(where, train.fingerprint)  # a store replaced under the run is "changed", not damaged
        suspects = failed or [key for key in span_of if key in size_of]  # the failed block, else every unfinished one
        try:
            named = train if shown is None else open_store(shown).train
            for key in suspects:
                named.read(*span_of[key])  # the checked reader raises the error naming the first bad chunk
            check_workers_see(client, path, where, SEE_FIX)  # it reads here: do the workers see this store?
            if isinstance(exc, (MissingChunk, BadChunkFile)):  # a chunk that reads here: name it from the worker's error
                raise chunk_file_error(named, exc) from None
        except FoalPipeError:
            check_same(where, train.fingerprint)  # replaced while the bad chunk was looked for here
            raise
        raise
    expected = np.bincount(groups[groups >= 0], minlength=n_groups)
    got = np.array([0 if t is None else t.n for t in totals])
    if not np.array_equal(got, expected) or any(t is None for t in totals):
        raise FoalPipeError(f"dask returned statistics for {int(got.sum())} of {int(expected.sum())} rows; re-run the command")
    if erased is not None:
        erased(found)
    return cast(list[RidgeStatistics], totals)


def chunk_file_error(split: Any, exc: MissingChunk | BadChunkFile) -> FoalPipeError:
    """A chunk file a worker could not read (its key, ``train/features/c/2/0``), named by split and rows as a local
    read names it (:func:`~foal_pipe.store.chunks.chunk_error`): for a chunk that reads here after all."""
    name, _, coords = str(exc.args[0]).split(":")[0].partition("/c/")
    array = getattr(split, name.rpartition("/")[2], None)
    if not coords or array is None:
        return FoalPipeError(f"{split.root}: chunk {name} is {damage_reason(exc)}; {REEXTRACT}")
    return chunk_error(split.root, name, array, int(coords.split("/")[0]), exc)


def read_chunks(path: str, fusion: str | None, fusion_norm: bool, split: str, identity: str,
                starts: list[int]) -> dict[int, Any]:
    """On a worker: the stored chunks of a split that start at ``starts`` (:meth:`~foal_pipe.store.Split.read_raw`,
    checked as a local read is), the store opened once for them, with the run's ``fusion``; refused where the store
    there is not the one the client opened (``identity``: its :func:`~foal_pipe.store.seen.store_identity`), whose rows
    would pass every check of a store of their own."""
    from foal_pipe.store import open_store

    if store_identity(path) != identity:
        raise FoalPipeError(f"a Dask worker does not see the feature store at {path} as the client does")
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
        self._where = (path, fusion, fusion_norm, name, store_identity(path))
        self._blocks = [starts[i : i + block] for i in range(0, len(starts), block)]
        self._block_of = {lo: b for b, chunk in enumerate(self._blocks) for lo in chunk}
        self._left = [len(chunk) for chunk in self._blocks]
        self._futures: dict[int, Any] = {}
        self._ahead = ahead
        self._lock = threading.Lock()
        self._watch = WorkerWatch(client)  # one clock for every reader thread

    def __getattr__(self, name: str) -> Any:  # labels, dim, features, chunk_rows, n_rows, rows_of: the local split's
        return getattr(self._split, name)

    def read_raw(self, lo: int, hi: int) -> np.ndarray:
        b = self._block_of[lo]
        try:
            with self._lock:
                for k in range(b, min(b + 1 + self._ahead, len(self._blocks))):
                    if k not in self._futures and self._left[k]:
                        self._futures[k] = self._client.submit(read_chunks, *self._where, self._blocks[k], pure=False)
                future = self._futures[b]
            raw = cluster_result(self._client, future, watch=self._watch)[lo]
        except NoWorkers:
            raise
        except (MissingChunk, BadChunkFile, FoalPipeError) as exc:  # raised on a worker by the checked read (a chunk
            # file, a damaged chunk or rows not finite, named there under the store's resolved path)
            from foal_pipe.store import check_same

            step, n = int(self._split.chunk_rows), int(self._split.n_rows)
            for start in self._blocks[b]:  # the worker read the whole block: the local checked read names its bad
                self._split.read_raw(start, min(start + step, n))  # chunk as a local run does
            check_same(self._split.root, self._split.fingerprint)  # a store replaced under the run is not "damaged"
            check_workers_see(self._client, self._where[0], self._split.root, SEE_FIX)  # it reads here: and there?
            if isinstance(exc, FoalPipeError):
                raise
            raise chunk_file_error(self._split, exc) from None
        except cluster_errors() as exc:  # workers or scheduler lost under the run
            raise cluster_failure(exc) from None
        with self._lock:
            self._left[b] -= 1
            if not self._left[b]:
                self._futures.pop(b).release()
        return raw
