"""The second table audit's faults: every head's run equals its separate ``learn --head`` whatever the order of
``--heads`` (dual listed before balanced gave balanced the projected rows, not the activations); a kept run file
that is not a whole run record is run again, not read into the table (a traceback before); ``--activation``'s help
does not claim dual takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from helpers import build_store, die_after_kept_runs, invoke

from foal_pipe.cli import app
from foal_pipe.protocol import table as engine

COMMON = ("--tasks", "2", "--projection-dim", "20", "--gamma", "0.5", "--seed", "3", "--batch-size", "10",
          "--backend", "numpy")


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> tuple[Path, dict[tuple[str, str], list[list[float]]]]:
    """A store and the accuracy matrix of each separate ``learn --head H`` (balanced, dual; sigmoid and relu)."""
    root = tmp_path_factory.mktemp("heads")
    store = build_store(root / "a.zarr", n_train=300, n_test=120, seed=0)
    matrices = {}
    for head in ("balanced", "dual"):
        for activation in ("sigmoid", "relu"):
            out = root / f"{head}-{activation}"
            extra = ("--activation", activation) if head == "balanced" else ()
            result = invoke("learn", "--features", store, "--head", head, "--order-seed", 1, *COMMON, *extra, "--out", out)
            assert result.exit_code == 0, result.output
            matrices[(head, activation)] = json.loads((out / "metrics.json").read_text())["accuracy_matrix"]
    return store, matrices


@pytest.mark.parametrize("heads", ["dual,balanced", "balanced,dual", "ncm,dual,cosine,balanced"])
@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_every_head_equals_its_learn_whatever_the_order_of_heads(learned, tmp_path, heads, activation):
    store, matrices = learned
    out = tmp_path / "t"
    result = invoke("table", "--features", store, "--heads", heads, "--order-seeds", 1, *COMMON,
                    *(("--activation", activation) if activation != "sigmoid" else ()), "--out", out)
    assert result.exit_code == 0, result.output
    runs = {r["head"]: r for r in json.loads((out / "table.json").read_text())["runs"]}
    for head in ("balanced", "dual"):
        assert runs[head]["accuracy_matrix"] == matrices[(head, activation)], head


CONFIG = engine.TableConfig(("ridge", "ncm"), (0, 1), (2,))


def _settings():
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    return engine.Settings(StreamConfig(batch_size=10, seed=3), ModelConfig(projection_dim=24, gamma="auto"),
                           EvaluationConfig(), ExecutionConfig(backend="numpy"))


def _missing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "A_last"}


DAMAGES = {
    "empty object": lambda record: {},
    "a list": lambda record: [1],
    "a field missing": _missing,
    "a number as text": lambda record: {**record, "A_last": str(record["A_last"])},
    "another run's head": lambda record: {**record, "head": "ncm" if record["head"] == "ridge" else "ridge"},
    "ridge without its gammas": lambda record: {**record, "options": {}},
}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("whole")
    store = build_store(root / "a.zarr", n_train=300, n_test=120, seed=0)
    return store, engine.run_table([store], root / "t", CONFIG, _settings(), log=lambda _: None)


def _killed_after(monkeypatch, store: Path, out: Path, runs: int) -> list[Path]:
    """Kill a table on ``out`` once ``runs`` runs are kept; the kept runs' files, sorted."""
    put = engine._Kept.put
    die_after_kept_runs(monkeypatch, runs)
    with pytest.raises(KeyboardInterrupt):
        engine.run_table([store], out, CONFIG, _settings(), log=lambda _: None)
    monkeypatch.setattr(engine._Kept, "put", put)
    files = sorted((out.parent / f".{out.name}.table-runs").glob("*.json"))
    assert len(files) == runs
    return files


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_kept_run_that_is_not_a_whole_record_is_run_again(whole, tmp_path, monkeypatch, damage):
    store, table = whole
    out = tmp_path / "t"
    files = _killed_after(monkeypatch, store, out, 3)
    ridge = next(f for f in files if json.loads(f.read_text())["head"] == "ridge")
    ridge.write_text(json.dumps(DAMAGES[damage](json.loads(ridge.read_text()))))
    said: list[str] = []
    again = engine.run_table([store], out, CONFIG, _settings(), log=said.append)
    assert "resumed 2 finished runs of an interrupted table" in said
    assert any(line.startswith("ignored 1 kept run in ") and "not a whole run record" in line for line in said), said
    assert again["runs"] == table["runs"] and again["cells"] == table["cells"]


def test_a_kept_file_that_is_not_json_is_run_again_through_the_cli(whole, tmp_path, monkeypatch):
    store, table = whole
    out = tmp_path / "t"
    (kept,) = _killed_after(monkeypatch, store, out, 1)
    kept.write_text('{"head": ')
    result = invoke("table", "--features", store, "--heads", "ridge,ncm", "--order-seeds", "0,1", "--tasks", 2,
                    "--projection-dim", 24, "--seed", 3, "--batch-size", 10, "--backend", "numpy", "--out", out)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "not a whole run record" in result.output
    assert json.loads((out / "table.json").read_text())["cells"] == table["cells"]


def test_the_activation_help_does_not_say_dual_takes_it():
    command = typer.main.get_command(app).commands["table"]  # type: ignore[attr-defined]
    (option,) = [p for p in command.params if p.name == "activation"]
    assert "Default" in option.help
    assert "projection of ridge, balanced, dual" not in option.help and "dual on the projected rows ignores it" in option.help


def test_a_store_name_with_a_bar_keeps_table_md_s_columns(tmp_path):
    """A ``|`` in a store's name is escaped in table.md's header: every row has as many cells as the separator."""
    store = build_store(tmp_path / "a|b.zarr", n_train=200, n_test=80, seed=2)
    result = invoke("table", "--features", store, "--out", tmp_path / "t", "--heads", "ncm", "--order-seeds", "0,1",
                    "--tasks", 2, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "t" / "table.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith("|")]
    assert rows and "a\\|b" in rows[0]

    def cells(line: str) -> int:
        return len(line.replace("\\|", "").strip("|").split("|"))

    assert {cells(line) for line in rows} == {cells(rows[1])}


@pytest.mark.parametrize("extra", [("--stream", "si-blurry"), ("--max-memory", "1KiB")])
def test_a_missing_parent_of_out_is_made_on_the_runs_walked_apart_too(tmp_path, extra):
    """Ridge runs walked one by one (si-blurry, or too little memory for one pass) made their scratch folder beside
    ``--out`` before its parent existed; the one-pass path made it. Both now give the table."""
    store = build_store(tmp_path / "a.zarr", n_train=200, n_test=80, seed=3)
    out = tmp_path / "new" / "deeper" / "t"
    result = invoke("table", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16, "--order-seeds",
                    "0", "--backend", "numpy", *extra)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "table.json").read_text())
    assert rows and sorted(p.name for p in out.parent.iterdir()) == ["t"]
