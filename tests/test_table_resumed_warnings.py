"""A killed table's kept runs say their warnings again when it resumes them (a choice on the grid's edge, GCV near
its degrees of freedom), as they said them when they ran; a kept file whose lines were edited is run again."""

from __future__ import annotations

import json

import pytest
from helpers import build_store, die_after_kept_runs, invoke

from foal_pipe.protocol import table as engine

WARNING = "a better gamma may lie beyond the grid: extend --gamma-grid"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("said") / "a.zarr", seed=0)


def _table(store, out, *extra):
    return invoke("table", "--features", store, "--heads", "ridge,ncm", "--order-seeds", "0,1", "--tasks", "3",
                  "--projection-dim", "48", "--batch-size", "10", "--seed", "3", "--backend", "numpy",
                  "--gamma-grid", "1e3,1e4", "--out", out, *extra)


def _killed_after_ridge(store, out, monkeypatch) -> None:
    """A table (as :func:`_table`'s) killed once it kept its first run: ridge's, of order 0."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    settings = engine.Settings(StreamConfig(batch_size=10, seed=3),
                               ModelConfig(projection_dim=48, gamma="auto", gamma_grid=(1e3, 1e4)),
                               EvaluationConfig(), ExecutionConfig(backend="numpy"))
    die_after_kept_runs(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        engine.run_table([store], out, engine.TableConfig(("ridge", "ncm"), (0, 1), (3,)), settings, log=lambda _: None)
    monkeypatch.undo()


def _warned(output: str) -> list[str]:
    return sorted(line for line in output.splitlines() if WARNING in line)


def test_a_resumed_run_says_its_edge_warning_again(store, tmp_path, monkeypatch):
    fresh = _table(store, tmp_path / "fresh")
    assert fresh.exit_code == 0, fresh.output
    assert len(_warned(fresh.output)) == 2  # ridge at both orders chose the grid's smallest gamma
    out = tmp_path / "t"
    _killed_after_ridge(store, out, monkeypatch)
    result = _table(store, out)
    assert result.exit_code == 0, result.output
    assert "resumed 1 finished run" in result.output
    assert _warned(result.output) == _warned(fresh.output)
    for name in ("table.json", "table.csv"):
        assert (out / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()


def test_a_kept_file_whose_lines_were_edited_is_run_again(store, tmp_path, monkeypatch):
    out = tmp_path / "t"
    _killed_after_ridge(store, out, monkeypatch)
    (kept,) = (out.parent / f".{out.name}.table-runs").glob("*.json")
    record = json.loads(kept.read_text())
    assert len(record["said"]) == 1 and WARNING in record["said"][0]
    record["said"] = ["all is well"]
    kept.write_text(json.dumps(record))
    result = _table(store, out)
    assert result.exit_code == 0, result.output
    assert "all is well" not in result.output
    assert "ignored 1 kept run" in result.output
    assert len(_warned(result.output)) == 2
