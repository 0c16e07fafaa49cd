"""Reading a store: :func:`open_store` checks it whole before any row is read, :class:`Split` reads it chunk by chunk."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.errors import FoalPipeError, NoBlocks, limit_failure, param
from foal_pipe.store.blockfusion import (
    NORMS,
    FinalNorm,
    FusedSplit,
    FusedSplits,
    Fusion,
    fused_encoder,
    parse_fusion,
    parse_fusions,
)
from foal_pipe.store.chunks import (
    REEXTRACT,
    check_finite,
    chunk_error,
    chunk_spans,
    read_rows,
)
from foal_pipe.store.integrity import (
    UNSEALED_FIX,
    check_chunks,
    compute_generation,
    generation_problem,
    group_arrays,
    guard_chunks,
    proven_version,
    sealed,
)
from foal_pipe.store.manifest import read_row_sources, stored_manifest
from foal_pipe.store.meta import (
    FEATURE_DTYPES,
    MEMORY_SHARE,
    SPLITS,
    UNLABELLED,
    BlockLayout,
    StoreMeta,
    check_rows_layout,
    edited_version,
    layout_attribute,
    open_array,
    read_meta,
    resume_advice,
)


@dataclass
class Split:
    """One split (``train`` or ``test``): features (and per-block tokens, when the store keeps them) stay on
    disk, labels (small) are held in memory."""

    name: str
    features: zarr.Array
    labels: np.ndarray
    root: Path = Path(".")
    fingerprint: tuple[Any, ...] = ()
    blocks: zarr.Array | None = None

    @property
    def n_rows(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def chunk_rows(self) -> int:
        return int(self.features.chunks[0])

    @property
    def chunk_bytes(self) -> int:
        """Memory to hold one chunk of features as read."""
        return self.chunk_rows * self.dim * self.features.dtype.itemsize

    def _array(self, leaf: str) -> zarr.Array:
        array = self.features if leaf == "features" else self.blocks
        if array is None:
            raise FoalPipeError(f"{self.root}: {self.name} has no {leaf} array; extract the store with "
                                f"{param('keep_blocks', True)}")
        return array

    def _read(self, leaf: str, lo: int, hi: int) -> np.ndarray:
        array = self._array(leaf)
        try:
            block = read_rows(self.root, f"{self.name}/{leaf}", array, lo, hi)
        except FoalPipeError:
            check_same(self.root, self.fingerprint)  # a store swapped underneath is not "damaged"
            raise
        return check_finite(block, self.name, lo, leaf, self.root)

    def _take(self, leaf: str, rows: np.ndarray) -> np.ndarray:
        array = self._array(leaf)
        step = int(array.chunks[0])
        order = np.argsort(rows, kind="stable")
        try:
            block = np.asarray(array.get_orthogonal_selection((rows[order],) + (slice(None),) * (array.ndim - 1)))
        except (FoalPipeError, MemoryError):
            raise
        except Exception as exc:
            if limit_failure(exc):
                raise
            for first in np.unique(rows // step):  # name the first chunk that fails on its own
                lo = int(first) * step
                self._read(leaf, lo, min(lo + step, self.n_rows))
            check_same(self.root, self.fingerprint)
            raise chunk_error(self.root, f"{self.name}/{leaf}", array, int(rows.min()) // step, exc) from None
        out = np.empty_like(block)
        out[order] = block
        return check_finite(out, self.name, rows, leaf, self.root)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)``, checked (a missing or damaged chunk is named)."""
        return self._read("features", lo, hi)

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_row, features)`` for each stored chunk in ``[start, stop)``, in row order."""
        for lo, hi in chunk_spans(self.n_rows, self.chunk_rows, start, stop):
            yield lo, self.read(lo, hi)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows in the given order, reading each touched chunk once (orthogonal selection)."""
        return self._take("features", rows)

    def read_raw(self, lo: int, hi: int) -> np.ndarray:
        """The stored chunk of rows ``[lo, hi)``, for :meth:`rows_of` (as fused splits have it)."""
        return self.read(lo, hi)

    def rows_of(self, raw: np.ndarray, lo: int, sel: np.ndarray, fusion: str | None = None) -> np.ndarray:
        """Rows ``lo + sel`` of the chunk ``raw`` that :meth:`read_raw` read at ``lo``."""
        return raw[sel]

    def read_blocks(self, lo: int, hi: int) -> np.ndarray:
        """Per-block tokens ``(hi - lo, L, d)`` of rows ``[lo, hi)``, checked like :meth:`read`."""
        return self._read("blocks", lo, hi)

    def take_blocks(self, rows: np.ndarray) -> np.ndarray:
        """Per-block tokens of rows in the given order, each touched chunk read once."""
        return self._take("blocks", rows)


def _fingerprint(path: Path) -> tuple[Any, ...]:
    """What identifies the store now at ``path``: its folder, its generation id (for stores without one, the
    hash of its attributes file) and whether it is complete."""
    st = os.stat(path)
    raw = (path / "zarr.json").read_bytes()
    doc = json.loads(raw)
    attrs = doc.get("attributes", {}) if isinstance(doc, dict) else {}
    generation = attrs.get("generation") if isinstance(attrs, dict) else None
    complete = isinstance(attrs, dict) and attrs.get("complete") is True
    return st.st_dev, st.st_ino, generation or hashlib.sha256(raw).hexdigest()[:32], complete


def _current(path: Path) -> tuple[Any, ...] | None:
    """:func:`_fingerprint` now, None where it cannot be read (the store removed, its attributes unparsable); the
    process at one of its limits (:func:`~foal_pipe.errors.limit_failure`) is raised: the store may well be the same."""
    try:
        return _fingerprint(path)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        if limit_failure(exc):
            raise
        return None


@dataclass
class FeatureStore:
    """An opened, validated, complete feature store."""

    path: Path
    meta: StoreMeta
    train: Split | FusedSplit
    test: Split | FusedSplit
    fingerprint: tuple[Any, ...] = ()
    blocks: BlockLayout | None = None
    #: ``train/index`` (each train row's dataset index), read and checked by :func:`open_store` (small), so that a
    #: damaged one is refused before any work.
    train_index: np.ndarray | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        return self.meta.classes

    def check_labelled(self, splits: Sequence[str] = SPLITS) -> None:
        """Refuse a store whose train split is empty, or whose ``splits`` hold unlabelled rows (label -1, from
        ``extract --dataset images``): a learner needs a label for every train row, an accuracy for every test row
        (a -1 test row would be left out, or counted against the last class)."""
        if "train" in splits and self.train.labels.size == 0 and (self.test.labels != UNLABELLED).any():
            raise FoalPipeError(f"{self.path} has an empty train split (0 rows, test {self.test.labels.size:,}), so "
                                "there is nothing to learn; extract it again with train rows")
        if "train" in splits and self.train.labels.size == 0:
            raise FoalPipeError(
                f"{self.path} has no train rows: it was extracted from unlabelled images, so there is nothing to learn; "
                f"extract labelled images ({param('dataset', 'imagefolder')}) to learn, or predict on it with `foal-pipe predict`"
            )
        for name in splits:
            unlabelled = int((self.split(name).labels == UNLABELLED).sum())
            if unlabelled:
                raise FoalPipeError(
                    f"{self.path} has {unlabelled:,} unlabelled {name} rows (label -1): every {name} row needs a "
                    f"label to be learned or scored; extract labelled images ({param('dataset', 'imagefolder')}), or predict on "
                    "the store with `foal-pipe predict`"
                )

    @property
    def dim(self) -> int:
        return self.train.dim

    def split(self, name: str) -> Split | FusedSplit:
        return {"train": self.train, "test": self.test}[name]

    def data_identity(self) -> str | None:
        """What identifies the training rows whatever their chunking and dtype (the generation id changes with
        both): a hash of the dataset, its source and the train rows' source indices and labels, all recorded by
        ``extract``; None for a store without row indices or a source (one written by ``write_store``)."""
        source = self.meta.extra.get("source")
        if source is None or self.train_index is None:
            return None
        digest = hashlib.sha256(json.dumps([self.meta.dataset, source], sort_keys=True).encode())
        for ids in (self.train_index, self.train.labels):
            digest.update(np.ascontiguousarray(ids, dtype="<i8").tobytes())
        return digest.hexdigest()

    def _layout(self, fusions: str) -> BlockLayout:
        if self.blocks is None or isinstance(self.train, FusedSplit):
            raise NoBlocks(f"feature store {self.path} keeps no per-block tokens, so fusion {fusions} cannot be "
                           "computed from it", "extract a store that does with `foal-pipe extract ... --keep-blocks`, or "
                           "use its features as they are (no fusion)")
        return self.blocks

    def fused(self, fusion: str | Fusion, norm: bool = True) -> FeatureStore:
        """This store with ``train`` and ``test`` fused from the stored blocks at read time (``fusion``: a
        :func:`~foal_pipe.store.blockfusion.parse_fusion` spec; ``norm=False`` skips the final norm). The ``encoder``
        attribute of the result names the fusion, so a model trained on it is refused on other features."""
        fusion = parse_fusion(fusion)
        layout = self._layout(repr(fusion.text))
        final = layout.norm if norm else None
        train, test = FusedSplit(self.train, fusion, final), FusedSplit(self.test, fusion, final)
        meta = StoreMeta(self.meta.classes, self.meta.dataset,
                         fused_encoder(self.meta.encoder, fusion, norm, layout.dtype), self.meta.complete,
                         self.meta.format_version, self.meta.generation, self.meta.extra)
        return FeatureStore(self.path, meta, train, test, self.fingerprint, layout, self.train_index)

    def fusions(self, fusions: str | Sequence[str | Fusion], norm: bool = True) -> dict[str, FusedSplits]:
        """Several fusions at once (``sweep --fusions``): ``{"train": FusedSplits, "test": FusedSplits}``, whose
        ``iter_chunks()``/``take(rows)`` give ``{spec: features}`` from one read of each blocks chunk."""
        fusions = parse_fusions(fusions)
        layout = self._layout(", ".join(repr(f.text) for f in fusions))
        return {name: FusedSplits(self.split(name), fusions, layout.norm if norm else None) for name in SPLITS}

    def check_unchanged(self) -> None:
        """Raise :class:`FoalPipeError` if the store on disk is no longer the complete store that was opened
        (replaced by ``extract --overwrite``, re-extracted, removed): call it after reading, before writing
        results, so results computed from a store that changed underneath are never reported. A store with a
        generation id but no chunk records (formats 2-3) has it recomputed over every chunk's size and last bytes: a
        chunk replaced while it was read changes nothing else."""
        check_same(self.path, self.fingerprint)
        if self.meta.generation is None or sealed(self.meta) or not self.fingerprint:
            return
        try:
            now = compute_generation(self.path)
        except OSError as exc:
            if limit_failure(exc):
                raise
            now = f"unreadable ({exc.strerror or exc})"
        if now != self.meta.generation:
            raise FoalPipeError(f"feature store {self.path} changed while it was being read (its chunk files differ "
                                f"from generation {self.meta.generation[:12]}: {now[:12]} now); these results are void: "
                                "re-run the command, or check the store with `foal-pipe info --verify`")


def check_same(path: Path, fingerprint: tuple[Any, ...]) -> None:
    """Raise if the store at ``path`` no longer has ``fingerprint`` (see :func:`_fingerprint`); no-op for ()."""
    if not fingerprint:
        return
    now = _current(path)
    if now == fingerprint:
        return
    if now is None:
        how = "it was removed or its attributes are unreadable"
    elif not now[3]:
        how = "it is no longer complete"
    elif now[2] != fingerprint[2]:
        how = f"generation {fingerprint[2][:12]} -> {now[2][:12]}"
    else:
        how = "it was replaced"
    raise FoalPipeError(f"feature store {path} changed while it was being read ({how}; another `foal-pipe "
                        "extract`?); these results are void: re-run the command")


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def chunk_too_large(array: zarr.Array) -> str | None:
    """Why one chunk of ``array`` cannot be read into memory (None when it can)."""
    nbytes = math.prod(int(c) for c in array.chunks) * array.dtype.itemsize
    available = _available_memory()
    if nbytes > MEMORY_SHARE * available:
        return (f"one chunk needs {nbytes / 2**30:,.1f} GiB in memory, more than half of the {available / 2**30:,.1f} "
                "GiB available (not a store extract writes)")
    return None


def _check_size(path: Path, what: str, nbytes: int, fix: str) -> None:
    """Refuse, before reading, a block that cannot fit in memory (absurd shapes in hand-made metadata)."""
    available = _available_memory()
    if nbytes > MEMORY_SHARE * available:
        raise FoalPipeError(f"{path}: {what} needs {nbytes / 2**30:,.1f} GiB in memory, more than half of the "
                            f"{available / 2**30:,.1f} GiB available; {fix}")


def open_store(path: str | Path, fusion: str | Fusion | None = None, fusion_norm: bool = True) -> FeatureStore:
    """Open a store for reading and validate everything a learner relies on; with ``fusion``, its features
    are fused from the stored blocks at read time (:meth:`FeatureStore.fused`).

    The order matters: every attribute and array's metadata is checked first (each problem named precisely),
    then sizes, then -- format 4 -- the generation id over the metadata (anything edited since completion is
    refused) and the chunk records every later read checks, then the chunk listing; only then is anything read:
    the labels, the norm parameters, ``train/index`` and the split manifest (all small, all checked now).
    """
    path = Path(path)
    fingerprint = _current(path) or ()  # first: a store swapped from here on is noticed by check_unchanged
    group, meta = read_meta(path)  # the precise error when the attributes cannot be read
    if not meta.complete:
        raise FoalPipeError(f"feature store {path} is not complete (extraction unfinished or interrupted); "
                            f"{resume_advice(meta.format_version)}")
    if not fingerprint:
        raise FoalPipeError(f"cannot read the attributes file of {path}; {REEXTRACT}")
    arrays = {name: _split_arrays(group, path, name) for name in SPLITS}
    dims = {name: int(features.shape[1]) for name, (features, _) in arrays.items()}
    if dims["train"] != dims["test"]:
        raise FoalPipeError(
            f"train features have {dims['train']} dimensions but test features have "
            f"{dims['test']} in {path}; extract both splits with the same encoder"
        )
    dtypes = {name: features.dtype.name for name, (features, _) in arrays.items()}
    if dtypes["train"] != dtypes["test"]:
        raise FoalPipeError(f"train features are {dtypes['train']} but test features are {dtypes['test']} in {path}; "
                            f"re-extract it: extract writes both splits in one {param('dtype')}")
    norm_arrays, blocks = {}, {}
    if "blocks" in meta.extra:
        count, dtype, kind, eps = layout_attribute(path, meta.extra["blocks"])
        norm_arrays = {name: _norm_array(group, path, name, dims["train"]) for name in NORMS[kind][1]}
        blocks = {name: _blocks_array(group, path, name, features, count, dtype) for name, (features, _) in arrays.items()}
    for name, (features, labels) in arrays.items():
        n = int(labels.shape[0])
        _check_size(path, f"{name}/labels ({n:,} rows)", 2 * n * 8, "this is not a store extract writes: re-extract it")
        chunk_bytes = int(features.chunks[0]) * int(features.chunks[1]) * features.dtype.itemsize
        _check_size(path, f"one {name}/features chunk ({features.chunks[0]:,} x {features.chunks[1]:,})",
                    chunk_bytes, "re-extract it with a smaller --chunk-rows")
    every = group_arrays(group, path)
    check_sealed(path, group, meta, every, fingerprint)
    check_chunks(path, group, arrays=every, format_version=meta.format_version)
    splits = {}
    for name, (features, labels) in arrays.items():
        y = read_rows(path, f"{name}/labels", labels, 0, int(labels.shape[0]))
        if y.size and (y.min() < UNLABELLED or y.max() >= len(meta.classes)):
            bad = int(np.flatnonzero((y < UNLABELLED) | (y >= len(meta.classes)))[0])
            raise FoalPipeError(
                f"{name}/labels in {path} has label {int(y[bad])} at row {bad}, outside [0, {len(meta.classes)}) "
                "(the number of classes) and not -1 (unlabelled); fix the labels or the 'classes' attribute"
            )
        splits[name] = Split(name, features, y.astype(np.int64), path, fingerprint, blocks.get(name))
    layout = None
    if "blocks" in meta.extra:
        layout = BlockLayout(count, dtype, FinalNorm(kind, eps, **{name: _norm_values(path, name, array)
                                                                   for name, array in norm_arrays.items()}))
    index = read_row_sources(path, group, meta, every, splits["train"].n_rows)
    store = FeatureStore(path, meta, splits["train"], splits["test"], fingerprint, layout, index)
    return store if fusion is None else store.fused(fusion, fusion_norm)


def read_split(path: str | Path, split: str = "train", fusion: str | Fusion | None = None,
               fusion_norm: bool = True) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A store's split in memory in one call: ``(X, y, class_names)``, features (n, d) as stored (fused with
    ``fusion``), label ids (n,) indexing ``class_names``. Refused when the features would take more than half
    the available memory: then read the split chunk by chunk (:meth:`Split.iter_chunks`)."""
    if split not in SPLITS:
        raise FoalPipeError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
    store = open_store(path, fusion, fusion_norm)
    data = store.split(split)
    _check_size(store.path, f"{split}/features ({data.n_rows:,} x {data.dim:,})",
                data.n_rows * data.dim * np.dtype(data.features.dtype).itemsize,
                "read it chunk by chunk: open_store(path).train.iter_chunks()")
    X = data.read(0, data.n_rows)
    store.check_unchanged()
    return X, data.labels.copy(), list(store.classes)


def read_manifest_bytes(path: str | Path) -> bytes | None:
    """The manifest bytes of the complete store at ``path`` (checked as :func:`open_store` checks any store, then
    against their recorded SHA-256); None when the store keeps none."""
    open_store(path)
    return stored_manifest(path)


def _split_arrays(group: zarr.Group, path: Path, name: str) -> tuple[zarr.Array, zarr.Array]:
    """``SPLIT/features`` and ``SPLIT/labels``, their shapes and dtypes checked."""
    features = open_array(group, path, f"{name}/features")
    labels = open_array(group, path, f"{name}/labels")
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise FoalPipeError(
            f"{name}/features {features.shape} and {name}/labels {labels.shape} do not match "
            f"in {path}; expected (N, d) and (N,); re-extract it"
        )
    if features.dtype.name not in FEATURE_DTYPES:
        raise FoalPipeError(f"{name}/features in {path} has dtype {features.dtype}, outside the spec "
                            f"({', '.join(FEATURE_DTYPES)}); re-extract it with {param('dtype', 'float32')}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise FoalPipeError(f"{name}/labels in {path} has dtype {labels.dtype}, expected integers; re-extract it")
    check_rows_layout(path, f"{name}/features", features, tuple(int(n) for n in features.shape), features.dtype.name)
    return features, labels


def check_sealed(path: Path, group: zarr.Group, meta: StoreMeta, arrays: dict[str, zarr.Array],
                 fingerprint: tuple[Any, ...]) -> None:
    """Refuse a format-4 store whose metadata changed since it was completed, then make every chunk read check
    the file against its record; older stores get the chunk size limits and, where they carry a generation id,
    its check (over every chunk's size and last bytes). Every record present is checked: a store declaring a
    version older than its content proves (:func:`~foal_pipe.store.meta.edited_version`) is refused."""
    edited = edited_version(meta, arrays, proven_version(arrays))
    if edited is not None:
        raise FoalPipeError(f"feature store {path} declares format_version {meta.format_version} but carries the "
                            f"{edited[1]} of format {edited[0]}: its version was edited down, which would skip their "
                            f"checks; restore format_version {edited[0]} (its generation id is then checked) or re-extract it")
    if not sealed(meta) and meta.complete and meta.generation is not None:
        check_chunks(path, group, arrays=arrays, format_version=meta.format_version)  # named as missing, not as changed
    if meta.complete and meta.generation is not None or sealed(meta):
        problem = generation_problem(path, group, meta)
        if problem is not None:
            check_same(path, fingerprint)  # a store replaced meanwhile is "changed", not damaged
            if meta.generation is None:
                raise FoalPipeError(f"feature store {path}: {problem}; {UNSEALED_FIX}")
            raise FoalPipeError(f"feature store {path} is damaged: {problem}; {REEXTRACT}")
    guard_chunks(path, group, arrays, records=sealed(meta))


def _norm_array(group: zarr.Group, path: Path, name: str, dim: int) -> zarr.Array:
    """``norm/<name>``, one of the final norm's parameters: floats of shape (d,)."""
    array = open_array(group, path, f"norm/{name}")
    if array.shape != (dim,) or array.dtype.kind != "f":
        raise FoalPipeError(f"norm/{name} in {path} is {array.dtype} {array.shape}, expected floats of shape "
                            f"({dim},) (the feature dimension); {REEXTRACT}")
    return array


def _norm_values(path: Path, name: str, array: zarr.Array) -> np.ndarray:
    """The values of ``norm/<name>``, a final-norm parameter: all finite."""
    values = read_rows(path, f"norm/{name}", array, 0, int(array.shape[0]))
    if not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        raise FoalPipeError(f"norm/{name} in {path}, a parameter of the final norm, holds {values[bad]} at feature "
                            f"{bad}; {REEXTRACT}")
    return values


def _blocks_array(group: zarr.Group, path: Path, split: str, features: zarr.Array, count: int,
                  dtype: str) -> zarr.Array:
    """``SPLIT/blocks``, checked against the layout and the split's features (chunked along rows only)."""
    name = f"{split}/blocks"
    array = open_array(group, path, name)
    n_rows, dim = (int(n) for n in features.shape)
    check_rows_layout(path, name, array, (n_rows, count, dim), dtype)
    chunk_bytes = int(array.chunks[0]) * count * dim * array.dtype.itemsize
    _check_size(path, f"one {name} chunk ({array.chunks[0]:,} x {count} x {dim:,})", chunk_bytes,
                "re-extract it with a smaller --chunk-rows")
    return array
