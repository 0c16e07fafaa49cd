"""``--scheduler dask`` for ``extract``: one store written by many Dask workers.

The client starts (or reaches) the cluster first, so a bad address or worker count leaves no store behind; then it
holds the store's writer lock and creates the store (:func:`foal_pipe.extract.extraction`), then
every chunk-aligned row range is a task (:func:`extract_range`) that encodes its rows and writes them
straight into the store; the model is loaded once per worker process. A range that raises is resubmitted
(``RETRIES`` times); one whose worker dies is rerun elsewhere by the scheduler. Each chunk is computed from
the same batches wherever it runs, so the store equals a single-process extraction. Only the client writes
attributes: ``progress`` (the contiguous prefix of finished ranges, the same bookkeeping as the
single-process resume) and, last, ``complete`` (through :mod:`foal_pipe.store`).

Workers read the store themselves, so its path must be visible to every worker (a shared filesystem, or an
object store mounted on every node); a range that fails where they do not see it is said so in one line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING

from foal_pipe.cluster import cluster_errors, dask_client, is_local, n_workers, require_distributed
from foal_pipe.encoders.runtime import resolve_device
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.run import ExtractProgress, ExtractReport, check_unchanged, extract_rows, extraction
from foal_pipe.extract.spec import ExtractSpec
from foal_pipe.store import SPLITS, mark_progress, update_run
from foal_pipe.store.meta import store_group
from foal_pipe.store.seen import check_workers_see

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed import Future

#: Times a range that raised is resubmitted before the error stops the extraction.
RETRIES = 3
#: Extraction ranges: aim for this many per worker, each of at most ``MAX_RANGE_CHUNKS`` store chunks
#: (small ranges keep the progress bar moving and make a lost worker cheap; a task costs milliseconds).
RANGES_PER_WORKER = 8
MAX_RANGE_CHUNKS = 4


def extract_range(spec: ExtractSpec, split: str, lo: int, hi: int, pin_gpu: bool = False) -> int:
    """Task body, on a worker: encode rows ``[lo, hi)`` of ``split`` into the store; returns the row count.

    ``pin_gpu`` (LocalClusters that foal-pipe starts) gives worker ``k`` the GPU ``k mod n_gpus``; on
    clusters that pin GPUs themselves (dask-cuda) every worker's device 0 is its own.
    """
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

    ``workers`` (``address="local"`` only; refused with another address, whose cluster has its own): worker
    processes of the LocalCluster; default one per CUDA GPU when the device is CUDA, else one per CPU core.
    ``range_chunks``: store chunks per task (default: about ``RANGES_PER_WORKER`` tasks per worker, at most
    ``MAX_RANGE_CHUNKS`` chunks each). The cluster is started (or reached) before the store is touched, so a bad
    ``workers`` or ``address`` leaves nothing behind.
    """
    require_distributed()
    import zarr
    from distributed import KilledWorker, as_completed

    local = is_local(address)
    if not local and workers is not None:
        raise FoalPipeError(f"{param('workers')} acts only with {param('dask_address', 'local')}: the cluster at "
                            f"{address} has its own workers; drop {param('workers')}")
    if local and workers is None:
        gpus = _cuda_count() if resolve_device(spec.device) == "cuda" else 0
        workers = gpus or os.cpu_count() or 1
    progress = progress or ExtractProgress()
    with dask_client(address, 1 if workers is None else workers) as client, extraction(
            spec, overwrite, runtime={"scheduler": "dask", "dask_address": address}) as (inputs, state, report):
        if state.status == "complete":
            return report
        path = state.path.resolve()
        # What every worker runs: the client's resolved device and precision (they are part of the store's
        # provenance), images loaded in the worker process itself, nothing downloaded twice; on an external cluster,
        # whose workers have working directories of their own, the client's paths made absolute.
        task_spec = dataclasses.replace(spec, out=str(path), device=inputs.device, precision=inputs.precision,
                                        batch_size=inputs.batch_size, workers=0, download=False)
        if not local:
            task_spec = dataclasses.replace(task_spec, data_dir=_absolute(spec.data_dir),
                                            checkpoint=_absolute(spec.checkpoint),
                                            split_manifest=_absolute(spec.split_manifest))
        try:
            n = n_workers(client)
            update_run(path, {"dask_workers": n})
            group = store_group(path)
            chunk_rows: dict[str, int] = {}
            for s in SPLITS:
                features = group[f"{s}/features"]
                assert isinstance(features, zarr.Array)  # the skeleton's array
                chunk_rows[s] = int(features.chunks[0])
            todo = {s: state.rows[s] - state.progress[s] for s in SPLITS}
            if range_chunks is None:
                total_chunks = sum(math.ceil(todo[s] / chunk_rows[s]) for s in SPLITS)
                range_chunks = min(MAX_RANGE_CHUNKS, max(1, math.ceil(total_chunks / (RANGES_PER_WORKER * n))))
            pending: dict[Key, tuple[str, int, int]] = {}
            futures: list[Future[int]] = []
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
                if future.status != "finished":
                    exc = future.exception() if future.status == "error" else None
                    if isinstance(exc, KilledWorker):
                        raise FoalPipeError(
                            f"Dask workers died {RETRIES} times while extracting {s} rows [{lo}, {hi}) (out of "
                            f"memory?); {state.out} is resumable: re-run the same command"
                        ) from None
                    check_workers_see(client, path, state.out, f"mount it there and re-run the same command ({state.out} "
                                      f"is resumable), or use {param('scheduler', 'local')}")
                    future.result()  # re-raises the task's own error (a FoalPipeError stays one line)
                progress.advance(s, hi - lo)
                done[s][lo] = hi
                while prefix[s] in done[s]:
                    prefix[s] = done[s].pop(prefix[s])
                if prefix[s] != state.progress[s]:
                    check_unchanged(inputs)
                    mark_progress(path, s, prefix[s])
                    state.progress[s] = prefix[s]
        except cluster_errors() as exc:  # workers or scheduler lost under the run
            raise FoalPipeError(f"the Dask cluster failed during the extraction ({type(exc).__name__}); {state.out} "
                                "is resumable: check the workers and re-run the same command") from None
    return report


def _absolute(path: str | None) -> str | None:
    """``path`` as the client sees it, so every worker reads the file the client checked."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def _cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 0
