"""Verification: every chunk of a store listed, read and checked (``foal-pipe info --verify``)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import (
    REEXTRACT,
    chunk_grid,
    chunk_span,
    damage_reason,
    grid_coords,
    leading_chunks,
    missing_chunks,
    rows_text,
)
from foal_pipe.store.integrity import (
    CHUNK_FILES,
    compute_generation,
    generation_problem,
    group_arrays,
    guard_chunks,
    proven_version,
    record_problem,
    sealed,
)
from foal_pipe.store.manifest import MANIFEST, parse_stored_manifest, stored_manifest
from foal_pipe.store.meta import ROW_ARRAYS, SPLITS, StoreMeta, edited_version, read_meta, shown
from foal_pipe.store.read import chunk_too_large, open_store

#: The ``array`` of a problem of the whole store, and the start of one every reader refuses (its message says the fix).
WHOLE_STORE, REFUSED = "(whole store)", "readers refuse it: "


def has_checksums(array: zarr.Array) -> bool:
    """Whether every chunk of ``array`` carries a crc32c checksum (format versions 2 and 3 write one)."""
    return any(isinstance(codec, Crc32cCodec) for codec in getattr(array.metadata, "codecs", ()))


@dataclass(frozen=True)
class ChunkProblem:
    """Rows ``[lo, hi)`` of ``array`` (e.g. ``train/features``) are ``missing`` or ``damaged`` (with why).
    ``refusal``: a reader's refusal of the whole store, whose parameters a caller names its own way
    (:meth:`~foal_pipe.errors.FoalPipeError.render`: the command line's flags); ``problem`` words them for Python."""

    array: str
    lo: int
    hi: int
    problem: str
    refusal: FoalPipeError | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        where = f" {rows_text((self.lo, self.hi), self.array)}" if self.hi > self.lo else ""
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


def _manifest_labels(path: Path, group: zarr.Group, meta: StoreMeta, arrays: dict[str, zarr.Array],
                     faulty: set[str]) -> list[ChunkProblem]:
    """The first row of each split whose label in the split manifest differs from its ``labels`` array: both are
    written by ``extract``, so a difference means one of them is not the dataset's (a resume over moved images). A
    manifest that is not the document ``extract`` writes is the refusal a model's identity would meet
    (:func:`~foal_pipe.store.manifest.parse_stored_manifest`). Arrays in ``faulty`` (and all, when it holds the
    manifest or the whole store) have a problem found already, its cause: they are not compared."""
    if faulty & {WHOLE_STORE, MANIFEST}:
        return []
    try:
        raw = stored_manifest(path, (group, meta))
    except FoalPipeError:  # a damaged manifest: its chunks are reported above, and open_store names it
        return []
    if raw is None:
        return []
    try:
        _, splits = parse_stored_manifest(raw, path)
    except FoalPipeError as exc:
        return [ChunkProblem(MANIFEST, 0, 0, str(exc))]
    found = []
    for split in (split for split in SPLITS if f"{split}/labels" not in faulty):
        listed = np.asarray([label for _, _, label in splits[split]], np.int64)
        labels = np.asarray(arrays[f"{split}/labels"][:])
        differ = np.flatnonzero(listed != labels) if listed.shape == labels.shape else [min(len(listed), len(labels))]
        if len(differ):
            row = int(differ[0])
            found.append(ChunkProblem(f"{split}/labels", 0, 0, f"row {row:,} differs from the split manifest's label "
                                      f"for that row (manifest {_at(listed, row)}, labels {_at(labels, row)})"))
    return found


def resumable(done: object, rows: int, step: int) -> TypeGuard[int]:
    """Whether ``done``, a split's recorded progress, is one ``extract`` resumes from: a whole number of ``step``-row
    chunks of its ``rows``, or all of them."""
    return type(done) is int and 0 <= done <= rows and (done % step == 0 or done == rows)


def _progress_problems(recorded: object, arrays: dict[str, zarr.Array]) -> list[ChunkProblem]:
    """Why an incomplete store's ``progress`` is not what ``extract`` resumes from (each split's rows written: a whole
    number of chunks, or all rows), none when it is or is absent: ``info`` would advise a resume ``extract`` refuses."""
    if recorded is None:
        return []
    if not isinstance(recorded, dict):
        return [ChunkProblem(WHOLE_STORE, 0, 0, f"its attribute 'progress' is {shown(recorded)}, expected the rows "
                             "written of each split (extract refuses to resume it)")]
    found = []
    for split in SPLITS:
        features, done = arrays.get(f"{split}/features"), recorded.get(split)
        if features is None:
            continue
        rows, step = int(features.shape[0]), int(features.chunks[0])
        if not resumable(done, rows, step):
            found.append(ChunkProblem(f"{split}/features", 0, 0, f"attribute 'progress' records {shown(done)} rows "
                                      f"written, expected a multiple of {step:,} from 0 to {rows:,} (extract refuses "
                                      "to resume it)"))
    return found


def _at(values: np.ndarray, row: int) -> str:
    return str(int(values[row])) if row < len(values) else "no row"


def verify_store(path: str | Path, read: bool = True, max_listed: int = 10**4) -> Verification:
    """Report the missing chunk files of every array (features and blocks of an incomplete store only below
    its ``progress``) by array and rows, from a listing, and -- for a complete store of format 4 -- metadata
    changed since completion (its generation id, recomputed from the metadata) or a ``format_version`` edited below
    what its content proves (:func:`~foal_pipe.store.meta.edited_version`); with ``read``, also read every
    chunk (its record of format 4, checksum, decoding, NaN/inf in features) and recompute an older complete
    store's generation id, then -- when no chunk is at fault -- run every check of
    :func:`~foal_pipe.store.read.open_store` (labels in range, shapes, dtypes, finite norm parameters, row indices
    and manifest), so a store every reader refuses is never reported intact. An array with more than
    ``max_listed`` missing chunks is reported as one problem."""
    path = Path(path)
    group, meta = read_meta(path)
    progress = None
    if not meta.complete:
        recorded = meta.extra.get("progress")
        progress = recorded if isinstance(recorded, dict) else {}
    problems: list[ChunkProblem] = []
    n_read = row_damage = 0  # row_damage: damaged or non-finite features/blocks chunks, which opening a store never reads
    arrays = group_arrays(group, path)
    for name in (f"{split}/{leaf}" for split in SPLITS for leaf in ("features", "labels")):
        if name not in arrays:  # the readers open it by path: unlisted, none of its chunks would be read here
            problems.append(ChunkProblem(name, 0, 0, "not listed by the store's metadata (its zarr.json, or its "
                                                     "split's, is missing or damaged)"))
    if progress is not None:
        problems += _progress_problems(meta.extra.get("progress"), arrays)
    edited = edited_version(meta, arrays, proven_version(arrays))
    if edited is not None:  # the generation id then differs too: the edit is the cause to name
        problems.append(ChunkProblem(WHOLE_STORE, 0, 0, f"it declares format_version {meta.format_version} but "
                                     f"carries the {edited[1]} of format {edited[0]} (its version was edited down: "
                                     f"restore format_version {edited[0]})"))
    elif sealed(meta):
        changed = generation_problem(path, group, meta)
        if changed is not None:
            problems.append(ChunkProblem(WHOLE_STORE, 0, 0, changed))
    for name, array in sorted(arrays.items()):
        split, _, leaf = name.partition("/")
        bad_record = record_problem(array) if sealed(meta) else None
        if bad_record is not None:  # still read the chunks, without the record
            problems.append(ChunkProblem(name, 0, 0, bad_record))
        guard_chunks(path, group, {name: array}, records=sealed(meta) and bad_record is None)
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
        too_large = chunk_too_large(array)
        if too_large is not None:
            problems.append(ChunkProblem(name, 0, 0, too_large))
            continue
        gone = set(missing)
        for coords in grid_coords((leading_chunks(array, below), *chunk_grid(array)[1:])):
            if coords in gone:
                continue
            block, why = _decoded(array, coords)
            if block is None:
                problems.append(ChunkProblem(name, *chunk_span(array, coords[0]), str(why)))
                row_damage += leaf in ROW_ARRAYS
                continue
            n_read += 1
            if leaf in ROW_ARRAYS and block.dtype.kind == "f" and not np.isfinite(block).all():
                lo = chunk_span(array, coords[0])[0]
                finite = np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
                problems.append(ChunkProblem(name, *chunk_span(array, coords[0]), "NaN or inf values (first at row "
                                f"{lo + int(np.flatnonzero(~finite)[0]):,})"))
                row_damage += 1
    if (read and meta.complete and not sealed(meta) and meta.generation is not None and not problems
            and compute_generation(path, group) != meta.generation):
        problems.append(ChunkProblem(WHOLE_STORE, 0, 0, "its files changed after it was completed "
                                     "(generation id mismatch)"))
    # the checks below read the labels, the manifest and what opening the store reads: a fault found above in those
    # is its cause, reported once, while damaged rows of features or blocks leave them to run (a full report)
    if read:
        problems += _manifest_labels(path, group, meta, arrays, {p.array for p in problems})
    if read and meta.complete and len(problems) == row_damage:
        try:
            open_store(path)
        except FoalPipeError as exc:
            problems.append(ChunkProblem(WHOLE_STORE, 0, 0, f"{REFUSED}{exc}", exc))
    return Verification(n_read, _merge(problems))


def _decoded(array: zarr.Array, coords: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
    """The chunk at ``coords`` decoded (its CRC-32C checked by the codec), or None and why it cannot be."""
    try:
        return np.asarray(array.blocks[coords]), None
    except (MemoryError, FoalPipeError):
        raise
    except Exception as exc:
        return None, damage_reason(exc)


def _file_change(file: Path, size: int, crc: int) -> tuple[str | None, int | None]:
    """Why the chunk file ``file`` is not the one recorded (``size`` bytes ending in the 4 bytes ``crc``), from its
    size and last 4 bytes alone (None when it may be), and its modification time (None for a missing file: the
    listing names it)."""
    try:
        info = os.stat(file)
        if not stat.S_ISREG(info.st_mode):
            return "damaged (not a regular file)", info.st_mtime_ns
        if info.st_size != size:
            return f"damaged ({info.st_size:,} bytes, {size:,} recorded)", info.st_mtime_ns
        with open(file, "rb") as f:
            f.seek(max(0, size - 4))
            tail = int.from_bytes(f.read(), "little")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return f"damaged ({exc.strerror or exc})", None
    return (None if tail == crc else "damaged (checksum mismatch)"), info.st_mtime_ns


def changed_chunks(path: str | Path) -> list[ChunkProblem]:
    """The chunk files of a complete store of format 4 or later that are not those it was completed with, found
    without reading them whole: a size or last 4 bytes (the CRC-32C the codec appends) other than its array's record
    -- a stat and 4 bytes a file, as completion's records took -- or, for a file modified since those records were
    written, a chunk that fails to decode (its CRC-32C recomputed). A file damaged with its modification time unchanged
    (decay on the disk) is left to :func:`verify_store`, which reads every chunk. Missing files, records that are not
    one per chunk and metadata changed since completion are :func:`verify_store`'s (``read=False``) to report."""
    path = Path(path)
    group, meta = read_meta(path)
    if not sealed(meta):
        return []
    problems = []
    for name, array in sorted(group_arrays(group, path).items()):
        if record_problem(array) is not None:
            continue
        files = array.attrs[CHUNK_FILES]
        assert isinstance(files, dict)  # record_problem checked it: {"bytes": [...], "crc32c": [...]}
        folder = path / name
        recorded_at = (folder / "zarr.json").stat().st_mtime_ns  # written at completion, with the records
        for index, coords in enumerate(grid_coords(chunk_grid(array))):
            key = array.metadata.encode_chunk_key(coords)
            why, modified = _file_change(folder / key, files["bytes"][index], files["crc32c"][index])
            if why is None and modified is not None and modified >= recorded_at:
                why = _decoded(array, coords)[1]
            if why is not None:
                problems.append(ChunkProblem(name, *chunk_span(array, coords[0]), why))
    return problems
