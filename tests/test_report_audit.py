"""The report audit's faults: a continued model or a Si-Blurry table claimed comparable with published numbers, a sweep
of other class orders or of another store taken as a run's, a sweep's wall time shown as the run's, a resumed table
mixing a replaced store's runs, means of identical orders off in their last digit, head runs described as ridge's,
and numbers shown that the accuracy matrix contradicts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import (
    A_AVG,
    A_LAST,
    HAND,
    PAPER_ENCODER,
    build_store,
    invoke,
    make_metrics,
    make_run,
    shifted,
)

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.report import evaluate
from foal_pipe.report.discovery import RunSummary, load_run
from foal_pipe.report.paper import PAPER_BACKBONE, match_paper
from foal_pipe.report.published import PUBLISHED, references
from foal_pipe.report.readers import read_metrics, read_sweep
from foal_pipe.report.resultstable import markdown


def paper_metrics(**overrides) -> dict:
    """A cifar100 run with Table 2's settings and data."""
    x = 0.9  # every accuracy of its 10 tasks
    settings = {"dataset": "cifar100", "encoder": PAPER_ENCODER, "n_tasks": 10, "tasks": [[k] for k in range(10)],
                "n_train_seen": 50_000, "n_test": 10_000, "accuracy_matrix": [[x] * (i + 1) for i in range(10)],
                "A_steps": [x] * 10, "A_avg": x, "A_last": x, "F": 0.0, "F_published_code": 0.0}
    return make_metrics(**{**settings, **overrides})


def sweep_record(**overrides) -> dict:
    """A sweep of the hand-made run's store and settings (make_metrics), at three gammas: :data:`MATRIX` raised by 0,
    0.02 and 0.01, so test A_avg chooses gamma 1."""
    run = make_metrics()
    results = [{"gamma": g, **shifted(HAND, k)} for g, k in ((0.1, 0), (1.0, 2), (10.0, 1))]
    keep = ("tasks", "n_tasks", "projection_dim", "batch_size", "seed", "dataset", "encoder", "n_train_seen", "n_test",
            "projection_init", "mask_unseen", "drop_last", "dtype")
    return {**{k: run[k] for k in keep}, "gammas": [0.1, 1.0, 10.0], "best_gamma": 1.0, "best_gamma_test": 1.0,
            "selected_by": "test", "results": results, **overrides}


def test_a_continued_model_is_not_compared_with_the_paper(tmp_path):
    assert match_paper(paper_metrics()).comparable  # the same run, trained from scratch: compared
    continued = paper_metrics(continuation={"init_model": "pre/model.safetensors"})
    match = match_paper(continued)
    assert not match.comparable and any("--init-model pre/model.safetensors" in d for d in match.differences)
    run = make_run(tmp_path / "run", continued, model=False)
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert "Same dataset" not in text and "ours - paper" not in text and "a continued model" in text


def test_a_sweep_of_other_class_orders_is_refused_or_set_aside(tmp_path):
    run = make_run(tmp_path / "run", make_metrics(order_seed=0), model=False)
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps(sweep_record(order_seeds=[0, 1, 2])))
    with pytest.raises(FoalPipeError, match=r"order_seeds is \[0, 1, 2\] but the run's metrics.json has \[0\]"):
        load_run(run, sweep=tmp_path / "sw")
    (run / "sweep.json").write_text(json.dumps(sweep_record(order_seeds=[0, 1, 2])))
    found = load_run(run)
    assert found.sweep is None and "order_seeds" in found.sweep_mismatch
    (run / "sweep.json").write_text(json.dumps(sweep_record(order_seed=0)))  # the same single order: the run's
    assert load_run(run).sweep is not None


def test_a_sweep_of_another_store_in_the_run_folder_is_set_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("A.zarr", "B.zarr", "sub"):
        (tmp_path / name).mkdir()
    run = make_run(tmp_path / "run", make_metrics(features="B.zarr"), model=False,
                   sweep=sweep_record(features="A.zarr"))
    ev = evaluate(run)
    assert ev.run.sweep is None
    assert any("features (store path) is 'A.zarr'" in n and "'B.zarr'" in n for n in ev.notes)
    (run / "sweep.json").write_text(json.dumps(sweep_record(features=str(Path("B.zarr").resolve()))))
    assert load_run(run).sweep is not None  # the same store, named relative and absolute
    # `sweep --features ../B.zarr` typed in sub/: not a store from here, so not taken for another one (the audit's
    # false refusal); the data and settings decide
    (run / "sweep.json").write_text(json.dumps(sweep_record(features="../B.zarr")))
    assert load_run(run).sweep is not None


def test_summary_shows_no_wall_time_that_a_sweep_may_have_written(tmp_path):
    run = make_run(tmp_path / "run", model=False)
    (run / "timings.json").write_text(json.dumps({"total": 12.5}))
    metrics = read_metrics(run)
    assert RunSummary(run, metrics=metrics).seconds == 12.5
    (run / "sweep.json").write_text(json.dumps(sweep_record()))  # `sweep --out run`: timings.json is now the sweep's
    assert RunSummary(run, metrics=metrics, sweep=read_sweep(run)).seconds is None
    result = invoke("summary", run)
    assert result.exit_code == 0 and "12.5" not in result.output and "timings.json" in result.output
    assert "Warning" not in result.output and f"{100 * (A_AVG + 0.02):.2f}" in result.output  # the sweep's row, gamma 1


def test_a_resumed_table_takes_no_run_of_a_store_replaced_at_its_path(tmp_path):
    from foal_pipe.protocol.capabilities import Settings
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.table import TableConfig, run_table

    store = tmp_path / "v1.zarr"
    build_store(store, n_train=200, n_test=80, seed=0)  # format 1: no generation id
    settings = Settings(StreamConfig(), ModelConfig(), EvaluationConfig(), ExecutionConfig(backend="numpy"))
    config = TableConfig(heads=("ncm",), order_seeds=(0, 1), tasks=(2,))

    def killed(tmp: Path, table: dict) -> None:
        raise KeyboardInterrupt  # after every run was kept, before the table is written

    with pytest.raises(KeyboardInterrupt):
        run_table([store], tmp_path / "tab", config, settings, log=lambda m: None, write=killed)
    assert any((tmp_path / ".tab.table-runs").iterdir())
    build_store(store, n_train=200, n_test=80, seed=1)  # other data, same path and sizes
    logged: list[str] = []
    resumed = run_table([store], tmp_path / "tab", config, settings, log=logged.append)
    fresh = run_table([store], tmp_path / "fresh", config, settings, log=lambda m: None)
    assert not any("resumed" in m for m in logged)
    assert [r["A_last"] for r in resumed["runs"]] == [r["A_last"] for r in fresh["runs"]]


def test_the_mean_of_identical_orders_is_their_value():
    from foal_pipe.protocol.ordermeans import summary
    from foal_pipe.protocol.table import cells
    from foal_pipe.report.grouping import group_cells

    x = 107 / 160  # 66.875 %: three orders of it print 66.88 each
    assert sum([x, x, x]) / 3 != x  # what a plain mean gives
    run = {"store": "s", "dataset": "d", "encoder": "e", "head": "ncm", "tasks": 1, "n_tasks": 1, "stream": "disjoint",
           "n_classes": 2, "A_avg": x, "A_last": x, "F": 0.0, "A_auc": None}
    (cell,) = cells([{**run, "order_seed": s} for s in range(3)])
    assert (cell["A_avg"]["mean"], cell["A_avg"]["std"]) == (x, 0.0)
    orders = [SimpleNamespace(A_avg=x, A_last=x, F=0.0, A_auc=None) for _ in range(3)]
    stats = summary(orders)
    assert (stats["mean"]["A_avg"], stats["std"]["A_avg"]) == (x, 0.0)
    metrics = LearnMetrics.from_dict(make_metrics(A_avg=x, A_last=x, F=0.0), "m")
    (grouped,) = group_cells([metrics] * 3, ("head",))
    assert (grouped["A_avg"]["mean"], grouped["A_avg"]["std"]) == (x, 0.0)
    a, b = 0.61, 0.73  # other values: the mean and std as before
    (cell,) = cells([{**run, "order_seed": s, "A_avg": v} for s, v in enumerate((a, b))])
    assert cell["A_avg"]["mean"] == (a + b) / 2 and cell["A_avg"]["std"] == pytest.approx(abs(a - b) / 2, abs=1e-16)


def test_a_head_run_summary_names_the_head_and_its_gamma(tmp_path):
    metrics = make_metrics(head="balanced", head_options={"gamma": 0.5}, gamma=None, engine=None)
    run = make_run(tmp_path / "run", metrics, model=False)
    evaluate(run)
    head = (run / "eval" / "summary.md").read_text().split("## Results")[0]
    assert "head balanced" in head and "gamma=0.5" in head and "?" not in head and "F-OAL run" not in head
    ncm = make_run(tmp_path / "ncm", make_metrics(head="ncm", head_options={}, gamma=None, engine=None,
                                                  projection_dim=0), model=False)
    evaluate(ncm)
    head = (ncm / "eval" / "summary.md").read_text().split("## Results")[0]
    assert "head ncm" in head and "gamma" not in head and "?" not in head


def test_evaluate_shows_the_matrix_numbers_not_contradicted_ones(tmp_path):
    run = make_run(tmp_path / "run", make_metrics(A_avg=0.5), model=False)
    ev = evaluate(run)
    assert len(ev.warnings) == 1 and "A_avg in metrics.json is 0.500000" in ev.warnings[0]
    scores = json.loads((run / "eval" / "scores.json").read_text())
    assert scores["A_avg"] == pytest.approx(A_AVG, abs=1e-12) and scores["A_last"] == pytest.approx(A_LAST, abs=1e-12)
    text = (run / "eval" / "summary.md").read_text()
    assert f"| A_avg (%) | {100 * A_AVG:.2f} |" in text and "| 50.00 |" not in text


def test_table_md_of_one_order_and_one_task_has_no_std_nor_plural():
    values = {"mean": 0.9, "std": 0.0, "values": [0.9]}
    cell = {"store": "s.zarr", "dataset": "blobs", "encoder": "x", "head": "ncm", "tasks": 1, "n_tasks": 1,
            "order_seeds": [4], "A_avg": values, "A_last": values, "F": values}
    md = markdown({"features": ["s.zarr"], "heads": ["ncm"], "order_seeds": [4], "tasks": [1], "std_ddof": 0,
                   "cells": [cell]})
    assert "## 1 task\n" in md and "| ncm | **90.00** | **90.00** |" in md and "±" not in md.split("## 1 task")[1]
    assert "one class order (seed 4; no std)" in md


def test_published_rows_match_only_a_disjoint_stream_of_their_class_count():
    row = next(r for r in PUBLISHED if r.method == "F-OAL" and r.benchmark == "cifar100")
    values = {"mean": 0.9, "std": 0.0, "values": [0.9]}
    cell = {"store": "c.zarr", "dataset": "cifar100", "encoder": PAPER_BACKBONE, "head": "ridge", "tasks": 10,
            "n_tasks": 10, "order_seeds": [0], "A_avg": values, "A_last": values, "F": values, "stream": "disjoint",
            "n_classes": 100}
    matched, _ = references([cell])
    assert row in [ref.row for ref in matched]
    for other, why in (({"stream": "si-blurry"}, "the stream differs"), ({"n_classes": 20}, "the class count differs")):
        matched, missed = references([{**cell, **other}])
        assert matched == [] and any(why in w for w in missed)


def test_a_blurry_table_prints_no_disjoint_reference_rows(tmp_path):
    encoder = {"name": PAPER_BACKBONE, "fusion": "none", "image_size": 0, "normalize": False}
    store = build_store(tmp_path / "cifar100.zarr", attrs={"dataset": "cifar100", "encoder": encoder})
    result = invoke("table", "--features", store, "--heads", "ncm", "--order-seeds", "2", "--tasks", "2",
                    "--stream", "si-blurry", "--out", tmp_path / "t")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "t" / "table.md").read_text()
    assert "| *F-OAL [" not in md and "the stream" in md
    doc = json.loads((tmp_path / "t" / "table.json").read_text())
    assert (doc["cells"][0]["stream"], doc["runs"][0]["stream"]) == ("si-blurry", "si-blurry")


def test_paper_delta_prints_no_negative_zero(tmp_path):
    x = 0.9109  # 0.01 points under the paper's 91.1: rounds to 0.0, not -0.0
    metrics = paper_metrics(accuracy_matrix=[[x] * (i + 1) for i in range(10)], A_steps=[x] * 10, A_avg=x, A_last=x, F=0.0,
                            F_published_code=0.0)
    run = make_run(tmp_path / "run", metrics, model=False)
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    assert "| A_avg (%) | 91.09 | 91.1 | +0.0 |" in text and "-0.0" not in text
    assert math.copysign(1, round(100 * (x - 0.911), 1)) == -1  # what printed -0.0


def test_summary_group_over_sweeps_only_says_so(tmp_path):
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps(sweep_record()))
    result = invoke("summary", tmp_path / "sw", "--group", "head")
    assert result.exit_code == 1 and "no learn run" in result.output and "Traceback" not in result.output


def test_summary_shows_an_order_runs_std_and_order_count(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=200, n_test=80)
    out = tmp_path / "runs" / "m"
    result = invoke("learn", "--features", store, "--head", "ncm", "--tasks", "2", "--order-seeds", "0,1,2",
                    "--out", out)
    assert result.exit_code == 0, result.output
    m = json.loads((out / "metrics.json").read_text())
    result = invoke("summary", tmp_path / "runs")
    text = " ".join(result.output.split())
    assert f"{100 * m['A_avg']:.2f} ± {100 * m['std']['A_avg']:.2f}" in text and "3 class orders" in text
