"""The memory estimate bounds what a run holds, measured (tracemalloc traces NumPy's allocations): one walk per class
order on top of every order's prepared run (``--order-seeds`` with a head, or ridge's walks per order), and the index
of a row cache spilled to a temporary file, whose rows cost no memory but whose positions and labels do."""

from __future__ import annotations

import tracemalloc

import pytest
from helpers import assert_clean_error, build_store, invoke

import foal_pipe.memory as memory
import foal_pipe.protocol.orders as orders
import foal_pipe.protocol.run as run_module

WIDTH, D, ORDERS = 256, 1000, 10  # each order's drawn projection (2 MiB) is about a tenth of one walk's estimate

#: name -> the command's arguments after the store and --out: ncm walks each order by definition; ridge's sweep falls
#: back to one walk per order where the per-class statistics exceed --max-memory (which also spills the rows).
WALKS = {
    "learn-ncm": ("learn", "--head", "ncm"),
    "sweep-fallback": ("sweep", "--gammas", "0.1,1", "--no-loo", "--max-memory", "1MiB"),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("walks") / "wide.zarr", train_dim=WIDTH, test_dim=WIDTH)


def _args(store, out, name: str, seeds: str) -> list:
    command, *rest = WALKS[name]
    return [command, "--features", store, "--out", out, "--tasks", 3, "--projection-dim", D, "--order-seeds", seeds,
            "--backend", "numpy", *rest]


def _estimates(monkeypatch) -> dict[str, list[int]]:
    """Every check_memory estimate (the parts, the interpreter left out) by module: ``run``, each walk's own."""
    seen: dict[str, list[int]] = {"run": [], "orders": []}

    def spy(check, key):
        def recorded(command, parts, fix):
            seen[key].append(sum(parts.values()))
            return check(command, parts, fix)
        return recorded

    for key, module in (("run", run_module), ("orders", orders)):
        monkeypatch.setattr(module, "check_memory", spy(module.check_memory, key))
    return seen


def _measured(store, tmp_path, monkeypatch, name: str) -> tuple[int, int, int]:
    """(traced peak, largest estimate, largest walk's own estimate) of the command at ORDERS orders, after a one-order
    run has imported all it imports (the interpreter's own memory is BASELINE_BYTES', not the estimate's)."""
    assert invoke(*_args(store, tmp_path / "warm", name, "0")).exit_code == 0
    estimates = _estimates(monkeypatch)
    tracemalloc.start()
    try:
        result = invoke(*_args(store, tmp_path / "out", name, ",".join(map(str, range(ORDERS)))))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    return peak, max(estimates["run"] + estimates["orders"]), max(estimates["run"])


@pytest.mark.parametrize("name", list(WALKS))
def test_walks_per_order_estimate_every_orders_prepared_run(store, tmp_path, monkeypatch, name):
    """Before: each walk's estimate alone (~20 MiB here) against a peak that also holds the other orders' projections."""
    peak, estimate, _ = _measured(store, tmp_path, monkeypatch, name)
    assert peak <= estimate <= 2 * peak, (peak, estimate)


@pytest.mark.parametrize("name", list(WALKS))
def test_walks_per_order_refused_below_their_need(store, tmp_path, monkeypatch, name):
    """A machine that holds one walk's estimate and the measured peak, not the other orders' runs counted beside it
    (ncm: the peak is above that estimate, the other orders' projections being much of it), is refused in one line
    before any work. Before: the walks ran."""
    peak, _, walk = _measured(store, tmp_path, monkeypatch, name)
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + max(peak, walk))
    out = tmp_path / "refused"
    result = invoke(*_args(store, out, name, ",".join(map(str, range(ORDERS)))))
    assert_clean_error(result, f"{WALKS[name][0]} --order-seeds needs about", out)
    assert f"the {ORDERS} orders' prepared runs" in result.output and "--order-seeds" in result.output.split(";")[-1]


def test_a_spilled_row_cache_counts_its_index(tmp_path):
    """Rows spilled to a file cost no memory; their store rows, labels and positions (and the walk's) do: 8 bytes each,
    about 40 per row, which at 10 million rows is 400 MB. Before: nothing counted for a spilled cache."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.memoryparts import memory_parts
    from foal_pipe.protocol.rowcache import TaskBlocks
    from foal_pipe.protocol.run import prepare
    from foal_pipe.protocol.walk import train_rows

    n = 200_000
    store = build_store(tmp_path / "long.zarr", n_train=n, train_dim=4, test_dim=4, chunk=4096)
    run = prepare(store, StreamConfig(tasks=3), ModelConfig(projection_dim=4, gamma=1.0), EvaluationConfig(),
                  ExecutionConfig(backend="numpy", max_memory=2**16))
    train_rows(run).close()  # its imports and thread pool, before the measure
    tracemalloc.start()
    try:
        with train_rows(run) as rows:
            assert not rows.in_memory
            TaskBlocks(rows, run.stream.rows, run.block_rows)
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    counted = sum(size for name, size in memory_parts(run, 1, False).items() if name.startswith("decoded train rows"))
    assert peak <= counted <= 2 * peak, (peak, counted)
