"""Resumable, chunk-aligned feature extraction into a feature store (docs/feature-store.md).

Every write of the store format is :mod:`foal_pipe.store`'s; this module decides what to write. The work is
split in three steps so that a distributed driver can reuse the middle one:

1. :func:`create_store` makes the store skeleton -- attributes, labels, row indices and empty feature arrays
   chunked along rows -- in a hidden sibling folder and renames it into place, so a crash never leaves a
   half-made store. An existing store is resumed if it was made with the same settings (chunk files missing
   below its progress are extracted again), refused otherwise. ``overwrite=True`` builds the replacement
   beside it and swaps it in when complete, so a reader of the old store is never served a half-written one.
2. :func:`extract_rows` encodes rows ``[lo, hi)`` of one split and writes them chunk by chunk, each write
   exactly one chunk. Batches never straddle a chunk boundary, so any chunk is computed from the same
   batches whether the run was interrupted or not, and a resumed store is identical to an uninterrupted one.
   It is callable from any process that can see the store (a DataLoader/Dask worker): it needs only the
   :class:`ExtractSpec` (the dataset and the encoder are opened once per process and cached).
3. :func:`finish_store` sets ``complete`` and the ``generation`` id last, once every split's ``progress``
   reaches its row count and every chunk file is there.

:func:`extraction` wraps them with the store's writer lock and the sidecar run log; :func:`run_extract`
fills every split in one process, recording ``progress`` (rows written, a multiple of the chunk size) after
every chunk; a re-run continues after the last chunk recorded. Torch is imported inside functions only.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.blockfusion import NORMS, FinalNorm
from foal_pipe.datasets import DatasetSplits, PreparedImages, open_dataset
from foal_pipe.encoders import (
    PAPER_MODEL,
    RESIZE_ON,
    Encoder,
    EncoderConfig,
    build_encoder,
    resolve_device,
    resolve_precision,
    resolve_resize_on,
    torch_version,
)
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import (
    BLOCK_DTYPES,
    FORMAT,
    FORMAT_VERSION,
    ROW_ARRAYS,
    SPLITS,
    BlockLayout,
    FeatureWriter,
    StoreMeta,
    complete_store,
    create_skeleton,
    log_run,
    mark_progress,
    remove_partial_files,
    reopen_at,
    replace_store,
    update_run,
    verify_store,
    writer_lock,
)

DTYPES = ("float32", "float16")
DEFAULT_CHUNK_ROWS = 1024
DEFAULT_OUT = "data/features/{dataset}.zarr"


@dataclass(frozen=True)
class ExtractSpec:
    """Everything that defines one extraction (the CLI options of ``foal-pipe extract``).

    ``batch_size=None``: 256 on CUDA, 32 on CPU. ``workers=None``: half the CPU cores, at most 8.
    ``out=None``: ``data/features/<dataset>.zarr``. ``model_kwargs`` (``--model-kwargs``) go to
    ``timm.create_model``; ``pretrained=False`` (Python API only) gives seeded random weights, for benchmarks.
    ``resize_on`` (``--resize-on``): where images are resized, see :func:`resolve_resize_on`; it never changes
    the features, so it is not among the store's settings.
    ``keep_blocks`` (``--keep-blocks``) also stores every block's token in ``blocks_dtype``, so other fusions
    can be computed at read time (:mod:`foal_pipe.blockfusion`).
    """

    dataset: str = "digits"
    out: str | None = None
    data_dir: str | None = None
    download: bool = False
    model: str = PAPER_MODEL
    checkpoint: str | None = None
    fusion: str = "mean-cls"
    token: str = "cls"
    image_size: int | None = None
    normalize: bool = True
    dtype: str = "float32"
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    batch_size: int | None = None
    workers: int | None = None
    device: str = "auto"
    precision: str = "auto"
    pretrained: bool = True
    model_kwargs: tuple[tuple[str, Any], ...] = ()
    resize_on: str = "auto"
    keep_blocks: bool = False
    blocks_dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise FoalPipeError(f"unknown --dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
        if self.resize_on not in RESIZE_ON:
            raise FoalPipeError(f"unknown --resize-on {self.resize_on!r}; choose one of: {', '.join(RESIZE_ON)}")
        if self.blocks_dtype not in BLOCK_DTYPES:
            raise FoalPipeError(f"unknown --blocks-dtype {self.blocks_dtype!r}; choose one of: "
                                f"{', '.join(BLOCK_DTYPES)}")
        for option, value in (("--chunk-rows", self.chunk_rows), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise FoalPipeError(f"{option} must be at least 1, got {value}")
        if self.workers is not None and self.workers < 0:
            raise FoalPipeError(f"--workers must be 0 (load in the main process) or more, got {self.workers}")

    @property
    def out_path(self) -> Path:
        return Path(self.out or DEFAULT_OUT.format(dataset=self.dataset)).expanduser()

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(self.model, self.fusion, self.token, self.image_size, self.normalize,
                             self.checkpoint, self.pretrained, self.model_kwargs)


@dataclass
class Inputs:
    """An opened dataset and a described encoder, with the device, precision and resize place resolved."""

    data: DatasetSplits
    encoder: Encoder
    device: str
    precision: str
    batch_size: int
    workers: int
    resize_on: str = "workers"
    loaded: bool = False

    @property
    def loaded_size(self) -> int:
        """Side of the images the loader ships: the native size when the device resizes them."""
        return self.data.native_size if self.resize_on == "device" else self.encoder.image_size


def open_inputs(spec: ExtractSpec) -> Inputs:
    """Open the dataset and describe the encoder; weights are not loaded yet (see :func:`load_inputs`)."""
    data = open_dataset(spec.dataset, spec.data_dir, spec.download)
    encoder = build_encoder(spec.encoder_config(), data.native_size)
    if spec.keep_blocks:
        _check_keeps_blocks(encoder)
    # a NumPy encoder computes on the host: `auto` is the CPU for it (asking torch about CUDA would import torch)
    device = "cpu" if spec.device == "auto" and not encoder.needs_torch else resolve_device(spec.device)
    precision = resolve_precision(spec.precision, device) if encoder.name != "pixels" else "fp32"
    encoder.device, encoder.precision = device, precision
    batch = spec.batch_size or (256 if device == "cuda" else 32)
    workers = spec.workers if spec.workers is not None else min(8, max(1, (os.cpu_count() or 2) // 2))
    resize_on = resolve_resize_on(spec.resize_on, data.native_size, encoder.image_size, encoder.interpolation, device)
    return Inputs(data, encoder, device, precision, batch, workers, resize_on)


def _check_keeps_blocks(encoder: Encoder) -> None:
    """``--keep-blocks`` needs transformer blocks and a final norm the reader can recompute."""
    if not getattr(encoder, "n_blocks", 0):
        raise FoalPipeError(f"--model {encoder.name} has no transformer blocks, so --keep-blocks does not apply; drop "
                            "--keep-blocks or choose a timm ViT --model")
    if getattr(encoder, "norm_kind", None) is None:
        raise FoalPipeError(f"--keep-blocks: the final norm of {encoder.name} is not one foal-pipe can recompute "
                            f"({', '.join(NORMS)}); drop --keep-blocks and extract one store per --fusion")


def load_inputs(inputs: Inputs) -> Inputs:
    """Load the encoder's weights onto the device (once)."""
    if not inputs.loaded:
        inputs.encoder.load(inputs.device, inputs.precision)
        inputs.loaded = True
    return inputs


@functools.lru_cache(maxsize=2)
def _cached_inputs(spec: ExtractSpec) -> Inputs:
    return load_inputs(open_inputs(spec))


# ---------------------------------------------------------------------------------------------------------
# Store creation and checks
# ---------------------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def store_settings(spec: ExtractSpec, inputs: Inputs) -> dict[str, Any]:
    """What must match for a store to be resumed: the data, the encoder and the layout (not the device,
    batch size or workers, and not where the checkpoint file lies, only its hash)."""
    return _jsonable({
        "dataset": spec.dataset,
        "rows": {split: len(inputs.data.split(split)) for split in SPLITS},
        "classes": inputs.data.classes,
        "encoder": stored_encoder(inputs),
        "dtype": spec.dtype,
        "chunk_rows": spec.chunk_rows,
        "keep_blocks": spec.keep_blocks,
        "blocks_dtype": spec.blocks_dtype if spec.keep_blocks else None,
    })


def stored_encoder(inputs: Inputs) -> dict[str, Any]:
    """The encoder's provenance as the store records it: the checkpoint's hash and size, not its path (the path
    goes to the run log), so the same weights give the same store wherever they lie."""
    encoder = dict(inputs.encoder.provenance())
    encoder["weights"] = {k: v for k, v in encoder.get("weights", {}).items() if k != "path"}
    return encoder


def runtime_info(spec: ExtractSpec, inputs: Inputs) -> dict[str, Any]:
    """What the run log records about this run (never the store: it varies from run to run)."""
    import foal_pipe

    return {"host": socket.gethostname(), "pid": os.getpid(), "device": inputs.device,
            "batch_size": inputs.batch_size, "workers": inputs.workers, "resize_on": inputs.resize_on,
            "checkpoint": spec.checkpoint,
            "torch_version": torch_version() if "torch" in sys.modules else None,  # None: not used
            "foal_pipe_version": foal_pipe.__version__}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            show = (lambda v: f"{len(v)} entries" if isinstance(v, list) and len(v) > 4 else repr(v))
            out.append(f"{prefix}{key}: {show(a)} -> {show(b)}")
    return out


@dataclass
class StoreState:
    """Where a store stands: ``status`` is ``created``, ``resumed`` or ``complete``.

    ``path`` is where rows are written: ``out`` itself, or -- when ``--overwrite`` replaces an existing store --
    a staging sibling ``.<name>.replacing`` that is swapped in when complete, so readers of the old store are
    never served a half-written one. ``holes``: the first row of each split where a missing chunk file was
    found below the recorded progress (those rows are extracted again).
    """

    path: Path
    status: str
    progress: dict[str, int]
    rows: dict[str, int]
    out: Path
    holes: dict[str, int] = field(default_factory=dict)


def _is_zarr_dir(path: Path) -> bool:
    return (path / "zarr.json").is_file() or (path / ".zgroup").is_file()


def staging_path(out: Path) -> Path:
    """Where ``--overwrite`` builds the replacement of the store at ``out``."""
    return out.parent / f".{out.name}.replacing"


def _build_skeleton(where: Path, spec: ExtractSpec, inputs: Inputs, settings: dict[str, Any]) -> None:
    meta = StoreMeta(classes=tuple(inputs.data.classes), dataset=spec.dataset, encoder=stored_encoder(inputs),
                     extra={"extract": settings, "source": inputs.data.location})
    labels = {split: inputs.data.split(split).labels for split in SPLITS}
    index = {split: inputs.data.split(split).index for split in SPLITS}
    create_skeleton(where, meta, inputs.encoder.dim, spec.dtype, spec.chunk_rows, labels, index,
                    block_layout(spec, inputs))


def block_layout(spec: ExtractSpec, inputs: Inputs) -> BlockLayout | None:
    """What the store keeps of the blocks with ``--keep-blocks`` (the final norm read from the loaded weights)."""
    if not spec.keep_blocks:
        return None
    norm = load_inputs(inputs).encoder.norm_parameters()
    return BlockLayout(inputs.encoder.n_blocks, spec.blocks_dtype,
                       FinalNorm(norm.pop("kind"), norm.pop("eps"), **norm))


def create_store(spec: ExtractSpec, inputs: Inputs | None = None, overwrite: bool = False) -> StoreState:
    """Create the store for ``spec`` (or find it resumable / complete); never mixes settings.

    A store replaced with ``overwrite`` is rebuilt in :func:`staging_path` (resumed there if an earlier
    ``--overwrite`` run with the same settings was interrupted); :func:`finish_store` swaps it in. The caller
    holds the store's writer lock (:func:`foal_pipe.store.writer_lock`) when other writers may run.
    """
    inputs = inputs or open_inputs(spec)
    state = check_store(spec, inputs, overwrite)
    if state is not None:
        if state.holes:
            reopen_at(state.path, state.progress)
        return state
    out = spec.out_path
    settings = store_settings(spec, inputs)
    target = staging_path(out) if out.is_dir() and any(out.iterdir()) else out
    _build_skeleton(target, spec, inputs, settings)
    return StoreState(target, "created", {split: 0 for split in SPLITS}, dict(settings["rows"]), out)


def check_store(spec: ExtractSpec, inputs: Inputs, overwrite: bool = False) -> StoreState | None:
    """The state of the store at ``spec.out_path`` without writing anything: ``None`` when it is to be
    created (missing, an empty folder, or replaced because of ``overwrite``); a :class:`FoalPipeError` when
    it may not be touched (not a store written by ``extract``, or other settings without ``overwrite``)."""
    out = spec.out_path
    if not out.exists():
        return None
    if not out.is_dir() or (any(out.iterdir()) and not _is_zarr_dir(out)):
        raise FoalPipeError(f"{out} exists and is not a feature store; refusing to replace it: choose another "
                            "--out or remove it")
    if not any(out.iterdir()):
        return None
    settings = store_settings(spec, inputs)
    if not overwrite:
        return _existing_state(out, out, settings)
    staged = staging_path(out)
    if staged.is_dir():  # an interrupted --overwrite: resume it when it has these settings
        try:
            return _existing_state(staged, out, settings)
        except FoalPipeError:
            return None
    return None


def _existing_state(path: Path, out: Path, settings: dict[str, Any]) -> StoreState:
    """The state of the store at ``path`` (``out`` or its staging copy), which must have been made by
    ``extract`` in this format with the same settings; holes below its progress move the progress back."""
    try:
        group = zarr.open_group(str(path), mode="r")
        attrs = dict(group.attrs)
    except Exception:  # unreadable metadata: not ours to resume
        attrs, group = {}, None
    if attrs.get("format") != FORMAT or not isinstance(attrs.get("extract"), dict):
        raise FoalPipeError(f"{out} is a Zarr store but not one written by `foal-pipe extract`; pass --overwrite "
                            "to replace it or choose another --out")
    if attrs.get("format_version") != FORMAT_VERSION or type(attrs.get("format_version")) is not int:
        raise FoalPipeError(f"{out} was written in store format {attrs.get('format_version')!r}, this foal-pipe "
                            f"writes format {FORMAT_VERSION}; pass --overwrite to extract it again")
    diffs = _differences(attrs["extract"], settings)
    if diffs:
        raise FoalPipeError(f"{out} was extracted with different settings ({'; '.join(diffs[:4])}); re-run with "
                            "the original options to resume it, or pass --overwrite to replace it")
    rows = dict(settings["rows"])
    recorded = attrs.get("progress")
    progress = {}
    damaged = f"{out} is damaged (%s); pass --overwrite to extract it again"
    for split in SPLITS:
        try:
            features = group[f"{split}/features"]
        except KeyError:
            raise FoalPipeError(damaged % f"no {split}/features array") from None
        done = recorded.get(split) if isinstance(recorded, dict) else None
        step = int(features.chunks[0])
        if features.shape[0] != rows[split] or type(done) is not int or not 0 <= done <= rows[split] or (
                done % step and done != rows[split]):
            raise FoalPipeError(damaged % f"{split}/features {features.shape} with progress {done!r}")
        progress[split] = done
    lost = verify_store(path, read=False).problems  # chunk files missing (features, blocks: below the progress)
    skeleton = [problem for problem in lost if problem.array.partition("/")[2] not in ROW_ARRAYS]
    if skeleton:  # labels or row indices: only a new skeleton can bring them back
        raise FoalPipeError(damaged % f"{skeleton[0]}")
    holes: dict[str, int] = {}
    for problem in lost:  # the first hole of each split (features or blocks) is where its extraction resumes
        split = problem.array.split("/")[0]
        holes[split] = min(holes.get(split, problem.lo), problem.lo)
        progress[split] = holes[split]
    status = "complete" if attrs.get("complete") is True and not holes else "resumed"
    return StoreState(path, status, progress, rows, out, holes)


# ---------------------------------------------------------------------------------------------------------
# Filling: rows [lo, hi) of one split, chunk by chunk
# ---------------------------------------------------------------------------------------------------------
def chunk_ranges(n_rows: int, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """The chunk-aligned ``(lo, hi)`` row ranges covering ``[start, stop)``; ``start`` must be aligned."""
    stop = n_rows if stop is None else stop
    for lo in range(start, stop, chunk_rows):
        yield lo, min(lo + chunk_rows, stop)


def _load_batches(images: PreparedImages, batches: list[list[int]], inputs: Inputs) -> Iterator[tuple[Any, Any, Any]]:
    """``(pixels, labels, errors)`` per batch: a torch DataLoader (worker processes, pinned memory) for an encoder
    that computes with torch; for a NumPy one (``--model pixels``), the same batches read without torch."""
    if not inputs.encoder.needs_torch:
        yield from _numpy_batches(images, batches, inputs.workers)
        return
    import torch

    yield from torch.utils.data.DataLoader(
        images, batch_sampler=batches, num_workers=inputs.workers, pin_memory=inputs.device == "cuda",
        prefetch_factor=4 if inputs.workers else None, persistent_workers=False,
    )


_POOL_IMAGES: PreparedImages | None = None
"""The images a :func:`_numpy_batches` worker process reads (set once per worker: a source may be large)."""


def _pool_worker(images: PreparedImages) -> None:
    global _POOL_IMAGES
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to report, once
    _POOL_IMAGES = images


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
    pool = ProcessPoolExecutor(min(workers, len(batches)), initializer=_pool_worker, initargs=(images,))
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
) -> None:
    """Encode rows ``[lo, hi)`` of ``split`` and write them into the existing store at ``path`` (default
    ``spec.out_path``).

    ``lo`` and ``hi`` must each be a multiple of the store's chunk size or the split's row count; each
    write covers exactly one chunk. ``on_batch(n)`` is called after each batch, ``on_chunk(hi)`` after each
    chunk is written (with the end row of that chunk). Does not touch the attributes: progress and
    ``complete`` are the caller's (see :func:`run_extract`, :func:`mark_progress`, :func:`finish_store`).
    """
    inputs = load_inputs(inputs) if inputs is not None else _cached_inputs(spec)
    writer = FeatureWriter(path or spec.out_path, split)
    writer.check_range(lo, hi)
    if lo == hi:
        return
    n, step = writer.n_rows, writer.chunk_rows
    encoder, source = inputs.encoder, inputs.data.split(split)
    images = PreparedImages(source, inputs.loaded_size, encoder.interpolation)
    batches = [list(range(b, min(b + inputs.batch_size, c_hi)))
               for c_lo, c_hi in chunk_ranges(n, step, lo, hi) for b in range(c_lo, c_hi, inputs.batch_size)]
    buffer = np.empty((step, encoder.dim), dtype=spec.dtype)
    kept = np.empty((step, encoder.n_blocks, encoder.dim), dtype=spec.blocks_dtype) if spec.keep_blocks else None
    chunk_lo, filled = lo, 0
    for pixels, _labels, errors in _load_batches(images, batches, inputs):
        bad = [e for e in errors if e]
        if bad:
            raise FoalPipeError(f"cannot read image {bad[0]}; remove or replace the file, then re-run the same "
                                "command to resume")
        if kept is None:
            feats = encoder.encode(pixels).astype(spec.dtype)
        else:
            feats, tokens = encoder.encode_blocks(pixels, spec.blocks_dtype)
            feats = feats.astype(spec.dtype)
            _check_finite(tokens, f"block tokens at {split}", chunk_lo + filled, f"precision {inputs.precision}, "
                          f"--blocks-dtype {spec.blocks_dtype}", "use --precision fp32 or --blocks-dtype float32")
            kept[filled : filled + len(tokens)] = tokens
        _check_finite(feats, f"features at {split}", chunk_lo + filled, f"precision {inputs.precision}, dtype "
                      f"{spec.dtype}", "use --precision fp32 or --dtype float32")
        buffer[filled : filled + len(feats)] = feats
        filled += len(feats)
        if on_batch:
            on_batch(len(feats))
        chunk_hi = min(chunk_lo + step, hi)
        if chunk_lo + filled == chunk_hi:
            writer.write(chunk_lo, buffer[:filled], *(() if kept is None else (kept[:filled],)))
            if on_chunk:
                on_chunk(chunk_hi)
            chunk_lo, filled = chunk_hi, 0


def _check_finite(values: np.ndarray, what: str, first_row: int, how: str, fix: str) -> None:
    """Refuse a batch with a NaN or inf (reduced precision or float16 overflow), naming its first row."""
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if not finite.all():
        raise FoalPipeError(f"non-finite {what} row {first_row + int(np.flatnonzero(~finite)[0])} ({how}); {fix}")


def finish_store(state: StoreState) -> str:
    """Mark the store complete (last, once every split's progress reaches its row count and every chunk file
    is there) and, for a replacement built aside, swap it in; returns the store's generation id."""
    generation = complete_store(state.path)
    if state.path != state.out:
        replace_store(state.path, state.out)
        state.path = state.out
    return generation


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
    status: str  # "created", "resumed", or "complete" (nothing to do)
    rows: dict[str, int]
    resumed_from: dict[str, int]
    seconds: float
    encoder: str
    dim: int
    device: str
    precision: str
    holes: dict[str, int] = field(default_factory=dict)
    generation: str | None = None


def prepare_store(spec: ExtractSpec, overwrite: bool = False) -> tuple[Inputs, StoreState]:
    """The inputs and the store to fill: an existing store checked against ``spec``, or a new one.

    The weights are loaded before a store is created, so when they cannot be had nothing is left behind.
    """
    inputs = open_inputs(spec)
    state = check_store(spec, inputs, overwrite=overwrite)
    if state is None or state.status != "complete":
        load_inputs(inputs)
        state = create_store(spec, inputs, overwrite=overwrite)
    return inputs, state


@contextmanager
def extraction(spec: ExtractSpec, overwrite: bool = False,
               runtime: dict[str, Any] | None = None) -> Iterator[tuple[Inputs, StoreState, ExtractReport]]:
    """Hold the store's writer lock, prepare the store, let the body fill every split, then finish it.

    Yields ``(inputs, state, report)``; the body fills rows into ``state.path`` (nothing to do when
    ``state.status == "complete"``) and records ``progress``. The sidecar log ``<store>.log.json`` gets the
    run's start, end or error, and ``runtime`` (what :func:`runtime_info` does not know, e.g. the scheduler).
    """
    with writer_lock(spec.out_path):
        for folder in (spec.out_path, staging_path(spec.out_path)):
            if folder.is_dir() and _is_zarr_dir(folder):
                remove_partial_files(folder)  # halves of writes a killed writer left: nobody else writes now
        inputs, state = prepare_store(spec, overwrite)
        report = ExtractReport(state.out, state.status, state.rows, dict(state.progress), 0.0, inputs.encoder.name,
                               inputs.encoder.dim, inputs.device, inputs.precision, dict(state.holes))
        if state.status == "complete":
            yield inputs, state, report
            return
        started = time.perf_counter()
        log_run(state.path, {"started": _now(), "status": state.status, "resumed_from": dict(state.progress),
                             "holes": dict(state.holes), **runtime_info(spec, inputs), **(runtime or {})},
                fresh=state.status == "created")
        try:
            yield inputs, state, report
            report.seconds = time.perf_counter() - started
            report.generation = finish_store(state)
        except BaseException as exc:
            _log_stop(state.path, exc)
            raise
        update_run(state.out, {"finished": _now(), "seconds": round(report.seconds, 3),
                               "generation": report.generation})


def _log_stop(path: Path, exc: BaseException) -> None:
    """Record in the run log why a run stopped; never hides the error itself."""
    reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
    try:
        update_run(path, {"stopped": _now(), "error": reason})
    except (OSError, FoalPipeError):
        pass


def run_extract(spec: ExtractSpec, overwrite: bool = False, progress: ExtractProgress | None = None) -> ExtractReport:
    """Create (or resume) the store for ``spec``, fill every split in order, then mark it complete."""
    progress = progress or ExtractProgress()
    with extraction(spec, overwrite) as (inputs, state, report):
        if state.status == "complete":
            return report
        for split in SPLITS:
            done, n = state.progress[split], state.rows[split]
            progress.start(split, done, n)
            extract_rows(spec, split, done, n, path=state.path, inputs=inputs,
                         on_batch=lambda k, s=split: progress.advance(s, k),
                         on_chunk=lambda hi, s=split: mark_progress(state.path, s, hi))
    return report
