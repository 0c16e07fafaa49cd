"""Resumable, chunk-aligned feature extraction into a feature store (docs/feature-store.md).

The work is split in three steps so that a distributed driver can reuse the middle one:

1. :func:`create_store` makes the store skeleton -- attributes, labels, row indices and empty feature arrays
   chunked along rows -- in a hidden sibling folder and renames it into place, so a crash never leaves a
   half-made store. An existing store is resumed if it was made with the same settings, refused otherwise
   (``overwrite=True`` replaces it).
2. :func:`extract_rows` encodes rows ``[lo, hi)`` of one split and writes them chunk by chunk, each write
   exactly one chunk. Batches never straddle a chunk boundary, so any chunk is computed from the same
   batches whether the run was interrupted or not, and a resumed store is identical to an uninterrupted one.
   It is callable from any process that can see the store (a DataLoader/Dask worker): it needs only the
   :class:`ExtractSpec` (the dataset and the encoder are opened once per process and cached).
3. :func:`finish_store` sets ``complete`` last, once every split's ``progress`` reaches its row count.

:func:`run_extract` chains them for one process, recording ``progress`` (rows written, a multiple of the
chunk size) in the group attributes after every chunk; a re-run continues after the last chunk recorded.
Torch is imported inside functions only.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.datasets import DatasetSplits, PreparedImages, open_dataset
from foal_pipe.encoders import (
    PAPER_MODEL,
    Encoder,
    EncoderConfig,
    build_encoder,
    resolve_device,
    resolve_precision,
    torch_version,
)
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import FORMAT, SPLITS, StoreMeta

DTYPES = ("float32", "float16")
DEFAULT_CHUNK_ROWS = 1024
DEFAULT_OUT = "data/features/{dataset}.zarr"
TIMING_KEYS = ("created", "finished", "seconds", "runtime")
"""Attributes that describe a run rather than the data: they may differ between a resumed and an
uninterrupted extraction of the same store."""


@dataclass(frozen=True)
class ExtractSpec:
    """Everything that defines one extraction (the CLI options of ``foal-pipe extract``).

    ``batch_size=None``: 256 on CUDA, 32 on CPU. ``workers=None``: half the CPU cores, at most 8.
    ``out=None``: ``data/features/<dataset>.zarr``. ``model_kwargs`` (``--model-kwargs``) go to
    ``timm.create_model``; ``pretrained=False`` (Python API only) gives seeded random weights, for benchmarks.
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

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise FoalPipeError(f"unknown --dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
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
    """An opened dataset and a described encoder, with the device and precision resolved."""

    data: DatasetSplits
    encoder: Encoder
    device: str
    precision: str
    batch_size: int
    workers: int
    loaded: bool = False


def open_inputs(spec: ExtractSpec) -> Inputs:
    """Open the dataset and describe the encoder; weights are not loaded yet (see :func:`load_inputs`)."""
    data = open_dataset(spec.dataset, spec.data_dir, spec.download)
    encoder = build_encoder(spec.encoder_config(), data.native_size)
    device = resolve_device(spec.device)
    precision = resolve_precision(spec.precision, device) if encoder.name != "pixels" else "fp32"
    encoder.device, encoder.precision = device, precision
    batch = spec.batch_size or (256 if device == "cuda" else 32)
    workers = spec.workers if spec.workers is not None else min(8, max(1, (os.cpu_count() or 2) // 2))
    return Inputs(data, encoder, device, precision, batch, workers)


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
    encoder = dict(inputs.encoder.provenance())
    weights = {k: v for k, v in encoder.get("weights", {}).items() if k != "path"}
    encoder["weights"] = weights
    return _jsonable({
        "dataset": spec.dataset,
        "rows": {split: len(inputs.data.split(split)) for split in SPLITS},
        "classes": inputs.data.classes,
        "encoder": encoder,
        "dtype": spec.dtype,
        "chunk_rows": spec.chunk_rows,
    })


def runtime_info(inputs: Inputs) -> dict[str, Any]:
    import foal_pipe

    return {"device": inputs.device, "batch_size": inputs.batch_size, "workers": inputs.workers,
            "torch_version": torch_version(), "foal_pipe_version": foal_pipe.__version__}


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
    """Where a store stands: ``status`` is ``created``, ``resumed`` or ``complete``."""

    path: Path
    status: str
    progress: dict[str, int]
    rows: dict[str, int]


def _is_zarr_dir(path: Path) -> bool:
    return (path / "zarr.json").is_file() or (path / ".zgroup").is_file()


def create_feature_array(group: zarr.Group, split: str, rows: int, dim: int, chunk_rows: int, dtype: str) -> zarr.Array:
    """``<split>/features``: ``(rows, dim)`` chunked along rows only, unwritten chunks read as 0."""
    return group.create_array(f"{split}/features", shape=(rows, dim), chunks=(min(chunk_rows, rows), dim),
                              dtype=dtype, fill_value=0)


def _build_skeleton(where: Path, spec: ExtractSpec, inputs: Inputs, settings: dict[str, Any]) -> None:
    enc = inputs.encoder
    meta = StoreMeta(classes=tuple(inputs.data.classes), dataset=spec.dataset, encoder=enc.provenance(),
                     complete=False)
    group = zarr.open_group(str(where), mode="w")
    for split in SPLITS:
        source = inputs.data.split(split)
        n = len(source)
        create_feature_array(group, split, n, enc.dim, spec.chunk_rows, spec.dtype)
        one = (max(1, min(n, 1 << 20)),)
        group.create_array(f"{split}/labels", shape=(n,), chunks=one, dtype="int64")[:] = source.labels
        group.create_array(f"{split}/index", shape=(n,), chunks=one, dtype="int64")[:] = source.index
    attrs = meta.to_dict()
    attrs.update({
        "extract": settings,
        "source": inputs.data.location,
        "progress": {split: 0 for split in SPLITS},
        "created": _now(),
        "runtime": runtime_info(inputs),
    })
    group.attrs.update(attrs)  # one write: the skeleton is usable from here on


def create_store(spec: ExtractSpec, inputs: Inputs | None = None, overwrite: bool = False) -> StoreState:
    """Create the store for ``spec`` (or find it resumable / complete); never mixes settings.

    The skeleton is built in ``.<name>.creating`` beside ``out`` and renamed into place, so an interrupted
    creation leaves nothing at ``out``.
    """
    inputs = inputs or open_inputs(spec)
    state = check_store(spec, inputs, overwrite)
    if state is not None:
        return state
    out = spec.out_path
    settings = store_settings(spec, inputs)
    tmp = out.parent / f".{out.name}.creating"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a creation that was interrupted
    out.parent.mkdir(parents=True, exist_ok=True)
    _build_skeleton(tmp, spec, inputs, settings)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return StoreState(out, "created", {split: 0 for split in SPLITS}, dict(settings["rows"]))


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
    return _existing_state(out, settings, dict(settings["rows"]), overwrite)


def _existing_state(out: Path, settings: dict[str, Any], rows: dict[str, int], overwrite: bool) -> StoreState | None:
    """The state of an existing store with the same settings; ``None`` if it is to be replaced."""
    try:
        group = zarr.open_group(str(out), mode="r")
        attrs = dict(group.attrs)
    except Exception:  # unreadable metadata: not ours to resume
        attrs, group = {}, None
    if attrs.get("format") != FORMAT or "extract" not in attrs:
        if overwrite:
            return None
        raise FoalPipeError(f"{out} is a Zarr store but not one written by `foal-pipe extract`; pass --overwrite "
                            "to replace it or choose another --out")
    diffs = _differences(attrs["extract"], settings)
    if diffs:
        if overwrite:
            return None
        raise FoalPipeError(f"{out} was extracted with different settings ({'; '.join(diffs[:4])}); re-run with "
                            "the original options to resume it, or pass --overwrite to replace it")
    if overwrite:
        return None
    for split in SPLITS:
        try:
            shape = group[f"{split}/features"].shape
        except KeyError:
            shape = None
        if shape is None or shape[0] != rows[split]:
            raise FoalPipeError(f"{out} lacks a complete {split}/features array (damaged store); pass --overwrite "
                                "to extract it again")
    progress = {split: int(attrs.get("progress", {}).get(split, 0)) for split in SPLITS}
    status = "complete" if attrs.get("complete") is True else "resumed"
    return StoreState(out, status, progress, rows)


# ---------------------------------------------------------------------------------------------------------
# Filling: rows [lo, hi) of one split, chunk by chunk
# ---------------------------------------------------------------------------------------------------------
def chunk_ranges(n_rows: int, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """The chunk-aligned ``(lo, hi)`` row ranges covering ``[start, stop)``; ``start`` must be aligned."""
    stop = n_rows if stop is None else stop
    for lo in range(start, stop, chunk_rows):
        yield lo, min(lo + chunk_rows, stop)


def _write_chunk(array: zarr.Array, lo: int, block: np.ndarray) -> None:
    """One aligned write of one whole chunk (the last chunk of a split may be short)."""
    array[lo : lo + block.shape[0]] = block


def _load_batches(images: PreparedImages, batches: list[list[int]], inputs: Inputs) -> Iterator[tuple[Any, Any, Any]]:
    """``(pixels, labels, errors)`` per batch: a torch DataLoader (worker processes, pinned memory), or, without
    torch (``--model pixels`` on a light install), the same batches read in this process."""
    try:
        import torch
    except ImportError:
        for rows in batches:
            items = [images[i] for i in rows]
            yield np.stack([it[0] for it in items]), np.array([it[1] for it in items]), [it[2] for it in items]
        return
    yield from torch.utils.data.DataLoader(
        images, batch_sampler=batches, num_workers=inputs.workers, pin_memory=inputs.device == "cuda",
        prefetch_factor=4 if inputs.workers else None, persistent_workers=False,
    )


def extract_rows(
    spec: ExtractSpec,
    split: str,
    lo: int,
    hi: int,
    *,
    inputs: Inputs | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """Encode rows ``[lo, hi)`` of ``split`` and write them into the existing store at ``spec.out_path``.

    ``lo`` and ``hi`` must each be a multiple of the store's chunk size or the split's row count; each
    write covers exactly one chunk. ``on_batch(n)`` is called after each batch, ``on_chunk(hi)`` after each
    chunk is written (with the end row of that chunk). Does not touch the attributes: progress and
    ``complete`` are the caller's (see :func:`run_extract`, :func:`mark_progress`, :func:`finish_store`).
    """
    inputs = load_inputs(inputs) if inputs is not None else _cached_inputs(spec)
    group = zarr.open_group(str(spec.out_path), mode="r+")
    array = group[f"{split}/features"]
    n, step = int(array.shape[0]), int(array.chunks[0])
    if not (0 <= lo <= hi <= n) or any(r % step and r != n for r in (lo, hi)):
        raise FoalPipeError(f"rows [{lo}, {hi}) of {split} are not aligned to its {step}-row chunks (or exceed "
                            f"its {n} rows); pass chunk-aligned ranges")
    if lo == hi:
        return
    encoder, source = inputs.encoder, inputs.data.split(split)
    images = PreparedImages(source, encoder.image_size, encoder.interpolation)
    batches = [list(range(b, min(b + inputs.batch_size, c_hi)))
               for c_lo, c_hi in chunk_ranges(n, step, lo, hi) for b in range(c_lo, c_hi, inputs.batch_size)]
    buffer = np.empty((step, encoder.dim), dtype=spec.dtype)
    chunk_lo, filled = lo, 0
    for pixels, _labels, errors in _load_batches(images, batches, inputs):
        bad = [e for e in errors if e]
        if bad:
            raise FoalPipeError(f"cannot read image {bad[0]}; remove or replace the file, then re-run the same "
                                "command to resume")
        feats = encoder.encode(pixels).astype(spec.dtype)
        if not np.isfinite(feats).all():
            row = chunk_lo + filled + int(np.flatnonzero(~np.isfinite(feats).all(axis=1))[0])
            raise FoalPipeError(f"non-finite features at {split} row {row} (precision {inputs.precision}, dtype "
                                f"{spec.dtype}); use --precision fp32 or --dtype float32")
        buffer[filled : filled + len(feats)] = feats
        filled += len(feats)
        if on_batch:
            on_batch(len(feats))
        chunk_hi = min(chunk_lo + step, hi)
        if chunk_lo + filled == chunk_hi:
            _write_chunk(array, chunk_lo, buffer[:filled])
            if on_chunk:
                on_chunk(chunk_hi)
            chunk_lo, filled = chunk_hi, 0


def mark_progress(path: str | Path, split: str, rows: int) -> None:
    """Record that rows ``[0, rows)`` of ``split`` are written (one atomic metadata write)."""
    group = zarr.open_group(str(path), mode="r+")
    progress = dict(group.attrs.get("progress", {}))
    progress[split] = int(rows)
    group.attrs["progress"] = progress


def finish_store(path: str | Path, seconds: float | None = None) -> None:
    """Set ``complete`` (last, in one metadata write) once every split's progress reaches its row count."""
    group = zarr.open_group(str(path), mode="r+")
    progress = dict(group.attrs.get("progress", {}))
    for split in SPLITS:
        n = int(group[f"{split}/features"].shape[0])
        if int(progress.get(split, 0)) != n:
            raise FoalPipeError(f"{path}: {split} has {progress.get(split, 0)} of {n} rows written; finish the "
                                "extraction (re-run the same command) before marking it complete")
    update: dict[str, Any] = {"finished": _now(), "complete": True}
    if seconds is not None:
        update["seconds"] = round(float(seconds), 3)
    group.attrs.update(update)


class ExtractProgress:
    """Progress callbacks of :func:`run_extract` (the CLI draws a rich bar with them); all no-ops here."""

    def start(self, split: str, done: int, total: int) -> None:
        pass

    def advance(self, split: str, n: int) -> None:
        pass


@dataclass
class ExtractReport:
    """What :func:`run_extract` did; ``seconds`` is 0 when the store was already complete."""

    path: Path
    status: str  # "created", "resumed", or "complete" (nothing to do)
    rows: dict[str, int]
    resumed_from: dict[str, int]
    seconds: float
    encoder: str
    dim: int
    device: str
    precision: str


def prepare_store(spec: ExtractSpec, overwrite: bool = False) -> tuple[Inputs, StoreState]:
    """The inputs and the store to fill: an existing store checked against ``spec``, or a new one.

    The weights are loaded before a store is created, so when they cannot be had nothing is left behind.
    """
    inputs = open_inputs(spec)
    state = check_store(spec, inputs, overwrite=overwrite)
    if state is None or state.status != "complete":
        load_inputs(inputs)
        state = state or create_store(spec, inputs, overwrite=overwrite)
    return inputs, state


def run_extract(spec: ExtractSpec, overwrite: bool = False, progress: ExtractProgress | None = None) -> ExtractReport:
    """Create (or resume) the store for ``spec``, fill every split in order, then mark it complete."""
    progress = progress or ExtractProgress()
    started = time.perf_counter()
    inputs, state = prepare_store(spec, overwrite)
    report = ExtractReport(state.path, state.status, state.rows, dict(state.progress), 0.0, inputs.encoder.name,
                           inputs.encoder.dim, inputs.device, inputs.precision)
    if state.status == "complete":
        return report
    if state.status == "resumed":
        group = zarr.open_group(str(state.path), mode="r+")
        group.attrs["runtime"] = runtime_info(inputs)
    for split in SPLITS:
        done, n = state.progress[split], state.rows[split]
        progress.start(split, done, n)
        extract_rows(spec, split, done, n, inputs=inputs, on_batch=lambda k, s=split: progress.advance(s, k),
                     on_chunk=lambda hi, s=split: mark_progress(state.path, s, hi))
    report.seconds = time.perf_counter() - started
    finish_store(state.path, report.seconds)
    return report

