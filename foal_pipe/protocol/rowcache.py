"""A split's rows decoded once and kept grouped (by task, or by class), in memory or in a spill file.

A walk over a stream used to decode every chunk once per task: in a random class order each chunk holds rows
of every task. :class:`GroupedRows` reads each stored chunk once, on background threads, and scatters the rows
the walk needs into one array ordered by group (within a group, in storage order). A group is then one
contiguous range, cut into full-size blocks by a fixed rule (:meth:`GroupedRows.blocks`) whatever the number
of tasks or how they cut the chunks, so every pass over the rows (the Gram sums, leave-one-out, kept
activations) sees the same blocks and the sums are byte-stable.

The rows stay in the store's dtype. Up to :data:`RAM_BYTES` (and ``max_memory``) they are held in memory;
larger they go to an unlinked temporary file in ``TMPDIR``, written once in group order and read back block by
block: the operating system's page cache holds it, not the process, so memory stays flat in the data size.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from array_api_compat import is_cupy_namespace, is_numpy_namespace, is_torch_namespace

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.memory import human, human_up
from foal_pipe.protocol.devicecopy import SYNC_VARIABLE, StagedCopier, SyncCopier, device_copier
from foal_pipe.protocol.internal import internal_error

#: Rows per block of the walk: the projection and the Gram update run on this many rows at once (4,096 rows
#: x D = 1000 float64 is 33 MB). Fewer at large D, so that a block's activations stay near 2**25 values.
BLOCK_ROWS = 4096
MIN_BLOCK_ROWS = 256
BLOCK_VALUES = 2**25
#: Decoded rows held in memory at most; a larger cache spills to a temporary file.
RAM_BYTES = 512 * 2**20
#: Threads decoding chunks (zstd and the checksums release the GIL): half the cores, 2 to 8; and chunks decoded
#: ahead of the scatter.
READ_THREADS = min(8, max(2, (os.cpu_count() or 2) // 2))
READ_AHEAD = 2 * READ_THREADS
#: Rows compared between the device copy and the host cache after the read (spread evenly over the cache).
CHECKED_ROWS = 1024


def block_rows(dim: int) -> int:
    """Rows per block for activations of width ``dim``: :data:`BLOCK_ROWS`, fewer at large ``dim``."""
    return int(min(BLOCK_ROWS, max(MIN_BLOCK_ROWS, BLOCK_VALUES // max(dim, 1))))


def cache_bytes(n_rows: int, dim: int, itemsize: int, lanes: int = 1) -> int:
    return n_rows * dim * itemsize * lanes


def index_bytes(n_rows: int, n_source: int) -> int:
    """What a :class:`GroupedRows` of ``n_rows`` rows from a split of ``n_source`` rows holds beside the rows, in memory
    or spilled alike (int64 each): every cached row's store row and label and every split row's cache position; then a
    walk's positions of the cached rows (:class:`TaskBlocks`) and, as it builds them, one task's rows sorted (at most
    every row). The grouping's sort (:func:`ordered`: 3 per cached row at its peak) comes before and stays below that."""
    return (4 * n_rows + n_source) * 8


def in_memory(nbytes: int, max_memory: int) -> bool:
    """Whether a cache of ``nbytes`` is held in memory (else it spills to a temporary file)."""
    return nbytes <= min(RAM_BYTES, max_memory)


def on_device(xp: Any) -> bool:
    """Whether ``xp`` keeps arrays away from host memory (CuPy; torch on a GPU), so rows must be copied there."""
    if is_cupy_namespace(xp):
        return True
    return is_torch_namespace(xp) and default_device(xp).type != "cpu"


def ordered(group_of_row: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, offsets)``: the rows with a group (>= 0), by group and within a group in storage order, and
    where each group starts in that order (``n_groups + 1`` offsets)."""
    keep = np.flatnonzero(group_of_row >= 0)
    rows = keep[np.argsort(group_of_row[keep], kind="stable")]
    counts = np.bincount(group_of_row[keep], minlength=n_groups)[:n_groups]
    return rows, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class _Spill:
    """One lane's rows in an unlinked temporary file, at ``position * row_bytes``, in ``TMPDIR`` when it is set (an
    unusable one is refused, not swapped silently for another folder, as :mod:`tempfile` would); ``need``: what the
    whole cache spills, the figure a refusal names."""

    def __init__(self, n_rows: int, dim: int, dtype: np.dtype, need: int):
        self.dim, self.dtype, self.need = dim, dtype, need
        self.row_bytes = dim * dtype.itemsize
        self.folder = os.environ.get("TMPDIR") or tempfile.gettempdir()
        try:
            self.file = tempfile.TemporaryFile(prefix="foal-pipe-rows-", dir=self.folder)  # noqa: SIM115 (close())
        except OSError as exc:
            raise _spill_error(self.folder, need, exc) from None
        try:
            os.ftruncate(self.file.fileno(), n_rows * self.row_bytes)
        except OSError as exc:
            self.file.close()
            raise _spill_error(self.folder, need, exc) from None

    def put(self, positions: np.ndarray, X: np.ndarray) -> None:
        """Write the rows at their positions, every byte: a short write (a disk filling up) is continued until it
        fails, never left as a hole that reads back as zeros."""
        order = np.argsort(positions, kind="stable")
        pos = positions[order]
        breaks = np.flatnonzero(np.diff(pos) != 1) + 1
        for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [pos.size]])):
            data = np.ascontiguousarray(X[order[a:b]], dtype=self.dtype)
            view, offset = data.data.cast("B"), int(pos[a]) * self.row_bytes
            while view.nbytes:
                try:
                    n = os.pwrite(self.file.fileno(), view, offset)
                except OSError as exc:
                    raise _spill_error(self.folder, self.need, exc) from None
                if n <= 0:
                    raise _spill_error(self.folder, self.need, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
                view, offset = view[n:], offset + n

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, self.dim), dtype=self.dtype)
        view, offset = out.data.cast("B"), start * self.row_bytes
        while view.nbytes:
            n = os.preadv(self.file.fileno(), [view], offset)
            if n <= 0:
                raise FoalPipeError(f"the temporary file of decoded rows in {self.folder} ended early; re-run the command")
            view, offset = view[n:], offset + n
        return out

    def close(self) -> None:
        self.file.close()


def _spill_error(folder: str, need: int, exc: OSError) -> FoalPipeError:
    """The spill refused in one line: the whole cache's size (what the folder must hold), and raising the limit only
    where the cache would then be held in memory (at most :data:`RAM_BYTES`)."""
    keep = f", or raise {param('max_memory')} to {human_up(need)} to keep them in memory" if need <= RAM_BYTES else ""
    return FoalPipeError(f"cannot write the {human(need)} of decoded rows to a temporary file in {folder} "
                         f"({exc.strerror or exc}); set TMPDIR to a folder with room{keep}")


class GroupedRows:
    """The rows of ``source`` (a store split, or the fused splits of ``sweep --fusions``) whose group is >= 0,
    decoded once and held by group; ``lanes`` are the feature sets read from each chunk (``[None]``: the split's
    features; fusion specs: each fusion of its blocks).

    ``rows[i]`` is the store row at cache position ``i``, ``labels[i]`` its label, ``offsets[g]`` where group
    ``g`` starts, ``position[r]`` the cache position of store row ``r`` (-1: not cached). ``on_chunk(n)`` is
    called with the rows of each chunk once it is scattered.

    With ``xp`` a device namespace (CuPy, torch) and the rows held in memory, each decoded chunk is also copied
    to the device and scattered there while the next chunks decode (:mod:`~foal_pipe.protocol.devicecopy`:
    through pinned buffers on a stream of its own where the backend has one; ``copy_mode`` says which), so the
    walk finds its rows on the device without a bulk copy after the read.
    """

    def __init__(self, source: Any, lanes: Sequence[str | None], group_of_row: np.ndarray, n_groups: int,
                 max_memory: int, on_chunk: Callable[[int], None] = lambda n: None, xp: Any = None):
        self.lanes = tuple(lanes)
        self.rows, self.offsets = ordered(group_of_row, n_groups)
        self.labels = np.asarray(source.labels)[self.rows]
        self.dim = int(source.dim)
        self.dtype = np.dtype(source.features.dtype) if self.lanes == (None,) else np.dtype(np.float32)
        self.nbytes = cache_bytes(self.rows.size, self.dim, self.dtype.itemsize, len(self.lanes))
        self.in_memory = in_memory(self.nbytes, max_memory)
        self._store: dict[str | None, np.ndarray | _Spill] = {}
        self._device: dict[tuple[str | None, str], Any] = {}
        self._copier: SyncCopier | StagedCopier | None = None
        self.copy_mode: str | None = None
        try:
            for lane in self.lanes:
                self._store[lane] = (np.empty((self.rows.size, self.dim), dtype=self.dtype) if self.in_memory
                                     else _Spill(self.rows.size, self.dim, self.dtype, self.nbytes))
            if xp is not None and self.in_memory and on_device(xp):
                self._copier = device_copier(xp, self.lanes, self.n_rows, self.dim, self.dtype,
                                             min(int(source.chunk_rows), self.n_rows))
                self.copy_mode = self._copier.mode
            self._fill(source, group_of_row, on_chunk)
            if self._copier is not None:
                self._device.update({(lane, xp.__name__): X for lane, X in self._copier.finish().items()})
                self._copier = None
                self._check_device_rows(xp)
        except BaseException:
            self.close()
            raise

    @property
    def n_rows(self) -> int:
        return int(self.rows.size)

    def _fill(self, source: Any, group_of_row: np.ndarray, on_chunk: Callable[[int], None]) -> None:
        """Decode every chunk holding a cached row once, ``READ_AHEAD`` chunks ahead on ``READ_THREADS`` threads,
        and scatter its rows to their positions."""
        position = self.position = np.full(group_of_row.shape, -1, dtype=np.int64)
        position[self.rows] = np.arange(self.rows.size)
        step, n = int(source.chunk_rows), int(source.n_rows)
        starts = [lo for lo in range(0, n, step) if (group_of_row[lo : lo + step] >= 0).any()]

        def decode(lo: int) -> tuple[np.ndarray, dict[str | None, np.ndarray]]:
            sel = np.flatnonzero(group_of_row[lo : lo + step] >= 0)
            raw = source.read_raw(lo, min(lo + step, n))
            return lo + sel, {lane: source.rows_of(raw, lo, sel, lane) for lane in self.lanes}

        pending: deque[Future[tuple[np.ndarray, dict[str | None, np.ndarray]]]] = deque()
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="foal-pipe-read") as pool:
            try:
                for lo in starts:
                    pending.append(pool.submit(decode, lo))
                    if len(pending) > READ_AHEAD:
                        self._scatter(position, *pending.popleft().result(), on_chunk)
                while pending:
                    self._scatter(position, *pending.popleft().result(), on_chunk)
            finally:
                for future in pending:
                    future.cancel()

    def _scatter(self, position: np.ndarray, rows: np.ndarray, values: dict[str | None, np.ndarray],
                 on_chunk: Callable[[int], None]) -> None:
        pos = position[rows]
        for lane, X in values.items():
            store = self._store[lane]
            if isinstance(store, _Spill):
                store.put(pos, X)
            else:
                store[pos] = X
        if self._copier is not None:
            self._copier.put(pos, values)
        on_chunk(rows.size)

    def _check_device_rows(self, xp: Any) -> None:
        """Compare :data:`CHECKED_ROWS` rows spread over the cache, bit for bit, between the device and the host:
        an asynchronous copy that went wrong (a buffer refilled early, a chunk not copied) is refused, not learnt
        from."""
        sample = np.unique(np.linspace(0, self.n_rows - 1, min(self.n_rows, CHECKED_ROWS)).astype(np.int64))
        for lane in self.lanes:
            device_rows = to_numpy(xp.take(self._device[(lane, xp.__name__)],
                                           xp.asarray(sample, device=default_device(xp)), axis=0))
            host = self._store[lane]
            if isinstance(host, _Spill):  # a spilled cache is read from its file, never copied to the device
                raise internal_error("rows spilled to disk checked against a device copy")
            host_rows = host[sample]
            if device_rows.tobytes() != np.ascontiguousarray(host_rows).tobytes():
                raise FoalPipeError(f"the rows copied to the device differ from the decoded rows ({self.copy_mode} "
                                    f"copy); set {SYNC_VARIABLE}=1 to copy synchronously, and report it")

    def block(self, lane: str | None, start: int, stop: int, xp: Any = None) -> Any:
        """Rows at positions ``[start, stop)`` of ``lane``; with a device namespace ``xp``, on the device (the
        whole in-memory cache is copied there once, so the walk does not wait on a copy per block)."""
        store = self._store[lane]
        if isinstance(store, _Spill):
            return store.read(start, stop)
        if xp is None or is_numpy_namespace(xp):
            return store[start:stop]
        key = (lane, xp.__name__)
        if key not in self._device:
            self._device[key] = xp.asarray(store, device=default_device(xp))
        return self._device[key][start:stop, ...]

    def take(self, lane: str | None, positions: np.ndarray, xp: Any = None) -> Any:
        """Rows at ``positions`` (in that order): :meth:`block` where they are consecutive, else gathered (from a
        spill file, each run of consecutive positions read once)."""
        if positions.size and int(positions[-1]) - int(positions[0]) == positions.size - 1 and \
                (positions.size == 1 or (np.diff(positions) == 1).all()):
            return self.block(lane, int(positions[0]), int(positions[-1]) + 1, xp)
        store = self._store[lane]
        if isinstance(store, _Spill):
            breaks = np.flatnonzero(np.diff(positions) != 1) + 1
            runs = zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [positions.size]]))
            X = np.concatenate([store.read(int(positions[a]), int(positions[b - 1]) + 1) for a, b in runs])
        elif xp is not None and (lane, xp.__name__) in self._device:
            return xp.take(self._device[(lane, xp.__name__)], xp.asarray(positions, device=default_device(xp)), axis=0)
        else:
            X = store[positions]
        return X if xp is None or is_numpy_namespace(xp) else xp.asarray(X, device=default_device(xp))

    def close(self) -> None:
        if self._copier is not None:
            self._copier.close()
            self._copier = None
        for store in self._store.values():
            if isinstance(store, _Spill):
                store.close()
        self._store, self._device = {}, {}

    def __enter__(self) -> GroupedRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TaskBlocks:
    """One stream's tasks over a :class:`GroupedRows` that holds their rows: each task's rows in storage order (so a
    cache grouped by this stream's tasks gives consecutive ranges, and a cache grouped otherwise, by class for many
    orders, walks the rows in the same order, so that walk positions, and the leave-one-out sample drawn over them,
    name the same rows), as cache positions cut into blocks of ``size`` rows.

    ``blocks(k)`` yields ``(start, stop, positions)``: the block's place in the walk (tasks 1..k are walk rows
    ``[0, ends[k])``) and its cache positions. Every pass cuts a task the same way. With ``points`` (training
    rows seen, in stream order: ``--eval-every``), a task is first cut, in stream order, into segments at the
    points inside it; each segment is then put in storage order and cut into blocks, so a block ends at every point
    and walk rows ``[0, p)`` are the first ``p`` rows of the stream.
    """

    def __init__(self, rows: GroupedRows, stream_rows: Sequence[np.ndarray], size: int, points: Sequence[int] = ()):
        self.size, self.points = size, frozenset(points)
        self.ends = np.cumsum([r.size for r in stream_rows]).astype(np.int64)
        self.segments: list[list[np.ndarray]] = []
        for k, r in enumerate(stream_rows):
            base = int(self.ends[k]) - r.size
            cuts = [p - base for p in points if base < p < base + r.size]
            self.segments.append([rows.position[np.sort(s)] for s in np.split(r, cuts)])
        if any((s < 0).any() for segments in self.segments for s in segments):
            raise FoalPipeError("the decoded rows lack some of the stream's rows; re-run the command")

    def blocks(self, k: int) -> Iterator[tuple[int, int, np.ndarray]]:
        base = int(self.ends[k]) - sum(s.size for s in self.segments[k])
        for positions in self.segments[k]:
            for a in range(0, positions.size, self.size):
                yield base + a, base + min(a + self.size, positions.size), positions[a : a + self.size]
            base += positions.size
