"""``--scheduler dask``: foal-pipe's data-parallel stages on a Dask cluster.

Dask (``pip install 'foal-pipe[dist]'``) does the scheduling, data movement and fault tolerance;
this module only says what each task computes:

* **Gram statistics** (``learn``/``sweep --engine gram``): the train features are read with
  :func:`dask.array.from_zarr` in blocks aligned to the store's chunks. Each block task fuses
  projection and sigmoid and returns its partial sums ``G_t = H_t^T H_t`` (one per task ``t``) and
  ``Q = H^T Y``; the partials are added pairwise on the workers as they finish, and only the total
  comes back. The sums are the same as the single-process pass (to rounding, ~1e-13), so the
  classifiers, weights and metrics are too. The per-batch RLS path is sequential and stays local.

Workers read the store themselves, so its path must be visible to every worker (a shared
filesystem, or an object store mounted on every node).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from foal_pipe.classifier import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.progress import progress_bar
from foal_pipe.projection import SmoothProjection

if TYPE_CHECKING:
    from distributed import Client

    from foal_pipe.learn import Prepared

#: Upper bound on the feature bytes one Gram task reads at once (a block of whole store chunks).
BLOCK_BYTES = 64 * 2**20
#: Aim for at least this many blocks per worker, so a slow or lost worker costs little.
BLOCKS_PER_WORKER = 4
#: Seconds to wait for a remote cluster to have at least one worker.
WORKER_TIMEOUT = 60


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
def dask_client(address: str | None = "local", workers: int = 2, log: Callable[[str], None] | None = None) -> Iterator[Client]:
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
        if log is not None:
            n = len(client.scheduler_info().get("workers", {}))
            log(f"dask: {n} workers at {client.scheduler.address}")
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
    X: np.ndarray,
    first_row: int,
    tasks: np.ndarray,
    labels: np.ndarray,
    projection: SmoothProjection,
    n_classes: int,
    step: int,
) -> dict[str, Any]:
    """Partial sums of one block, in the same arithmetic as the single-process pass.

    Rows are projected ``step`` (the store's chunk size) at a time, as ``learn.task_statistics`` does.
    Returns ``{"G": {task: H_t^T H_t}, "Q": H^T Y (D, n_classes), "rows": len(X)}`` where ``Y`` is
    one-hot over all classes (each class belongs to one task, so ``Q`` serves every task).
    """
    X = np.asarray(X)
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        raise FoalPipeError(
            f"train/features has NaN or inf values (first bad row: {first_row + int(np.flatnonzero(~finite)[0])}); "
            "re-extract the store (try `--dtype float32` if it was float16)"
        )
    dtype = projection.components_.dtype
    D = projection.components_.shape[1]
    G: dict[int, np.ndarray] = {}
    Q = np.zeros((D, n_classes), dtype=dtype)
    for lo in range(0, X.shape[0], step):
        keep = np.flatnonzero(tasks[lo : lo + step] >= 0)
        if keep.size == 0:
            continue
        H = projection.transform(X[lo + keep])
        y, t_rows = labels[lo + keep], tasks[lo + keep]
        Y = np.zeros((keep.size, n_classes), dtype=dtype)
        Y[np.arange(keep.size), y] = 1.0
        Q += H.T @ Y
        for t in np.unique(t_rows):
            Ht = H[np.flatnonzero(t_rows == t)]
            if int(t) in G:
                G[int(t)] += Ht.T @ Ht
            else:
                G[int(t)] = Ht.T @ Ht
    return {"G": G, "Q": Q, "rows": int(X.shape[0])}


def add_statistics(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The sum of two partials (new arrays: inputs held by Dask are never modified)."""
    G = {t: a["G"][t] + b["G"][t] if t in b["G"] else a["G"][t].copy() for t in a["G"]}
    G.update({t: g.copy() for t, g in b["G"].items() if t not in a["G"]})
    return {"G": G, "Q": a["Q"] + b["Q"], "rows": a["rows"] + b["rows"]}


def reduce_as_completed(
    client: Client, futures: list[Any], combine: Callable[[Any, Any], Any], advance: Callable[[Any], None]
) -> Any:
    """Combine futures pairwise on the workers as they finish; ``advance(future)`` for each input.

    Returns the future of the total. A task that failed raises its error here at once.
    """
    from distributed import as_completed

    inputs = {f.key for f in futures}
    waiting = None
    queue = as_completed(futures)
    for future in queue:
        if future.status == "error":
            future.result()  # re-raises the task's exception
        if future.key in inputs:
            advance(future)
        if waiting is None:
            waiting = future
        else:
            queue.add(client.submit(combine, waiting, future, pure=False))
            waiting = None
    return waiting


def dask_task_statistics(p: Prepared) -> list[AnalyticClassifier]:
    """The distributed twin of :func:`foal_pipe.learn.task_statistics`: same classifiers, to 1e-9."""
    require_distributed()
    import dask
    import dask.array as da

    cfg, train = p.config, p.store.train
    if cfg.engine != "gram":
        raise FoalPipeError("--engine rls is sequential and runs in one process; use --engine gram with --scheduler dask")
    row_task = p.stream.row_tasks(train.n_rows)
    n_classes = len(p.store.classes)
    projection = SmoothProjection.from_matrix(p.projection.components_, cfg.dtype)
    path = str(Path(p.store.path).resolve())
    with dask_client(cfg.dask_address, cfg.workers) as client:
        step = train.chunk_rows
        rows = block_rows(train.n_rows, train.dim, train.features.dtype.itemsize, step, n_workers(client))
        X = da.from_zarr(path, component="train/features", chunks=(rows, train.dim))
        proj = client.scatter(projection, broadcast=True)
        stat = dask.delayed(block_statistics, pure=True)
        blocks = []
        for i, block in enumerate(X.to_delayed().ravel()):
            lo, hi = i * rows, min((i + 1) * rows, train.n_rows)
            blocks.append(stat(block, lo, row_task[lo:hi], train.labels[lo:hi], proj, n_classes, step))
        futures = client.compute(blocks)
        sizes = {f.key: min(rows, train.n_rows - i * rows) for i, f in enumerate(futures)}
        label = f"train (gram, dask x{n_workers(client)})"
        with progress_bar(label, train.n_rows) as advance:
            total = reduce_as_completed(client, futures, add_statistics, lambda f: advance(sizes[f.key])).result()
    if total["rows"] != train.n_rows:
        raise FoalPipeError(f"dask returned statistics for {total['rows']} of {train.n_rows} rows; re-run the command")
    D = cfg.projection_dim
    out = []
    for t, task_rows in enumerate(p.stream.rows):
        classes = np.unique(train.labels[task_rows])
        G = total["G"].get(t, np.zeros((D, D), dtype=projection.components_.dtype))
        out.append(
            AnalyticClassifier.from_statistics(
                G, total["Q"][:, classes], classes, task_rows.size, cfg.gamma, cfg.dtype, cfg.backend
            )
        )
    return out
