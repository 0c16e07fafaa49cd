"""Report audit (third round): an old run's model file of another width is refused; a current metrics.json without
``model_checksum`` beside a model file is refused as damaged; a ``sweep --heads --order-seeds`` ridge row in
summary.md names the gamma each order ran at, once where they agree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import as_old_run, assert_one_line_error, cluster_store, invoke, make_metrics, make_run

from foal_pipe.core.expansion import Expansion
from foal_pipe.model.modelfile import read_model, stored_header
from foal_pipe.protocol.schema import CHECKSUM_VERSION, LearnMetrics
from foal_pipe.report import load_run
from foal_pipe.report.markdown import _head_options

COMMON = ("--tasks", 2, "--seed", 3, "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("audit3") / "s.zarr", 4, 6, 40, 64, 0, n_train=200)


def _learn(store: Path, out: Path, *extra) -> dict:
    result = invoke("learn", "--features", store, "--out", out, "--gamma", 0.5, *COMMON, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _heads_row(summary: str, head: str) -> list[str]:
    line = next(line for line in summary.splitlines() if line.startswith(f"| {head} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


# -- 1. make_run's files agree, and an old run's model file of another width is refused -------------------------------
def test_make_runs_model_fits_its_metrics(tmp_path):
    run = make_run(tmp_path / "run")
    meta, shapes = stored_header(run / "model.safetensors")
    assert shapes["projection"] == (2, 1000) and shapes["W"] == (1000, 6)
    assert (meta["n_samples_seen"], meta["gamma"], meta["dataset"]) == (600, 1.0, "digits")
    drawn = Expansion.draw(2, 1000, "uniform", "identity", 0, "float64").components_
    assert (read_model(run / "model.safetensors", names=("projection",))[0]["projection"] == drawn).all()
    assert load_run(run).model_path == run / "model.safetensors"  # the old run's settings were compared, and fit


def test_an_old_run_refuses_a_model_file_of_another_width(tmp_path):
    run = make_run(tmp_path / "run")
    other = make_run(tmp_path / "other", make_metrics(projection_dim=8))
    assert stored_header(other / "model.safetensors")[1]["projection"] == (2, 8)
    shutil.copy(other / "model.safetensors", run / "model.safetensors")
    assert_one_line_error(invoke("evaluate", "--run", run, "--no-plots"),
                          f"{run / 'model.safetensors'} is not the model run {run} wrote: projection width D 8 in the "
                          "file, 1000 in the run's metrics.json (the run predates model_checksum",
                          f"run `foal-pipe learn --out {run}` again")


def test_an_old_run_without_a_projection_refuses_an_identity_of_another_width(tmp_path):
    run = make_run(tmp_path / "run", make_metrics(projection_dim=0, feature_dim=3))
    assert stored_header(run / "model.safetensors")[1]["projection"] == (3, 3)  # the identity a D 0 file keeps
    assert load_run(run).model_path is not None
    other = make_run(tmp_path / "other", make_metrics(projection_dim=0, feature_dim=5))
    shutil.copy(other / "model.safetensors", run / "model.safetensors")
    assert_one_line_error(invoke("evaluate", "--run", run, "--no-plots"),
                          "projection width D 5 in the file, 3 (projection_dim 0: the identity on its 3 features) in "
                          "the run's metrics.json")


def test_an_old_learn_run_refuses_another_Ds_model_in_its_folder(store, tmp_path):
    for name, D in (("run", 8), ("wide", 12)):
        _learn(store, tmp_path / name, "--projection-dim", D)
        as_old_run(tmp_path / name)
    assert invoke("evaluate", "--run", tmp_path / "run", "--no-plots").exit_code == 0  # its own model fits
    shutil.copy(tmp_path / "wide" / "model.safetensors", tmp_path / "run" / "model.safetensors")
    assert_one_line_error(invoke("evaluate", "--run", tmp_path / "run", "--no-plots"),
                          "is not the model run", "projection width D 12 in the file, 8 in the run's metrics.json")


# -- 2. a current metrics.json without model_checksum beside a model file is damaged --------------------------------
def test_a_current_metrics_without_model_checksum_is_refused(store, tmp_path):
    run = tmp_path / "run"
    metrics = _learn(store, run, "--projection-dim", 8)
    assert metrics["format_version"] == LearnMetrics.VERSION >= CHECKSUM_VERSION and "model_checksum" in metrics
    del metrics["model_checksum"]  # edited: the file still says it is of the current format
    (run / "metrics.json").write_text(json.dumps(metrics))
    for given in ((), ("--model", run / "model.safetensors")):
        assert_one_line_error(invoke("evaluate", "--run", run, "--no-plots", *given),
                              f"{run / 'metrics.json'} is damaged or edited: it is format_version {LearnMetrics.VERSION}, "
                              "which records the checksum of the run's model file (model_checksum), but has none, so "
                              f"{run / 'model.safetensors'} cannot be checked as the run's model; run "
                              f"`foal-pipe learn --out {run}` again")
    as_old_run(run)  # the same keys, marked as written before model_checksum: compared by its settings instead
    assert invoke("evaluate", "--run", run, "--no-plots").exit_code == 0
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "model.safetensors").unlink()  # no model file: nothing to check, none is reported
    result = invoke("evaluate", "--run", run, "--no-plots")
    assert result.exit_code == 0, result.output
    assert not (run / "eval" / "weight_norms.csv").exists()


# -- 3. sweep --heads --order-seeds: ridge's row names the gamma each order ran at ----------------------------------
def test_a_multi_order_heads_sweep_shows_ridges_gamma_once_where_the_orders_agree(store, tmp_path):
    run = tmp_path / "run"
    _learn(store, run, "--projection-dim", 16, "--order-seeds", "0,1")
    result = invoke("sweep", "--features", store, "--out", tmp_path / "run-sweep", "--gammas", "0.1,1", "--heads",
                    "ridge,ncm", "--order-seeds", "0,1", "--projection-dim", 16, *COMMON)
    assert result.exit_code == 0, result.output
    sweep_file = tmp_path / "run-sweep" / "sweep.json"
    sweep = json.loads(sweep_file.read_text())
    gammas = sweep["heads"]["ridge"]["options"]["gammas"]
    assert len(gammas) == 2 and gammas[0] == gammas[1]  # this store: both orders choose the same gamma
    result = invoke("evaluate", "--run", run, "--no-plots")
    assert result.exit_code == 0, result.output
    text = (run / "eval" / "summary.md").read_text()
    assert _heads_row(text, "ridge")[-1] == f"gamma {gammas[0]:g}, selected_by {sweep['selected_by']}"
    assert "(ridge at each class order's gamma, selected on its rows)" in text
    assert _heads_row(text, "ncm")[-1] == "-"
    sweep["heads"]["ridge"]["options"]["gammas"] = [0.1, 1.0]  # not what the orders chose: refused (the shown
    sweep_file.write_text(json.dumps(sweep))                      # form of orders that differ: the test below)
    result = invoke("evaluate", "--run", run, "--no-plots")
    assert result.exit_code != 0 and "gammas" in result.output, result.output


def test_head_options_of_one_order_are_shown_as_before():
    assert _head_options({"gamma": 1.0, "selected_by": "loo"}, None) == "gamma 1, selected_by loo"
    assert _head_options({"shrinkage": 0.25, "oas": True}, [0, 1]) == "shrinkage 0.25, oas True"
    assert _head_options({"gammas": [10.0, 10.0, 10.0], "selected_by": "gcv"}, [4, 5, 6]) == "gamma 10, selected_by gcv"
    assert _head_options({"gammas": [0.01, 10.0], "selected_by": "gcv"}, [4, 5]) == \
        "gamma 0.01 (order 4), 10 (order 5), selected_by gcv"
