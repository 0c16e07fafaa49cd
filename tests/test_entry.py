"""The library entry points ``foal_pipe.protocol.learn`` and ``sweep``: the command line's bytes from Python, and the
combination rules refused in one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import build_store, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol import LearnSettings, ModelConfig, StreamConfig, SweepConfig, SweepSettings, learn, sweep
from foal_pipe.protocol.config import ExecutionConfig

STREAM = StreamConfig(tasks=4, batch_size=7, seed=5)
CLI = ["--tasks", "4", "--batch-size", "7", "--seed", "5", "--backend", "numpy"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("entry") / "s.zarr")


def _same_files(a: Path, b: Path, names: tuple[str, ...]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize(("model", "seeds", "cli"), [
    (ModelConfig(projection_dim=24, gamma=0.5), None, ["--projection-dim", "24", "--gamma", "0.5"]),
    (ModelConfig(head="slda"), (0, 3), ["--head", "slda", "--order-seeds", "0,3"]),
], ids=["ridge", "slda-orders"])
def test_learn_from_python_writes_the_command_lines_bytes(store, tmp_path, model, seeds, cli):
    execution = ExecutionConfig(backend="numpy")
    learn(store, tmp_path / "py", LearnSettings(stream=STREAM, model=model, execution=execution, order_seeds=seeds),
          log=lambda text: None)
    result = invoke("learn", "--features", store, "--out", tmp_path / "cli", *CLI, *cli)
    assert result.exit_code == 0, result.output
    _same_files(tmp_path / "py", tmp_path / "cli", ("metrics.json", "model.safetensors"))


def test_sweep_from_python_writes_the_command_lines_bytes(store, tmp_path):
    config = SweepConfig(gammas=(0.1, 1.0), heads=("ridge", "ncm"))
    sweep(store, tmp_path / "py", SweepSettings(sweep=config, stream=STREAM, model=ModelConfig(projection_dim=24),
                                                execution=ExecutionConfig(backend="numpy")), log=lambda text: None)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "cli", *CLI, "--projection-dim", "24",
                    "--gammas", "0.1,1", "--heads", "ridge,ncm")
    assert result.exit_code == 0, result.output
    _same_files(tmp_path / "py", tmp_path / "cli", ("sweep.json",))


@pytest.mark.parametrize(("settings", "message"), [
    (LearnSettings(eval_features=(Path("other.zarr"),)), "eval_features scores a continued model; use it with init_model"),
    (LearnSettings(init_model=Path("m.safetensors"), order_seeds=(0, 1)), "init_model continues one stream"),
    (LearnSettings(init_model=Path("m.safetensors"), given=("seed",)), "seed draws the projection"),
])
def test_learn_refuses_a_combination_in_one_line_before_any_work(store, tmp_path, settings, message):
    with pytest.raises(FoalPipeError, match=message):
        learn(store, tmp_path / "out", settings)
    assert not (tmp_path / "out").exists()


def test_sweep_refuses_fusions_with_order_seeds(store, tmp_path):
    settings = SweepSettings(sweep=SweepConfig(fusions=("last", "mean-cls")), order_seeds=(0, 1))
    with pytest.raises(FoalPipeError, match="fusions compares fusions on one class order"):
        sweep(store, tmp_path / "out", settings)
    assert not (tmp_path / "out").exists()
