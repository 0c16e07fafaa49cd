"""Decoded rows onto the device (foal_pipe/protocol/devicecopy.py), checked without a GPU: a stream double runs
no copy until the host waits, so a staging buffer refilled before its copy ran shows up as wrong rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import foal_pipe.protocol.devicecopy as devicecopy
import foal_pipe.protocol.rowcache as rowcache
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.devicecopy import StagedCopier, SyncCopier, device_copier
from foal_pipe.store import open_store, write_store

LANES = (None, "mean(1-2)", "mean(3-4)")


class _Box:
    """A device array that a queued copy fills when the stream runs it."""

    value: Any = None


class DeferredStreams:
    """A copy stream that queues every copy and scatter and runs them only when the host waits (an event, or the
    whole stream): a copy reads its pinned buffer then, not when it was issued. Logs each call; ``overwritten``
    lists the buffers whose contents changed between a copy's issue and its run."""

    def __init__(self, to_device: Callable[[np.ndarray], Any] = lambda a: a):
        self.to_device = to_device
        self.queue: list[Callable[[], None]] = []
        self.ran = 0
        self.marks: dict[int, int] = {}
        self.buffers: list[np.ndarray] = []
        self.last_copy: dict[int, int] = {}
        self.log: list[tuple[str, int]] = []
        self.overwritten: list[int] = []
        self.early: list[int] = []

    def _run(self, upto: int) -> None:
        while self.ran < upto:
            self.queue[self.ran]()
            self.ran += 1

    def empty(self, shape, dtype):
        return self.to_device(np.full(shape, np.nan, dtype=dtype))

    def follow(self) -> None:
        self.log.append(("follow", -1))

    def pinned(self, shape, dtype):
        self.buffers.append(np.full(shape, -7, dtype=dtype))
        return self.buffers[-1]

    def event(self):
        return object()

    def copy(self, host):
        (b,) = [i for i, buf in enumerate(self.buffers) if np.shares_memory(buf, host)]
        if b in self.last_copy and self.last_copy[b] >= self.ran:
            self.early.append(b)  # refilled while its previous copy had not run
        issued, out = host.copy(), _Box()

        def run() -> None:
            if not np.array_equal(host, issued):
                self.overwritten.append(b)
            out.value = self.to_device(host.copy())

        self.last_copy[b] = len(self.queue)
        self.queue.append(run)
        self.log.append(("copy", b))
        return out

    def scatter(self, dst, positions, values):
        def run() -> None:
            dst[positions.value] = values.value

        self.queue.append(run)
        self.log.append(("scatter", -1))

    def record(self, event):
        self.marks[id(event)] = len(self.queue)
        self.log.append(("record", id(event)))

    def wait(self, event):
        self._run(self.marks[id(event)])
        self.log.append(("wait", id(event)))

    def synchronize(self):
        self._run(len(self.queue))
        self.log.append(("synchronize", -1))


class NoWait(DeferredStreams):
    """A broken ring: refills a buffer without waiting for its event."""

    def wait(self, event):
        self.log.append(("wait", id(event)))


def _chunks(sizes: list[int], dim: int, lanes=LANES, seed: int = 0):
    """Chunks of the given row counts at random cache positions, each lane its own values; and the rows expected
    on the device (a plain NumPy scatter)."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    positions = np.split(rng.permutation(n).astype(np.int64), np.cumsum(sizes)[:-1])
    chunks = [(pos, {lane: rng.normal(size=(pos.size, dim)).astype(np.float32) for lane in lanes}) for pos in positions]
    expected = {lane: np.zeros((n, dim), dtype=np.float32) for lane in lanes}
    for pos, values in chunks:
        for lane, X in values.items():
            expected[lane][pos] = X
    return n, chunks, expected


SIZES = [7, 23, 1, 40, 12, 9, 31, 5, 18]  # unequal, more chunks than buffers, some larger than a buffer


def _staged(streams: DeferredStreams) -> tuple[dict, dict]:
    """SIZES' chunks (4 columns) through a ring of 16-row buffers on ``streams``: the device arrays, the host's."""
    n, chunks, expected = _chunks(SIZES, 4)
    copier = StagedCopier(streams, LANES, n, 4, np.dtype(np.float32), rows=16)
    for pos, values in chunks:
        copier.put(pos, values)
    return copier.finish(), expected


@pytest.mark.parametrize("rows", [40, 10])
def test_staged_rows_equal_the_host_rows(rows):
    n, chunks, expected = _chunks(SIZES, 6)
    streams = DeferredStreams()
    copier = StagedCopier(streams, LANES, n, 6, np.dtype(np.float32), rows=rows)
    assert len(copier.slots) == devicecopy.BUFFERS < len(SIZES) and copier.rows == rows
    for pos, values in chunks:
        copier.put(pos, values)
    assert streams.ran < len(streams.queue)  # copies were still queued: the double deferred them
    device = copier.finish()
    assert streams.ran == len(streams.queue)
    for lane in LANES:
        assert device[lane].dtype == np.float32 and np.array_equal(device[lane], expected[lane])


def test_a_buffer_is_refilled_only_after_its_event_was_waited_on():
    streams = DeferredStreams()
    _staged(streams)
    assert streams.overwritten == [] and streams.early == []
    assert streams.log[0] == ("follow", -1)  # the copy stream follows the default stream before any copy
    # between two uses of a slot (its positions buffer: the first of its 1 + lanes buffers), a wait on that slot's
    # event, recorded after the earlier use's copies and scatters
    per_slot = 1 + len(LANES)
    uses: dict[int, list[int]] = {}
    for i, (call, b) in enumerate(streams.log):
        if call == "copy" and b % per_slot == 0:
            uses.setdefault(b // per_slot, []).append(i)
    assert max(len(u) for u in uses.values()) > 1
    for at in uses.values():
        event = streams.log[next(i for i in range(at[0], len(streams.log)) if streams.log[i][0] == "record")][1]
        for before, after in zip(at, at[1:]):
            between = streams.log[before:after]
            assert ("wait", event) in between and between.index(("record", event)) < between.index(("wait", event))
        for i in at:  # each lane's copy is scattered before the slot's event is recorded
            calls = [c for c, _ in streams.log[i : i + 2 * len(LANES) + 2]]
            assert calls == ["copy"] + ["copy", "scatter"] * len(LANES) + ["record"]


def test_the_double_catches_a_ring_that_does_not_wait():
    """The checks above can fail: without the waits, buffers are refilled under queued copies and rows go wrong."""
    streams = NoWait()
    device, expected = _staged(streams)
    assert streams.overwritten and streams.early
    assert not all(np.array_equal(device[lane], expected[lane]) for lane in LANES)


def test_staging_buffers_are_bounded():
    dim = 64
    row_bytes = dim * 4 * len(LANES)
    copier = StagedCopier(DeferredStreams(), LANES, 10, dim, np.dtype(np.float32), rows=10**6)
    assert copier.rows == devicecopy.STAGING_BYTES // row_bytes
    assert all(buf.nbytes <= devicecopy.STAGING_BYTES // len(LANES) for buf in copier.streams.buffers)


def _namespaces():
    import array_api_compat.numpy as np_xp

    out = [pytest.param(np_xp, id="numpy")]
    try:
        import array_api_compat.torch as torch_xp
        import torch

        if not torch.cuda.is_available():
            out.append(pytest.param(torch_xp, id="torch-cpu"))
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("xp", _namespaces())
def test_the_synchronous_copy_gives_the_host_rows(xp):
    from foal_pipe.core.backend import to_numpy

    n, chunks, expected = _chunks(SIZES, 5)
    copier = device_copier(xp, LANES, n, 5, np.dtype(np.float32), rows=64)
    assert isinstance(copier, SyncCopier) and copier.mode == "sync"
    for pos, values in chunks:
        copier.put(pos, values)
    device = copier.finish()
    for lane in LANES:
        assert np.array_equal(to_numpy(device[lane]), expected[lane])


def test_namespaces_without_streams_copy_synchronously():
    import array_api_strict

    assert isinstance(device_copier(array_api_strict, [None], 3, 2, np.dtype(np.float32), 3), SyncCopier)


@pytest.fixture
def torch_xp():
    pytest.importorskip("torch")
    import array_api_compat.torch as xp

    return xp


def test_the_variable_and_a_failed_setup_give_the_synchronous_copy(torch_xp, monkeypatch):
    monkeypatch.setitem(devicecopy.STREAMS, "torch", lambda xp: DeferredStreams())
    assert isinstance(device_copier(torch_xp, [None], 8, 2, np.dtype(np.float32), 4), StagedCopier)
    monkeypatch.setenv(devicecopy.SYNC_VARIABLE, "1")
    assert isinstance(device_copier(torch_xp, [None], 8, 2, np.dtype(np.float32), 4), SyncCopier)
    monkeypatch.delenv(devicecopy.SYNC_VARIABLE)

    class NoPinned(DeferredStreams):
        def pinned(self, shape, dtype):
            raise MemoryError("cannot page-lock")

    monkeypatch.setitem(devicecopy.STREAMS, "torch", lambda xp: NoPinned())
    assert isinstance(device_copier(torch_xp, [None], 8, 2, np.dtype(np.float32), 4), SyncCopier)


def test_a_failed_copy_is_one_clear_error():
    class Broken(DeferredStreams):
        def copy(self, host):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    copier = StagedCopier(Broken(), [None], 4, 2, np.dtype(np.float32), rows=4)
    fix = f"copying the decoded rows to the device failed .*{devicecopy.SYNC_VARIABLE}=1"
    with pytest.raises(FoalPipeError, match=fix) as err:
        copier.put(np.arange(4), {None: np.ones((4, 2), np.float32)})
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """130 rows in 20-row chunks, 9 classes."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 9, 130)
    x = rng.normal(size=(130, 5)).astype(np.float32)
    return write_store(tmp_path_factory.mktemp("copy") / "s.zarr", (x, y), (x[:20], y[:20]), [f"c{i}" for i in range(9)],
                       chunk_rows=20)


def test_grouped_rows_staged_on_the_device_equal_the_host_rows(store, torch_xp, monkeypatch):
    """Through GroupedRows (chunks of unequal selected rows, more chunks than buffers): the staged device rows, the
    synchronous ones and the host cache are the same bits, for every block and gather."""
    import torch

    monkeypatch.setattr(rowcache, "on_device", lambda namespace: namespace is torch_xp)  # torch on the CPU stands in
    doubles: list[DeferredStreams] = []

    def deferred(xp):
        doubles.append(DeferredStreams(torch.from_numpy))
        return doubles[-1]

    monkeypatch.setitem(devicecopy.STREAMS, "torch", deferred)
    split = open_store(store).split("train")
    groups = np.where(np.asarray(split.labels) % 3 == 0, -1, np.asarray(split.labels) % 4)  # some rows left out
    host = rowcache.GroupedRows(split, [None], groups, 4, 2**30)
    staged = rowcache.GroupedRows(split, [None], groups, 4, 2**30, xp=torch_xp)
    monkeypatch.setenv(devicecopy.SYNC_VARIABLE, "1")
    sync = rowcache.GroupedRows(split, [None], groups, 4, 2**30, xp=torch_xp)
    assert (host.copy_mode, staged.copy_mode, sync.copy_mode) == (None, "staged", "sync")
    (double,) = doubles
    assert double.overwritten == [] and double.early == [] and double.ran == len(double.queue)
    assert len({pos for call, pos in double.log if call == "copy"}) == 2 * devicecopy.BUFFERS
    expected = host.block(None, 0, host.n_rows)
    assert host.n_rows < 130 and not np.isnan(expected).any()
    for rows in (staged, sync):
        device = rows._device[(None, torch_xp.__name__)]
        assert torch.equal(device, torch.from_numpy(expected))
        for lo, hi in zip(rows.offsets[:-1], rows.offsets[1:]):
            assert torch.equal(rows.block(None, int(lo), int(hi), torch_xp), torch.from_numpy(expected[lo:hi]))
        picked = np.random.default_rng(1).permutation(rows.n_rows)[:30]
        assert torch.equal(rows.take(None, picked, torch_xp), torch.from_numpy(expected[picked]))


@pytest.mark.parametrize("name", ["numpy", "array_api_strict", "torch"])
def test_host_namespaces_copy_nothing(store, name):
    """NumPy, array_api_strict and torch on the CPU read as before: no copier, the host cache's rows."""
    from foal_pipe.core.backend import NAMESPACES, to_numpy

    if name == "torch":
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("torch sees a GPU here")
    xp = NAMESPACES[name]()
    split = open_store(store).split("train")
    groups = np.asarray(split.labels) % 4
    rows = rowcache.GroupedRows(split, [None], groups, 4, 2**30, xp=xp)
    assert rows.copy_mode is None and rows._device == {}
    expected = np.asarray(split.read(0, 130))[rows.rows]
    assert np.array_equal(to_numpy(rows.block(None, 0, rows.n_rows, xp)), expected)


def test_device_rows_that_differ_from_the_host_are_refused(store, torch_xp, monkeypatch):
    """A copy stream that loses a chunk's scatter: GroupedRows compares sampled rows with the host cache and refuses
    in one line instead of handing the walk wrong rows."""
    import torch

    monkeypatch.setattr(rowcache, "on_device", lambda namespace: namespace is torch_xp)

    class LosesOneScatter(DeferredStreams):
        lost = False

        def scatter(self, dst, positions, values):
            if not self.lost:
                self.lost = True
                return
            super().scatter(dst, positions, values)

    monkeypatch.setitem(devicecopy.STREAMS, "torch", lambda xp: LosesOneScatter(torch.from_numpy))
    split = open_store(store).split("train")
    groups = np.asarray(split.labels) % 4
    with pytest.raises(FoalPipeError, match="differ from the decoded rows .staged copy.; set FOAL_PIPE_SYNC_COPY=1"):
        rowcache.GroupedRows(split, [None], groups, 4, 2**30, xp=torch_xp)
