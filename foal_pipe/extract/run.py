"""Filling a store: rows encoded and written chunk by chunk (:func:`extract_rows`), under the writer lock and
the run log (:func:`extraction`), every split in one process (:func:`run_extract`).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.loaders import removing_new_folders
from foal_pipe.datasets.sources import PreparedImages
from foal_pipe.durable import raise_swallowed_stop
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.spec import ExtractSpec, Inputs, block_encoder, cached_inputs, load_inputs, now, open_inputs, runtime_info
from foal_pipe.extract.state import (
    StoreState,
    check_store,
    create_store,
    finish_store,
    is_zarr_dir,
    settle_staging,
    staging_path,
)
from foal_pipe.io import enclosing_store
from foal_pipe.store import SPLITS, FeatureWriter, log_run, mark_progress, remove_partial_files, update_run, writer_lock
from foal_pipe.store.log import close_inherited_locks
from foal_pipe.store.meta import read_meta


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
    by SIGKILL leaves the lock free at once, not once torch's watchdog has ended its workers (seconds later)."""
    close_inherited_locks()


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
    (:func:`start_loading`): its workers read the first batches while the weights load."""

    done: dict[str, int]
    batches: Iterator[tuple[Any, Any, Any]]

    def close(self) -> None:
        """Stop the loader's workers (a run that failed before reading every batch)."""
        close = getattr(self.batches, "close", None) or getattr(self.batches, "_shutdown_workers", None)
        if close is not None:
            close()


def start_loading(spec: ExtractSpec, inputs: Inputs, done: dict[str, int]) -> Loading:
    """Start reading every split's rows from ``done`` on: one loader for the whole extraction, in order."""
    images = SplitImages({split: PreparedImages(inputs.data.split(split), inputs.loaded_size,
                                                inputs.encoder.interpolation) for split in SPLITS})
    batches = [[(split, i) for i in rows] for split in SPLITS
               for rows in batch_rows(len(images.images[split]), spec.chunk_rows, done[split],
                                      len(images.images[split]), inputs.batch_size)]
    loading = Loading(dict(done), _load_batches(images, batches, inputs))
    start_device(inputs.device)
    return loading


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


def extract_rows(
    spec: ExtractSpec,
    split: str,
    lo: int,
    hi: int,
    *,
    path: str | Path | None = None,
    inputs: Inputs | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_chunk: Callable[[int], None] | None = None,
    loaded: Iterator[tuple[Any, Any, Any]] | None = None,
) -> None:
    """Encode rows ``[lo, hi)`` of ``split`` and write them into the existing store at ``path`` (default
    ``spec.out_path``).

    ``lo`` and ``hi`` must each be a multiple of the store's chunk size or the split's row count; each
    write covers exactly one chunk. ``on_batch(n)`` is called after each batch, ``on_chunk(hi)`` after each
    chunk is written (with the end row of that chunk). ``loaded``: a loader already started whose next batches
    are these rows' (:func:`start_loading`); by default one is started here. Does not touch the attributes:
    progress and ``complete`` are the caller's (see :func:`run_extract`, :func:`mark_progress`,
    :func:`finish_store`).
    """
    inputs = load_inputs(inputs) if inputs is not None else cached_inputs(spec)
    writer = FeatureWriter(path or spec.out_path, split)
    writer.check_range(lo, hi)
    if lo == hi:
        return
    n, step = writer.n_rows, writer.chunk_rows
    encoder = inputs.encoder
    batches = batch_rows(n, step, lo, hi, inputs.batch_size)
    if loaded is None:
        images = PreparedImages(inputs.data.split(split), inputs.loaded_size, encoder.interpolation)
        loaded = _load_batches(images, batches, inputs)
    filler = _ChunkFiller(spec, split, writer, lo, hi, inputs.precision, encoder, on_batch, on_chunk)
    pending: deque[Callable[[], Any]] = deque()
    for pixels, _labels, errors in itertools.islice(loaded, len(batches)):
        bad = [e for e in errors if e]
        if bad:
            while pending:  # the rows before it are written, as a resumed run expects
                filler.add(pending.popleft()())
            raise FoalPipeError(f"cannot read image {bad[0]}; {fix_images(hashed=inputs.data.hashed)}")
        pending.append(encoder.submit(pixels) if not spec.keep_blocks
                       else block_encoder(encoder).submit_blocks(pixels, spec.blocks_dtype))
        if len(pending) > BATCHES_AHEAD:
            filler.add(pending.popleft()())
    while pending:
        filler.add(pending.popleft()())


def fix_images(n: int = 1, hashed: bool = False) -> str:
    """How to go on from ``n`` images that cannot be read once the store exists: a replaced file keeps the rows,
    a removed one changes them (the store must then be made again). ``hashed``: the store records each split's
    SHA-256 over its images (``DatasetSplits.hashed``), which any fix changes, so that a resume would be refused."""
    it, one = ("them", "readable images") if n > 1 else ("it", "a readable image")
    if hashed:
        return f"fix {it} and re-run with {param('overwrite', True)} (the store records the images' SHA-256, which a fix changes)"
    return (f"replace {it} with {one} and re-run the same command to resume, or remove {it} and re-run with "
            f"{param('overwrite', True)} (the split then has other rows)")


BATCHES_AHEAD = 2
"""Batches an extraction queues on the device before it waits for the oldest one's features: the device computes
them while the host checks, buffers and writes the last ones (on the CPU encoding is done when queued)."""


class _ChunkFiller:
    """Batches' features (and block tokens), in order, into whole chunks of one split: each chunk is written once
    full, ``on_batch(n)`` called after each batch and ``on_chunk(hi)`` after each chunk."""

    def __init__(self, spec: ExtractSpec, split: str, writer: FeatureWriter, lo: int, hi: int, precision: str,
                 encoder: Any, on_batch: Callable[[int], None] | None, on_chunk: Callable[[int], None] | None):
        self.spec, self.split, self.writer, self.hi, self.precision = spec, split, writer, hi, precision
        self.on_batch, self.on_chunk = on_batch, on_chunk
        step = writer.chunk_rows
        self.buffer = np.empty((step, encoder.dim), dtype=spec.dtype)
        self.kept = (np.empty((step, encoder.n_blocks, encoder.dim), dtype=spec.blocks_dtype)
                     if spec.keep_blocks else None)
        self.chunk_lo, self.filled = lo, 0

    def add(self, encoded: Any) -> None:
        """One batch: its features, or ``(features, tokens)`` in a store that keeps block tokens."""
        spec, split, first = self.spec, self.split, self.chunk_lo + self.filled
        with np.errstate(over="ignore"):  # float16's overflow to inf: refused below, by its row
            feats = (encoded if self.kept is None else encoded[0]).astype(spec.dtype)
        if self.kept is not None:
            tokens = encoded[1]
            _check_finite(tokens, f"block tokens at {split}", first, f"precision {self.precision}, "
                          f"{param('blocks_dtype', spec.blocks_dtype)}", self._fix("blocks_dtype", spec.blocks_dtype))
            self.kept[self.filled : self.filled + len(tokens)] = tokens
        _check_finite(feats, f"features at {split}", first, f"precision {self.precision}, dtype {spec.dtype}",
                      self._fix("dtype", spec.dtype))
        self.buffer[self.filled : self.filled + len(feats)] = feats
        self.filled += len(feats)
        if self.on_batch:
            self.on_batch(len(feats))
        chunk_hi = min(self.chunk_lo + self.writer.chunk_rows, self.hi)
        if self.chunk_lo + self.filled == chunk_hi:
            kept = () if self.kept is None else (self.kept[: self.filled],)
            self.writer.write(self.chunk_lo, self.buffer[: self.filled], *kept)
            if self.on_chunk:
                self.on_chunk(chunk_hi)
            self.chunk_lo, self.filled = chunk_hi, 0

    def _fix(self, option: str, dtype: str) -> str:
        """The wider settings not yet in effect, and ``--overwrite``: the store now holds this run's settings, which
        a run with others is refused to mix with."""
        wider = [param(name, value) for name, value, now in (("precision", "fp32", self.precision),
                                                             (option, "float32", dtype)) if now != value]
        if not wider:
            return (f"the model gives them at full precision: check its weights ({param('checkpoint')}) and "
                    f"{param('model_kwargs')}, then re-run with {param('overwrite', True)}")
        return f"re-run with {' or '.join(wider)} and {param('overwrite', True)} (the incomplete store has this run's settings)"


def _check_finite(values: np.ndarray, what: str, first_row: int, how: str, fix: str) -> None:
    """Refuse a batch with a NaN or inf (reduced precision or float16 overflow), naming its first row."""
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if not finite.all():
        raise FoalPipeError(f"non-finite {what} row {first_row + int(np.flatnonzero(~finite)[0])} ({how}); {fix}")


class ExtractProgress:
    """Progress callbacks of :func:`run_extract` (the CLI draws a rich bar with them); all no-ops here."""

    def start(self, split: str, done: int, total: int) -> None:
        pass

    def advance(self, split: str, n: int) -> None:
        pass


@dataclass
class ExtractReport:
    """What an extraction did; ``seconds`` is 0 when the store was already complete."""

    path: Path
    status: str  # "created", "resumed" (a complete replacement swapped in too), or "complete" (nothing to do)
    rows: dict[str, int]
    resumed_from: dict[str, int]
    seconds: float
    encoder: str
    dim: int
    device: str
    precision: str
    holes: dict[str, int] = field(default_factory=dict)
    generation: str | None = None


def check_readable(inputs: Inputs, resuming: bool = False) -> None:
    """Refuse, before anything is written, image files that cannot be read whatever their contents (missing, a
    broken link, empty), and HDF5 images whose values are not pixels; a file that fails to decode still stops the run
    at its row, resumable. ``resuming``: the store exists, so removing a file changes its rows (:func:`fix_images`)."""
    bad = [row for split in SPLITS for row in inputs.data.split(split).unreadable()]
    if bad:
        more, many = (f" and {len(bad) - 1} more", "s") if len(bad) > 1 else ("", "")
        what = "fix the image" if inputs.data.hashed else "remove or replace the file"
        fix = fix_images(len(bad), inputs.data.hashed) if resuming else f"{what}{many}, then re-run the same command"
        raise FoalPipeError(f"cannot read image {bad[0]}{more}; {fix}")


def prepare_store(spec: ExtractSpec, overwrite: bool = False,
                  before_load: Callable[[Inputs, dict[str, int]], None] | None = None) -> tuple[Inputs, StoreState]:
    """The inputs and the store to fill: an existing store checked against ``spec``, or a new one.

    The weights are loaded before a store is created, so when they cannot be had nothing is left behind.
    ``before_load(inputs, done)``, when there is work to do, is called before the weights load with the rows of
    each split already in the store (to start reading the rest meanwhile).
    """
    inputs = open_inputs(spec)
    state = check_store(spec, inputs, overwrite=overwrite)
    if state is None or state.status != "complete":
        check_readable(inputs, resuming=state is not None)
        if before_load is not None:
            before_load(inputs, dict(state.progress) if state is not None else dict.fromkeys(SPLITS, 0))
        load_inputs(inputs)
        state = create_store(spec, inputs, overwrite=overwrite)
    return inputs, state


#: The most bytes that extract's names beside a store add to its name: its log's temporary ``.NAME.log.json.tmp-PID``
#: (a 7-digit PID); ``.NAME.replacing``, ``.NAME.creating``, ``.NAME.old-PID`` and ``NAME.lock`` add fewer.
SIBLING_EXTRA = len("..log.json.tmp-") + 7


def check_name_length(out: Path) -> None:
    """Refuse, before any work, a store name that its sibling names would take past the filesystem's limit: the
    store would be left half-made, and a resumed run fail the same way."""
    where = next(parent for parent in out.absolute().parents if parent.is_dir())
    limit = os.pathconf(where, "PC_NAME_MAX")
    if len(os.fsencode(out.name)) + SIBLING_EXTRA > limit:
        raise FoalPipeError(f"store name {out.name[:40]}... is too long: the names extract keeps beside it add up to "
                            f"{SIBLING_EXTRA} bytes to it, past this filesystem's {limit}; choose a name of at most "
                            f"{limit - SIBLING_EXTRA} bytes")


@contextmanager
def extraction(spec: ExtractSpec, overwrite: bool = False, runtime: dict[str, Any] | None = None,
               before_load: Callable[[Inputs, dict[str, int]], None] | None = None,
               ) -> Iterator[tuple[Inputs, StoreState, ExtractReport]]:
    """Hold the store's writer lock, prepare the store, let the body fill every split, then finish it.

    Yields ``(inputs, state, report)``; the body fills rows into ``state.path`` (nothing to do when
    ``state.status == "complete"``) and records ``progress``. The sidecar log ``<store>.log.json`` gets the
    run's start, end or error, and ``runtime`` (what :func:`runtime_info` does not know, e.g. the scheduler). The
    staging folder of a killed ``--overwrite`` is settled under the lock (:func:`settle_staging`).
    ``before_load``: see :func:`prepare_store`.
    """
    outer = enclosing_store(spec.out_path)
    if outer is not None:
        raise FoalPipeError(f"{param('out')} {spec.out_path} lies in the feature store {outer}, which a store inside "
                            f"would damage (its metadata would no longer match); choose an {param('out')} outside it")
    check_name_length(spec.out_path)
    with removing_new_folders(spec.out_path.parent), writer_lock(spec.out_path):  # a refused run leaves no folder
        for folder in (spec.out_path, staging_path(spec.out_path)):
            if folder.is_dir() and not folder.is_symlink() and is_zarr_dir(folder):  # a link's target is not ours
                remove_partial_files(folder)  # halves of writes a killed writer left: nobody else writes now
        inputs, state = prepare_store(spec, overwrite, before_load)
        staged = state.path if state.status == "complete" and state.path != state.out else None
        settled = settle_staging(state)
        if settled is not None:  # the run goes on without it: a later --overwrite starts afresh
            sys.stderr.write(f"note: removed {settled}, left by an interrupted overwrite of {state.out}\n")
        report = ExtractReport(state.out, "resumed" if staged else state.status, state.rows, dict(state.progress), 0.0,
                               inputs.encoder.name, inputs.encoder.dim, inputs.device, inputs.precision, dict(state.holes))
        if staged is not None:  # this run's --overwrite is done: the replacement it resumed was complete
            sys.stderr.write(f"note: swapped in the complete replacement of {state.out} that an interrupted overwrite "
                             f"left in {staged}\n")
            _log_swap(spec, inputs, state, report, runtime)
        if state.status == "complete":
            yield inputs, state, report
            return
        started = time.perf_counter()
        log_run(state.path, {"started": now(), "status": state.status, "resumed_from": dict(state.progress),
                             "holes": dict(state.holes), **runtime_info(spec, inputs), **(runtime or {})},
                fresh=state.status == "created")
        try:
            yield inputs, state, report
            report.seconds = time.perf_counter() - started
            report.generation = finish_store(state)
        except BaseException as exc:
            _log_stop(state.path, exc)
            raise
        _log_finish(state.out, {"finished": now(), "seconds": round(report.seconds, 3), "generation": report.generation})


def _log_swap(spec: ExtractSpec, inputs: Inputs, state: StoreState, report: ExtractReport,
              runtime: dict[str, Any] | None) -> None:
    """Record in the run log (the replacement's, moved in with it; a new one where it had none) the run that swapped
    in a complete replacement an interrupted ``--overwrite`` left, with the store's generation id."""
    report.generation = read_meta(state.out)[1].generation
    stamp = now()
    log_run(state.out, {"started": stamp, "status": "swapped", "resumed_from": dict(state.progress),
                        **runtime_info(spec, inputs), **(runtime or {}), "finished": stamp, "seconds": 0.0,
                        "generation": report.generation})


def _log_finish(out: Path, fields: dict[str, Any]) -> None:
    """Record the finished run in the store's log. The store is sealed: a stop that a finaliser swallowed while it was
    sealed cannot undo that, and is raised once the finish is recorded (the command then says the store is complete)."""
    try:
        raise_swallowed_stop()
    finally:
        update_run(out, fields)


def _log_stop(path: Path, exc: BaseException) -> None:
    """Record in the run log why a run stopped; never hides the error itself."""
    reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
    try:
        update_run(path, {"stopped": now(), "error": reason})
    except (OSError, FoalPipeError):
        pass


def run_extract(spec: ExtractSpec, overwrite: bool = False, progress: ExtractProgress | None = None) -> ExtractReport:
    """Create (or resume) the store for ``spec``, fill every split in order, then mark it complete.

    One loader reads every split, started before the weights load: its workers read the first batches while the
    checkpoint is read, hashed and moved to the device, and start once rather than once per split."""
    progress = progress or ExtractProgress()
    started: list[Loading] = []
    try:
        with extraction(spec, overwrite, before_load=lambda inputs, done: started.append(
                start_loading(spec, inputs, done))) as (inputs, state, report):
            if state.status == "complete":
                return report
            if not started or started[0].done != state.progress:  # the store's rows are not those planned
                for loading in started:
                    loading.close()
                started[:] = [start_loading(spec, inputs, state.progress)]
            for split in SPLITS:
                done, n = state.progress[split], state.rows[split]
                progress.start(split, done, n)

                def on_batch(k: int, s: str = split) -> None:
                    progress.advance(s, k)

                def on_chunk(hi: int, s: str = split) -> None:
                    mark_progress(state.path, s, hi)

                extract_rows(spec, split, done, n, path=state.path, inputs=inputs, loaded=started[0].batches,
                             on_batch=on_batch, on_chunk=on_chunk)
    finally:
        for loading in started:
            loading.close()
    return report
