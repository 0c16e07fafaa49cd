"""Every setting of ``learn`` and ``sweep`` (the fields of :mod:`foal_pipe.protocol.config`) is recorded in
``metrics.json`` or ``sweep.json``, or exempt for a stated reason; a new field fails here until it is one or the
other. Runs with settings away from their defaults show the recorded values are the ones given."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from helpers import build_store
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.protocol import config
from foal_pipe.protocol.schema import LearnMetrics, SweepReport
from foal_pipe.store import write_store
from foal_pipe.store.blockfusion import FinalNorm

CONFIGS = (config.StreamConfig, config.ModelConfig, config.EvaluationConfig, config.ExecutionConfig,
           config.SweepConfig)
#: Field -> where it is recorded: ``FILE:key`` or ``FILE:key.nested`` (metrics: metrics.json, sweep: sweep.json).
RECORDED = {
    "StreamConfig.tasks": "metrics:n_tasks",
    "StreamConfig.batch_size": "metrics:batch_size",
    "StreamConfig.seed": "metrics:seed",
    "StreamConfig.class_order": "metrics:tasks",  # the order itself, task by task
    "StreamConfig.drop_last": "metrics:drop_last",
    "StreamConfig.order_seed": "metrics:order_seed",
    "StreamConfig.drop_remainder": "metrics:drop_remainder",
    "StreamConfig.stream": "metrics:stream",  # si-blurry only: absent for the default disjoint stream
    "StreamConfig.disjoint_ratio": "metrics:disjoint_ratio",
    "StreamConfig.blurry_ratio": "metrics:blurry_ratio",
    "ModelConfig.projection_dim": "metrics:projection_dim",
    "ModelConfig.projection_init": "metrics:projection_init",
    "ModelConfig.activation": "metrics:activation",  # resolved: the default names the head's
    "ModelConfig.gamma": "metrics:gamma",
    "ModelConfig.select": "metrics:selected_by",
    "ModelConfig.gamma_grid": "metrics:gamma_grid",
    "ModelConfig.per_decade": "metrics:gamma_search.per_decade",
    "ModelConfig.loo_sample": "metrics:gamma_search.loo_sample",
    "ModelConfig.engine": "metrics:engine",
    "ModelConfig.dtype": "metrics:dtype",
    "ModelConfig.fusion": "metrics:encoder.fusion",
    "ModelConfig.fusion_norm": "metrics:encoder.final_norm",
    "ModelConfig.head": "metrics:head",  # absent for ridge
    "ModelConfig.head_rows": "metrics:head_rows",  # absent where the head takes its own rows
    "ModelConfig.head_options": "metrics:head_options",  # the head's options, its defaults included
    "EvaluationConfig.mask_unseen": "metrics:mask_unseen",
    "EvaluationConfig.eval_every": "metrics:anytime.eval_every",
    "ExecutionConfig.backend": "metrics:backend",  # resolved: auto names the backend that ran
    "SweepConfig.gammas": "sweep:gammas",
    "SweepConfig.select": "sweep:selected_by",
    "SweepConfig.loo": "sweep:results.loo_mse",  # null at every boundary without the leave-one-out pass
    "SweepConfig.per_decade": "sweep:selections.per_decade",
    "SweepConfig.fusions": "sweep:fusions.fusion",
    "SweepConfig.heads": "sweep:heads",
}
#: Field -> why it is not recorded: how a run executes, never what it computes.
EXEMPT = {
    "ExecutionConfig.scheduler": "where the sums run; Dask's sums equal the local ones (tests/test_distributed.py)",
    "ExecutionConfig.dask_address": "which cluster runs the sums; the results do not depend on it",
    "ExecutionConfig.workers": "how many local Dask workers; the results do not depend on it",
    "ExecutionConfig.max_memory": "a limit the run is checked against before it starts; it changes no result",
}
RECORDS = {"metrics": LearnMetrics, "sweep": SweepReport}
runner = CliRunner()


def test_every_config_field_is_recorded_or_exempt():
    names = {f"{cls.__name__}.{f.name}" for cls in CONFIGS for f in dataclasses.fields(cls)}
    assert not RECORDED.keys() & EXEMPT.keys()
    assert names - RECORDED.keys() - EXEMPT.keys() == set(), "record the new field in metrics.json, or exempt it here"
    assert RECORDED.keys() | EXEMPT.keys() <= names  # no entry for a field that is gone


def test_every_recorded_key_is_a_field_of_its_file():
    for where in RECORDED.values():
        file, _, path = where.partition(":")
        assert path.split(".")[0] in {f.name for f in dataclasses.fields(RECORDS[file])}, where


def recorded(doc: dict, where: str):
    """The value at ``where`` (``FILE:a.b``) of a written file, the first entry of a list on the way."""
    value = doc
    for part in where.partition(":")[2].split("."):
        value = value[0] if isinstance(value, list) else value
        value = value[part]
    return value


def _run(*args: str) -> dict:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / ("metrics.json" if args[0] == "learn" else "sweep.json")).read_text())


def test_learn_records_the_settings_it_was_given(tmp_path):
    store = build_store(tmp_path / "s.zarr")
    metrics = _run("learn", "--features", str(store), "--out", str(tmp_path / "a"), "--tasks", "5", "--batch-size", "7",
                   "--seed", "3", "--order-seed", "5", "--drop-last", "--drop-remainder", "--projection-dim", "20",
                   "--projection-init", "normal", "--activation", "relu", "--gamma", "auto", "--select", "loo_accuracy",
                   "--gamma-grid", "0.1,1,10", "--per-decade", "2", "--loo-sample", "50", "--engine", "gram",
                   "--dtype", "float32", "--no-mask-unseen", "--eval-every", "100", "--backend", "numpy")
    given = {"StreamConfig.tasks": 5, "StreamConfig.batch_size": 7, "StreamConfig.seed": 3, "StreamConfig.order_seed": 5,
             "StreamConfig.drop_last": True, "StreamConfig.drop_remainder": True, "ModelConfig.projection_dim": 20,
             "ModelConfig.projection_init": "normal", "ModelConfig.activation": "relu", "ModelConfig.gamma": "auto",
             "ModelConfig.select": "loo_accuracy", "ModelConfig.gamma_grid": [0.1, 1.0, 10.0],
             "ModelConfig.per_decade": 2, "ModelConfig.loo_sample": 50, "ModelConfig.engine": "gram",
             "ModelConfig.dtype": "float32", "EvaluationConfig.mask_unseen": False, "EvaluationConfig.eval_every": 100,
             "ExecutionConfig.backend": "numpy"}
    assert {name: recorded(metrics, RECORDED[name]) for name in given} == given
    blurry = _run("learn", "--features", str(store), "--out", str(tmp_path / "b"), "--tasks", "3", "--stream", "si-blurry",
                  "--disjoint-ratio", "40", "--blurry-ratio", "20", "--projection-dim", "20")
    assert [recorded(blurry, RECORDED[f"StreamConfig.{k}"]) for k in ("stream", "disjoint_ratio", "blurry_ratio")] == [
        "si-blurry", 40, 20]
    head = _run("learn", "--features", str(store), "--out", str(tmp_path / "c"), "--tasks", "3", "--head", "fecam",
                "--shrinkage", "0.25", "--shrinkage-offdiag", "0.5")
    assert [recorded(head, RECORDED[f"ModelConfig.{k}"]) for k in ("head", "head_options")] == [
        "fecam", {"shrinkage": 0.25, "shrinkage_offdiag": 0.5}]
    rows = _run("learn", "--features", str(store), "--out", str(tmp_path / "d"), "--tasks", "3", "--head", "slda",
                "--head-rows", "activations", "--projection-dim", "20", "--activation", "relu")
    assert [recorded(rows, RECORDED[f"ModelConfig.{k}"]) for k in ("head", "head_rows", "projection_dim")] == [
        "slda", "activations", 20]
    assert "head_rows" not in head


def test_learn_records_the_fusion_and_sweep_its_settings(tmp_path):
    rng = np.random.default_rng(0)
    blocks = rng.normal(size=(60, 3, 4)).astype(np.float32)
    y = np.arange(60) % 3
    store = write_store(tmp_path / "b.zarr", (blocks.mean(axis=1), y), (blocks[:30].mean(axis=1), y[:30]), ["a", "b", "c"],
                        blocks=(blocks, blocks[:30]), norm=FinalNorm("layernorm", 1e-6, np.ones(4, np.float32),
                                                                      np.zeros(4, np.float32)))
    metrics = _run("learn", "--features", str(store), "--out", str(tmp_path / "a"), "--tasks", "3", "--fusion", "concat:2-3",
                   "--no-fusion-norm", "--projection-dim", "10")
    assert recorded(metrics, RECORDED["ModelConfig.fusion"]) == "concat:2-3"
    assert recorded(metrics, RECORDED["ModelConfig.fusion_norm"]).startswith("not applied")
    sweep = _run("sweep", "--features", str(store), "--out", str(tmp_path / "s"), "--tasks", "3", "--gammas", "0.1,1",
                 "--select", "gcv", "--no-loo", "--per-decade", "3", "--fusions", "last,block:2", "--projection-dim", "10")
    assert recorded(sweep, RECORDED["SweepConfig.gammas"]) == [0.1, 1.0]
    assert recorded(sweep, RECORDED["SweepConfig.select"]) == "gcv"
    assert recorded(sweep, RECORDED["SweepConfig.per_decade"]) == 3
    assert [e["fusion"] for e in sweep["fusions"]] == ["last", "block:2"]
    assert all(r["loo_mse"] is None for e in sweep["fusions"] for r in e["results"])  # --no-loo: null, not computed
    heads = _run("sweep", "--features", str(store), "--out", str(tmp_path / "h"), "--tasks", "3", "--gammas", "0.1,1",
                 "--heads", "ridge,ncm", "--projection-dim", "10")
    assert sorted(recorded(heads, RECORDED["SweepConfig.heads"])) == ["ncm", "ridge"]
