"""``summary``: runs grouped into table cells (``--group``), the stream and A_auc columns, and a ``sweep --heads``'
heads on rows of their own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import build_store, invoke

COMMON = ("--projection-dim", "32", "--seed", "3", "--backend", "numpy")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups")
    store = build_store(root / "s.zarr")
    for head in ("ridge", "ncm"):
        for seed in (0, 1, 2):
            extra = COMMON if head == "ridge" else ("--seed", "3", "--backend", "numpy")
            result = invoke("learn", "--features", store, "--head", head, "--order-seed", seed, "--tasks", 3,
                            "--out", root / "runs" / f"{head}-{seed}", *extra)
            assert result.exit_code == 0, result.output
    return root, store


def test_group_head_tasks_gives_mean_and_population_std_of_the_runs(runs):
    root, _ = runs
    result = invoke("summary", root / "runs", "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    for head in ("ridge", "ncm"):
        values = {k: [json.loads((root / "runs" / f"{head}-{s}" / "metrics.json").read_text())[k] for s in (0, 1, 2)]
                  for k in ("A_avg", "A_last", "F")}
        line = next(row for row in result.output.splitlines() if row.split()[:3] == [head, "3", "3"])
        for k, v in values.items():
            mean = sum(v) / 3
            std = (sum((x - mean) ** 2 for x in v) / 3) ** 0.5  # population std, written out
            assert f"{100 * mean:.2f} +- {100 * std:.2f}" in line, (k, line)
    assert np.std([0.0, 1.0]) == 0.5  # ddof 0, as the table and the title say
    assert "ddof 0" in result.output


def test_a_run_of_many_orders_counts_as_its_orders(runs, tmp_path):
    """``learn --order-seeds 0,1,2`` in a cell gives what its three ``--order-seed`` runs give: n 3, their std."""
    root, store = runs
    result = invoke("learn", "--features", store, "--order-seeds", "0,1,2", "--tasks", 3, "--out", tmp_path / "multi",
                    *COMMON)
    assert result.exit_code == 0, result.output
    alone = invoke("summary", root / "runs", "--group", "head,tasks")
    together = invoke("summary", tmp_path / "multi", "--group", "head,tasks")
    assert together.exit_code == 0, together.output
    line = next(row for row in together.output.splitlines() if row.split()[:2] == ["ridge", "3"])
    expected = next(row for row in alone.output.splitlines() if row.split()[:2] == ["ridge", "3"])
    assert line.split()[2] == "3" and "+- 0.00" not in line
    assert line.split()[2:] == expected.split()[2:]


def test_group_refuses_an_unknown_key(runs):
    root, _ = runs
    result = invoke("summary", root / "runs", "--group", "head,colour")
    assert result.exit_code == 2, result.output  # a usage error (docs/cli.md), as typer's own types
    assert result.output.startswith("Error: unknown --group key 'colour'; choose from head, tasks"), result.output
    assert result.output.endswith("; see `foal-pipe summary --help`\n") and result.output.count("\n") == 1


def test_summary_shows_stream_a_auc_and_every_head_of_a_sweep(runs, tmp_path):
    root, store = runs
    out = tmp_path / "runs"
    assert invoke("learn", "--features", store, "--tasks", 3, "--eval-every", 100, "--out", out / "anytime",
                  *COMMON).exit_code == 0
    result = invoke("sweep", "--features", store, "--tasks", 3, "--gammas", "0.1,1", "--heads", "ridge,ncm",
                    "--out", out / "heads", *COMMON)
    assert result.exit_code == 0, result.output
    shown = invoke("summary", out)
    assert shown.exit_code == 0, shown.output
    anytime = json.loads((out / "anytime" / "metrics.json").read_text())
    assert f"{100 * anytime['A_auc']:.2f}" in shown.output and "disjoint" in shown.output
    sweep = json.loads((out / "heads" / "sweep.json").read_text())
    for name, head in sweep["heads"].items():
        assert f"· head {name}" in shown.output
        assert f"{100 * head['A_last']:.2f}" in shown.output


def test_evaluate_summary_has_the_heads_table(runs, tmp_path):
    _, store = runs
    run = tmp_path / "run"
    assert invoke("learn", "--features", store, "--tasks", 3, "--out", run, *COMMON).exit_code == 0
    result = invoke("sweep", "--features", store, "--tasks", 3, "--gammas", "0.1,1", "--heads", "ridge,ncm,slda",
                    "--out", tmp_path / "run-sweep", *COMMON)
    assert result.exit_code == 0, result.output
    assert invoke("evaluate", "--run", run, "--no-plots").exit_code == 0
    text = (run / "eval" / "summary.md").read_text()
    sweep = json.loads((tmp_path / "run-sweep" / "sweep.json").read_text())
    assert "## Heads" in text
    for name, head in sweep["heads"].items():
        assert f"| {name} | {100 * head['A_avg']:.2f} | {100 * head['A_last']:.2f} | {100 * head['F']:.2f} |" in text
    assert f"the test oracle's: {sweep['best_head_test']}" in text


def test_a_class_order_found_twice_counts_once(runs, tmp_path):
    """A copied run folder, or an ``--order-seeds`` run beside one of its orders' own runs, holds an order the cell
    has already: counted twice it moved the mean and std (3 runs of 2 orders) with nothing said."""
    import shutil

    root, store = runs
    for name, source in (("a", "ridge-1"), ("b", "ridge-1"), ("c", "ridge-0")):
        shutil.copytree(root / "runs" / source, tmp_path / "copies" / name)
    result = invoke("summary", tmp_path / "copies", "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    line = next(row for row in result.output.splitlines() if row.split()[:2] == ["ridge", "3"])
    values = [json.loads((root / "runs" / f"ridge-{s}" / "metrics.json").read_text())["A_avg"] for s in (0, 1)]
    mean, std = sum(values) / 2, abs(values[0] - values[1]) / 2
    assert line.split()[2] == "2" and f"{100 * mean:.2f} +- {100 * std:.2f}" in line, line
    assert "1 run(s) of a class order it already holds" in " ".join(result.output.split())
    result = invoke("learn", "--features", store, "--order-seeds", "0,1,2", "--tasks", 3, "--out", tmp_path / "mix" / "multi",
                    *COMMON)
    assert result.exit_code == 0, result.output
    shutil.copytree(root / "runs" / "ridge-1", tmp_path / "mix" / "one")
    mixed = invoke("summary", tmp_path / "mix", "--group", "head,tasks")
    alone = invoke("summary", root / "runs", "--group", "head,tasks")
    line = next(row for row in mixed.output.splitlines() if row.split()[:2] == ["ridge", "3"])
    expected = next(row for row in alone.output.splitlines() if row.split()[:2] == ["ridge", "3"])
    assert line.split()[2:] == expected.split()[2:]


def test_runs_of_one_order_with_other_numbers_both_count(runs, tmp_path):
    """The same order with settings the grouping does not record (dual's batch size) gives other numbers: not a copy,
    so both count."""
    _, store = runs
    for batch in (5, 7):
        result = invoke("learn", "--features", store, "--head", "dual", "--order-seed", 1, "--tasks", 3, "--batch-size",
                        batch, "--out", tmp_path / "dual" / f"b{batch}", *COMMON)
        assert result.exit_code == 0, result.output
    A = [json.loads((tmp_path / "dual" / f"b{b}" / "metrics.json").read_text())["accuracy_matrix"] for b in (5, 7)]
    assert A[0] != A[1]
    result = invoke("summary", tmp_path / "dual", "--group", "head,tasks")
    line = next(row for row in result.output.splitlines() if row.split()[:2] == ["dual", "3"])
    assert line.split()[2] == "2" and "already holds" not in result.output, result.output
