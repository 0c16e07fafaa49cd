"""Chunk files of a Zarr array: which exist (a directory listing, never a read), reads that refuse a missing
chunk instead of returning the fill value, errors that name a bad chunk by its rows, and the check that the
rows read are finite.

Zarr reads a chunk whose file is missing as the fill value; for a feature store that means rows of zeros,
trained on in silence. The helpers here make every absence and every undecodable chunk an error instead, and
read only what a chunk can be: a regular file (a FIFO would block the read forever, ``/dev/zero`` never ends),
no larger than the chunk can be, and -- where the store records it (format 4) -- the very file written at
that position (a chunk moved or copied from elsewhere keeps a valid checksum of its own).
"""

from __future__ import annotations

import asyncio
import errno
import io
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from foal_pipe.errors import FoalPipeError, limit_failure, param

_METADATA_FILES = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
DTYPE_OPTIONS = {"blocks": "blocks_dtype"}
"""The extract parameter that sets an array's dtype, where it is not ``dtype``."""
REEXTRACT = "re-extract it (`foal-pipe extract ... --overwrite`) or restore it from a copy"
#: Arrays whose first axis counts bytes, not rows (the split manifest): their chunks are named by bytes.
BYTE_ARRAYS = frozenset({"manifest"})


class MissingChunk(FileNotFoundError):
    """A chunk file that should exist does not (Zarr alone would read it as the fill value)."""


class BadChunkFile(OSError):
    """A chunk file that is not one: not a regular file, larger than its chunk can be, or not the file the
    store recorded at its position. ``reason`` says which, in a few words."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class ChunkFiles:
    """What the chunk files of one array (``path`` in the store) may be: at most ``limit`` bytes each or, where
    the store records them (format 4), exactly ``sizes[i]`` bytes ending in the 4 bytes ``crcs[i]`` (the
    CRC-32C the ``crc32c`` codec appends), ``i`` the chunk's index in C order over the chunk grid."""

    path: str
    prefix: str
    sep: str
    grid: tuple[int, ...]
    limit: int
    n_rows: int
    chunk_rows: int
    sizes: np.ndarray | None = None
    crcs: np.ndarray | None = None

    def index(self, rest: str) -> int | None:
        """The C-order index of the chunk whose key (below the array's folder) is ``rest``; None for another file."""
        if not rest.startswith(self.prefix):
            return None
        parts = rest[len(self.prefix):].split(self.sep)
        if len(parts) != len(self.grid) or not all(p.isdigit() for p in parts):
            return None
        flat = 0
        for part, size in zip(parts, self.grid):
            if int(part) >= size:
                return None
            flat = flat * size + int(part)
        return flat

    def oversized(self, index: int | None, size: int, f: io.BufferedReader) -> str | None:
        """Why the open file ``f`` of ``size`` bytes at chunk ``index`` is larger than it can be (None when it is
        not): larger than its recorded size where the store records one -- unless its size and last 4 bytes are those
        of another chunk, moved or copied here -- else than :func:`chunk_limit`. Refused before it is read, so an
        appended-to or endless file is never read whole."""
        if self.sizes is None or index is None:
            limit = None if size <= self.limit else f"{self.limit:,}"
        else:
            recorded = int(self.sizes[index])
            if size <= recorded:
                return None
            f.seek(max(0, size - 4))
            tail = int.from_bytes(f.read(4), "little") if size >= 4 else -1
            moved = self._moved(size, tail)
            if moved is not None:
                return moved
            limit = f"{recorded:,}, its recorded size"
        return None if limit is None else f"{size:,} bytes, more than a chunk of its array can hold ({limit})"

    def _moved(self, size: int, tail: int) -> str | None:
        """``it holds the chunk of rows ...`` when a file of ``size`` bytes ending in ``tail`` is another chunk's."""
        if self.sizes is None or self.crcs is None:
            return None
        same = np.flatnonzero((self.sizes == size) & (self.crcs == tail))
        if not same.size:
            return None
        first = int(same[0]) // math.prod(self.grid[1:]) * self.chunk_rows
        where = rows_text((first, min(first + self.chunk_rows, self.n_rows)), self.path)
        return f"it holds the chunk of {where}, moved or copied here"

    def mismatch(self, index: int, data: bytes) -> str | None:
        """Why ``data`` is not the file recorded for chunk ``index`` (None when it is): another chunk's file,
        moved or copied here, or a checksum mismatch."""
        tail = int.from_bytes(data[-4:], "little") if len(data) >= 4 else -1
        if self.sizes is None or self.crcs is None or (len(data) == self.sizes[index] and tail == self.crcs[index]):
            return None
        return self._moved(len(data), tail) or "checksum mismatch"


def chunk_limit(array: zarr.Array) -> int:
    """The most bytes a chunk file of ``array`` without a record can hold: its raw size plus 1/16 and 4 KiB (the worst
    case of every standard compressor -- zstd, blosc, gzip, lz4 -- and a checksum fits well inside)."""
    raw = math.prod(int(c) for c in (getattr(array, "shards", None) or array.chunks)) * array.dtype.itemsize
    return raw + raw // 16 + 4096


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


class StrictLocalStore(LocalStore):
    """A local Zarr store for reading a feature store: a missing chunk raises :class:`MissingChunk` instead of
    reading as zeros (so a chunk deleted, or a store swapped away, while a reader reads it is an error), and
    every file read is a regular file, read to at most its recorded size (else :func:`chunk_limit`) and checked against
    the store's record of its chunk (:meth:`expect`); anything else raises :class:`BadChunkFile`."""

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self.arrays: dict[str, ChunkFiles] = {}

    def with_read_only(self, read_only: bool = False) -> StrictLocalStore:
        other = type(self)(self.root, read_only=read_only)
        other.arrays = self.arrays
        return other

    def expect(self, name: str, array: zarr.Array, sizes: np.ndarray | None = None,
               crcs: np.ndarray | None = None) -> None:
        """Check the chunk files of array ``name`` when read: their size, and their record when given."""
        prefix, sep = _key_parser(array)
        rows = int(array.shape[0]) if array.ndim else 1
        step = int(array.chunks[0]) if array.ndim else 1
        self.arrays[name] = ChunkFiles(name, prefix, sep, chunk_grid(array), chunk_limit(array), rows, step, sizes, crcs)

    def _files_of(self, key: str) -> tuple[ChunkFiles | None, int | None]:
        if key.rpartition("/")[2] in _METADATA_FILES:
            return None, None
        for files in self.arrays.values():
            if key.startswith(files.path + "/"):
                return files, files.index(key[len(files.path) + 1:])
        return None, None

    def _read(self, key: str, prototype: Any, byte_range: Any) -> Any:
        """The file at ``key`` (None if absent, as LocalStore), refused unless it is a regular file that can be
        the chunk it stands for."""
        path = self.root / key
        try:  # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        with open(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                return None
            if not stat.S_ISREG(mode):
                raise BadChunkFile(key, f"{_kind(mode)}, not a regular file")
            files, index = self._files_of(key)
            size = f.seek(0, io.SEEK_END)
            too_large = files.oversized(index, size, f) if files is not None else None
            if too_large is not None:
                raise BadChunkFile(key, too_large)
            f.seek(0)
            if byte_range is not None:
                return prototype.buffer.from_bytes(_read_range(f, size, byte_range))
            data = f.read(size + 1)
        if len(data) != size:
            raise BadChunkFile(key, "its size changed while it was read")
        problem = files.mismatch(index, data) if files is not None and index is not None else None
        if problem is not None:
            raise BadChunkFile(key, problem)
        return prototype.buffer.from_bytes(data)

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        if not self._is_open:
            await self._open()
        value = await asyncio.to_thread(self._read, key, prototype or default_buffer_prototype(), byte_range)
        if value is None and key.rsplit("/", 1)[-1] not in _METADATA_FILES:
            raise MissingChunk(key)
        return value

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        self._ensure_open_sync()
        value = self._read(key, prototype or default_buffer_prototype(), byte_range)
        if value is None and key.rsplit("/", 1)[-1] not in _METADATA_FILES:
            raise MissingChunk(key)
        return value


def _read_range(f: io.BufferedReader, size: int, byte_range: Any) -> bytes:
    """The bytes of ``byte_range`` (Zarr's three kinds) of the open file ``f`` of ``size`` bytes."""
    if isinstance(byte_range, RangeByteRequest):
        f.seek(byte_range.start)
        return f.read(max(0, byte_range.end - byte_range.start))
    if isinstance(byte_range, OffsetByteRequest):
        f.seek(byte_range.offset)
    elif isinstance(byte_range, SuffixByteRequest):
        f.seek(max(0, size - byte_range.suffix))
    else:
        raise TypeError(f"unexpected byte range {byte_range!r}")
    return f.read(max(0, size - f.tell()))


def chunk_grid(array: zarr.Array) -> tuple[int, ...]:
    """Chunks along each dimension; a chunk side below 1 (hand-edited metadata: no rows could be stored) is refused."""
    if any(int(c) < 1 for c in array.chunks):
        where = getattr(array.store, "root", None)
        shape = tuple(map(int, array.chunks))
        raise FoalPipeError(f"array {array.path}{f' in {where}' if where else ''} has chunk shape {shape}, with a side "
                            f"below 1, so no chunk can hold its rows; {REEXTRACT}")
    return tuple(math.ceil(s / c) for s, c in zip(array.shape, array.chunks))


def grid_coords(grid: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every chunk coordinate of ``grid`` in C order, one at a time (``np.ndindex`` and ``itertools.product``
    first build the ranges whole: a hand-made shape of 10^12 rows would exhaust the memory)."""
    if not grid:
        yield ()
        return
    for first in range(grid[0]):
        for rest in grid_coords(grid[1:]):
            yield (first, *rest)


def chunk_count(array: zarr.Array) -> int:
    """Chunks in the whole array."""
    return math.prod(chunk_grid(array))


def chunk_span(array: zarr.Array, first: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the ``first``-th chunk along the rows."""
    step = int(array.chunks[0])
    return first * step, min((first + 1) * step, int(array.shape[0]))


def rows_text(span: tuple[int, int], name: str = "") -> str:
    """``rows 256-383`` (inclusive, as a user counts them) or ``row 7``; ``bytes ...`` for array ``name`` of
    :data:`BYTE_ARRAYS`."""
    unit = "byte" if name in BYTE_ARRAYS else "row"
    return f"{unit}s {span[0]:,}-{span[1] - 1:,}" if span[1] - span[0] > 1 else f"{unit} {span[0]:,}"


def sharding_problem(array: zarr.Array) -> str | None:
    """Why ``array`` cannot be read chunk file by chunk file (None when it can): Zarr's sharding puts many chunks
    in one file, which the chunk listing and records of the store format do not describe."""
    shards = getattr(array, "shards", None)
    if shards is None:
        return None
    return (f"it is sharded (shards of {tuple(map(int, shards))}, chunks of {tuple(map(int, array.chunks))}), which "
            "foal-pipe does not read; write it without shards (foal_pipe.store.create_array does)")


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
        for coords in grid_coords((rows_done, *grid[1:])):
            if coords not in present:
                first.append(coords)
                if limit is not None and len(first) >= limit:
                    break
    return count, first


def damage_reason(exc: BaseException) -> str:
    """Why a chunk could not be read, in a few words. The process at one of its limits (too many open files, a thread
    that cannot start: :func:`~foal_pipe.errors.limit_failure`) is no damage: ``exc`` is raised again."""
    if limit_failure(exc):
        raise exc
    if isinstance(exc, MissingChunk):
        return "missing (deleted, or the store was replaced while it was read)"
    if isinstance(exc, BadChunkFile):
        return f"damaged ({exc.reason})"
    if "checksum" in str(exc).lower():
        return "damaged (checksum mismatch)"
    detail = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"damaged ({type(exc).__name__}{': ' + detail if detail else ''})"


def chunk_error(root: Path, name: str, array: zarr.Array, first: int, exc: BaseException) -> FoalPipeError:
    """The error for the chunk at row-chunk ``first`` of array ``name`` that could not be read."""
    where = rows_text(chunk_span(array, first), name)
    return FoalPipeError(f"{root}: {name} chunk at {where} is {damage_reason(exc)}; {REEXTRACT}")


def read_rows(root: Path, name: str, array: zarr.Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``[lo, hi)`` of ``array``; a chunk that is missing or fails to decode is named."""
    try:
        return np.asarray(array[lo:hi])
    except (FoalPipeError, MemoryError):
        raise
    except Exception as exc:  # zarr/numcodecs raise many types for a chunk they cannot decode
        if limit_failure(exc):
            raise
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


def check_finite(block: np.ndarray, split: str, rows: np.ndarray | int, what: str = "features",
                 root: Path | None = None) -> np.ndarray:
    """``block`` (rows first, as stored) if every value is finite, else an error naming the store at ``root``,
    ``split/what`` and the first bad row. ``rows`` is the store row of ``block[0]`` (contiguous rows) or the store
    row of every block row. A wider dtype is suggested only for float16, the one a value can overflow in."""
    # the row width spelled out: NumPy cannot infer a -1 from an empty block (an empty split)
    finite = np.isfinite(block.reshape(block.shape[0], math.prod(block.shape[1:]))).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        row = int(rows + bad) if isinstance(rows, int) else int(rows[bad])
        where = "" if root is None else f"{root}: "
        wider = (f" (try {param(DTYPE_OPTIONS.get(what.split()[0], 'dtype'), 'float32')} instead of float16)"
                 if block.dtype == np.float16 else "")
        raise FoalPipeError(f"{where}{split}/{what} has NaN or inf values (first bad row: {row}); re-extract the store{wider}")
    return block
