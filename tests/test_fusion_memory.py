"""``sweep --fusions``' memory estimate: a fused read charges what its threads hold (each chunk's blocks read and
copied, one fusion's norm temporaries at a time), the other lanes' activations of a block are one task's rows, and
the rows cached have the fusions' width; computed here from the shapes, and checked against the read's allocations."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.memoryparts import _read_bytes, memory_parts
from foal_pipe.protocol.rowcache import READ_AHEAD, READ_THREADS, GroupedRows, block_rows
from foal_pipe.protocol.run import prepare
from foal_pipe.store import write_store
from foal_pipe.store.blockfusion import FinalNorm, fuse

N_TRAIN, N_TEST, L, d, C, CHUNK = 900, 300, 4, 64, 6, 256
D, TASKS, MODELS = 96, 3, 13


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """float16 blocks (4 of 64 dims), a LayerNorm, 900 train and 300 test rows in chunks of 256."""
    rng = np.random.default_rng(7)
    y = np.arange(N_TRAIN + N_TEST) % C
    blocks = (rng.normal(size=(y.size, L, d)) + rng.normal(size=(C, 1, d))[y]).astype(np.float16)
    norm = FinalNorm("layernorm", 1e-6, np.linspace(0.5, 2, d, dtype=np.float32), np.zeros(d, np.float32))
    splits = [(fuse(b, "mean-cls", norm), t) for b, t in ((blocks[:N_TRAIN], y[:N_TRAIN]), (blocks[N_TRAIN:], y[N_TRAIN:]))]
    return write_store(tmp_path_factory.mktemp("fmem") / "blocks.zarr", *splits, [f"c{i}" for i in range(C)],
                       chunk_rows=CHUNK, blocks=(blocks[:N_TRAIN], blocks[N_TRAIN:]), norm=norm)


def _run(store, fusions):
    return prepare(store, StreamConfig(tasks=TASKS), ModelConfig(projection_dim=D), EvaluationConfig(),
                   ExecutionConfig(backend="numpy"), n_models=MODELS, loo=True, command="sweep", fusions=fusions)


def _read(n_rows: int, width: int, lanes: int) -> int:
    """A split's fused read: each reading thread holds 3x a chunk's blocks while reading (the array, zarr's decoded
    copy, the compressed bytes), or 2x while fusing (the array and a fusion's rows of it) with one fusion's float32
    mean and four float64 norm arrays and their row statistics (a fifth); READ_AHEAD + 1 chunks' float32 rows of every
    fusion are in flight."""
    chunks = -(-n_rows // CHUNK)
    blocks = CHUNK * L * d * 2
    thread = max(3 * blocks, 2 * blocks + CHUNK * width * (4 + 5 * 8))
    return min(READ_THREADS, chunks) * thread + min(READ_AHEAD + 1, chunks) * CHUNK * width * 4 * lanes


@pytest.mark.parametrize(("fusions", "width"), [(("mean-cls",), d), (("mean-cls", "last", "mean:2-3"), d),
                                                (("concat:1-2", "concat:3-4"), 2 * d)],
                         ids=["one", "three", "concat"])
def test_a_fusions_sweep_is_charged_the_parts_it_holds(store, fusions, width):
    run = _run(store, fusions)
    lanes = len(fusions)
    parts = memory_parts(run, MODELS, True, eigen=True)
    rows = min(block_rows(D), N_TRAIN)
    task_rows = N_TRAIN // TASKS  # 2 of the 6 classes a task, 150 rows each
    block = rows * (D * 8 * 3 + width * 8) + task_rows * D * 8 * (lanes - 1) + rows * (D + 3 * MODELS * C) * 8
    read = max(_read(N_TRAIN, width, lanes), _read(N_TEST, width, lanes))
    per_lane = f" x {lanes} fusions" if lanes > 1 else ""
    assert parts["a block of rows"] == block + read
    assert parts[f"decoded train rows{per_lane}"] == N_TRAIN * width * 4 * lanes
    assert parts[f"decoded test rows{per_lane}"] == N_TEST * width * 4 * lanes
    assert parts[f"state at D={D}{per_lane}"] == lanes * D * D * 48  # one set of statistics per fusion, as before


FUSIONS = [("mean-cls",), ("mean-cls", "last", "mean:2-3"), ("concat:1-2", "concat:3-4")]


def _traced(work, repeats: int = 3):
    """The peak of what ``work()`` allocates (NumPy's arrays included), and what it returns; run once before, so
    that what a first read loads (codecs, caches) is not counted. tracemalloc counts every thread's allocations, and
    in the whole suite another test's leftover thread may allocate meanwhile (135 kB once): the least peak of
    ``repeats`` runs is the work's own."""
    work()
    peaks = []
    for _ in range(repeats):
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = work()
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
        finally:
            tracemalloc.stop()
    return min(peaks), kept  # what one run held beforehand is in its `before`


@pytest.mark.parametrize("fusions", FUSIONS, ids=["one", "three", "concat"])
def test_a_reading_thread_allocates_no_more_than_a_chunk_is_charged(store, fusions):
    """One chunk read and fused as a reading thread does it (read_raw, then rows_of fusion by fusion): its peak stays
    under chunk_bytes plus the fused rows it returns (the old estimate, one copy of the blocks and 28 bytes a fused
    value, was under it for one fusion: 655,360 bytes against 924,711)."""
    split = _run(store, fusions).source("train")
    sel = np.arange(CHUNK)

    def work():
        raw = split.read_raw(0, CHUNK)
        return {lane: split.rows_of(raw, 0, sel, lane) for lane in split.specs}

    peak, fused = _traced(work)
    returned = sum(X.nbytes for X in fused.values())
    assert returned == CHUNK * split.dim * 4 * len(fusions)
    assert peak <= split.chunk_bytes + returned, (peak, split.chunk_bytes + returned)


@pytest.mark.parametrize("fusions", FUSIONS, ids=["one", "three", "concat"])
def test_the_fused_read_allocates_no_more_than_its_estimate(store, fusions):
    """The train split's whole read (GroupedRows, its threads included), less the cache it fills, stays under the
    estimate however the threads interleave."""
    run = _run(store, fusions)
    source = run.source("train")

    def work():
        with GroupedRows(source, run.lanes, run.row_task, run.stream.n_tasks, run.execution.max_memory) as cached:
            return cached.nbytes

    peak, cache = _traced(work)
    assert peak - cache <= _read_bytes(run, source), (peak - cache, _read_bytes(run, source))
