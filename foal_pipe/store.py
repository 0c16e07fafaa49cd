"""The feature store: the Zarr contract between ``extract`` and ``learn`` (docs/feature-store.md).

Readers go through :func:`open_store`, which refuses anything a learner cannot trust (missing, not a
store, incomplete, another format version, mismatched splits, bad labels) with a one-line
:class:`FoalPipeError`. Features are never loaded whole: :meth:`Split.iter_chunks` and
:meth:`Split.take` read chunk by chunk and check every row they return for NaN and inf.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.errors import FoalPipeError

FORMAT = "foal-pipe/features"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
_KNOWN_KEYS = ("format", "format_version", "classes", "dataset", "encoder", "complete")


@dataclass(frozen=True)
class StoreMeta:
    """Group attributes of a feature store; ``extra`` keeps writer-specific keys verbatim."""

    classes: tuple[str, ...]
    dataset: str
    encoder: dict[str, Any]
    complete: bool = False
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "classes": list(self.classes),
            "dataset": self.dataset,
            "encoder": dict(self.encoder),
            "complete": self.complete,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, attrs: dict[str, Any], where: str = "store") -> StoreMeta:
        if attrs.get("format") != FORMAT:
            raise FoalPipeError(
                f"{where} is not a foal-pipe feature store (attribute 'format' is "
                f"{attrs.get('format')!r}, expected {FORMAT!r}); create one with `foal-pipe extract`"
            )
        version = attrs.get("format_version")
        if version != FORMAT_VERSION:
            raise FoalPipeError(
                f"{where} has format_version {version!r} but this foal-pipe reads version "
                f"{FORMAT_VERSION}; re-extract it with this version or upgrade foal-pipe"
            )
        for key in ("classes", "dataset", "encoder"):
            if key not in attrs:
                raise FoalPipeError(f"{where} lacks the attribute {key!r}; re-extract it with `foal-pipe extract`")
        return cls(
            classes=tuple(str(c) for c in attrs["classes"]),
            dataset=str(attrs["dataset"]),
            encoder=dict(attrs["encoder"]),
            complete=attrs.get("complete") is True,
            format_version=version,
            extra={k: v for k, v in attrs.items() if k not in _KNOWN_KEYS},
        )


def check_finite(block: np.ndarray, split: str, rows: np.ndarray | int) -> np.ndarray:
    """``block`` if every value is finite, else an error naming the split and the first bad row.

    ``rows`` is the store row of ``block[0]`` (contiguous rows) or the store row of every block row.
    """
    finite = np.isfinite(block).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        row = int(rows + bad) if isinstance(rows, int) else int(rows[bad])
        raise FoalPipeError(
            f"{split}/features has NaN or inf values (first bad row: {row}); "
            "re-extract the store (try `--dtype float32` if it was float16)"
        )
    return block


@dataclass
class Split:
    """One split (``train`` or ``test``): features stay on disk, labels (small) are held in memory."""

    name: str
    features: zarr.Array
    labels: np.ndarray

    @property
    def n_rows(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def chunk_rows(self) -> int:
        return int(self.features.chunks[0])

    def _checked(self, block: np.ndarray, rows: np.ndarray | int) -> np.ndarray:
        return check_finite(block, self.name, rows)

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_row, features)`` for each stored chunk in ``[start, stop)``, in row order."""
        stop = self.n_rows if stop is None else stop
        step = self.chunk_rows
        for lo in range(start - start % step, stop, step):
            lo, hi = max(lo, start), min(lo + step, stop)
            yield lo, self._checked(np.asarray(self.features[lo:hi]), lo)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows in the given order, reading each touched chunk once (orthogonal selection)."""
        order = np.argsort(rows, kind="stable")
        block = np.asarray(self.features.get_orthogonal_selection((rows[order], slice(None))))
        out = np.empty_like(block)
        out[order] = block
        return self._checked(out, rows)


@dataclass
class FeatureStore:
    """An opened, validated, complete feature store."""

    path: Path
    meta: StoreMeta
    train: Split
    test: Split

    @property
    def classes(self) -> tuple[str, ...]:
        return self.meta.classes

    @property
    def dim(self) -> int:
        return self.train.dim

    def split(self, name: str) -> Split:
        return {"train": self.train, "test": self.test}[name]


def read_meta(path: str | Path) -> tuple[zarr.Group, StoreMeta]:
    """Open the group at ``path`` and parse its attributes, without requiring ``complete``."""
    path = Path(path)
    if not path.exists():
        raise FoalPipeError(f"feature store {path} does not exist; create it with `foal-pipe extract` or check the path")
    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception:  # zarr raises several types for "not a group"
        raise FoalPipeError(
            f"{path} is not a Zarr feature store; point --features at a directory made by `foal-pipe extract`"
        ) from None
    return group, StoreMeta.from_dict(dict(group.attrs), where=str(path))


def open_store(path: str | Path) -> FeatureStore:
    """Open a store for reading and validate everything a learner relies on."""
    group, meta = read_meta(path)
    if not meta.complete:
        raise FoalPipeError(
            f"feature store {path} is not complete (extraction unfinished or interrupted); "
            "re-run the same `foal-pipe extract` command to resume it"
        )
    splits = {}
    for name in SPLITS:
        try:
            features, labels = group[f"{name}/features"], group[f"{name}/labels"]
        except KeyError:
            raise FoalPipeError(
                f"feature store {path} has no {name}/features or {name}/labels array; re-extract it"
            ) from None
        if features.ndim != 2 or labels.shape != (features.shape[0],):
            raise FoalPipeError(
                f"{name}/features {features.shape} and {name}/labels {labels.shape} do not match "
                f"in {path}; expected (N, d) and (N,); re-extract it"
            )
        y = np.asarray(labels[:])
        if not np.issubdtype(y.dtype, np.integer):
            raise FoalPipeError(f"{name}/labels in {path} has dtype {y.dtype}, expected integers; re-extract it")
        if y.size and (y.min() < 0 or y.max() >= len(meta.classes)):
            bad = int(np.flatnonzero((y < 0) | (y >= len(meta.classes)))[0])
            raise FoalPipeError(
                f"{name}/labels in {path} has label {int(y[bad])} at row {bad}, outside [0, {len(meta.classes)}) "
                "(the number of classes); fix the labels or the 'classes' attribute"
            )
        splits[name] = Split(name, features, y.astype(np.int64))
    if splits["train"].dim != splits["test"].dim:
        raise FoalPipeError(
            f"train features have {splits['train'].dim} dimensions but test features have "
            f"{splits['test'].dim} in {path}; extract both splits with the same encoder"
        )
    return FeatureStore(Path(path), meta, splits["train"], splits["test"])


def write_split(
    group: zarr.Group,
    name: str,
    features: np.ndarray,
    labels: np.ndarray,
    chunk_rows: int = 4096,
    dtype: str = "float32",
) -> None:
    """Write a whole in-memory split: for tests, benchmarks and small datasets (extract streams instead)."""
    n, d = features.shape
    arr = group.create_array(f"{name}/features", shape=(n, d), chunks=(min(chunk_rows, max(n, 1)), d), dtype=dtype)
    arr[:] = features.astype(dtype)
    lab = group.create_array(f"{name}/labels", shape=(n,), chunks=(max(n, 1),), dtype="int64")
    lab[:] = labels.astype(np.int64)


def write_store(
    path: str | Path,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    classes: list[str],
    dataset: str = "synthetic",
    encoder: dict[str, Any] | None = None,
    chunk_rows: int = 4096,
    dtype: str = "float32",
) -> Path:
    """Write a complete store from in-memory arrays; ``complete`` is set last."""
    encoder = encoder or {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}
    meta = StoreMeta(classes=tuple(classes), dataset=dataset, encoder=encoder)
    group = zarr.open_group(str(path), mode="w")
    group.attrs.update(meta.to_dict())
    for name, (x, y) in zip(SPLITS, (train, test)):
        write_split(group, name, x, y, chunk_rows=chunk_rows, dtype=dtype)
    group.attrs["complete"] = True
    return Path(path)
