"""The memory estimates count what the runs hold together (table, --order-seeds), the test pass's scores, the
store's real size, and refuse in one line with options the command has; checked on the estimates, not on RSS."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from helpers import N_CLASSES, assert_clean_error, build_store, invoke

import foal_pipe.memory as memory
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

D = 200  # C x D^2 float64 per-class statistics: 12 x 200^2 x 8 = 3.7 MiB, far above any rounding of the rest


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("estimates") / "blobs.zarr")


def _prepare(store, tasks=2, loo=False, n_models=1, command="learn", **model):
    from foal_pipe.protocol.run import prepare

    return prepare(store, StreamConfig(tasks=tasks), ModelConfig(**model), EvaluationConfig(),
                   ExecutionConfig(backend="numpy"), n_models=n_models, loo=loo, command=command)


def _record(monkeypatch, module) -> list[tuple[str, dict[str, int]]]:
    """Every check_memory call of ``module`` (command, parts), on an unbounded machine."""
    calls: list[tuple[str, dict[str, int]]] = []

    def spy(command, parts, fix):
        calls.append((command, dict(parts)))
        return memory.BASELINE_BYTES + sum(parts.values())

    monkeypatch.setattr(module, "check_memory", spy)
    return calls


def test_table_counts_the_per_class_statistics_before_the_first_run(store, tmp_path, monkeypatch):
    """A machine that holds each run alone but not the per-class statistics beside it: refused before any work."""
    import foal_pipe.protocol.run as run_module
    from foal_pipe.protocol.classsums import class_statistics_bytes

    monkeypatch.setattr(memory, "available_memory", lambda: 2**40)
    calls = _record(monkeypatch, run_module)
    args = ("table", "--features", store, "--tasks", 3, "--projection-dim", D, "--heads", "ridge", "--order-seeds",
            "0,1", "--gamma", 1, "--backend", "numpy")
    assert invoke(*args, "--out", tmp_path / "probe").exit_code == 0
    one_run = max(memory.BASELINE_BYTES + sum(parts.values()) for _, parts in calls)
    monkeypatch.undo()
    stats = class_statistics_bytes(N_CLASSES, D, "float64")
    monkeypatch.setattr(memory, "available_memory", lambda: one_run + stats // 2)
    out = tmp_path / "out"
    result = invoke(*args, "--out", out)
    assert_clean_error(result, "table needs about", out)
    assert "per-class statistics" in result.output and str(store) in result.output
    assert "--dtype" not in result.output and "--gammas" not in result.output
    monkeypatch.setattr(memory, "available_memory", lambda: one_run + 2 * stats)
    assert invoke(*args, "--out", tmp_path / "fits").exit_code == 0


def test_sweep_order_seeds_counts_every_gamma_and_the_other_orders(store, tmp_path, monkeypatch):
    import foal_pipe.protocol.orders as orders

    monkeypatch.setattr(memory, "available_memory", lambda: 2**40)
    calls = _record(monkeypatch, orders)
    gammas = [0.01, 0.1, 1.0, 10.0, 100.0]
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 2, "--projection-dim", D,
                    "--gammas", ",".join(map(str, gammas)), "--order-seeds", "0,1,2", "--no-loo", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    ((command, parts),) = [c for c in calls if c[0] == "sweep --order-seeds"]
    assert parts["weights of every boundary"] == 2 * D * len(gammas) * N_CLASSES * 8
    assert parts[f"state at D={D}"] == D * D * 48  # factored at every boundary, as ManyGammas solves
    assert parts["the other 2 orders' prepared runs"] > 0


def test_no_loo_counts_the_test_pass_scores_of_every_gamma(store):
    from foal_pipe.protocol.memoryparts import memory_parts

    run = _prepare(store, projection_dim=D, gamma=1.0, n_models=1, command="sweep")
    one, many = memory_parts(run, 1, False), memory_parts(run, 250, False)
    rows = min(run.block_rows, run.store.test.n_rows)
    assert many["a block of rows"] - one["a block of rows"] >= rows * 249 * N_CLASSES * 8


def test_projection_dim_0_keeps_max_memory_for_the_per_class_statistics(store, tmp_path):
    """D is the store's width with --projection-dim 0: its per-class statistics count against --max-memory."""
    from foal_pipe.protocol.classsums import class_statistics_bytes

    need = class_statistics_bytes(N_CLASSES, run_width(store), "float64")
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", "--tasks", 2, "--projection-dim", 0,
                    "--gammas", "0.1,1", "--order-seeds", "0,1", "--no-loo", "--max-memory", need - 1,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "running one walk per class order" in result.output and "per-class statistics need" in result.output


def run_width(store) -> int:
    from foal_pipe.store import open_store

    return int(open_store(store).dim)


@pytest.mark.parametrize("text", ["1e400", "1e300TiB", "0.5", "0.4"])
def test_max_memory_overflow_and_fractions_are_refused_in_one_line(text):
    with pytest.raises(FoalPipeError) as info:
        memory.parse_memory(text)
    assert "\n" not in str(info.value) and repr(text) in str(info.value)


def test_raise_max_memory_to_the_suggested_figure_takes_one_pass():
    """The fallback's "raise --max-memory to X": X read back holds the statistics (rounded up, not to nearest)."""
    from foal_pipe.protocol.classsums import class_statistics_bytes
    from foal_pipe.protocol.orderchecks import fallback_reason

    dim = next(d for d in range(500, 800) if memory.parse_memory(memory.human(class_statistics_bytes(50, d, "float64")))
               < class_statistics_bytes(50, d, "float64"))
    model, execution = ModelConfig(projection_dim=dim), ExecutionConfig(max_memory=2**20)
    reason = fallback_reason(StreamConfig(), model, execution, False, 50)
    suggested = re.search(r"raise --max-memory to ([0-9.]+ [KMGT]iB)", reason or "")
    assert suggested is not None, reason
    raised = replace(execution, max_memory=memory.parse_memory(suggested.group(1)))
    assert fallback_reason(StreamConfig(), model, raised, False, 50) is None


def test_refusals_name_the_commands_own_options(store, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 1)
    out = tmp_path / "out"
    learn = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 64, "--gamma", 1,
                   "--backend", "numpy")
    assert_clean_error(learn, "learn needs about", out)
    assert "--gammas" not in learn.output and "--projection-dim" in learn.output
    sweep = invoke("sweep", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 64,
                   "--backend", "numpy")
    assert_clean_error(sweep, "fewer --gammas", out)
    auto = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 64, "--gamma", "auto",
                  "--backend", "numpy")
    assert_clean_error(auto, "--gamma-grid", out)


def test_sweep_fusions_refusal_suggests_fewer_fusions(store):
    from foal_pipe.protocol.memoryparts import memory_fix

    run = _prepare(store, projection_dim=48, gamma=1.0, command="sweep")
    assert "fewer fusions" in str(FoalPipeError(memory_fix("sweep", run, fusions=("last", "mean-cls"))))
    assert "fusions" not in str(FoalPipeError(memory_fix("sweep", run)))


def test_a_small_store_is_not_charged_a_full_block_and_every_chunk_in_flight(store):
    """600 train rows in 64-row chunks: the block holds at most 600 rows, the read at most the split's 10 chunks."""
    run = _prepare(store, projection_dim=48, gamma=1.0)
    from foal_pipe.protocol.memoryparts import memory_parts

    full_block = run.block_rows * (48 * 8 * 3 + run.store.dim * 8)
    assert run.block_rows > run.store.train.n_rows
    assert memory_parts(run, 1, False)["a block of rows"] < full_block


def test_a_heads_sweep_refusal_keeps_ridges_ways_and_names_the_heads():
    """Beside ridge, a head's statistics may be a small part: the refusal names ridge's ways too (it offered only
    'leave that head out' before)."""
    from foal_pipe.protocol.memoryparts import memory_fix

    run = SimpleNamespace(model=SimpleNamespace(gamma=1.0), evaluation=SimpleNamespace(eval_every=None),
                          execution=SimpleNamespace(scheduler="local"))
    both = str(FoalPipeError(memory_fix("sweep", run, ridge=True, heads=("fecam",))))
    for way in ("lower projection_dim", "dtype='float32'", "fewer gammas", "drop from heads a head"):
        assert way in both, both
    alone = str(FoalPipeError(memory_fix("learn", run, ridge=False, heads=("fecam",))))
    assert "leave that head out" in alone and "dtype" not in alone
