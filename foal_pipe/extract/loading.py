"""Reading an extraction's images in batches: the chunk-aligned row ranges and batches, one map-style dataset over
every split (:class:`SplitImages`) and its started loader (:class:`Loading`), torch's DataLoader or, for a NumPy
encoder, reader processes that die with the extraction, and the CUDA context started on a thread. Its own module
because it is what runs in the worker processes: :mod:`foal_pipe.extract.run` plans and writes the store with it.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from foal_pipe.datasets.sources import PreparedImages
from foal_pipe.extract.spec import Inputs
from foal_pipe.store.log import close_inherited_locks


def chunk_ranges(n_rows: int, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """The chunk-aligned ``(lo, hi)`` row ranges covering ``[start, stop)``; ``start`` must be aligned."""
    stop = n_rows if stop is None else stop
    for lo in range(start, stop, chunk_rows):
        yield lo, min(lo + chunk_rows, stop)


def _load_batches(images: Any, batches: list[list[Any]], inputs: Inputs) -> Iterator[tuple[Any, Any, Any]]:
    """``(pixels, labels, errors)`` per batch: a torch DataLoader (worker processes, pinned memory) for an encoder
    that computes with torch, its workers started by this call, not at the first batch; for a NumPy one
    (``--model pixels``), the same batches read without torch."""
    if not inputs.encoder.needs_torch:
        return _numpy_batches(images, batches, inputs.workers)
    import torch

    return iter(torch.utils.data.DataLoader(
        images, batch_sampler=batches, num_workers=inputs.workers, pin_memory=inputs.device == "cuda",
        prefetch_factor=4 if inputs.workers else None, persistent_workers=False, worker_init_fn=_loader_worker,
    ))


def _loader_worker(worker_id: int) -> None:
    """A DataLoader worker, forked under the store's writer lock: its copy of the lock is closed, so a writer killed
    by SIGKILL leaves the lock free at once, not once torch's watchdog has ended its workers (seconds later). A
    batch handed over as the run stops finds the main process gone: multiprocessing's sharer thread would print that
    connection's error as a traceback under the run's one ``Interrupted:`` line, so the worker keeps it quiet."""
    close_inherited_locks()
    sys.excepthook = _quiet_disconnects


def _quiet_disconnects(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
    if not issubclass(kind, ConnectionError | EOFError):
        sys.__excepthook__(kind, value, traceback)


def batch_rows(n_rows: int, chunk_rows: int, lo: int, hi: int, batch_size: int) -> list[list[int]]:
    """The rows of each batch encoding ``[lo, hi)``: batches never cross a chunk, so each chunk is written whole."""
    return [list(range(b, min(b + batch_size, c_hi)))
            for c_lo, c_hi in chunk_ranges(n_rows, chunk_rows, lo, hi) for b in range(c_lo, c_hi, batch_size)]


class SplitImages:
    """Every split's images as one map-style dataset, row ``(split, i)``: one loader (its workers started once)
    reads every split of an extraction in order."""

    def __init__(self, images: dict[str, PreparedImages]):
        self.images = images

    def __len__(self) -> int:
        return sum(len(images) for images in self.images.values())

    def __getitem__(self, key: tuple[str, int]) -> tuple[np.ndarray, int, str]:
        split, i = key
        return self.images[split][i]


@dataclass
class Loading:
    """The batches of a whole extraction (every split from ``done`` to its end), their loader already started
    (:func:`~foal_pipe.extract.run.start_loading`): its workers read the first batches while the weights load."""

    done: dict[str, int]
    batches: Iterator[tuple[Any, Any, Any]]

    def close(self) -> None:
        """Stop the loader's workers (a run that failed before reading every batch)."""
        close = getattr(self.batches, "close", None) or getattr(self.batches, "_shutdown_workers", None)
        if close is not None:
            close()


def start_device(device: str) -> threading.Thread | None:
    """On CUDA, create the device's context on a thread (it takes seconds on a bare machine) while the main thread
    reads the weights; called after the loader's workers were forked, so no process is forked while it runs.
    torch's lazy initialisation holds a lock: moving the weights to the device waits for it, or does it."""
    if device != "cuda":
        return None
    import torch

    def init() -> None:
        try:
            torch.cuda.init()
        except Exception:  # (the main thread's first use of the device raises it again, as one line)
            pass

    thread = threading.Thread(target=init, name="foal-pipe-cuda-init", daemon=True)
    thread.start()
    return thread


_POOL_IMAGES: PreparedImages | None = None
"""The images a :func:`_numpy_batches` worker process reads (set once per worker: a source may be large)."""


def _pool_worker(images: PreparedImages, parent: int) -> None:
    """A reader process: it dies with the extraction. Forked, it would otherwise outlive a parent killed by
    SIGKILL (or the OOM killer) blocked on its pipe, holding the store's inherited lock so that no resume could
    start, and ignoring SIGTERM through the parent's handler."""
    global _POOL_IMAGES
    close_inherited_locks()  # as a DataLoader's worker does (_loader_worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to report, once
    for stop in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(stop) is not signal.SIG_IGN:
            signal.signal(stop, signal.SIG_DFL)
    _die_with(parent)
    _POOL_IMAGES = images


def _die_with(parent: int) -> None:
    """Ask Linux to kill this process when its parent ends (``PR_SET_PDEATHSIG``), and end now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(0)


def _read_batch(rows: list[int], images: PreparedImages | None = None) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    source = images if images is not None else _POOL_IMAGES
    items = [source[i] for i in rows]  # type: ignore[index]
    return np.stack([it[0] for it in items]), np.array([it[1] for it in items]), [it[2] for it in items]


def _numpy_batches(images: PreparedImages, batches: list[list[int]],
                   workers: int) -> Iterator[tuple[np.ndarray, np.ndarray, list[Any]]]:
    """The batches in order, read by ``workers`` processes (at most 4 batches ahead each), or in this process
    with ``workers=0``."""
    if workers == 0 or len(batches) < 2:
        for rows in batches:
            yield _read_batch(rows, images)
        return
    from concurrent.futures import ProcessPoolExecutor

    todo = iter(batches)
    pool = ProcessPoolExecutor(min(workers, len(batches)), initializer=_pool_worker, initargs=(images, os.getpid()))
    try:
        ahead = deque(pool.submit(_read_batch, rows) for rows in itertools.islice(todo, 4 * workers))
        while ahead:
            batch = ahead.popleft().result()
            ahead.extend(pool.submit(_read_batch, rows) for rows in itertools.islice(todo, 1))
            yield batch
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
