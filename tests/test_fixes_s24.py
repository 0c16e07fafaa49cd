"""This stop's own fixes beside the audits' files: the result line of `learn --gamma auto` over many tasks."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import cluster_store, runner

from foal_pipe.cli import app


def test_the_result_line_lists_at_most_twenty_boundaries_gammas(tmp_path: Path) -> None:
    """`--gamma auto` printed every boundary's gamma on its one line (5,600 characters at 400 tasks): past 20 it names
    the first ten, the last five and where the rest are; metrics.json keeps every one."""
    store = cluster_store(tmp_path / "s.zarr", 25, 8, 500, 100, 0, n_train=1000)
    lines, chosen = {}, {}
    for tasks in (20, 25):
        out = tmp_path / f"r{tasks}"
        result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", str(tasks),
                                     "--projection-dim", "16", "--gamma", "auto", "--select", "gcv"])
        assert result.exit_code == 0, result.output
        chosen[tasks] = [f"{g:g}" for g in json.loads((out / "metrics.json").read_text())["gammas_selected"]]
        assert len(chosen[tasks]) == tasks
        lines[tasks] = next(part for part in " ".join(result.output.split("\n")).split("  ") if "gamma by" in part)
    assert lines[20] == f"gamma by gcv: {', '.join(chosen[20])}"
    first, last = ", ".join(chosen[25][:10]), ", ".join(chosen[25][-5:])
    assert lines[25] == f"gamma by gcv: {first}, ..., {last} (25 boundaries: metrics.json's gammas_selected)"


def test_a_task_of_classes_without_training_rows_names_the_fix(tmp_path: Path) -> None:
    """One class per task and a class with test rows only: the refusal said "check the store's labels or the task
    split"; it names why (no class of the task has a training row) and the fixes (fewer tasks, a class order without
    it), and fewer tasks do run (the class is left out of the stream)."""
    import numpy as np

    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    y_train = np.repeat(np.arange(10), 3)
    y_train = y_train[y_train != 4]
    y_test = np.repeat(np.arange(10), 2)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(y_train.size, 4)), y_train),
                        (rng.normal(size=(y_test.size, 4)), y_test), [f"c{k}" for k in range(10)], chunk_rows=16)
    out = tmp_path / "r"
    refused = runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "10"])
    assert refused.exit_code == 1
    text = " ".join(refused.output.split())
    assert "(classes 4) has no training rows: none of its classes has a row in the training split" in text, text
    assert "use fewer --tasks" in text and "--class-order" in text and not out.exists()
    fewer = runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "9"])
    assert fewer.exit_code == 0, fewer.output


def test_summary_md_names_at_most_twenty_boundaries_gammas(tmp_path: Path) -> None:
    """summary.md's Gamma section listed every boundary's choice on one line (10 KB at 1,000 tasks): past 20 it names
    the first ten and the last five, as learn's result line does."""
    store = cluster_store(tmp_path / "s.zarr", 25, 8, 500, 100, 0, n_train=1000)
    texts = {}
    for tasks in (20, 25):
        out = tmp_path / f"r{tasks}"
        assert runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", str(tasks),
                                   "--projection-dim", "16", "--gamma", "auto", "--select", "gcv"]).exit_code == 0
        assert runner.invoke(app, ["evaluate", "--run", str(out), "--no-plots"]).exit_code == 0
        named = [f"T{i + 1} {g:g}" for i, g in enumerate(json.loads((out / "metrics.json").read_text())["gammas_selected"])]
        texts[tasks] = (next((out / "eval").glob("summary.md")).read_text(), named)
    text, named = texts[20]
    assert f": {', '.join(named)}." in text
    text, named = texts[25]
    rest = "(every boundary's in metrics.json's gammas_selected)."
    assert f": {', '.join(named[:10])}, ..., {', '.join(named[-5:])} {rest}" in text
    assert "T11 " not in text.split("## Gamma")[1].split("\n\n")[1]
