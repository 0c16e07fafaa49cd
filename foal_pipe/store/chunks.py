"""Chunk files of a Zarr array: which exist (a directory listing, never a read), reads that refuse a missing
chunk instead of returning the fill value, errors that name a bad chunk by its rows, and the check that the
rows read are finite.

Zarr reads a chunk whose file is missing as the fill value; for a feature store that means rows of zeros,
trained on in silence. The helpers here make every absence and every undecodable chunk an error instead.
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from foal_pipe.errors import FoalPipeError

_METADATA_FILES = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
DTYPE_OPTIONS = {"blocks": "--blocks-dtype"}
"""The extract option that sets an array's dtype, where it is not ``--dtype``."""
REEXTRACT = "re-extract it (`foal-pipe extract ... --overwrite`) or restore it from a copy"


class MissingChunk(FileNotFoundError):
    """A chunk file that should exist does not (Zarr alone would read it as the fill value)."""


class StrictLocalStore(LocalStore):
    """A local Zarr store whose missing chunks raise :class:`MissingChunk` instead of reading as zeros, so a
    chunk deleted (or a store swapped away) while a reader reads it is an error, never silent zeros."""

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        value = await super().get(key, prototype, byte_range)
        if value is None and key.rsplit("/", 1)[-1] not in _METADATA_FILES:
            raise MissingChunk(key)
        return value

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        value = super().get_sync(key, prototype=prototype, byte_range=byte_range)
        if value is None and key.rsplit("/", 1)[-1] not in _METADATA_FILES:
            raise MissingChunk(key)
        return value


def chunk_grid(array: zarr.Array) -> tuple[int, ...]:
    """Chunks along each dimension."""
    return tuple(math.ceil(s / c) for s, c in zip(array.shape, array.chunks))


def chunk_count(array: zarr.Array) -> int:
    """Chunks in the whole array."""
    return math.prod(chunk_grid(array))


def chunk_span(array: zarr.Array, first: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the ``first``-th chunk along the rows."""
    step = int(array.chunks[0])
    return first * step, min((first + 1) * step, int(array.shape[0]))


def rows_text(span: tuple[int, int]) -> str:
    """``rows 256-383`` (inclusive, as a user counts them) or ``row 7``."""
    return f"rows {span[0]:,}-{span[1] - 1:,}" if span[1] - span[0] > 1 else f"row {span[0]:,}"


def _list_files(top: Path) -> list[str]:
    """Relative paths of every file under ``top`` (a listing, not a read); directory loops are errors."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    stack = [(top, "")]
    while stack:
        folder, rel = stack.pop()
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            raise OSError(errno.ELOOP, "directory loop (a symlink points back up)", str(folder))
        seen.add((st.st_dev, st.st_ino))
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir():
                    stack.append((Path(entry.path), f"{rel}{entry.name}/"))
                else:
                    out.append(rel + entry.name)
    return out


def _key_parser(array: zarr.Array) -> tuple[str, str]:
    """The prefix and separator of the array's chunk keys (``c`` and ``/`` for Zarr v3's default)."""
    ndim = array.ndim
    sample = array.metadata.encode_chunk_key((0,) * ndim)
    prefix = sample[: len(sample) - (2 * ndim - 1)]
    sep = sample[len(prefix) + 1] if ndim > 1 else "/"
    return prefix, sep


def present_chunks(root: Path, array: zarr.Array) -> set[tuple[int, ...]]:
    """Coordinates of the chunks whose files exist under the array's folder, from a directory listing."""
    folder = root / array.path
    prefix, sep = _key_parser(array)
    grid = chunk_grid(array)
    found = set()
    for key in _list_files(folder) if folder.is_dir() else []:
        if not key.startswith(prefix) or key.endswith(".partial"):
            continue
        parts = key[len(prefix):].split(sep)
        if len(parts) == array.ndim and all(p.isdigit() for p in parts):
            coords = tuple(int(p) for p in parts)
            if all(c < g for c, g in zip(coords, grid)) and array.metadata.encode_chunk_key(coords) == key:
                found.add(coords)
    return found


def leading_chunks(array: zarr.Array, below_row: int | None) -> int:
    """Row-chunks wholly below ``below_row`` (all of them for None or a row at or past the end)."""
    grid0 = chunk_grid(array)[0]
    if below_row is None or below_row >= array.shape[0]:
        return grid0
    return max(0, int(below_row)) // int(array.chunks[0])


def missing_chunks(root: Path, array: zarr.Array, below_row: int | None = None,
                   limit: int | None = None) -> tuple[int, list[tuple[int, ...]]]:
    """How many chunks (those wholly below ``below_row``, default all) have no file, and the first ``limit``
    of them in row order. Counted from a listing, so an absurd shape costs nothing."""
    grid = chunk_grid(array)
    rows_done = leading_chunks(array, below_row)
    expected = rows_done * math.prod(grid[1:])
    present = {c for c in present_chunks(root, array) if c[0] < rows_done}
    count = expected - len(present)
    first: list[tuple[int, ...]] = []
    if count:
        for coords in np.ndindex(rows_done, *grid[1:]):
            if coords not in present:
                first.append(tuple(int(c) for c in coords))
                if limit is not None and len(first) >= limit:
                    break
    return count, first


def damage_reason(exc: BaseException) -> str:
    """Why a chunk could not be read, in a few words."""
    if isinstance(exc, MissingChunk):
        return "missing (deleted, or the store was replaced while it was read)"
    if "checksum" in str(exc).lower():
        return "damaged (checksum mismatch)"
    detail = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"damaged ({type(exc).__name__}{': ' + detail if detail else ''})"


def chunk_error(root: Path, name: str, array: zarr.Array, first: int, exc: BaseException) -> FoalPipeError:
    """The error for the chunk at row-chunk ``first`` of array ``name`` that could not be read."""
    where = rows_text(chunk_span(array, first))
    return FoalPipeError(f"{root}: {name} chunk at {where} is {damage_reason(exc)}; {REEXTRACT}")


def read_rows(root: Path, name: str, array: zarr.Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``[lo, hi)`` of ``array``; a chunk that is missing or fails to decode is named."""
    try:
        return np.asarray(array[lo:hi])
    except (FoalPipeError, MemoryError):
        raise
    except Exception as exc:  # zarr/numcodecs raise many types for a chunk they cannot decode
        step = int(array.chunks[0])
        for first in range(lo // step, (max(hi, lo + 1) - 1) // step + 1):  # name the first bad chunk
            try:
                np.asarray(array[first * step : min((first + 1) * step, array.shape[0])])
            except Exception as inner:
                raise chunk_error(root, name, array, first, inner) from None
        raise chunk_error(root, name, array, lo // step, exc) from None


def chunk_spans(n_rows: int, chunk_rows: int, start: int = 0, stop: int | None = None) -> list[tuple[int, int]]:
    """The rows ``[lo, hi)`` of each chunk of ``chunk_rows`` rows that meets ``[start, stop)``, cut to it."""
    stop = n_rows if stop is None else stop
    return [(max(lo, start), min(lo + chunk_rows, stop)) for lo in range(start - start % chunk_rows, stop, chunk_rows)]


def check_finite(block: np.ndarray, split: str, rows: np.ndarray | int, what: str = "features") -> np.ndarray:
    """``block`` (rows first) if every value is finite, else an error naming ``split/what`` and the first bad
    row. ``rows`` is the store row of ``block[0]`` (contiguous rows) or the store row of every block row."""
    finite = np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        row = int(rows + bad) if isinstance(rows, int) else int(rows[bad])
        raise FoalPipeError(
            f"{split}/{what} has NaN or inf values (first bad row: {row}); "
            f"re-extract the store (try `{DTYPE_OPTIONS.get(what.split()[0], '--dtype')} float32` if it was float16)"
        )
    return block
