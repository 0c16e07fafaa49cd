"""Decoded rows onto a device, chunk by chunk, the copies overlapped with the read.

:class:`~foal_pipe.protocol.rowcache.GroupedRows` decodes a split's chunks on background threads and hands each
to the main thread; on a device namespace every chunk's rows also go into one device array per lane. A
synchronous copy (:class:`SyncCopier`: ``xp.asarray`` from pageable memory on the default stream) holds the main
thread until the chunk is on the device. :class:`StagedCopier` copies instead through a ring of page-locked
("pinned") host buffers on a stream of its own: a chunk's rows go into the next buffer, are copied and scattered
into the device arrays on that stream, and the main thread moves on to the next chunk. A buffer is refilled only
after the event recorded behind its last copy has passed, and :meth:`StagedCopier.finish` waits for the stream
once, before the walk uses the rows: it is only a copy, so the device holds the same bits either way.

The stream primitives come from :data:`STREAMS` (CuPy; torch on CUDA), behind the small :class:`Streams`
interface the tests replace with a double that defers every copy. A namespace without an entry, a failure to
set up the stream or the pinned buffers, or ``FOAL_PIPE_SYNC_COPY=1`` in the environment gives the synchronous
copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from foal_pipe.core.backend import IS_NAMESPACE, default_device
from foal_pipe.errors import FoalPipeError

#: Set to 1 to copy decoded rows to the device synchronously (the fallback; to compare, or to rule the staged
#: copy out).
SYNC_VARIABLE = "FOAL_PIPE_SYNC_COPY"
#: Pinned staging buffers in the ring: one being filled while the stream copies the others.
BUFFERS = 3
#: Pinned bytes per buffer at most (every lane together); a larger chunk is staged in pieces.
STAGING_BYTES = 32 * 2**20

Lane = str | None


class Streams(Protocol):
    """A backend's primitives for asynchronous host-to-device copies on one stream of their own."""

    def empty(self, shape: tuple[int, int], dtype: np.dtype) -> Any:
        """A device array, made on the current (default) stream."""

    def follow(self) -> None:
        """Order the copy stream after the work queued so far on the current stream (the device arrays' memory
        may have been in use there)."""

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A page-locked host buffer, as a NumPy array."""

    def event(self) -> Any: ...

    def copy(self, host: np.ndarray) -> Any:
        """``host`` (a view of a pinned buffer) to a new device array, asynchronously on the copy stream."""

    def scatter(self, dst: Any, positions: Any, values: Any) -> None:
        """``dst[positions] = values`` on the copy stream."""

    def record(self, event: Any) -> None:
        """Record ``event`` on the copy stream, behind the copies and scatters queued so far."""

    def wait(self, event: Any) -> None:
        """Block the host until ``event`` has passed."""

    def synchronize(self) -> None:
        """Block the host until all the work queued on the copy stream is done."""


class SyncCopier:
    """Each chunk copied and scattered at once (``xp.asarray`` on the default stream): the fallback."""

    mode = "sync"

    def __init__(self, xp: Any, n_rows: int, dim: int, dtype: np.dtype):
        self.xp, self.where, self.shape, self.dtype = xp, default_device(xp), (n_rows, dim), np.dtype(dtype)
        self.device: dict[Lane, Any] = {}

    def put(self, positions: np.ndarray, values: Mapping[Lane, np.ndarray]) -> None:
        at = self.xp.asarray(positions, device=self.where)
        for lane, X in values.items():
            X = self.xp.asarray(np.asarray(X, dtype=self.dtype), device=self.where)
            if lane not in self.device:
                self.device[lane] = self.xp.empty(self.shape, dtype=X.dtype, device=self.where)
            self.device[lane][at, ...] = X

    def finish(self) -> dict[Lane, Any]:
        return self.device

    def close(self) -> None:
        self.device = {}


@dataclass
class _Slot:
    """One staging buffer of the ring: positions and each lane's rows, and the event behind its last copy."""

    positions: np.ndarray
    values: dict[Lane, np.ndarray]
    event: Any
    in_flight: bool = False


class StagedCopier:
    """Chunks copied through :data:`BUFFERS` pinned buffers on a stream of their own (see the module)."""

    mode = "staged"

    def __init__(self, streams: Streams, lanes: Sequence[Lane], n_rows: int, dim: int, dtype: np.dtype, rows: int,
                 buffers: int = BUFFERS):
        dtype = np.dtype(dtype)
        self.streams = streams
        self.rows = int(max(1, min(rows, STAGING_BYTES // max(1, dim * dtype.itemsize * len(lanes)))))
        self.device = {lane: streams.empty((n_rows, dim), dtype) for lane in lanes}
        streams.follow()
        self.slots = [_Slot(streams.pinned((self.rows,), np.dtype(np.int64)),
                            {lane: streams.pinned((self.rows, dim), dtype) for lane in lanes}, streams.event())
                      for _ in range(buffers)]
        self.turn = 0

    def put(self, positions: np.ndarray, values: Mapping[Lane, np.ndarray]) -> None:
        """Stage the rows at cache ``positions`` (in pieces of at most :attr:`rows`) and queue their copies."""
        try:
            for a in range(0, positions.size, self.rows):
                self._stage(positions[a : a + self.rows], {lane: X[a : a + self.rows] for lane, X in values.items()})
        except Exception as exc:
            raise _copy_error(exc) from None

    def _stage(self, positions: np.ndarray, values: Mapping[Lane, np.ndarray]) -> None:
        slot = self.slots[self.turn % len(self.slots)]
        self.turn += 1
        if slot.in_flight:
            self.streams.wait(slot.event)  # its last copy has read the buffer: it may be refilled
        m = positions.size
        slot.positions[:m] = positions
        for lane, X in values.items():
            slot.values[lane][:m] = X
        at = self.streams.copy(slot.positions[:m])
        for lane in values:
            self.streams.scatter(self.device[lane], at, self.streams.copy(slot.values[lane][:m]))
        self.streams.record(slot.event)
        slot.in_flight = True

    def finish(self) -> dict[Lane, Any]:
        """The device arrays, once every queued copy and scatter is done."""
        try:
            self.streams.synchronize()
        except Exception as exc:
            raise _copy_error(exc) from None
        for slot in self.slots:
            slot.in_flight = False
        return self.device

    def close(self) -> None:
        """Let the queued copies end before the buffers go (after a failure too)."""
        try:
            self.streams.synchronize()
        except Exception:  # the copy already failed and said so; nothing is read from these arrays
            pass
        self.slots, self.device = [], {}


def _copy_error(exc: Exception) -> FoalPipeError:
    return FoalPipeError(f"copying the decoded rows to the device failed ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}); set {SYNC_VARIABLE}=1 to copy synchronously, or use "
                         f"another backend")


class _OnStream:
    """What CuPy's and torch's streams and events share: record on the copy stream, wait on the host."""

    stream: Any

    def record(self, event: Any) -> None:
        event.record(self.stream)

    def wait(self, event: Any) -> None:
        event.synchronize()

    def synchronize(self) -> None:
        self.stream.synchronize()


class _CupyStreams(_OnStream):
    """CuPy: ``cupyx.empty_pinned`` buffers, a non-blocking ``cupy.cuda.Stream``, ``ndarray.set(..., stream=)``."""

    def __init__(self, xp: Any):
        import cupy
        import cupyx

        self.cupy, self.cupyx = cupy, cupyx
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def empty(self, shape: tuple[int, int], dtype: np.dtype) -> Any:
        return self.cupy.empty(shape, dtype=dtype)

    def follow(self) -> None:
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self.cupyx.empty_pinned(shape, dtype=dtype)

    def event(self) -> Any:
        return self.cupy.cuda.Event(block=True, disable_timing=True)

    def copy(self, host: np.ndarray) -> Any:
        with self.stream:  # allocated from the stream's own pool: reused only in the stream's order
            out = self.cupy.empty(host.shape, dtype=host.dtype)
        out.set(host, stream=self.stream)
        return out

    def scatter(self, dst: Any, positions: Any, values: Any) -> None:
        with self.stream:
            dst[positions] = values


class _TorchStreams(_OnStream):
    """torch on CUDA: ``pin_memory=True`` tensors, a ``torch.cuda.Stream``, ``Tensor.to(non_blocking=True)``."""

    def __init__(self, xp: Any):
        import torch

        self.torch, self.where = torch, default_device(xp)
        self.stream = torch.cuda.Stream(self.where)
        self.pinned_of: dict[int, Any] = {}

    def _dtype(self, dtype: np.dtype) -> Any:
        return self.torch.from_numpy(np.empty(0, dtype=dtype)).dtype

    def empty(self, shape: tuple[int, int], dtype: np.dtype) -> Any:
        return self.torch.empty(shape, dtype=self._dtype(dtype), device=self.where)

    def follow(self) -> None:
        self.stream.wait_stream(self.torch.cuda.current_stream(self.where))

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        tensor = self.torch.empty(shape, dtype=self._dtype(dtype), pin_memory=True)
        host = tensor.numpy()  # shares the pinned memory; copy() finds the tensor by the address of its start
        self.pinned_of[host.ctypes.data] = tensor
        return host

    def event(self) -> Any:
        return self.torch.cuda.Event(blocking=True)

    def copy(self, host: np.ndarray) -> Any:
        tensor = self.pinned_of[host.ctypes.data][: host.shape[0]]  # a buffer's first rows, as its pinned tensor
        with self.torch.cuda.stream(self.stream):
            return tensor.to(self.where, non_blocking=True)

    def scatter(self, dst: Any, positions: Any, values: Any) -> None:
        with self.torch.cuda.stream(self.stream):
            dst[positions] = values


def _torch_streams(xp: Any) -> Streams | None:
    return _TorchStreams(xp) if default_device(xp).type == "cuda" else None


#: Stream primitives by backend name; each returns None where the namespace has no device streams.
STREAMS: dict[str, Callable[[Any], Streams | None]] = {"cupy": _CupyStreams, "torch": _torch_streams}


def device_copier(xp: Any, lanes: Sequence[Lane], n_rows: int, dim: int, dtype: np.dtype,
                  rows: int) -> SyncCopier | StagedCopier:
    """The copier for namespace ``xp``: staged through pinned buffers (``rows`` rows each: the largest chunk)
    where :data:`STREAMS` has the namespace and it sets up, else synchronous."""
    if os.environ.get(SYNC_VARIABLE, "") not in ("", "0"):
        return SyncCopier(xp, n_rows, dim, dtype)
    name = next((name for name, is_namespace in IS_NAMESPACE.items() if is_namespace(xp)), None)
    if name in STREAMS:
        try:
            streams = STREAMS[name](xp)
            if streams is not None:
                return StagedCopier(streams, lanes, n_rows, dim, dtype, rows)
        except Exception:  # no stream, no pinned memory: the synchronous copy gives the same rows
            pass
    return SyncCopier(xp, n_rows, dim, dtype)
