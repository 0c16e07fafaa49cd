"""Writing a store: arrays in the format's codecs, whole chunks, ``progress``, ``complete`` and the swap of a
replaced store.
"""

from __future__ import annotations

import functools
import hashlib
import numbers
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io import exchange
from foal_pipe.io.outpaths import enclosing_store, is_feature_store
from foal_pipe.store.blockfusion import FinalNorm
from foal_pipe.store.given import cast_finite, check_blocks, on_host
from foal_pipe.store.integrity import check_chunks, compute_generation, record_chunks
from foal_pipe.store.log import log_path
from foal_pipe.store.manifest import MANIFEST
from foal_pipe.store.meta import (
    BLOCK_DTYPES,
    FEATURE_DTYPES,
    FORMAT_VERSION,
    LABEL_CHUNK_ROWS,
    SPLITS,
    WRITE_CONFIG,
    BlockLayout,
    StoreMeta,
    classes_problem,
    encoder_problem,
    open_array,
    store_group,
    writable_name,
    write_attrs,
    writing,
)

#: Bytes per chunk of the ``manifest`` array (the split manifest, :mod:`foal_pipe.store.manifest`).
MANIFEST_CHUNK = 1 << 22


def create_array(group: zarr.Group, name: str, shape: tuple[int, ...], chunks: tuple[int, ...],
                 dtype: str) -> zarr.Array:
    """An array in the store's codec pipeline (bytes, zstd, crc32c), every chunk written even when empty."""
    return group.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
                              serializer=BytesCodec(endian="little"),
                              compressors=(ZstdCodec(level=0, checksum=False), Crc32cCodec()),
                              config=WRITE_CONFIG)


def create_skeleton(where: str | Path, meta: StoreMeta, dim: int, dtype: str, chunk_rows: int,
                    labels: dict[str, np.ndarray], index: dict[str, np.ndarray] | None = None,
                    blocks: BlockLayout | None = None, manifest: bytes | None = None) -> None:
    """A new, incomplete store at ``where``: labels, row indices, empty feature arrays chunked along rows (and,
    with ``blocks``, empty ``SPLIT/blocks`` arrays chunked the same way, the final norm's parameters and the
    ``blocks`` attribute; with ``manifest``, the split manifest's bytes and the ``manifest`` attribute), and the
    attributes with ``progress`` 0, written last.

    It is built in ``.<name>.creating`` beside ``where`` and renamed into place (replacing an empty folder or
    a feature store there), so an interrupted creation leaves nothing at ``where``. Anything else at ``where``
    -- a file, a folder holding other things -- is refused before anything is written: it is not ours to delete.
    """
    check_dtype(dtype)
    check_writable(meta.classes)
    if blocks is not None and blocks.dtype not in BLOCK_DTYPES:
        raise FoalPipeError(f"blocks dtype {blocks.dtype!r} is outside the spec; choose one of "
                            f"{', '.join(BLOCK_DTYPES)}")
    where = Path(where)
    check_replaceable(where)
    tmp = where.parent / f".{where.name}.creating"
    extra = dict(meta.extra)
    with writing(where, "the skeleton"):
        shutil.rmtree(tmp, ignore_errors=True)  # left by a creation that was killed
        where.parent.mkdir(parents=True, exist_ok=True)
        try:
            group = zarr.open_group(str(tmp), mode="w")
            for split in SPLITS:
                y = np.asarray(labels[split], dtype=np.int64)
                n = y.shape[0]
                rows = max(1, min(chunk_rows, n))
                create_array(group, f"{split}/features", (n, dim), (rows, dim), dtype)
                if blocks is not None:
                    shape = (n, blocks.count, dim)
                    create_array(group, f"{split}/blocks", shape, (rows, *shape[1:]), blocks.dtype)
                one = (max(1, min(n, LABEL_CHUNK_ROWS)),)
                create_array(group, f"{split}/labels", (n,), one, "int64")[:] = y
                if index is not None:
                    create_array(group, f"{split}/index", (n,), one, "int64")[:] = np.asarray(index[split], np.int64)
            if blocks is not None:
                for name, values in blocks.norm.parameters.items():
                    create_array(group, f"norm/{name}", (dim,), (dim,), "float32")[:] = np.asarray(values, np.float32)
                extra["blocks"] = blocks.to_dict()
            if manifest is not None:
                extra["manifest"] = write_manifest(group, manifest)
            attrs = StoreMeta(meta.classes, meta.dataset, meta.encoder, False, FORMAT_VERSION, None, extra).to_dict()
            write_attrs(group, {**attrs, "progress": {split: 0 for split in SPLITS}})
            if where.exists():
                shutil.rmtree(where)
            os.replace(tmp, where)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def check_writable(classes: Any) -> None:
    """Refuse a class name with a lone surrogate, which no report or prediction file could hold."""
    if unwritable := next((c for c in classes if isinstance(c, str) and not writable_name(c)), None):
        raise FoalPipeError(f"class name {unwritable!r} holds a lone surrogate, which no text file can hold (the reports "
                            "and predictions write every name); name the classes with text")


def check_dtype(dtype: Any) -> None:
    """Refuse a feature dtype outside the spec (before any value is cast to it)."""
    if not isinstance(dtype, str) or dtype not in FEATURE_DTYPES:
        raise FoalPipeError(f"feature dtype {dtype!r} is outside the spec; choose one of {', '.join(FEATURE_DTYPES)}")


def write_manifest(group: zarr.Group, raw: bytes) -> dict[str, Any]:
    """Write ``raw`` as the ``manifest`` array of a new store; returns the ``manifest`` attribute."""
    values = np.frombuffer(raw, dtype=np.uint8)
    create_array(group, MANIFEST, (values.size,), (max(1, min(values.size, MANIFEST_CHUNK)),), "uint8")[:] = values
    return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}


def replace_manifest(path: str | Path, raw: bytes) -> None:
    """Put ``raw`` in place of the manifest of an incomplete store (``extract`` resuming over image files that
    changed in rows not written yet); completion then seals it with the rest."""
    path = Path(path)
    with writing(path, "the split manifest"):
        group = store_group(path, "r+")
        attrs = dict(group.attrs)
        shutil.rmtree(path / MANIFEST)  # a failure is writing()'s line: Zarr would refuse to make it again over it
        group = store_group(path, "r+")
        attrs[MANIFEST] = write_manifest(group, raw)
        write_attrs(group, attrs)


_META = r"zarr\.(?:json|[0-9a-f]+\.partial)"
_STORE_FILE = re.compile(rf"(?:(?:train|test|norm)/)?{_META}|(?:(?:train|test)/(?:features|labels|index|blocks)|"
                         rf"norm/\w+|manifest)/(?:{_META}|c(?:/\d+)+(?:\.[0-9a-f]+\.partial)?)")
"""The relative path of every file a store's writer makes (metadata, chunks, Zarr's interrupted chunk writes)."""


def foreign_file(where: Path) -> str | None:
    """The first entry in the folder ``where`` that a store's writer does not make (a user's file, a symlink, a
    FIFO), as a relative path; None when it holds store files only, so deleting it deletes nothing else."""
    for root, dirs, files in os.walk(where):
        for name in sorted(dirs + files):
            entry = Path(root, name)
            relative = entry.relative_to(where).as_posix()
            if entry.is_symlink() or not (entry.is_dir() or (entry.is_file() and _STORE_FILE.fullmatch(relative))):
                return relative
    return None


def check_replaceable(where: Path) -> None:
    """Refuse to replace what is at ``where`` unless it is nothing, an empty folder or a feature store holding
    store files only (a look-alike's ``zarr.json`` is not enough: a user's file beside it would be deleted), and a
    store inside another (its metadata would change the outer store's generation id: that store would read as
    damaged)."""
    outer = enclosing_store(where)
    if outer is not None:
        raise FoalPipeError(f"{where} lies in the feature store {outer}, which a store inside would damage; choose a "
                            f"path outside it")
    if not (where.exists() or where.is_symlink()):
        return
    if where.is_symlink() or not where.is_dir():
        what = "a symlink" if where.is_symlink() else "a file"
    elif any(where.iterdir()) and not is_feature_store(where):
        what = "a folder that is not a feature store"
    elif (foreign := foreign_file(where)) is not None:
        what = f"a feature store that also holds {foreign!r}, which a store does not write"
    else:
        return
    raise FoalPipeError(f"{where} exists and is {what}; refusing to replace it: choose another path or remove it")


class FeatureWriter:
    """Writes whole chunks of one split's features -- and, in a store that keeps them, the same rows' block
    tokens -- into an existing store (each write one chunk file, written atomically: a kill leaves the old file
    or the new one, never a torn one)."""

    def __init__(self, path: str | Path, split: str):
        self.path, self.split = Path(path), split
        with writing(self.path, f"{split}/features"):
            group = store_group(self.path, "r+")
            self.array = open_array(group, self.path, f"{split}/features").with_config(WRITE_CONFIG)
            self.blocks = (open_array(group, self.path, f"{split}/blocks").with_config(WRITE_CONFIG)
                           if "blocks" in group.attrs else None)
        self.n_rows, self.chunk_rows = int(self.array.shape[0]), int(self.array.chunks[0])

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """The split's labels as the store holds them, read when first asked for (the rows written are their images)."""
        with writing(self.path, f"{self.split}/labels"):
            return np.asarray(open_array(store_group(self.path, "r"), self.path, f"{self.split}/labels")[:])

    def check_range(self, lo: int, hi: int) -> None:
        n, step = self.n_rows, self.chunk_rows
        if not (0 <= lo <= hi <= n) or any(r % step and r != n for r in (lo, hi)):
            raise FoalPipeError(f"rows [{lo}, {hi}) of {self.split} are not aligned to its {step}-row chunks (or "
                                f"exceed its {n} rows); pass chunk-aligned ranges")

    def write(self, lo: int, block: np.ndarray, blocks: np.ndarray | None = None) -> None:
        """Rows ``[lo, lo + len(block))``: exactly one chunk (the last chunk of a split may be short). A store that
        keeps block tokens needs ``blocks`` (those rows' ``(n, L, d)`` tokens): they are written first, so rows
        whose features chunk exists have their blocks chunk too."""
        hi = lo + block.shape[0]
        self.check_range(lo, hi)
        if hi - lo != min(self.chunk_rows, self.n_rows - lo):
            raise FoalPipeError(f"a write of {self.split} rows [{lo}, {hi}) is not one whole chunk; write whole chunks")
        if (blocks is None) != (self.blocks is None) or (blocks is not None and blocks.shape[0] != hi - lo):
            has = "keeps" if self.blocks is not None else "does not keep"
            raise FoalPipeError(f"{self.path} {has} block tokens; pass them with the features of the same rows "
                                "exactly when it keeps them")
        with writing(self.path, f"{self.split} rows [{lo}, {hi})"):
            if self.blocks is not None and blocks is not None:  # both or neither, checked above
                self.blocks[lo:hi] = blocks
            self.array[lo:hi] = block


def _open_rw(path: Path) -> tuple[zarr.Group, dict[str, Any]]:
    with writing(path, "the attributes"):
        group = store_group(path, "r+")
        return group, dict(group.attrs)


def mark_progress(path: str | Path, split: str, rows: int) -> None:
    """Record that rows ``[0, rows)`` of ``split`` are written (one atomic metadata write)."""
    path = Path(path)
    group, attrs = _open_rw(path)
    progress = dict(attrs.get("progress", {}))
    progress[split] = int(rows)
    with writing(path, "the progress"):
        write_attrs(group, {**attrs, "progress": progress})


def reopen_at(path: str | Path, progress: dict[str, int]) -> None:
    """Move ``progress`` back (a hole was found below it) and clear ``complete``: the rows from there on are
    extracted again."""
    path = Path(path)
    group, attrs = _open_rw(path)
    attrs.pop("generation", None)
    with writing(path, "the progress"):
        write_attrs(group, {**attrs, "progress": dict(progress), "complete": False})


def remove_partial_files(path: str | Path) -> int:
    """Delete ``*.partial`` files that Zarr's atomic writes leave behind when a writer is killed mid-write."""
    removed = 0
    for stray in Path(path).rglob("*.partial"):
        stray.unlink(missing_ok=True)
        removed += 1
    return removed


def complete_store(path: str | Path) -> str:
    """Mark a fully written store complete and return its generation id: record every chunk file's size and
    CRC-32C in its array's metadata, compute the generation id over the metadata, then write ``complete`` and
    ``generation`` (one attribute write, last). Refused while any split's ``progress`` is short of its rows or
    any chunk file is missing."""
    path = Path(path)
    group, attrs = _open_rw(path)
    progress = attrs.get("progress", {})
    for split in SPLITS:
        n = int(open_array(group, path, f"{split}/features").shape[0])
        if int(progress.get(split, 0)) != n:
            raise FoalPipeError(f"{path}: {split} has {progress.get(split, 0)} of {n} rows written; finish the "
                                "extraction (re-run the same command) before marking it complete")
    check_chunks(path, group)
    remove_partial_files(path)
    with writing(path, "the chunk records"):
        record_chunks(path, group)
    generation = compute_generation(path, group)
    with writing(path, "the attributes"):
        write_attrs(group, {**attrs, "complete": True, "generation": generation})
    return generation


def write_store(
    path: str | Path,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    classes: list[str],
    dataset: str = "synthetic",
    encoder: dict[str, Any] | None = None,
    chunk_rows: int = 4096,
    dtype: str = "float32",
    blocks: tuple[np.ndarray, np.ndarray] | None = None,
    norm: FinalNorm | None = None,
) -> Path:
    """Write a complete store from in-memory arrays (tests, benchmarks, small datasets; extract streams).

    ``blocks``: per-block tokens ``(N, L, d)`` of train and test (their dtype is stored), with the final
    ``norm`` (default: none, ``identity``). Features or tokens that are NaN or inf are refused before anything is
    written, as every reader would refuse the store."""
    encoder = encoder or {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}
    problem = encoder_problem(encoder) if isinstance(encoder, dict) else "is not a dict"
    if problem is not None:  # every reader would refuse the store
        example = {"name": "mine", "fusion": "none", "image_size": 0, "normalize": False}
        raise FoalPipeError(f"{param('encoder')} {problem}; pass e.g. {param('encoder', example)}")
    path = Path(path)
    names = _check_classes(classes)
    check_dtype(dtype)
    features, labels, dim = _check_rows(train, test, len(names), dtype)
    layout = None
    if blocks is not None:
        blocks = check_blocks(blocks, {name: int(features[name].shape[0]) for name in SPLITS})
        layout = BlockLayout(int(blocks[0].shape[1]), blocks[0].dtype.name, norm or FinalNorm("identity"))
    create_skeleton(path, StoreMeta(names, dataset, encoder), dim, dtype, chunk_rows, labels, blocks=layout)
    for i, name in enumerate(SPLITS):
        writer = FeatureWriter(path, name)
        for lo in range(0, writer.n_rows, writer.chunk_rows):
            hi = lo + writer.chunk_rows
            writer.write(lo, features[name][lo:hi], None if blocks is None else blocks[i][lo:hi])
        mark_progress(path, name, writer.n_rows)
    complete_store(path)
    return path


def _check_classes(classes: Any) -> tuple[str, ...]:
    """``classes`` as the store's names, refused as the reader refuses them (:func:`classes_problem`); one string is
    refused too: its letters are no list of names."""
    names: Any = classes
    problem: str | None = None
    if isinstance(classes, (str, bytes)):
        problem = f"is {'one string' if isinstance(classes, str) else 'bytes'} ({classes!r}), not a list of names"
    else:
        try:
            names = list(classes)
            check_writable(names)
        except TypeError:
            pass  # named by the reader's check below
        problem = classes_problem(names)
    if problem is not None:
        raise FoalPipeError(f"write_store: {param('classes')} {problem}; pass a list of distinct class names (strings), "
                            "one per label id")
    return tuple(names)


def _check_rows(train: tuple[Any, Any], test: tuple[Any, Any], n_classes: int,
                dtype: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """Each split's features cast to ``dtype``, its labels as int64 ids and the feature width, refused before anything
    is written unless each split is (N, d) real features, d >= 1 and alike in both, with one whole-number label per
    row in ``[0, n_classes)`` or -1 (unlabelled), and no finite value beyond ``dtype``'s range."""
    features, labels, widths = {}, {}, []
    for name, (x, y) in zip(SPLITS, (train, test)):
        x, y = _features(x, f"{name} features"), _label_ids(y, name)
        if x.ndim != 2 or x.shape[1] < 1 or y.shape != x.shape[:1]:
            raise FoalPipeError(f"write_store: {name} features {x.shape} and labels {y.shape} do not match; pass (N, d) "
                                "features, d >= 1, and (N,) labels")
        bad = np.flatnonzero((y < -1) | (y >= n_classes))
        if bad.size:
            raise FoalPipeError(f"write_store: {name} label {y[bad[0]]} at row {int(bad[0])} is outside [0, {n_classes}) "
                                "(the number of classes) and not -1 (unlabelled); fix the labels or the classes")
        features[name] = cast_finite(x, dtype, f"{name} feature", f"pass {param('dtype', 'float64')} or scale the features")
        labels[name] = y.astype(np.int64)
        widths.append(int(x.shape[1]))
    if widths[0] != widths[1]:
        raise FoalPipeError(f"write_store: train features have {widths[0]} dimensions but test features {widths[1]}; "
                            "pass both splits from the same encoder")
    return features, labels, widths[0]


def _features(x: Any, what: str) -> np.ndarray:
    """``x`` as a NumPy array of real numbers (a tensor detached, bfloat16 widened), refused in one line where NumPy
    would change it in the cast: complex (the imaginary part dropped), masked (the values behind the mask written),
    sparse, strings or other objects."""
    if type(x).__module__.startswith("scipy.sparse"):
        raise FoalPipeError(f"write_store: {what} are a SciPy sparse {type(x).__name__}; pass dense rows (.toarray())")
    if isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x):
        raise FoalPipeError(f"write_store: {what} have masked (missing) entries, which would be written as the values "
                            "behind the mask; fill them (.filled(value)) or drop their rows")
    values = on_host(x, what)
    if values.dtype.kind == "O":  # Python numbers are read as floats; None would be NaN, a str parsed
        other = next((v for v in values.ravel().tolist() if not isinstance(v, numbers.Real)), values)
        if other is not values:
            raise FoalPipeError(f"write_store: {what} hold objects that are no real numbers (first {other!r}); pass "
                                "an array of real numbers")
        try:
            values = values.astype(np.float64)
        except OverflowError:
            raise FoalPipeError(f"write_store: {what} hold an integer beyond float64's range; pass values that a "
                                "float can hold") from None
    if values.dtype.kind not in "biuf":
        raise FoalPipeError(f"write_store: {what} are {values.dtype} values, which a store cannot hold without changing "
                            "them; pass real numbers (NumPy floats or integers)")
    return values


def _label_ids(y: Any, split: str) -> np.ndarray:
    """``y`` as a NumPy array of whole numbers (a tensor detached), refused in one line when a label is no class id:
    a string, None, a boolean (written as id 0 or 1), a fraction (written as its integer part) or masked (the id
    behind the mask written)."""
    if isinstance(y, np.ma.MaskedArray) and np.ma.is_masked(y):
        raise FoalPipeError(f"write_store: {split} labels have masked (missing) entries; label those rows -1 "
                            "(unlabelled) or drop them")
    ids = on_host(y, f"{split} labels")
    given = y if isinstance(y, (list, tuple)) else ids.ravel().tolist() if ids.dtype.kind == "O" else ()
    if ids.dtype.kind == "O":
        ids = np.asarray(ids.tolist())  # Python ints read as int64 (a None stays an object)
    if ids.dtype.kind == "b" or any(isinstance(v, (bool, np.bool_)) for v in given):  # NumPy reads [0, True] as ids
        # a mask passed for the labels: True and False are no class names' positions
        raise FoalPipeError(f"write_store: {split} labels are booleans, not class ids; pass each row's class as an "
                            "integer, its position in classes (y.astype(int) if True and False mean ids 1 and 0)")
    if ids.dtype.kind not in "iuf":
        first = next((v for v in ids.ravel().tolist() if not isinstance(v, numbers.Real)), None)
        raise FoalPipeError(f"write_store: {split} labels are {ids.dtype} values (first {first!r}), not class ids; pass "
                            "each row's class as an integer, its position in classes (-1: unlabelled)")
    if ids.dtype.kind == "f" and ids.ndim == 1:
        bad = np.flatnonzero(~np.isfinite(ids) | (ids != np.round(ids)))
        if bad.size:
            raise FoalPipeError(f"write_store: {split} label {ids[bad[0]]} at row {int(bad[0])} is not a whole number, "
                                "so no class id; pass each row's class as an integer, its position in classes")
    return ids


class ReplacedStoreLeft(FoalPipeError):
    """The new store is in place, with its log, but the one it replaced could not be deleted (:func:`replace_store`)."""


def replace_store(new: str | Path, out: str | Path) -> None:
    """Put the store built at ``new`` in place of ``out`` (one atomic exchange where Linux allows) with its sidecar
    log, then delete the old one. A reader of the old store notices (see ``check_unchanged``). The log moves before
    the deletion, so a deletion that fails (a folder of the old store made read-only since the run's checks) leaves
    the new store whole, with its own log: a :class:`ReplacedStoreLeft` names what is left."""
    new, out = Path(new), Path(out)
    with writing(out, "the replaced store"):
        if out.exists() and exchange(new, out):
            old = new
        else:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            if out.exists():
                os.rename(out, old)
            os.rename(new, out)
        new_log = log_path(new)
        if new_log.exists():
            os.replace(new_log, log_path(out))
        else:
            log_path(out).unlink(missing_ok=True)
    try:
        if old.exists():
            shutil.rmtree(old)
    except OSError as exc:
        then = f"run the extract again without {param('overwrite', True)}, which removes it" if old == new else "remove it"
        raise ReplacedStoreLeft(f"{out} now holds the new store, but the one it replaced, left at {old}, could not be "
                                f"deleted: {exc.strerror or exc}; make it writable (chmod -R u+w {shlex.quote(str(old))}), "
                                f"then {then}") from None
