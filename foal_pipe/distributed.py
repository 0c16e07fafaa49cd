"""``--scheduler dask``: foal-pipe's data-parallel stages on a Dask cluster.

Dask (``pip install 'foal-pipe[dist]'``) does the scheduling, data movement and fault tolerance;
this module only says what each task computes:

* **Gram statistics** (``learn``/``sweep --engine gram``): :func:`dask_statistics` sums the
  :class:`~foal_pipe.statistics.RidgeStatistics` of the selected train rows (one task's, as ``learn``
  walks the stream). The features are read with :func:`dask.array.from_zarr` in blocks aligned to the
  store's chunks; each block task projects its selected rows and returns their statistics; partials are
  added pairwise on the workers as they finish (preferably two held by the same worker, so little
  moves), and only the total comes back. The sums are the same as the single-process pass (to rounding,
  ~1e-13), so the weights and metrics are too. The per-batch RLS path is sequential and stays local.
  This module takes a store path, arrays, a projection and statistics: it knows nothing of ``learn``.
* **Extraction** (``extract``): the client holds the store's writer lock and creates the store
  (:func:`foal_pipe.extract.extraction`), then every chunk-aligned row range is a task (:func:`extract_range`)
  that encodes its rows and writes them straight into the store; the model is loaded once per worker process. A range that raises is
  resubmitted (``RETRIES`` times); one whose worker dies is rerun elsewhere by the scheduler. Each chunk is
  computed from the same batches wherever it runs, so the store equals a single-process extraction.
  Only the client writes attributes: ``progress`` (the contiguous prefix of finished ranges, the same
  bookkeeping as the single-process resume) and, last, ``complete`` (through :mod:`foal_pipe.store`).

Workers read the store themselves, so its path must be visible to every worker (a shared
filesystem, or an object store mounted on every node).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.projection import SmoothProjection
from foal_pipe.statistics import RidgeStatistics
from foal_pipe.store import check_finite

if TYPE_CHECKING:
    from distributed import Client

    from foal_pipe.extract import ExtractProgress, ExtractReport, ExtractSpec

#: Upper bound on the feature bytes one Gram task reads at once (a block of whole store chunks).
BLOCK_BYTES = 64 * 2**20
#: Aim for at least this many blocks per worker, so a slow or lost worker costs little.
BLOCKS_PER_WORKER = 4
#: Seconds to wait for a remote cluster to have at least one worker.
WORKER_TIMEOUT = 60
#: Times a range that raised is resubmitted before the error stops the extraction.
RETRIES = 3
#: Extraction ranges: aim for this many per worker, each of at most ``MAX_RANGE_CHUNKS`` store chunks
#: (small ranges keep the progress bar moving and make a lost worker cheap; a task costs milliseconds).
RANGES_PER_WORKER = 8
MAX_RANGE_CHUNKS = 4


def require_distributed() -> ModuleType:
    """The ``distributed`` package, or a one-line error naming the extra to install."""
    try:
        import dask.array  # noqa: F401
        import distributed
    except ImportError:
        raise FoalPipeError(
            "--scheduler dask needs dask.distributed, which is not installed; "
            "install it with `pip install 'foal-pipe[dist]'` or use --scheduler local"
        ) from None
    return distributed


@contextmanager
def dask_client(address: str | None = "local", workers: int = 2) -> Iterator[Client]:
    """A connected client: ``local`` starts a LocalCluster of ``workers`` processes (closed on exit),
    anything else is a scheduler address such as ``tcp://host:8786`` (left running on exit)."""
    distributed = require_distributed()
    if address in (None, "", "local"):
        if workers < 1:
            raise FoalPipeError(f"--workers must be at least 1, got {workers}")
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        )
        client = distributed.Client(cluster)
    else:
        cluster = None
        try:
            client = distributed.Client(address, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise FoalPipeError(
                f"cannot connect to the Dask scheduler at {address!r} ({type(exc).__name__}); start one with "
                "`dask scheduler` and pass its tcp://host:port, or use --dask-address local"
            ) from None
        try:
            client.wait_for_workers(1, timeout=WORKER_TIMEOUT)
        except (TimeoutError, OSError):
            client.close()
            raise FoalPipeError(
                f"the Dask scheduler at {address} has no workers after {WORKER_TIMEOUT} s; start some with "
                f"`dask worker {address}`"
            ) from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def n_workers(client: Client) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))


# ----------------------------------------------------------------------------------------------
# Gram statistics


def block_rows(n_rows: int, dim: int, itemsize: int, chunk_rows: int, workers: int) -> int:
    """Rows per Gram block: whole store chunks, at most ``BLOCK_BYTES`` of features, and at least
    ``BLOCKS_PER_WORKER`` blocks per worker when the split is large enough."""
    by_bytes = max(1, BLOCK_BYTES // max(1, chunk_rows * dim * itemsize))
    by_balance = max(1, math.ceil(n_rows / (chunk_rows * workers * BLOCKS_PER_WORKER)))
    return chunk_rows * min(by_bytes, by_balance)


def block_statistics(
    X: np.ndarray, first_row: int, selected: np.ndarray, labels: np.ndarray, projection: SmoothProjection, step: int
) -> RidgeStatistics | None:
    """The statistics of one block's selected rows (None if it has none), projected ``step`` rows at a time."""
    X = np.asarray(X)
    check_finite(X, "train", first_row)
    total = None
    for lo in range(0, X.shape[0], step):
        keep = lo + np.flatnonzero(selected[lo : lo + step])
        if keep.size:
            part = RidgeStatistics.from_batch(projection.transform(X[keep]), labels[keep])
            total = part if total is None else total + part
    return total


def add_statistics(a: RidgeStatistics | None, b: RidgeStatistics | None) -> RidgeStatistics | None:
    """The sum of two partials, as new arrays (inputs held by Dask are never modified)."""
    return b if a is None else a if b is None else a + b


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
    selected: np.ndarray,
    labels: np.ndarray,
    projection: Any,
    step: int,
    advance: Callable[[int], None] = lambda n: None,
) -> RidgeStatistics:
    """The :class:`RidgeStatistics` of the train rows where ``selected`` is true, computed on the cluster.

    ``path`` is the store (visible to every worker), ``labels`` the train labels, ``projection`` a fitted
    :class:`SmoothProjection` (or its future, scattered once by the caller), ``step`` the rows projected at
    once; ``advance(n)`` reports rows done.
    """
    require_distributed()
    import dask
    import dask.array as da

    features = da.from_zarr(path, component="train/features")
    n_rows, dim = (int(n) for n in features.shape)
    chunk_rows = int(features.chunksize[0])
    rows = block_rows(n_rows, dim, features.dtype.itemsize, chunk_rows, n_workers(client))
    X = da.from_zarr(path, component="train/features", chunks=(rows, dim))
    stat = dask.delayed(block_statistics, pure=True)
    blocks, sizes = [], []
    for i, block in enumerate(X.to_delayed().ravel()):
        lo, hi = i * rows, min((i + 1) * rows, n_rows)
        count = int(np.count_nonzero(selected[lo:hi]))
        if count:
            blocks.append(stat(block, lo, selected[lo:hi], labels[lo:hi], projection, step))
            sizes.append(count)
    if not blocks:
        raise FoalPipeError("no train rows were selected for the Dask statistics; check the task split")
    futures = client.compute(blocks)
    size_of = {f.key: n for f, n in zip(futures, sizes)}
    total = reduce_as_completed(client, futures, add_statistics, lambda f: advance(size_of[f.key])).result()
    expected = int(np.count_nonzero(selected))
    if total is None or total.n != expected:
        raise FoalPipeError(f"dask returned statistics for {0 if total is None else total.n} of {expected} rows; re-run the command")
    return total


# ----------------------------------------------------------------------------------------------
# Extraction


def extract_range(spec: ExtractSpec, split: str, lo: int, hi: int, pin_gpu: bool = False) -> int:
    """Task body, on a worker: encode rows ``[lo, hi)`` of ``split`` into the store; returns the row count.

    ``pin_gpu`` (LocalClusters that foal-pipe starts) gives worker ``k`` the GPU ``k mod n_gpus``; on
    clusters that pin GPUs themselves (dask-cuda) every worker's device 0 is its own.
    """
    from foal_pipe.extract import extract_rows

    if pin_gpu:
        import torch
        from distributed import get_worker

        name = get_worker().name
        if isinstance(name, int) and torch.cuda.device_count() > 1:
            torch.cuda.set_device(name % torch.cuda.device_count())
    extract_rows(spec, split, lo, hi)
    return hi - lo


def extract_ranges(n_rows: int, chunk_rows: int, start: int, range_chunks: int) -> list[tuple[int, int]]:
    """Chunk-aligned ``(lo, hi)`` ranges of ``range_chunks`` chunks covering ``[start, n_rows)``."""
    step = chunk_rows * range_chunks
    return [(lo, min(lo + step, n_rows)) for lo in range(start, n_rows, step)]


def dask_extract(
    spec: ExtractSpec,
    address: str | None = "local",
    workers: int | None = None,
    overwrite: bool = False,
    progress: ExtractProgress | None = None,
    range_chunks: int | None = None,
) -> ExtractReport:
    """:func:`foal_pipe.extract.run_extract` on a Dask cluster: the same store, written by many workers.

    ``workers`` (``address="local"`` only): worker processes of the LocalCluster; default one per CUDA
    GPU when the device is CUDA, else one per CPU core. ``range_chunks``: store chunks per task (default:
    about ``RANGES_PER_WORKER`` tasks per worker, at most ``MAX_RANGE_CHUNKS`` chunks each).
    """
    require_distributed()
    import zarr
    from distributed import KilledWorker, as_completed

    from foal_pipe import extract as ex
    from foal_pipe.store import SPLITS, mark_progress, update_run

    progress = progress or ex.ExtractProgress()
    with ex.extraction(spec, overwrite, runtime={"scheduler": "dask", "dask_address": address}) as (
            inputs, state, report):
        if state.status == "complete":
            return report
        path = state.path.resolve()
        # What every worker runs: the client's resolved device and precision (they are part of the store's
        # provenance), images loaded in the worker process itself, nothing downloaded twice.
        task_spec = dataclasses.replace(spec, out=str(path), device=inputs.device, precision=inputs.precision,
                                        batch_size=inputs.batch_size, workers=0, download=False)
        local = address in (None, "", "local")
        if workers is None:
            gpus = _cuda_count() if inputs.device == "cuda" else 0
            workers = gpus or os.cpu_count() or 1
        with dask_client(address, workers) as client:
            n = n_workers(client)
            update_run(path, {"dask_workers": n})
            group = zarr.open_group(str(path), mode="r")
            chunk_rows = {s: int(group[f"{s}/features"].chunks[0]) for s in SPLITS}
            todo = {s: state.rows[s] - state.progress[s] for s in SPLITS}
            if range_chunks is None:
                total_chunks = sum(math.ceil(todo[s] / chunk_rows[s]) for s in SPLITS)
                range_chunks = min(MAX_RANGE_CHUNKS, max(1, math.ceil(total_chunks / (RANGES_PER_WORKER * n))))
            pending: dict[str, tuple[str, int, int]] = {}
            futures = []
            for s in SPLITS:
                progress.start(s, state.progress[s], state.rows[s])
                for lo, hi in extract_ranges(state.rows[s], chunk_rows[s], state.progress[s], range_chunks):
                    future = client.submit(
                        extract_range, task_spec, s, lo, hi, local and inputs.device == "cuda",
                        key=f"foal-extract-{s}-{lo}-{hi}-{os.getpid()}-{time.time_ns()}",
                        retries=RETRIES, priority=-len(futures), pure=False,
                    )
                    pending[future.key] = (s, lo, hi)
                    futures.append(future)
            done: dict[str, dict[int, int]] = {s: {} for s in SPLITS}
            prefix = dict(state.progress)
            queue = as_completed(futures)
            del futures  # finished ranges are released at once, so a lost worker's results are not recomputed
            for future in queue:
                s, lo, hi = pending.pop(future.key)
                if future.status == "error":
                    exc = future.exception()
                    if isinstance(exc, KilledWorker):
                        raise FoalPipeError(
                            f"Dask workers died {RETRIES} times while extracting {s} rows [{lo}, {hi}) (out of "
                            f"memory?); {state.out} is resumable: re-run the same command"
                        ) from None
                    future.result()  # re-raises the task's own error (a FoalPipeError stays one line)
                progress.advance(s, hi - lo)
                done[s][lo] = hi
                while prefix[s] in done[s]:
                    prefix[s] = done[s].pop(prefix[s])
                if prefix[s] != state.progress[s]:
                    mark_progress(path, s, prefix[s])
                    state.progress[s] = prefix[s]
    return report


def _cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 0
