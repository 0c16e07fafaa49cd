"""Filling a store: rows encoded and written chunk by chunk (:func:`extract_rows`), under the writer lock and
the run log (:func:`extraction`), every split in one process (:func:`run_extract`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foal_pipe.datasets.loaders import removing_new_folders
from foal_pipe.datasets.sources import WHOLE, PreparedImages
from foal_pipe.durable import raise_swallowed_stop
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.chunkfiller import _ChunkFiller
from foal_pipe.extract.loading import Loading, SplitImages, _load_batches, batch_rows, start_device
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
from foal_pipe.io.outpaths import enclosing_store
from foal_pipe.store import SPLITS, FeatureWriter, log_run, mark_progress, remove_partial_files, update_run, writer_lock
from foal_pipe.store.integrity import optimized_problem
from foal_pipe.store.meta import read_meta


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
    writer = FeatureWriter(path or spec.out_path, split)
    writer.check_range(lo, hi)
    if lo == hi:
        return
    inputs = load_inputs(inputs) if inputs is not None else cached_inputs(spec, split, writer.labels)
    n, step = writer.n_rows, writer.chunk_rows
    encoder = inputs.encoder
    batches = batch_rows(n, step, lo, hi, inputs.batch_size)
    with contextlib.ExitStack() as opened:
        if loaded is None:  # from a copy of the source, whose open files this call closes (its inputs outlive it)
            source = opened.enter_context(contextlib.closing(copy.copy(inputs.data.split(split))))
            loaded = _load_batches(PreparedImages(source, inputs.loaded_size, encoder.interpolation), batches, inputs)
        filler = _ChunkFiller(spec, split, writer, lo, hi, inputs.precision, encoder, on_batch, on_chunk)
        pending: deque[Callable[[], Any]] = deque()
        for pixels, _labels, errors in itertools.islice(loaded, len(batches)):
            bad = [e for e in errors if e]
            if bad:
                while pending:  # the rows before it are written, as a resumed run expects
                    filler.add(pending.popleft()())
                if bad[0].startswith(WHOLE):
                    raise FoalPipeError(bad[0][len(WHOLE):])
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


def check_unchanged(inputs: Inputs) -> None:
    """Refuse to record rows read from data that changed under the run (:meth:`ImageSource.changed`): the store
    holds the rows of the data it records the SHA-256 of, or none of another's."""
    for split in SPLITS:
        why = inputs.data.split(split).changed()
        if why is not None:
            raise FoalPipeError(why)


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


@contextlib.contextmanager
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
    optimized = optimized_problem()  # under -O zarr would fail only at the end, the store left incomplete
    if optimized is not None:
        raise FoalPipeError(optimized)
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
                    check_unchanged(inputs)
                    mark_progress(state.path, s, hi)

                extract_rows(spec, split, done, n, path=state.path, inputs=inputs, loaded=started[0].batches,
                             on_batch=on_batch, on_chunk=on_chunk)
    finally:
        for loading in started:
            loading.close()
    return report
