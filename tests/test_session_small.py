"""Small faults of the 2026-11-29 tenth stop: dual's runs recorded the sigmoid as their activation though the head
takes the projected rows before any activation (a continued run said sigmoid too, its model file records none); the
pipeline's settings stage advised ``--gamma 1`` for a table of dual without ridge, which no params key sets."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import invoke, params_with
from test_pipeline_audit import _settings_stage

from foal_pipe.store import write_store


def _store(path, names, n_per_class, rng, d=8):
    y = np.repeat(np.arange(len(names)), n_per_class)
    x = rng.normal(size=(y.size, d)) + y[:, None] * 0.5
    return write_store(path, (x, y), (x[::3], y[::3]), list(names), chunk_rows=7, dtype="float64")


def test_dual_records_the_activation_it_applies_fresh_and_continued(tmp_path):
    rng = np.random.default_rng(0)
    a = _store(tmp_path / "a.zarr", ["cat", "dog", "emu"], 8, rng)
    b = _store(tmp_path / "b.zarr", ["fox", "dog"], 8, rng)
    assert invoke("learn", "--features", a, "--out", tmp_path / "a", "--head", "dual", "--projection-dim", 12,
                  "--tasks", 1).exit_code == 0
    result = invoke("learn", "--init-model", tmp_path / "a" / "model.safetensors", "--features", b,
                    "--out", tmp_path / "b", "--tasks", 1)
    assert result.exit_code == 0, result.output
    fresh, continued = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("a", "b"))
    assert fresh["activation"] == continued["activation"] == "identity"
    assert fresh["projection_dim"] == continued["projection_dim"] == 12


@pytest.mark.parametrize("heads", [["dual"], ["ncm", "balanced"]])
def test_settings_advice_for_heads_that_need_ridge_names_only_params_keys(tmp_path, monkeypatch, heads):
    """settings@NAME: a table of balanced or dual without ridge was refused with advice to pass --gamma 1, which no
    params key sets (the table stage's gamma is auto), and "dual run" for one head."""
    error = _settings_stage(tmp_path, monkeypatch, params_with(table={"heads": heads}))
    assert error is not None and "\n" not in error and "--gamma" not in error
    named = [h for h in heads if h != "ncm"]
    assert f"table.heads: {', '.join(named)} run{'s' * (len(named) == 1)} at the gamma ridge chooses" in error
    assert error.endswith("add ridge to table.heads")


@pytest.mark.parametrize("group", [None, "head"])
def test_summary_names_a_results_table_among_runs(tmp_path, group):
    """summary DIR over runs and a `foal-pipe table` folder passed over the table without a word; it now names it
    under the summary, with its table.md, and warns of nothing (the pipeline's `summary runs`)."""
    rng = np.random.default_rng(1)
    store = _store(tmp_path / "s.zarr", ["cat", "dog", "emu", "fox"], 8, rng)
    assert invoke("learn", "--features", store, "--out", tmp_path / "runs" / "ncm", "--head", "ncm",
                  "--tasks", 2).exit_code == 0
    result = invoke("table", "--features", store, "--out", tmp_path / "runs" / "tab", "--heads", "ncm", "--tasks", 2)
    assert result.exit_code == 0, result.output
    result = invoke("summary", tmp_path / "runs", *(["--group", group] if group else []))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"{tmp_path / 'runs' / 'tab'}: a results table, not rows here; open {tmp_path / 'runs' / 'tab' / 'table.md'}" in text
    assert "Warning" not in result.output
    assert (str(tmp_path / "runs" / "ncm") if group is None else "ncm 1") in text


def test_summary_does_not_name_a_killed_tables_temporary(tmp_path):
    """A results table left in a killed command's temporary (``.NAME.tmp-PID-RANDOM``) is not a table to open."""
    rng = np.random.default_rng(2)
    store = _store(tmp_path / "s.zarr", ["cat", "dog", "emu"], 8, rng)
    assert invoke("learn", "--features", store, "--out", tmp_path / "runs" / "ncm", "--head", "ncm",
                  "--tasks", 1).exit_code == 0
    assert invoke("table", "--features", store, "--out", tmp_path / "tab", "--heads", "ncm", "--tasks", 1).exit_code == 0
    (tmp_path / "tab").rename(tmp_path / "runs" / ".tab.tmp-4242-abcd1234")
    result = invoke("summary", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert "results table" not in result.output and ".tmp-" not in result.output


def test_evaluate_refuses_an_out_that_holds_the_run(tmp_path):
    """evaluate --out at the run's folder (or above it) was accepted, and the run's folder was swapped with its
    metrics.json inside (a kill at the swap leaves it in the temporary); RUN/eval, the default, is fine."""
    rng = np.random.default_rng(3)
    store = _store(tmp_path / "s.zarr", ["cat", "dog", "emu"], 8, rng)
    run = tmp_path / "runs" / "r"
    assert invoke("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 1).exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for out in (run, tmp_path / "runs"):
        result = invoke("evaluate", "--run", run, "--out", out, "--no-plots")
        assert result.exit_code == 1 and "holds an input of this command" in result.output, result.output
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert invoke("evaluate", "--run", run, "--no-plots").exit_code == 0 and (run / "eval" / "summary.md").exists()


def test_extract_refuses_a_store_name_its_sibling_names_would_take_too_long(tmp_path):
    """A 245-byte store name (legal) wrote a store skeleton, then failed on its log's temporary name, and every resume
    failed the same way; refused now before anything is made, and the longest name allowed still extracts."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    too_long = tmp_path / "a" / ("s" * (limit - 15) + ".zarr")
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", too_long)
    assert result.exit_code == 1 and "is too long" in result.output and "\n" not in result.output.strip(), result.output
    assert not (tmp_path / "a").exists()
    longest = tmp_path / "b" / ("s" * (limit - 22 - 5) + ".zarr")
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", longest)
    assert result.exit_code == 0, result.output
