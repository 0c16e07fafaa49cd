"""The store's integrity data (format 4): what binds every chunk file to its position, and every attribute and
array's metadata to the store's generation id.

A chunk's CRC-32C covers only its own bytes, so a chunk file moved or copied to another position still passes
it. At completion the writer records, in each array's ``chunk_files`` attribute, the size and the CRC-32C of
every chunk file in chunk order (:func:`record_chunks`); the generation id then hashes the attributes and every
array's ``zarr.json`` (records included). A reader recomputes the id from the metadata alone (a few small files,
:func:`~foal_pipe.store.read.check_sealed`) -- an edited attribute, shape, norm or record is refused when the
store is opened -- and checks each chunk file against its record when it reads it
(:class:`~foal_pipe.store.chunks.StrictLocalStore`): a chunk in the wrong place is refused by the ordinary read,
at no cost beyond comparing 4 bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.group import GroupMetadata

from foal_pipe.errors import FoalPipeError, limit_failure
from foal_pipe.store.chunks import (
    REEXTRACT,
    StrictLocalStore,
    chunk_count,
    chunk_grid,
    chunk_span,
    grid_coords,
    missing_chunks,
    rows_text,
    sharding_problem,
)
from foal_pipe.store.meta import METADATA_ERRORS, ROW_ARRAYS, StoreMeta, shown, store_group

#: The first format version with integrity data.
SEALED_FROM = 4
#: The array attribute holding each chunk file's size and CRC-32C.
CHUNK_FILES = "chunk_files"
#: The fix for a format-4 store written without its integrity data (by another program).
UNSEALED_FIX = ("complete it with foal_pipe.store.complete_store (which writes the chunk records and the generation "
                "id once the attribute 'progress' names every row), or declare format_version 3")


#: The refusal under Python's optimisation mode (``python -O``, ``PYTHONOPTIMIZE``) where zarr cannot read a store there.
OPTIMIZED = "run without -O / PYTHONOPTIMIZE: zarr 3.1 reads store metadata inside assert statements, which -O strips"


def optimized_problem() -> str | None:
    """:data:`OPTIMIZED` where Python runs with ``-O`` and zarr then cannot read a group's metadata (zarr 3.1's
    ``GroupMetadata.from_dict`` pops ``node_type`` inside an ``assert``: every nested group fails, which would read
    as a corrupt store); None otherwise."""
    if not sys.flags.optimize:
        return None
    try:
        GroupMetadata.from_dict({"zarr_format": 3, "node_type": "group"})
    except TypeError:
        return OPTIMIZED
    return None


def group_arrays(group: zarr.Group, path: Path) -> dict[str, zarr.Array]:
    """Every array in the store, by path; a sharded one is refused (its chunks are not files). Refused under
    Python's ``-O`` where zarr cannot read metadata there (:func:`optimized_problem`), not called corrupt."""
    optimized = optimized_problem()
    if optimized is not None:
        raise FoalPipeError(optimized)
    try:
        arrays = {name: node for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)}
    except OSError as exc:
        if limit_failure(exc):
            raise
        raise FoalPipeError(f"cannot list feature store {path}: {exc.strerror or exc}; {REEXTRACT}") from None
    except METADATA_ERRORS as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise FoalPipeError(f"feature store {path} has corrupt array metadata ({detail}); {REEXTRACT}") from None
    for name, array in sorted(arrays.items()):
        sharded = sharding_problem(array)
        if sharded is not None:
            raise FoalPipeError(f"{path / name}: {sharded}")
    return arrays


def chunk_keys(array: zarr.Array) -> Iterator[str]:
    """The key of every chunk of ``array`` below its folder, in C order over the chunk grid."""
    for coords in grid_coords(chunk_grid(array)):
        yield array.metadata.encode_chunk_key(coords)


def _size_and_tail(file: Path) -> tuple[int, bytes]:
    with open(file, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 4))
        return size, f.read()


def record_chunks(path: Path, group: zarr.Group) -> None:
    """Write each array's ``chunk_files`` attribute -- ``{"bytes": [...], "crc32c": [...]}``, the size and the
    last 4 bytes (little-endian) of every chunk file in C order -- from the files as they are now."""
    for name, array in sorted(group_arrays(group, path).items()):
        sizes, crcs = [], []
        for key in chunk_keys(array):
            size, tail = _size_and_tail(path / name / key)
            sizes.append(size)
            crcs.append(int.from_bytes(tail, "little"))
        array.update_attributes({CHUNK_FILES: {"bytes": sizes, "crc32c": crcs}})


def compute_generation(path: str | Path, group: zarr.Group | None = None) -> str:
    """The store's generation id: the first 32 hex digits of a SHA-256 over its attributes (but ``complete``
    and ``generation``, keys sorted), then every array's path and ``zarr.json``, in path order. From format 4
    each ``zarr.json`` holds its chunk files' records, so this covers every chunk and reads only metadata;
    before, every chunk's key, size and last 4 bytes follow its array's ``zarr.json``. The same data written
    with the same settings gives the same id; other data another."""
    path = Path(path)
    group = group or store_group(path)
    digest = hashlib.sha256()
    attrs = {k: v for k, v in dict(group.attrs).items() if k not in ("complete", "generation")}
    version = attrs.get("format_version")
    digest.update(json.dumps(attrs, sort_keys=True).encode())
    for name, array in sorted(group_arrays(group, path).items()):
        digest.update(f"\n{name}\n".encode() + (path / name / "zarr.json").read_bytes())
        if type(version) is int and version >= SEALED_FROM:
            continue
        for key in chunk_keys(array):
            size, tail = _size_and_tail(path / name / key)
            digest.update(f"{key} {size} ".encode() + tail)
    return digest.hexdigest()[:32]


def record_problem(array: zarr.Array) -> str | None:
    """Why the ``chunk_files`` attribute of ``array`` is not one size and one CRC-32C per chunk (None if it is)."""
    attr = array.attrs.get(CHUNK_FILES)
    count = chunk_count(array)
    sizes = attr.get("bytes") if isinstance(attr, dict) else None
    crcs = attr.get("crc32c") if isinstance(attr, dict) else None
    if (isinstance(sizes, list) and isinstance(crcs, list) and len(sizes) == len(crcs) == count
            and all(type(v) is int and v >= 0 for v in sizes) and all(type(v) is int and 0 <= v < 2**32 for v in crcs)):
        return None
    return f"attribute {CHUNK_FILES!r} is {shown(attr)}, expected the size and CRC-32C of each of its {count:,} chunk files"


def proven_version(arrays: dict[str, zarr.Array]) -> int:
    """The newest format the store's integrity data proves (0: none): format 4's chunk records on any array. A
    declared ``format_version`` below it was edited down, which would skip their checks."""
    return SEALED_FROM if any(array.attrs.get(CHUNK_FILES) is not None for array in arrays.values()) else 0


def sealed(meta: StoreMeta) -> bool:
    """Whether the store carries integrity data to check: complete, in format 4 or later."""
    return meta.complete and meta.format_version >= SEALED_FROM


def generation_problem(path: Path, group: zarr.Group, meta: StoreMeta) -> str | None:
    """Why a sealed store's metadata is not what was completed (None when it is)."""
    if meta.generation is None:
        return f"it declares format_version {meta.format_version} but has no generation id"
    try:
        now = compute_generation(path, group)
    except OSError as exc:
        if limit_failure(exc):
            raise
        return f"its metadata cannot be read ({exc.strerror or exc})"
    if now != meta.generation:
        chunks = "" if sealed(meta) else ", or its chunk files do (a chunk replaced, moved or damaged)"
        return (f"its attributes or array metadata differ from those it was completed with{chunks} (generation id "
                f"{meta.generation[:12]} recorded, {now[:12]} now)")
    return None


def guard_chunks(path: Path, group: zarr.Group, arrays: dict[str, zarr.Array], records: bool) -> None:
    """Make the group's reads check every chunk file of ``arrays``: a regular file within its size limit and,
    with ``records``, the very file recorded at its position (a bad record is refused here)."""
    store = group.store
    if not isinstance(store, StrictLocalStore):
        return
    for name, array in arrays.items():
        if not records:
            store.expect(name, array)
            continue
        problem = record_problem(array)
        if problem is not None:
            raise FoalPipeError(f"{path / name}: {problem}; {REEXTRACT}")
        files: Any = array.attrs[CHUNK_FILES]  # record_problem checked it: {"bytes": [...], "crc32c": [...]}
        store.expect(name, array, np.asarray(files["bytes"], dtype=np.uint64), np.asarray(files["crc32c"], np.uint32))


#: Why a store of format 1 may lack chunk files without damage: its writer left out chunks of zeros (zarr's default
#: then), which a listing cannot tell from deleted ones, so such a store is refused and rewritten.
FORMAT_1_GAPS = ("a store of format 1 leaves out chunks that hold only zeros, which cannot be told from deleted ones: "
                 "re-extract it with this foal-pipe (`foal-pipe extract ... --overwrite`), which writes every chunk")


def check_chunks(path: Path, group: zarr.Group, progress: dict[str, int] | None = None,
                 arrays: dict[str, zarr.Array] | None = None, format_version: int | None = None) -> None:
    """Every chunk file of every array (of ``arrays``, default all) exists (a listing, nothing is read);
    features and blocks of split ``s`` only below ``progress[s]`` when given (an incomplete store)."""
    for name, array in sorted((arrays or group_arrays(group, path)).items()):
        split, _, leaf = name.partition("/")
        below = progress.get(split) if progress is not None and leaf in ROW_ARRAYS else None
        try:
            count, first = missing_chunks(path, array, below, limit=1)
        except OSError as exc:
            if limit_failure(exc):
                raise
            raise FoalPipeError(f"cannot list {path / name}: {exc.strerror or exc}; {REEXTRACT}") from None
        if count:
            where = rows_text(chunk_span(array, first[0][0]), name)
            why = FORMAT_1_GAPS if format_version == 1 else f"the store is damaged: {REEXTRACT}"
            raise FoalPipeError(f"{path}: {name} has {count:,} of {chunk_count(array):,} chunk files missing "
                                f"(first at {where}); {why}")
