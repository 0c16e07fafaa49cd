"""The table audit's faults: a killed table resumed with its store spelled otherwise (an absolute path, another
working directory) writes the cells of every order, as one run through; a refused setting is not put on a store;
``--gamma auto``'s grid-edge warning names the store, task count and order; the scratch directory of a run walked
apart, left by a table killed outright, is removed by the next table on the same output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import assert_clean_error, build_store, die_after_kept_runs, invoke

from foal_pipe.protocol import table as engine

ARGS = ("--heads", "ridge,ncm", "--tasks", "2", "--projection-dim", "24", "--seed", "3", "--backend", "numpy")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return build_store(tmp_path / "a.zarr", seed=0)


def _settings():
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    return engine.Settings(StreamConfig(batch_size=10, seed=3), ModelConfig(projection_dim=24, gamma="auto"),
                           EvaluationConfig(), ExecutionConfig(backend="numpy"))


CONFIG = engine.TableConfig(("ridge", "ncm"), (0, 1, 2), (2,))


def _cells(table: dict) -> list[tuple]:
    return [(c["store"], c["head"], c["order_seeds"], c["A_last"], c["A_avg"]) for c in table["cells"]]


def test_a_resumed_table_with_the_store_spelled_otherwise_holds_every_order(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    put = engine._Kept.put
    for spelled in (str(store), f"../{tmp_path.name}/a.zarr"):
        whole = engine.run_table([Path(spelled)], tmp_path / f"whole{len(spelled)}", CONFIG, _settings(), log=lambda _: None)
        die_after_kept_runs(monkeypatch, 2)
        with pytest.raises(KeyboardInterrupt):
            engine.run_table([Path("a.zarr")], tmp_path / "out", CONFIG, _settings(), log=lambda _: None)
        monkeypatch.setattr(engine._Kept, "put", put)
        said: list[str] = []
        resumed = engine.run_table([Path(spelled)], tmp_path / "out", CONFIG, _settings(), log=said.append)
        assert "resumed 2 finished runs of an interrupted table" in said
        assert _cells(resumed) == _cells(whole) and {c[0] for c in _cells(resumed)} == {spelled}


@pytest.mark.parametrize(("option", "message"), [(("--loo-sample", "-1"), "--loo-sample counts the rows"),
                                                  (("--batch-size", "0"), "--batch-size must be at least 1"),
                                                  (("--projection-dim", "-1"), "--projection-dim must be at least 0")])
def test_a_refused_setting_names_no_store(store, tmp_path, option, message):
    out = tmp_path / "out"
    result = invoke("table", "--features", store, "--heads", "ridge", "--tasks", "2", "--order-seeds", "0", *option,
                    "--out", out)
    assert_clean_error(result, message, out)
    assert str(store) not in result.output and "a.zarr" not in result.output


def test_the_grid_edge_warning_names_its_run(store, tmp_path):
    result = invoke("table", "--features", store, "--heads", "ridge", "--tasks", "2", "--order-seeds", "0,1",
                    "--gamma-grid", "1e3,1e4", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "--gamma auto chose" in line]
    assert warnings and all(line.startswith(f"{store} (--tasks 2, order ") for line in warnings), result.output
    assert {line.split("order ")[1][0] for line in warnings} == {"0", "1"}


def test_a_killed_tables_scratch_is_removed_by_the_next(store, tmp_path):
    out = tmp_path / "out"
    dead = tmp_path / f".out.table-runs-{2**22 + 7}-abc12_45"  # a process id no process has
    dead.mkdir()
    (dead / "run").mkdir()
    alive = tmp_path / f".out.table-runs-{os.getpid()}-def45678"  # a table under way here
    alive.mkdir()
    other = tmp_path / f".out.table-runs-{2**22 + 7}-keep.table-runs"  # the kept runs of a table named so
    other.mkdir()
    result = invoke("table", "--features", store, "--heads", "ridge", "--tasks", "2", "--order-seeds", "0", "--out", out)
    assert result.exit_code == 0, result.output
    assert not dead.exists() and alive.exists() and other.exists()
