"""The pipeline audit's faults: settings@NAME refuses what a later stage would (a value listed twice, a combination),
the table stage passes only the options its heads take, and every learn setting `foal-pipe table` takes reaches it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import STAGES, invoke, params_with, stage_module

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str):
    """stages/NAME.py (``_params`` or a stage script), with stages/ importable."""
    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    if name == "_params":
        import _params

        return _params
    return stage_module(name)


def _settings_stage(tmp_path: Path, monkeypatch, params: dict) -> str | None:
    """settings@digits on ``params``, run in this process in ``tmp_path``: its error line, having written nothing, or
    None when it wrote the settings files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setattr(sys, "argv", ["settings.py", "digits"])
    try:
        _module("settings").main()
    except SystemExit as exc:
        assert not (tmp_path / "runs").exists()
        return str(exc.code)
    assert (tmp_path / "runs" / "digits-settings" / "table.settings.json").is_file()
    return None


# --------------------------------------------------------------------------------------------------
# 1. settings@NAME refuses what a later stage would


@pytest.mark.parametrize(
    ("sections", "fragments"),
    [
        ({"table": {"order_seeds": [1, 1]}}, ["table.order_seeds lists a value twice"]),
        ({"table": {"tasks": [5, 5]}}, ["table.tasks lists a value twice"]),
        ({"table": {"heads": ["ridge", "ridge"]}}, ["table.heads lists a value twice"]),
        ({"learn": {"order_seeds": [1, 1]}}, ["learn.order_seeds '1,1' repeats a seed"]),
        ({"sweep": {"gammas": [1, 1]}}, ["sweep.gammas lists 1 twice"]),
        ({"learn": {"activation": "cos"}}, ["learn.activation: cos draws a projection bias"]),
        ({"learn": {"gamma": "auto", "engine": "rls"}}, ["learn.gamma: auto needs learn.engine: gram"]),
        ({"learn": {"engine": "rls", "dtype": "float32"}}, ["learn.engine: rls with learn.dtype: float32 is refused"]),
        ({"extract": {"keep_blocks": True}}, ["pixels has no transformer blocks, so extract.keep_blocks does not apply"]),
        ({"extract": {"split_seed": 3}}, ["extract.split_seed draws the split of extract.test_split"]),
        ({"extract": {"fusion": "last"}}, ["pixels has no transformer blocks or tokens, so extract.fusion: last does not"]),
        ({"extract": {"token": "mean"}}, ["pixels has no transformer blocks or tokens, so extract.token: mean does not"]),
        ({"sweep": {"fusions": ["last"]}}, ["sweep.fusions fuses the store's per-block tokens",
                                            "only with extract.keep_blocks: true"]),
        ({"table": {"heads": ["slda", "balanced"]}}, ["balanced runs at the gamma ridge chooses", "add ridge to table.heads"]),
    ],
)
def test_settings_refuses_what_a_later_stage_refuses(tmp_path, monkeypatch, sections, fragments):
    """Each was accepted by settings@NAME and refused only by a later stage, after dvc.lock and the settings files
    were updated and DVC had deleted that stage's outputs."""
    error = _settings_stage(tmp_path, monkeypatch, params_with(**sections))
    assert error is not None and "\n" not in error and error.startswith("Error: in params.yaml, ")
    for fragment in fragments:
        assert fragment in error, error


def test_an_entrys_own_key_is_named_as_the_entrys(tmp_path, monkeypatch):
    params = params_with()
    params["datasets"] = {"digits": {"table": {"order_seeds": [2, 2]}}}
    assert _settings_stage(tmp_path, monkeypatch, params) == ("Error: in params.yaml, datasets.digits.table.order_seeds "
                                                              "lists a value twice; list each once")


def test_fusions_with_several_orders_are_refused_as_sweep_refuses_them(tmp_path, monkeypatch):
    """sweep --fusions compares fusions on one class order: learn.order_seeds of two orders reach the sweep stage."""
    params = params_with(extract={"model": "vit_tiny_patch16_224", "keep_blocks": True},
                     sweep={"fusions": ["last"]}, learn={"order_seeds": [0, 1]})
    assert "sweep.fusions compares fusions on one class order; leave out learn.order_seeds" in (
        _settings_stage(tmp_path, monkeypatch, params) or "")
    params["learn"]["order_seeds"] = [4]  # one order: the sweep stage passes --order-seed
    assert _settings_stage(tmp_path, monkeypatch, params) is None


def test_the_settings_stage_writes_nothing_when_it_refuses(tmp_path):
    """`python stages/settings.py NAME`: one line, exit 1, no settings file written."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(table={"tasks": [5, 5]})))
    done = subprocess.run([sys.executable, str(STAGES / "settings.py"), "digits"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == "Error: in params.yaml, table.tasks lists a value twice; list each once\n"
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------
# 2. the table stage passes the options its heads take


def _store(path: Path, n_classes: int = 4) -> Path:
    from foal_pipe.store import write_store

    def rows(per_class: int, seed: int):
        rng = np.random.default_rng(seed)
        y = np.repeat(np.arange(n_classes), per_class)
        return (rng.normal(size=(y.size, 6)) + 2 * y[:, None]).astype(np.float32), y

    return write_store(path, rows(12, 0), rows(5, 1), [f"k{c}" for c in range(n_classes)])


def test_a_table_of_heads_on_the_features_runs(tmp_path, monkeypatch):
    """table.heads [ncm, slda] (no projection, no ridge) was always refused: the stage passed --projection-dim,
    --seed, --gamma and --select. Its runs now equal the separate `learn --head` runs."""
    p, table = _module("_params"), _module("table")
    params = params_with(table={"heads": ["ncm", "slda"], "order_seeds": [0, 1], "tasks": [2]},
                     learn={"projection_dim": 300, "seed": 5})
    assert _settings_stage(tmp_path, monkeypatch, params) is None
    settings = p.resolve(params, "digits")
    args = [str(a) for a in table.command("digits", settings)]
    for option in ("--projection-dim", "--seed", "--gamma", "--select", "--activation"):
        assert option not in args
    monkeypatch.chdir(tmp_path)
    _store(tmp_path / "data" / "features" / "digits.zarr")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    done = json.loads((tmp_path / "runs" / "digits-table" / "table.json").read_text())
    assert done["heads"] == ["ncm", "slda"] and len(done["runs"]) == 4
    run = next(r for r in done["runs"] if (r["head"], r["order_seed"]) == ("slda", 1))
    result = invoke("learn", "--features", "data/features/digits.zarr", "--out", tmp_path / "sep", "--head", "slda",
                    "--order-seed", 1, "--tasks", 2, "--batch-size", 10, "--backend", "auto")
    assert result.exit_code == 0, result.output
    separate = json.loads((tmp_path / "sep" / "metrics.json").read_text())
    assert len(run["accuracy_matrix"]) == len(separate["accuracy_matrix"]) == 2
    for row, want in zip(run["accuracy_matrix"], separate["accuracy_matrix"]):
        np.testing.assert_allclose(row, want, rtol=0, atol=1e-12)


def test_a_table_with_ridge_keeps_its_command():
    """With ridge among the heads every option applies: the default command is unchanged (outputs byte-identical)."""
    p, table = _module("_params"), _module("table")
    assert [str(a) for a in table.command("digits", p.resolve(params_with(), "digits"))] == [
        "table", "--features", "data/features/digits.zarr", "--out", "runs/digits-table", "--heads", "ridge,ncm,slda",
        "--order-seeds", "0,1,2", "--tasks", "5", "--gamma", "auto", "--select", "loo_accuracy", "--batch-size", "10",
        "--projection-dim", "1000", "--seed", "0", "--backend", "auto",
    ]  # learn.activation null: no --activation, the command's sigmoid (the same table.json as typed: test_pipeline)


# --------------------------------------------------------------------------------------------------
# 3. every learn setting `foal-pipe table` takes reaches it; the others are named as not carried over


def test_every_learn_setting_the_table_takes_is_passed():
    """learn.drop_remainder was dropped silently though `foal-pipe table --drop-remainder` exists."""
    import typer.main

    from foal_pipe.cli import app

    p, table = _module("_params"), _module("table")
    takes = {param.name for param in typer.main.get_command(app).commands["table"].params}
    own = {"tasks", "order_seeds", "gamma"}  # the table's own, or auto
    carried = {k for k in p.KEYS["learn"] if k in takes and k not in own}
    assert carried == set(p.TABLE_FROM_LEARN)
    settings = p.resolve(params_with(learn={"drop_remainder": True}), "digits")
    assert p.stage_settings(settings)["table"]["learn"]["drop_remainder"] is True  # the table stage's dependency
    assert table.command("digits", settings)[-1] == "--drop-remainder"
    docs = " ".join((ROOT / "docs" / "pipeline.md").read_text().split())
    comment = " ".join(line.lstrip("# ") for line in (ROOT / "params.yaml").read_text().splitlines() if line.startswith("#"))
    for key in set(p.KEYS["learn"]) - carried - own:
        assert f"`learn.{key}`" in docs.split("has no option for", 1)[1].split(":", 1)[0], key
        assert key in comment.split("has no option for", 1)[1].split(":", 1)[0], key
