"""Audit (aggregate, s25) of the aggregation commands: ``summary`` (plain and ``--group``), ``table`` and the
``summary.md`` of ``evaluate``, against docs/evaluate.md, docs/cli.md and docs/results-table.md.

Checked and found as documented (no test here): each ``--group`` cell's mean and population std (ddof 0) against
NumPy over the runs' own metrics.json (3 orders, 300 fake runs in two heads, a ``learn --order-seeds`` run beside its
orders' runs, a projection seed of its own named in a warning); ``table.json`` cells against NumPy over its runs
(2 stores, 2 heads, 2 task counts, orders 2,0,1; ``std_ddof`` 0), ``table.md`` equal to ``summary --group`` over the
separate ``learn`` runs, one order printed without a std; a ``sweep --order-seeds --heads``' rows against NumPy over
its orders; nested, non-ASCII and linked run folders (a folder reached twice listed once); a mix of learn runs and
sweeps; truncated, partial, empty, non-UTF-8, non-object and NaN ``metrics.json`` (skipped with a warning, refused in
one line by ``--group``); sweep-only and table-only paths; the same bytes on repeat (summary plain and grouped,
every table file); ``table``'s refusals (repeated orders, heads, task counts or stores, 0 or too many tasks, an
``--out`` that is a file, the store or above it; exit 1 or 2 as docs/cli.md says, nothing written).

Faults found, fixed (each test failed for its reason before the fix; batch is now a key, compared where it changes
the numbers: dual, --drop-last, --eval-every):

1. ``summary --group`` pools runs that differ in their batch size without the warning the docs promise for "a cell
   whose runs differ in a key left out" ("the other settings a run records"): ``batch_size`` is recorded in every
   metrics.json but is not one of grouping.GROUP_KEYS, so dual runs at ``--batch-size`` 5 and 50, or ridge
   ``--drop-last`` runs at 7 and 64 (other rows learned: 189 vs 192), make one cell whose +- is a spread over batch
   sizes, with nothing said.
2. ``summary --group``'s key cells print a value's line break as it is (a dataset or store path holding ``\\n``),
   splitting the cell's row over two lines, whereas the plain table shows the same dataset as ``x\\ny``
   (``one_line``) and docs/cli.md says a table's rows stay on one line in a log or a pipe.
3. The plain ``summary`` prints a run folder's name with a line break as it is: the row's path breaks and its second
   part reads as the row's ``dataset · encoder`` line; errors and the dataset in the same label escape it (``\\n``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HAND, build_store, invoke, make_metrics, make_run, shifted

TASKS = [[3, 7], [0, 5], [9, 1]]


def _fake(path: Path, k: int, **overrides) -> Path:
    """A hand-made run of order ``k`` (its matrix raised by 0.01 k: numbers its matrix gives), no model file."""
    return make_run(path, make_metrics(**shifted(HAND, k), order_seed=k, tasks=TASKS[k:] + TASKS[:k], **overrides),
                    model=False)


def _piped(*args) -> subprocess.CompletedProcess:
    """The real CLI with its stdout a pipe (no COLUMNS): a log's view of the table."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", "from foal_pipe.cli import main; main()", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("aggregate") / "s.zarr", n_train=200, n_test=80)


def test_a_cell_pooling_two_batch_sizes_is_named(store, tmp_path):
    """Two class orders at two batch sizes (dual; ridge with --drop-last, whose rows learned follow the batch size)
    are one cell of --group head,tasks: its +- spreads over the batch sizes too, so the cell must be named as a cell
    pooling two fusions or two seeds is (docs/evaluate.md: "a cell whose runs differ in a key left out ... is named
    in a one-line warning")."""
    common = ("--tasks", 3, "--projection-dim", 16, "--seed", 3, "--gamma", 1, "--backend", "numpy")
    cases = {"dual": (("--head", "dual"), ((5, 0), (50, 1))), "drop": (("--drop-last",), ((7, 0), (64, 1)))}
    unnamed = []
    for name, (extra, runs) in cases.items():
        for batch, order in runs:
            result = invoke("learn", "--features", store, *extra, "--order-seed", order, "--batch-size", batch,
                            *common, "--out", tmp_path / name / f"b{batch}")
            assert result.exit_code == 0, result.output
        recorded = [json.loads((tmp_path / name / f"b{b}" / "metrics.json").read_text()) for b, _ in runs]
        assert [m["batch_size"] for m in recorded] == [b for b, _ in runs]  # recorded: a setting a run records
        result = invoke("summary", tmp_path / name, "--group", "head,tasks")
        assert result.exit_code == 0, result.output
        assert any(line.split()[1:3] == ["3", "2"] for line in result.output.splitlines()), result.output  # one cell
        text = " ".join(result.output.split())
        if not ("pools runs that differ in" in text and "batch" in text):
            unnamed.append(f"{name}: {text}")
    assert not unnamed, "\n".join(unnamed)


def test_group_keys_stay_on_one_line_as_the_plain_table_shows_them(tmp_path):
    """A dataset (or store path) holding a line break: the plain table shows it ``x\\ny``; --group printed the break
    as it is, the cell's row split over two lines (the second holding only ``y``)."""
    for k in (0, 1):
        _fake(tmp_path / "runs" / f"r{k}", k, dataset="x\ny", features="/d/s\nt.zarr")
    plain = _piped("summary", tmp_path / "runs")
    assert plain.returncode == 0, plain.stderr
    assert "x\\ny · pixels" in plain.stdout  # the plain table's label: one_line
    for key in ("dataset", "store"):
        grouped = _piped("summary", tmp_path / "runs", "--group", f"{key},tasks")
        assert grouped.returncode == 0, grouped.stderr
        lines = [line for line in grouped.stdout.splitlines() if line.strip()]
        body = lines[lines.index(next(line for line in lines if set(line.strip()) == {"─"})) + 1:]
        assert len(body) == 1, (key, grouped.stdout)  # one cell, one row
        assert "\\n" in body[0] and body[0].split()[1:3] == ["3", "2"], (key, grouped.stdout)


def test_a_run_folder_with_a_line_break_stays_one_label(tmp_path):
    """A run folder named ``c\\nd``: its row's path is printed with the break as it is, so ``d`` stands on a line of
    its own where the row's ``dataset · encoder`` line belongs; the error naming such a path shows ``\\n``."""
    _fake(tmp_path / "runs" / "c\nd", 0)
    result = _piped("summary", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "d" not in lines, result.stdout  # the name's tail as a line of the table
    assert any(line.startswith(f"{tmp_path / 'runs'}/c\\nd ") for line in lines), result.stdout
    missing = _piped("summary", tmp_path / "no\nsuch")
    assert missing.returncode == 1 and "no\\nsuch does not exist" in missing.stderr  # errors: one_line
