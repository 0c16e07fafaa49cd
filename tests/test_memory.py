"""Memory up front: learn and sweep estimate their peak and refuse, with the figure, what the machine cannot hold."""

from __future__ import annotations

import pytest
from helpers import assert_clean_error, build_store, invoke

import foal_pipe.memory as memory


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("mem") / "blobs.zarr")


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_too_large_projection_is_refused_before_any_work(tmp_path, store, monkeypatch, command):
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**30)  # a 2 GiB machine
    out = tmp_path / "out"
    result = invoke(command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 20000,
                    "--backend", "numpy")
    assert_clean_error(result, f"{command} needs about", out)
    assert "state at D=20000" in result.output and "only 2.0 GiB is available" in result.output
    assert "lower --projection-dim" in result.output


def test_estimate_grows_with_d_squared_not_with_tasks(store, monkeypatch):
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.memoryparts import memory_parts
    from foal_pipe.protocol.run import prepare

    def state(dim, tasks, dtype="float64", **model):
        run = prepare(store, StreamConfig(tasks=tasks), ModelConfig(projection_dim=dim, dtype=dtype, **model),
                      EvaluationConfig(), ExecutionConfig(backend="numpy"))
        return memory_parts(run, 1, False)[f"state at D={dim}"]

    assert state(400, 2) == state(400, 6) == 400 * 400 * 16  # G and one more D x D: not one per task
    assert state(800, 2) == 4 * state(400, 2)
    assert state(400, 2, "float32") == 400 * 400 * 12  # float32 sums, float64 solve
    assert state(400, 2, gamma="auto") == 400 * 400 * 48  # eigendecomposition with its workspace, G copied for it


def test_small_run_fits(tmp_path, store, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**30)
    result = invoke("learn", "--features", store, "--out", tmp_path / "ok", "--tasks", 2, "--projection-dim", 64,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output


def test_available_memory_reads_the_machine():
    available = memory.available_memory()
    assert available is None or available > 0


def test_leave_one_out_keeps_activations_only_within_the_budget(store, monkeypatch):
    """A leave-one-out run keeps rows x D activations when --max-memory and the machine allow, and its estimate
    counts them; a fixed gamma (issue 12's bounded walk) never keeps them."""
    from foal_pipe.protocol.config import KEPT_PART, EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.run import prepare

    parts = {}
    monkeypatch.setattr("foal_pipe.protocol.run.check_memory", lambda command, p, fix: parts.update(p) or 0)

    def run(gamma="auto", loo=True, max_memory=2**30):
        parts.clear()
        r = prepare(store, StreamConfig(tasks=3), ModelConfig(projection_dim=400, gamma=gamma), EvaluationConfig(),
                    ExecutionConfig(backend="numpy", max_memory=max_memory), loo=loo)
        return r.keep_activations, parts.get(KEPT_PART)

    kept = 600 * 400 * 8  # build_store's 600 rows (12 classes into 3 tasks: all in the stream) x D float64
    assert run() == (True, kept)
    rest = sum(parts.values()) - kept
    assert run(max_memory=kept - 1) == (False, None)
    assert run(gamma=1.0, loo=False) == (False, None)
    for spare, keeps in ((-1, False), (0, True)):  # the machine holds the rest, then the activations too
        monkeypatch.setattr(memory, "available_memory", lambda s=spare: memory.BASELINE_BYTES + rest + kept + s)
        assert run()[0] is keeps
