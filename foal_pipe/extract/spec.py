"""What an extraction is asked for (:class:`ExtractSpec`), what it opens (:class:`Inputs`: the dataset and the
encoder, cached per process), and the settings and provenance a store records from them.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.identity import data_sha256
from foal_pipe.datasets.manifest import SplitManifest, build_manifest
from foal_pipe.datasets.registry import open_dataset
from foal_pipe.datasets.sources import DatasetSplits
from foal_pipe.encoders import (
    PAPER_MODEL,
    RESIZE_ON,
    Encoder,
    EncoderConfig,
    TimmEncoder,
    build_encoder,
    resolve_device,
    resolve_precision,
    resolve_resize_on,
    torch_version,
)
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.manifest import read_manifest
from foal_pipe.io.outpaths import follow_link
from foal_pipe.store import BLOCK_DTYPES, SPLITS
from foal_pipe.store.blockfusion import NORMS
from foal_pipe.version import __version__

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
    can be computed at read time (:mod:`foal_pipe.store.blockfusion`).
    ``test_split`` (``--test-split``) splits a folder of class folders, stratified, seeded by ``split_seed``
    (``--split-seed``); both are among the store's settings. ``split_manifest`` (``--split-manifest``): a store or an
    exported manifest whose splits are taken from the dataset's images, exactly.
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
    test_split: float | None = None
    split_seed: int = 0
    split_manifest: str | None = None

    def __post_init__(self) -> None:
        if self.test_split is not None and not 0 < self.test_split < 1:
            raise FoalPipeError(f"{param('test_split')} must be a fraction between 0 and 1 (the share of each class's images "
                                f"to test on), got {self.test_split}")
        if self.split_seed < 0:
            raise FoalPipeError(f"{param('split_seed')} must be 0 or more, got {self.split_seed}")
        if self.split_seed and self.test_split is None:
            raise FoalPipeError(f"{param('split_seed')} draws the split of {param('test_split')}; pass "
                                f"{param('test_split', 'FRACTION')} too")
        if self.dtype not in DTYPES:
            raise FoalPipeError(f"unknown {param('dtype')} {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
        if self.resize_on not in RESIZE_ON:
            raise FoalPipeError(f"unknown {param('resize_on')} {self.resize_on!r}; choose one of: {', '.join(RESIZE_ON)}")
        if self.blocks_dtype not in BLOCK_DTYPES:
            raise FoalPipeError(f"unknown {param('blocks_dtype')} {self.blocks_dtype!r}; choose one of: "
                                f"{', '.join(BLOCK_DTYPES)}")
        for option, value in (("--chunk-rows", self.chunk_rows), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise FoalPipeError(f"{option} must be at least 1, got {value}")
        if self.workers is not None and self.workers < 0:
            raise FoalPipeError(f"{param('workers')} must be 0 (load in the main process) or more, got {self.workers}")
        if self.model == "pixels" and self.precision in ("bf16", "fp16"):  # it computes in float32 on the host
            raise FoalPipeError(f"{param('model', 'pixels')} computes in float32 on the host, so "
                                f"{param('precision', self.precision)} does not apply; drop {param('precision')} or choose "
                                f"a timm {param('model')}")

    @property
    def out_path(self) -> Path:
        """Where the store is written: a symlinked ``--out`` at its target, the link kept."""
        return follow_link(Path(self.out or DEFAULT_OUT.format(dataset=self.dataset)).expanduser())

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

    @functools.cached_property
    def manifest(self) -> SplitManifest | None:
        """The split manifest of the opened dataset (its images hashed once, when first asked for)."""
        return build_manifest(self.data)

    @functools.cached_property
    def data_sha256(self) -> dict[str, str] | None:
        """Each split's SHA-256 over its images (:func:`~foal_pipe.datasets.identity.data_sha256`), for a dataset
        without a split manifest (torchvision, HDF5): the manifest names the images of the others."""
        return data_sha256(self.data) if self.manifest is None else None

    @property
    def loaded_size(self) -> int:
        """Side of the images the loader ships: the native size when the device resizes them."""
        if self.resize_on == "device":
            assert self.data.native_size is not None  # resolve_resize_on picks the device only for images of one size
            return self.data.native_size
        return self.encoder.image_size


def open_inputs(spec: ExtractSpec) -> Inputs:
    """Open the dataset and describe the encoder; weights are not loaded yet (see :func:`load_inputs`)."""
    manifest = None if spec.split_manifest is None else read_manifest(spec.split_manifest)
    data = open_dataset(spec.dataset, spec.data_dir, spec.download, spec.test_split, spec.split_seed,
                        manifest, str(spec.split_manifest))
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
        raise FoalPipeError(f"{param('model', encoder.name)} has no transformer blocks, so {param('keep_blocks')} does not "
                            f"apply; drop {param('keep_blocks', True)} or choose a timm ViT {param('model')}")
    if getattr(encoder, "norm_kind", None) is None:
        raise FoalPipeError(f"{param('keep_blocks')}: the final norm of {encoder.name} is not one foal-pipe can recompute "
                            f"({', '.join(NORMS)}); drop {param('keep_blocks', True)} and extract one store per "
                            f"{param('fusion')}")


def block_encoder(encoder: Encoder) -> TimmEncoder:
    """The encoder of a ``--keep-blocks`` run: a timm ViT, the one encoder with blocks (:func:`open_inputs` refused
    the others)."""
    assert isinstance(encoder, TimmEncoder)
    return encoder


def load_inputs(inputs: Inputs) -> Inputs:
    """Load the encoder's weights onto the device (once)."""
    if not inputs.loaded:
        inputs.encoder.load(inputs.device, inputs.precision)
        inputs.loaded = True
    return inputs


#: Specs whose inputs a process keeps (:func:`cached_inputs`), the least recently used dropped first.
KEPT_SPECS = 2
_KEPT: dict[ExtractSpec, Inputs] = {}
_KEPT_LOCK = threading.Lock()


def cached_inputs(spec: ExtractSpec, split: str, labels: np.ndarray) -> Inputs:
    """``spec``'s inputs, opened and their weights loaded once per process (a Dask worker extracts many ranges of
    one store), kept while they still describe the data: opened again once a split's file was replaced or written to
    (:meth:`~foal_pipe.datasets.sources.ImageSource.changed`) or ``split``'s labels are no longer the store's
    ``labels`` (a folder that gained or lost images), so that a store never takes the rows of data as it was."""
    with _KEPT_LOCK:  # a worker's threads share one copy of the weights
        kept = _KEPT.pop(spec, None)
        if kept is None or not _describes(kept, split, labels):
            kept = load_inputs(open_inputs(spec))
        _KEPT[spec] = kept
        while len(_KEPT) > KEPT_SPECS:
            del _KEPT[next(iter(_KEPT))]
        return kept


def _describes(inputs: Inputs, split: str, labels: np.ndarray) -> bool:
    if any(inputs.data.split(name).changed() is not None for name in SPLITS):
        return False
    return np.array_equal(inputs.data.split(split).labels, labels)


# ---------------------------------------------------------------------------------------------------------
# The settings and provenance a store records
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
        **({"test_split": inputs.data.test_split} if inputs.data.test_split else {}),
    })


def stored_encoder(inputs: Inputs) -> dict[str, Any]:
    """The encoder's provenance as the store records it: the checkpoint's hash and size, not its path (the path
    goes to the run log), so the same weights give the same store wherever they lie."""
    encoder = dict(inputs.encoder.provenance())
    encoder["weights"] = {k: v for k, v in encoder.get("weights", {}).items() if k != "path"}
    return encoder


def runtime_info(spec: ExtractSpec, inputs: Inputs) -> dict[str, Any]:
    """What the run log records about this run (never the store: it varies from run to run)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "device": inputs.device,
            "batch_size": inputs.batch_size, "workers": inputs.workers, "resize_on": inputs.resize_on,
            "checkpoint": spec.checkpoint,
            "torch_version": torch_version() if "torch" in sys.modules else None,  # None: not used
            "foal_pipe_version": __version__}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
