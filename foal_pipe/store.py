"""The feature store: the Zarr contract between ``extract`` and ``learn`` (docs/feature-store.md).

This module owns the format. Every write goes through it -- arrays with a crc32c checksum on every chunk,
whole-chunk writes, ``progress``, ``complete`` and the ``generation`` id, the swap of a replaced store, the
sidecar run log -- and every read is checked by it:

* :func:`open_store` refuses anything a learner cannot trust (missing, not a store, incomplete, another
  format version, attributes of the wrong type, dtypes outside the spec, mismatched or absurd shapes, a
  chunk file missing, bad labels) with a one-line :class:`FoalPipeError`, before reading anything whole.
* Reads go through a Zarr store that treats a missing chunk as an error (Zarr's own reads it as zeros), and
  a chunk that fails its checksum or cannot be decoded is named by split and rows.
* :meth:`FeatureStore.check_unchanged` tells a reader whether the store it read is still the one it opened.

Features are never loaded whole: :meth:`Split.iter_chunks` and :meth:`Split.take` read chunk by chunk and
check every row they return for NaN and inf.

A store made with ``extract --keep-blocks`` (format 3) also keeps every block's token (``SPLIT/blocks``, read
with :meth:`Split.read_blocks`/:meth:`Split.take_blocks`) and the final norm (:class:`BlockLayout`);
:meth:`FeatureStore.fused` (or ``open_store(path, fusion=...)``) gives the store with its features fused from
them at read time, :meth:`FeatureStore.fusions` several fusions from one read (:mod:`foal_pipe.blockfusion`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from foal_pipe.blockfusion import (
    NORMS,
    FinalNorm,
    Fusion,
    FusedSplit,
    FusedSplits,
    fused_encoder,
    parse_fusion,
    parse_fusions,
)
from foal_pipe.chunks import (
    REEXTRACT,
    StrictLocalStore,
    check_finite,
    chunk_count,
    chunk_error,
    chunk_grid,
    chunk_span,
    chunk_spans,
    damage_reason,
    leading_chunks,
    missing_chunks,
    read_rows,
    rows_text,
)
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import exchange, write_json
from foal_pipe.lock import exclusive_lock

FORMAT = "foal-pipe/features"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
SPLITS = ("train", "test")
FEATURE_DTYPES = ("float16", "float32", "float64")
BLOCK_DTYPES = ("float16", "float32")
ROW_ARRAYS = ("features", "blocks")
"""The arrays of a split that ``extract`` fills chunk by chunk (``progress`` counts their rows)."""
LOG_SUFFIX = ".log.json"
LABEL_CHUNK_ROWS = 1 << 20
#: Whole-array reads (labels) and single chunks may use at most this share of the available memory.
MEMORY_SHARE = 0.5
#: The label of a row with no class (``extract --dataset images``): a store keeps it, ``learn`` refuses it.
UNLABELLED = -1
_KNOWN_KEYS = ("format", "format_version", "classes", "dataset", "encoder", "complete", "generation")
_WRITE_CONFIG = {"write_empty_chunks": True}  # a chunk equal to the fill value is written too: none is ever absent


# ---------------------------------------------------------------------------------------------------------
# Attributes
# ---------------------------------------------------------------------------------------------------------
def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _versions() -> str:
    """``1, 2 or 3``."""
    *head, last = map(str, READABLE_VERSIONS)
    return f"{', '.join(head)} or {last}" if head else last


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class StoreMeta:
    """Group attributes of a feature store; ``extra`` keeps writer-specific keys verbatim."""

    classes: tuple[str, ...]
    dataset: str
    encoder: dict[str, Any]
    complete: bool = False
    format_version: int = FORMAT_VERSION
    generation: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "format_version": self.format_version,
            "classes": list(self.classes),
            "dataset": self.dataset,
            "encoder": dict(self.encoder),
            "complete": self.complete,
            **self.extra,
        }
        if self.generation is not None:
            out["generation"] = self.generation
        return out

    @classmethod
    def from_dict(cls, attrs: dict[str, Any], where: str = "store") -> StoreMeta:
        if not isinstance(attrs, dict) or attrs.get("format") != FORMAT:
            found = attrs.get("format") if isinstance(attrs, dict) else attrs
            raise FoalPipeError(
                f"{where} is not a foal-pipe feature store (attribute 'format' is {_shown(found)}, expected "
                f"{FORMAT!r}); create one with `foal-pipe extract`"
            )
        version = attrs.get("format_version")
        if type(version) is not int:  # bool is an int subclass, and 1.0 == 1: both are refused here
            raise FoalPipeError(
                f"{where} has format_version {_shown(version)} ({_json_type(version)}), expected an integer "
                f"({_versions()}); fix the attribute or re-extract the store"
            )
        if version not in READABLE_VERSIONS:
            raise FoalPipeError(
                f"{where} has format_version {version} but this foal-pipe reads versions "
                f"{_versions()}; re-extract it with this version or upgrade foal-pipe"
            )
        for key in ("classes", "dataset", "encoder"):
            if key not in attrs:
                raise FoalPipeError(f"{where} lacks the attribute {key!r}; re-extract it with `foal-pipe extract`")
        classes = attrs["classes"]
        if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
            if not isinstance(classes, list):
                found = f"is {_json_type(classes)} ({_shown(classes)})"
            elif not classes:
                found = "is empty"
            else:
                bad = next(c for c in classes if not isinstance(c, str))
                found = f"holds {_json_type(bad)} ({_shown(bad)})"
            raise FoalPipeError(f"{where}: attribute 'classes' must be a non-empty list of class names (strings), "
                                f"but it {found}; fix it or re-extract the store")
        expected = {"dataset": (str,), "encoder": (dict,), "complete": (bool,), "generation": (str,)}
        for key, types in expected.items():
            if key in attrs and not isinstance(attrs[key], types):
                want = {str: "a string", dict: "a mapping", bool: "a boolean"}[types[0]]
                raise FoalPipeError(
                    f"{where}: attribute {key!r} must be {want}, but it is {_json_type(attrs[key])} "
                    f"({_shown(attrs[key])}); fix it or re-extract the store"
                )
        return cls(
            classes=tuple(classes),
            dataset=attrs["dataset"],
            encoder=dict(attrs["encoder"]),
            complete=attrs.get("complete") is True,
            format_version=version,
            generation=attrs.get("generation"),
            extra={k: v for k, v in attrs.items() if k not in _KNOWN_KEYS},
        )


def _canonical(value: Any) -> Any:
    """``value`` with every mapping's keys sorted: the same attributes always give the same bytes."""
    return json.loads(json.dumps(value, sort_keys=True))


def _write_attrs(group: zarr.Group, attrs: dict[str, Any]) -> None:
    group.attrs.put(_canonical(attrs))  # one atomic write of zarr.json


@dataclass(frozen=True)
class BlockLayout:
    """The per-block tokens a store keeps (``extract --keep-blocks``, format 3): ``SPLIT/blocks`` of shape
    ``(N, count, d)`` and ``dtype``, chunked along rows only, and the encoder's final ``norm`` (its kind and
    eps in the attribute ``blocks``, its parameters in the arrays ``norm/<name>``)."""

    count: int
    dtype: str
    norm: FinalNorm

    def to_dict(self) -> dict[str, Any]:
        """The store's ``blocks`` attribute."""
        return {"count": self.count, "dtype": self.dtype, "norm": {"kind": self.norm.kind, "eps": self.norm.eps}}


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------
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
            raise FoalPipeError(f"{self.root}: {self.name} has no {leaf} array; extract the store with --keep-blocks")
        return array

    def _read(self, leaf: str, lo: int, hi: int) -> np.ndarray:
        array = self._array(leaf)
        try:
            block = read_rows(self.root, f"{self.name}/{leaf}", array, lo, hi)
        except FoalPipeError:
            check_same(self.root, self.fingerprint)  # a store swapped underneath is not "damaged"
            raise
        return check_finite(block, self.name, lo, leaf)

    def _take(self, leaf: str, rows: np.ndarray) -> np.ndarray:
        array = self._array(leaf)
        step = int(array.chunks[0])
        order = np.argsort(rows, kind="stable")
        try:
            block = np.asarray(array.get_orthogonal_selection((rows[order],) + (slice(None),) * (array.ndim - 1)))
        except (FoalPipeError, MemoryError):
            raise
        except Exception as exc:
            for first in np.unique(rows // step):  # name the first chunk that fails on its own
                lo = int(first) * step
                self._read(leaf, lo, min(lo + step, self.n_rows))
            check_same(self.root, self.fingerprint)
            raise chunk_error(self.root, f"{self.name}/{leaf}", array, int(rows.min()) // step, exc) from None
        out = np.empty_like(block)
        out[order] = block
        return check_finite(out, self.name, rows, leaf)

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
    for name in ("zarr.json", ".zattrs"):
        meta_file = path / name
        if meta_file.is_file():
            raw = meta_file.read_bytes()
            doc = json.loads(raw)
            attrs = (doc.get("attributes", {}) if name == "zarr.json" else doc) if isinstance(doc, dict) else {}
            break
    else:
        raise FileNotFoundError(path / "zarr.json")
    generation = attrs.get("generation") if isinstance(attrs, dict) else None
    complete = isinstance(attrs, dict) and attrs.get("complete") is True
    return st.st_dev, st.st_ino, generation or hashlib.sha256(raw).hexdigest()[:32], complete


@dataclass
class FeatureStore:
    """An opened, validated, complete feature store."""

    path: Path
    meta: StoreMeta
    train: Split | FusedSplit
    test: Split | FusedSplit
    fingerprint: tuple[Any, ...] = ()
    blocks: BlockLayout | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        return self.meta.classes

    def check_labelled(self) -> None:
        """Refuse a store whose train split is empty or holds unlabelled rows (``extract --dataset images``)."""
        train = self.train.labels
        unlabelled = int((train == UNLABELLED).sum()) if train.size else 0
        if train.size == 0 or unlabelled:
            what = "no train rows" if train.size == 0 else f"{unlabelled:,} unlabelled train rows (label -1)"
            raise FoalPipeError(
                f"{self.path} has {what}: it was extracted from unlabelled images, so there is nothing to learn; "
                "extract labelled images (--dataset imagefolder) to learn, or predict on it with `foal-pipe predict`"
            )

    @property
    def dim(self) -> int:
        return self.train.dim

    def split(self, name: str) -> Split | FusedSplit:
        return {"train": self.train, "test": self.test}[name]

    def _layout(self, fusions: str) -> BlockLayout:
        if self.blocks is None or isinstance(self.train, FusedSplit):
            raise FoalPipeError(f"feature store {self.path} keeps no per-block tokens, so fusion {fusions} cannot be "
                                "computed from it; extract a store that does with `foal-pipe extract ... "
                                "--keep-blocks`, or use its features as they are (no fusion)")
        return self.blocks

    def fused(self, fusion: str | Fusion, norm: bool = True) -> FeatureStore:
        """This store with ``train`` and ``test`` fused from the stored blocks at read time (``fusion``: a
        :func:`~foal_pipe.blockfusion.parse_fusion` spec; ``norm=False`` skips the final norm). The ``encoder``
        attribute of the result names the fusion, so a model trained on it is refused on other features."""
        fusion = parse_fusion(fusion)
        layout = self._layout(repr(fusion.text))
        final = layout.norm if norm else None
        train, test = FusedSplit(self.train, fusion, final), FusedSplit(self.test, fusion, final)
        meta = StoreMeta(self.meta.classes, self.meta.dataset,
                         fused_encoder(self.meta.encoder, fusion, norm, layout.dtype), self.meta.complete,
                         self.meta.format_version, self.meta.generation, self.meta.extra)
        return FeatureStore(self.path, meta, train, test, self.fingerprint, layout)

    def fusions(self, fusions: str | Sequence[str | Fusion], norm: bool = True) -> dict[str, FusedSplits]:
        """Several fusions at once (``sweep --fusions``): ``{"train": FusedSplits, "test": FusedSplits}``, whose
        ``iter_chunks()``/``take(rows)`` give ``{spec: features}`` from one read of each blocks chunk."""
        fusions = parse_fusions(fusions)
        layout = self._layout(", ".join(repr(f.text) for f in fusions))
        return {name: FusedSplits(self.split(name), fusions, layout.norm if norm else None) for name in SPLITS}

    def check_unchanged(self) -> None:
        """Raise :class:`FoalPipeError` if the store on disk is no longer the complete store that was opened
        (replaced by ``extract --overwrite``, re-extracted, removed): call it after reading, before writing
        results, so results computed from a store that changed underneath are never reported."""
        check_same(self.path, self.fingerprint)


def check_same(path: Path, fingerprint: tuple[Any, ...]) -> None:
    """Raise if the store at ``path`` no longer has ``fingerprint`` (see :func:`_fingerprint`); no-op for ()."""
    if not fingerprint:
        return
    try:
        now = _fingerprint(path)
    except (OSError, ValueError):
        now = None
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


def _open_group(path: Path) -> zarr.Group:
    meta_file = path / "zarr.json"
    if not meta_file.is_file() and not (path / ".zgroup").is_file():
        raise FoalPipeError(
            f"{path} is not a Zarr feature store; point --features at a directory made by `foal-pipe extract`"
        )
    try:
        return zarr.open_group(store=StrictLocalStore(str(path), read_only=True), mode="r")
    except OSError as exc:
        if exc.errno is not None:
            raise FoalPipeError(f"cannot read feature store {path}: {exc.strerror}; check the path") from None
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
    except Exception as exc:  # zarr raises several types for unparsable metadata
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
    raise FoalPipeError(f"the group metadata of {path} is corrupt ({detail}); re-extract the store or restore it "
                        "from a copy")


def read_meta(path: str | Path) -> tuple[zarr.Group, StoreMeta]:
    """Open the group at ``path`` and parse its attributes, without requiring ``complete``."""
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        dangling = " (a symlink to nothing)" if path.is_symlink() else ""
        raise FoalPipeError(f"feature store {path} does not exist{dangling}; create it with `foal-pipe extract` or "
                            "check the path") from None
    except OSError as exc:
        raise FoalPipeError(f"cannot open feature store {path}: {exc.strerror or exc}; point --features at the "
                            "store directory itself") from None
    if not path.is_dir():
        raise FoalPipeError(f"{path} is a file, not a feature store (a .zarr directory); point --features at "
                            "a directory made by `foal-pipe extract`")
    group = _open_group(path)
    return group, StoreMeta.from_dict(dict(group.attrs), where=str(path))


def open_array(group: zarr.Group, path: Path, name: str) -> zarr.Array:
    """Array ``name`` of the group; a missing array or unreadable metadata is one clear error."""
    try:
        node = group[name]
    except KeyError:
        if (path / name / "zarr.json").is_file():  # zarr reports metadata it cannot parse as a missing node
            raise FoalPipeError(f"{path / name}/zarr.json is corrupt (not valid array metadata); {REEXTRACT}") from None
        raise FoalPipeError(f"feature store {path} has no {name} array; {REEXTRACT}") from None
    except OSError as exc:
        raise FoalPipeError(f"cannot read {path / name}: {exc.strerror or exc}; {REEXTRACT}") from None
    except Exception as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise FoalPipeError(f"{path / name}/zarr.json is corrupt ({detail}); {REEXTRACT}") from None
    if not isinstance(node, zarr.Array):
        raise FoalPipeError(f"{path / name} is a group, not an array; {REEXTRACT}")
    return node


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_size(path: Path, what: str, nbytes: int, fix: str) -> None:
    """Refuse, before reading, a block that cannot fit in memory (absurd shapes in hand-made metadata)."""
    available = _available_memory()
    if nbytes > MEMORY_SHARE * available:
        raise FoalPipeError(f"{path}: {what} needs {nbytes / 2**30:,.1f} GiB in memory, more than half of the "
                            f"{available / 2**30:,.1f} GiB available; {fix}")


def _group_arrays(group: zarr.Group, path: Path) -> dict[str, zarr.Array]:
    """Every array in the store, by path."""
    try:
        return {name: node for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)}
    except OSError as exc:
        raise FoalPipeError(f"cannot list feature store {path}: {exc.strerror or exc}; {REEXTRACT}") from None
    except Exception as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise FoalPipeError(f"feature store {path} has corrupt array metadata ({detail}); {REEXTRACT}") from None


def check_chunks(path: Path, group: zarr.Group, progress: dict[str, int] | None = None) -> None:
    """Every chunk file of every array exists (a listing, nothing is read); features and blocks of split ``s``
    only below ``progress[s]`` when given (an incomplete store)."""
    for name, array in sorted(_group_arrays(group, path).items()):
        split, _, leaf = name.partition("/")
        below = progress.get(split) if progress is not None and leaf in ROW_ARRAYS else None
        try:
            count, first = missing_chunks(path, array, below, limit=1)
        except OSError as exc:
            raise FoalPipeError(f"cannot list {path / name}: {exc.strerror or exc}; {REEXTRACT}") from None
        if count:
            where = rows_text(chunk_span(array, first[0][0]))
            raise FoalPipeError(f"{path}: {name} has {count:,} of {chunk_count(array):,} chunk files missing "
                                f"(first at {where}); the store is damaged: {REEXTRACT}")


def open_store(path: str | Path, fusion: str | Fusion | None = None, fusion_norm: bool = True) -> FeatureStore:
    """Open a store for reading and validate everything a learner relies on; with ``fusion``, its features
    are fused from the stored blocks at read time (:meth:`FeatureStore.fused`)."""
    path = Path(path)
    try:  # first: a store swapped from here on is noticed by check_unchanged
        fingerprint = _fingerprint(path)
    except (OSError, ValueError):
        fingerprint = ()
    group, meta = read_meta(path)  # the precise error when the attributes cannot be read
    if not meta.complete:
        raise FoalPipeError(
            f"feature store {path} is not complete (extraction unfinished or interrupted); "
            "re-run the same `foal-pipe extract` command to resume it"
        )
    if not fingerprint:
        raise FoalPipeError(f"cannot read the attributes file of {path}; {REEXTRACT}")
    arrays = {}
    for name in SPLITS:
        features = open_array(group, path, f"{name}/features")
        labels = open_array(group, path, f"{name}/labels")
        if features.ndim != 2 or labels.shape != (features.shape[0],):
            raise FoalPipeError(
                f"{name}/features {features.shape} and {name}/labels {labels.shape} do not match "
                f"in {path}; expected (N, d) and (N,); re-extract it"
            )
        if features.dtype.name not in FEATURE_DTYPES:
            raise FoalPipeError(f"{name}/features in {path} has dtype {features.dtype}, outside the spec "
                                f"({', '.join(FEATURE_DTYPES)}); re-extract it with --dtype float32")
        if not np.issubdtype(labels.dtype, np.integer):
            raise FoalPipeError(f"{name}/labels in {path} has dtype {labels.dtype}, expected integers; re-extract it")
        arrays[name] = features, labels
    check_chunks(path, group)
    splits = {}
    for name, (features, labels) in arrays.items():
        n = int(labels.shape[0])
        _check_size(path, f"{name}/labels ({n:,} rows)", 2 * n * 8, "this is not a store extract writes: re-extract it")
        chunk_bytes = int(features.chunks[0]) * int(features.chunks[1]) * features.dtype.itemsize
        _check_size(path, f"one {name}/features chunk ({features.chunks[0]:,} x {features.chunks[1]:,})",
                    chunk_bytes, "re-extract it with a smaller --chunk-rows")
        y = read_rows(path, f"{name}/labels", labels, 0, n)
        if y.size and (y.min() < UNLABELLED or y.max() >= len(meta.classes)):
            bad = int(np.flatnonzero((y < UNLABELLED) | (y >= len(meta.classes)))[0])
            raise FoalPipeError(
                f"{name}/labels in {path} has label {int(y[bad])} at row {bad}, outside [0, {len(meta.classes)}) "
                "(the number of classes) and not -1 (unlabelled); fix the labels or the 'classes' attribute"
            )
        splits[name] = Split(name, features, y.astype(np.int64), path, fingerprint)
    if splits["train"].dim != splits["test"].dim:
        raise FoalPipeError(
            f"train features have {splits['train'].dim} dimensions but test features have "
            f"{splits['test'].dim} in {path}; extract both splits with the same encoder"
        )
    layout = None
    if "blocks" in meta.extra:
        layout = _read_layout(group, path, meta.extra["blocks"], splits["train"].dim)
        for split in splits.values():
            split.blocks = _blocks_array(group, path, split, layout)
    store = FeatureStore(path, meta, splits["train"], splits["test"], fingerprint, layout)
    return store if fusion is None else store.fused(fusion, fusion_norm)


def _read_layout(group: zarr.Group, path: Path, attr: Any, dim: int) -> BlockLayout:
    """The ``blocks`` attribute and the final norm's parameter arrays, checked."""
    norm = attr.get("norm") if isinstance(attr, dict) else None
    count, dtype = (attr.get("count"), attr.get("dtype")) if isinstance(attr, dict) else (None, None)
    if (type(count) is not int or count < 1 or dtype not in BLOCK_DTYPES or not isinstance(norm, dict)
            or not isinstance(norm.get("kind"), str) or type(norm.get("eps")) not in (int, float)
            or not norm["eps"] >= 0):
        raise FoalPipeError(f"{path}: attribute 'blocks' is {_shown(attr)}, expected count (an integer >= 1), dtype "
                            f"({' or '.join(BLOCK_DTYPES)}) and norm (kind and eps >= 0); {REEXTRACT}")
    if norm["kind"] not in NORMS:
        raise FoalPipeError(f"{path}: final norm kind {norm['kind']!r} is not one foal-pipe recomputes "
                            f"({', '.join(NORMS)}); upgrade foal-pipe or re-extract the store")
    parameters = {}
    for name in NORMS[norm["kind"]][1]:
        array = open_array(group, path, f"norm/{name}")
        if array.shape != (dim,) or array.dtype.kind != "f":
            raise FoalPipeError(f"norm/{name} in {path} is {array.dtype} {array.shape}, expected floats of shape "
                                f"({dim},) (the feature dimension); {REEXTRACT}")
        parameters[name] = check_finite(read_rows(path, f"norm/{name}", array, 0, dim)[None], "norm", 0, name)[0]
    return BlockLayout(count, dtype, FinalNorm(norm["kind"], float(norm["eps"]), **parameters))


def _blocks_array(group: zarr.Group, path: Path, split: Split, layout: BlockLayout) -> zarr.Array:
    """``SPLIT/blocks``, checked against the layout and the split's features (chunked along rows only)."""
    name = f"{split.name}/blocks"
    array = open_array(group, path, name)
    want = (split.n_rows, layout.count, split.dim)
    if array.shape != want or array.dtype.name != layout.dtype or tuple(array.chunks[1:]) != want[1:]:
        raise FoalPipeError(f"{name} in {path} is {array.dtype} {array.shape} in chunks of {array.chunks}, expected "
                            f"{layout.dtype} {want} chunked along rows only (rows, {layout.count}, {split.dim}); "
                            f"{REEXTRACT}")
    chunk_bytes = int(array.chunks[0]) * layout.count * split.dim * array.dtype.itemsize
    _check_size(path, f"one {name} chunk ({array.chunks[0]:,} x {layout.count} x {split.dim:,})", chunk_bytes,
                "re-extract it with a smaller --chunk-rows")
    return array


def has_checksums(array: zarr.Array) -> bool:
    """Whether every chunk of ``array`` carries a crc32c checksum (format versions 2 and 3 write one)."""
    return any(isinstance(codec, Crc32cCodec) for codec in getattr(array.metadata, "codecs", ()))


# ---------------------------------------------------------------------------------------------------------
# Verification: read everything
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkProblem:
    """Rows ``[lo, hi)`` of ``array`` (e.g. ``train/features``) are ``missing`` or ``damaged`` (with why)."""

    array: str
    lo: int
    hi: int
    problem: str

    def __str__(self) -> str:
        where = f" {rows_text((self.lo, self.hi))}" if self.hi > self.lo else ""
        return f"{self.array}{where}: {self.problem}"


@dataclass
class Verification:
    """What :func:`verify_store` found: how many chunks it read, and the problems (none: the store is intact)."""

    chunks_read: int
    problems: list[ChunkProblem]


def _merge(problems: list[ChunkProblem]) -> list[ChunkProblem]:
    out: list[ChunkProblem] = []
    for p in problems:
        if out and out[-1].array == p.array and out[-1].problem == p.problem and out[-1].hi == p.lo:
            out[-1] = ChunkProblem(p.array, out[-1].lo, p.hi, p.problem)
        else:
            out.append(p)
    return out


def verify_store(path: str | Path, read: bool = True, max_listed: int = 10**4) -> Verification:
    """Report the missing chunk files of every array (features and blocks of an incomplete store only below
    its ``progress``) by array and rows, from a listing; with ``read``, also read every chunk (checksum, decoding,
    NaN/inf in features) and recompute a complete store's generation id. An array with more than
    ``max_listed`` missing chunks is reported as one problem."""
    path = Path(path)
    group, meta = read_meta(path)
    progress = None
    if not meta.complete:
        recorded = meta.extra.get("progress")
        progress = recorded if isinstance(recorded, dict) else {}
    problems: list[ChunkProblem] = []
    n_read = 0
    arrays = _group_arrays(group, path)
    for name, array in sorted(arrays.items()):
        split, _, leaf = name.partition("/")
        below = None
        if progress is not None and leaf in ROW_ARRAYS:
            below = progress.get(split, 0) if type(progress.get(split, 0)) is int else 0
        try:
            count, missing = missing_chunks(path, array, below, limit=max_listed)
        except OSError as exc:
            raise FoalPipeError(f"cannot list {path / name}: {exc.strerror or exc}; {REEXTRACT}") from None
        if count > len(missing):
            problems.append(ChunkProblem(name, 0, int(array.shape[0]), f"{count:,} chunk files missing"))
            continue
        problems += [ChunkProblem(name, *chunk_span(array, c[0]), "missing") for c in missing]
        if not read:
            continue
        gone = set(missing)
        for coords in np.ndindex(leading_chunks(array, below), *chunk_grid(array)[1:]):
            if coords in gone:
                continue
            try:
                block = np.asarray(array.blocks[coords])
            except (MemoryError, FoalPipeError):
                raise
            except Exception as exc:
                problems.append(ChunkProblem(name, *chunk_span(array, coords[0]), damage_reason(exc)))
                continue
            n_read += 1
            if leaf in ROW_ARRAYS and block.dtype.kind == "f" and not np.isfinite(block).all():
                lo = chunk_span(array, coords[0])[0]
                finite = np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
                problems.append(ChunkProblem(name, *chunk_span(array, coords[0]), "NaN or inf values (first at row "
                                f"{lo + int(np.flatnonzero(~finite)[0]):,})"))
    if read and meta.complete and meta.generation is not None and not problems:
        if compute_generation(path, group) != meta.generation:
            problems.append(ChunkProblem("(whole store)", 0, 0, "its files changed after it was completed "
                                         "(generation id mismatch)"))
    return Verification(n_read, _merge(problems))


# ---------------------------------------------------------------------------------------------------------
# Writing (foal-pipe's writers, and other code that wants the same checks)
# ---------------------------------------------------------------------------------------------------------
@contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Turn an OS error while writing (no space, read-only, no permission) into one line."""
    try:
        yield
    except OSError as exc:
        raise FoalPipeError(f"cannot write {what} of {path}: {exc.strerror or exc}; free some space or make it "
                            "writable, then re-run the same command (a store resumes after its last chunk)") from None


def create_array(group: zarr.Group, name: str, shape: tuple[int, ...], chunks: tuple[int, ...],
                 dtype: str) -> zarr.Array:
    """An array in the store's codec pipeline (bytes, zstd, crc32c), every chunk written even when empty."""
    return group.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
                              serializer=BytesCodec(endian="little"),
                              compressors=(ZstdCodec(level=0, checksum=False), Crc32cCodec()),
                              config=_WRITE_CONFIG)


def create_skeleton(where: str | Path, meta: StoreMeta, dim: int, dtype: str, chunk_rows: int,
                    labels: dict[str, np.ndarray], index: dict[str, np.ndarray] | None = None,
                    blocks: BlockLayout | None = None) -> None:
    """A new, incomplete store at ``where``: labels, row indices, empty feature arrays chunked along rows (and,
    with ``blocks``, empty ``SPLIT/blocks`` arrays chunked the same way, the final norm's parameters and the
    ``blocks`` attribute), and the attributes with ``progress`` 0, written last.

    It is built in ``.<name>.creating`` beside ``where`` and renamed into place (replacing an empty folder or
    an older skeleton there), so an interrupted creation leaves nothing at ``where``.
    """
    if dtype not in FEATURE_DTYPES:
        raise FoalPipeError(f"feature dtype {dtype!r} is outside the spec; choose one of {', '.join(FEATURE_DTYPES)}")
    if blocks is not None and blocks.dtype not in BLOCK_DTYPES:
        raise FoalPipeError(f"blocks dtype {blocks.dtype!r} is outside the spec; choose one of "
                            f"{', '.join(BLOCK_DTYPES)}")
    where = Path(where)
    tmp = where.parent / f".{where.name}.creating"
    extra = dict(meta.extra)
    with _writing(where, "the skeleton"):
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
            attrs = StoreMeta(meta.classes, meta.dataset, meta.encoder, False, FORMAT_VERSION, None, extra).to_dict()
            _write_attrs(group, {**attrs, "progress": {split: 0 for split in SPLITS}})
            if where.exists():
                shutil.rmtree(where)
            os.replace(tmp, where)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


class FeatureWriter:
    """Writes whole chunks of one split's features -- and, in a store that keeps them, the same rows' block
    tokens -- into an existing store (each write one chunk file, written atomically: a kill leaves the old file
    or the new one, never a torn one)."""

    def __init__(self, path: str | Path, split: str):
        self.path, self.split = Path(path), split
        with _writing(self.path, f"{split}/features"):
            group = zarr.open_group(str(self.path), mode="r+")
            self.array = group[f"{split}/features"].with_config(_WRITE_CONFIG)
            self.blocks = group[f"{split}/blocks"].with_config(_WRITE_CONFIG) if "blocks" in group.attrs else None
        self.n_rows, self.chunk_rows = int(self.array.shape[0]), int(self.array.chunks[0])

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
        with _writing(self.path, f"{self.split} rows [{lo}, {hi})"):
            if self.blocks is not None:
                self.blocks[lo:hi] = blocks
            self.array[lo:hi] = block


def _open_rw(path: Path) -> tuple[zarr.Group, dict[str, Any]]:
    with _writing(path, "the attributes"):
        group = zarr.open_group(str(path), mode="r+")
        return group, dict(group.attrs)


def mark_progress(path: str | Path, split: str, rows: int) -> None:
    """Record that rows ``[0, rows)`` of ``split`` are written (one atomic metadata write)."""
    path = Path(path)
    group, attrs = _open_rw(path)
    progress = dict(attrs.get("progress", {}))
    progress[split] = int(rows)
    with _writing(path, "the progress"):
        _write_attrs(group, {**attrs, "progress": progress})


def reopen_at(path: str | Path, progress: dict[str, int]) -> None:
    """Move ``progress`` back (a hole was found below it) and clear ``complete``: the rows from there on are
    extracted again."""
    path = Path(path)
    group, attrs = _open_rw(path)
    attrs.pop("generation", None)
    with _writing(path, "the progress"):
        _write_attrs(group, {**attrs, "progress": dict(progress), "complete": False})


def remove_partial_files(path: str | Path) -> int:
    """Delete ``*.partial`` files that Zarr's atomic writes leave behind when a writer is killed mid-write."""
    removed = 0
    for stray in Path(path).rglob("*.partial"):
        stray.unlink(missing_ok=True)
        removed += 1
    return removed


def compute_generation(path: str | Path, group: zarr.Group | None = None) -> str:
    """The store's generation id: a hash of its attributes (but ``complete`` and ``generation``), every array's
    metadata, and every chunk's key, size and last 4 bytes (its crc32c checksum since format 2). The same data
    written with the same settings gives the same id; a store replaced by other data gives another."""
    path = Path(path)
    group = group or zarr.open_group(str(path), mode="r")
    digest = hashlib.sha256()
    attrs = {k: v for k, v in dict(group.attrs).items() if k not in ("complete", "generation")}
    digest.update(json.dumps(attrs, sort_keys=True).encode())
    for name, array in sorted(_group_arrays(group, path).items()):
        digest.update(f"\n{name}\n".encode() + (path / name / "zarr.json").read_bytes())
        for coords in np.ndindex(*chunk_grid(array)):
            key = array.metadata.encode_chunk_key(tuple(int(c) for c in coords))
            with open(path / name / key, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 4))
                digest.update(f"{key} {size} ".encode() + f.read())
    return digest.hexdigest()[:32]


def complete_store(path: str | Path) -> str:
    """Mark a fully written store complete (one attribute write, last) and return its generation id; refused
    while any split's ``progress`` is short of its rows or any chunk file is missing."""
    path = Path(path)
    group, attrs = _open_rw(path)
    progress = attrs.get("progress", {})
    for split in SPLITS:
        n = int(group[f"{split}/features"].shape[0])
        if int(progress.get(split, 0)) != n:
            raise FoalPipeError(f"{path}: {split} has {progress.get(split, 0)} of {n} rows written; finish the "
                                "extraction (re-run the same command) before marking it complete")
    check_chunks(path, group)
    remove_partial_files(path)
    generation = compute_generation(path, group)
    with _writing(path, "the attributes"):
        _write_attrs(group, {**attrs, "complete": True, "generation": generation})
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
    ``norm`` (default: none, ``identity``)."""
    encoder = encoder or {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}
    path = Path(path)
    dim = int(train[0].shape[1])
    layout = None
    if blocks is not None:
        layout = BlockLayout(int(blocks[0].shape[1]), np.asarray(blocks[0]).dtype.name, norm or FinalNorm("identity"))
    create_skeleton(path, StoreMeta(tuple(classes), dataset, encoder), dim, dtype, chunk_rows,
                    {name: y for name, (_, y) in zip(SPLITS, (train, test))}, blocks=layout)
    for i, (name, (x, _)) in enumerate(zip(SPLITS, (train, test))):
        writer = FeatureWriter(path, name)
        for lo in range(0, writer.n_rows, writer.chunk_rows):
            hi = lo + writer.chunk_rows
            writer.write(lo, np.asarray(x[lo:hi], dtype=dtype), None if blocks is None else blocks[i][lo:hi])
        mark_progress(path, name, writer.n_rows)
    complete_store(path)
    return path


def replace_store(new: str | Path, out: str | Path) -> None:
    """Put the store built at ``new`` in place of ``out`` (one atomic exchange where Linux allows) and delete
    the old one; the sidecar log moves with it. A reader of the old store notices (see ``check_unchanged``)."""
    new, out = Path(new), Path(out)
    with _writing(out, "the replaced store"):
        if out.exists() and exchange(new, out):
            shutil.rmtree(new)
        else:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            if out.exists():
                os.rename(out, old)
            os.rename(new, out)
            shutil.rmtree(old, ignore_errors=True)
        new_log = log_path(new)
        if new_log.exists():
            os.replace(new_log, log_path(out))
        else:
            log_path(out).unlink(missing_ok=True)


def writer_lock(path: str | Path) -> Any:
    """The exclusive lock every writer of the store at ``path`` holds (``<path>.lock``; see foal_pipe.lock)."""
    return exclusive_lock(path, f"feature store {path}")


# ---------------------------------------------------------------------------------------------------------
# The sidecar run log: what varies from run to run stays out of the store
# ---------------------------------------------------------------------------------------------------------
def log_path(path: str | Path) -> Path:
    """``<store>.log.json`` beside the store: timestamps, durations, host, device and versions of each run."""
    return Path(str(path) + LOG_SUFFIX)


def read_log(path: str | Path) -> dict[str, Any] | None:
    """The store's run log, or None when there is none or it is unreadable (it is informational only)."""
    try:
        log = json.loads(log_path(path).read_text())
    except (OSError, ValueError):
        return None
    return log if isinstance(log, dict) and isinstance(log.get("runs"), list) else None


def log_run(path: str | Path, entry: dict[str, Any], fresh: bool = False) -> None:
    """Append a run to the store's log (a new log when ``fresh``: the store was just created)."""
    log = None if fresh else read_log(path)
    log = log or {"store": Path(path).name, "runs": []}
    log["runs"].append(entry)
    with _writing(Path(path), "the run log"):
        write_json(log_path(path), log)


def update_run(path: str | Path, fields: dict[str, Any]) -> None:
    """Add ``fields`` to the last run of the store's log."""
    log = read_log(path) or {"store": Path(path).name, "runs": [{}]}
    log["runs"][-1] = {**log["runs"][-1], **fields}
    with _writing(Path(path), "the run log"):
        write_json(log_path(path), log)
