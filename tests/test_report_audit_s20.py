"""Reporting audit (session 20): an ``--order-seeds`` run's stored mean matrix checked against its orders; ``summary
--group`` naming cells that pool runs of other data or stream settings (feature width, classes, rows, ``--drop-last``,
the encoder's record); an unreadable ``metrics.json`` refused by ``--group`` rather than left out of a cell's mean; and
run folders linked into the searched paths found, each once."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import DIM, N_CLASSES, assert_one_line_error, build_store, invoke

from foal_pipe.report.discovery import find_runs

COMMON = ("--tasks", 3, "--projection-dim", 24, "--gamma", 1, "--seed", 3, "--backend", "numpy")


def _learn(store: Path | str, out: Path, *extra) -> dict:
    result = invoke("learn", "--features", store, "--out", out, *COMMON, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _warnings(output: str) -> list[str]:
    return " ".join(output.split()).split("Warning: ")[1:]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("s20") / "s.zarr")


def test_evaluate_shows_the_orders_mean_matrix_not_an_edited_one(store, tmp_path):
    """The stored mean matrix was trusted: accuracy_matrix.csv and steps.csv carried an edited 0.99 while scores.json's
    numbers came from the orders, with no warning."""
    run = tmp_path / "ord"
    metrics = _learn(store, run, "--order-seeds", "0,1,2")
    mean = np.mean([o["accuracy_matrix"][2][0] for o in metrics["orders"]])
    assert abs(metrics["accuracy_matrix"][2][0] - mean) < 1e-12
    clean = invoke("evaluate", "--run", run, "--out", tmp_path / "clean", "--no-plots")
    assert clean.exit_code == 0 and "Warning" not in clean.output, clean.output
    metrics["accuracy_matrix"][2][0] = 0.99
    (run / "metrics.json").write_text(json.dumps(metrics))
    result = invoke("evaluate", "--run", run, "--out", tmp_path / "ev", "--no-plots")
    assert result.exit_code == 0, result.output
    assert (f"Warning: accuracy_matrix[2][0] in metrics.json is 0.990000 but the mean over its orders is {mean:.6f} "
            "(the mean matrix shown)") in " ".join(result.output.split())
    for name in ("accuracy_matrix.csv", "steps.csv", "scores.json"):  # as the clean run's files: the orders' mean
        assert (tmp_path / "ev" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    rows = list(csv.DictReader((tmp_path / "ev" / "accuracy_matrix.csv").open()))
    cell = next(r for r in rows if r["after_task"] == "3" and r["task"] == "1")
    assert float(cell["accuracy"]) == pytest.approx(100 * mean, abs=1e-4)
    assert "accuracy_matrix[2][0] in metrics.json is 0.990000" in (tmp_path / "ev" / "summary.md").read_text()
    listed = invoke("summary", run)
    assert listed.exit_code == 0 and "accuracy_matrix[2][0]" in listed.output, listed.output


def test_group_names_runs_of_two_stores_typed_alike(tmp_path, monkeypatch):
    """Two stores both typed ``s.zarr`` (from two folders) of other widths, classes and rows pooled in one cell, with
    nothing said: only the path as typed was compared."""
    for name, kw in (("a", {}), ("b", {"train_dim": DIM // 2, "test_dim": DIM // 2, "n_classes": N_CLASSES - 2,
                                        "n_train": 500})):
        (tmp_path / name).mkdir()
        build_store(tmp_path / name / "s.zarr", **kw)
        monkeypatch.chdir(tmp_path / name)
        _learn("s.zarr", tmp_path / "runs" / name)
    result = invoke("summary", tmp_path / "runs", "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    (warning,) = _warnings(result.output)
    dims = ", ".join(sorted(map(str, (DIM // 2, DIM))))  # as strings, as every setting's values
    assert f"pools runs that differ in dim ({dims}) and classes ({N_CLASSES - 2}, {N_CLASSES}) and rows (" in warning, warning
    assert "split it: --group head,tasks,dim,classes,rows" in warning
    split = invoke("summary", tmp_path / "runs", "--group", "head,tasks,dim")
    assert split.exit_code == 0 and "Warning" not in split.output, split.output


def test_group_names_drop_last_beside_runs_without_and_keeps_order_cells_clean(store, tmp_path):
    """``--drop-last`` runs pooled with runs without it; the rows a ``--drop-last`` run counts change with the class
    order, so two of its orders are not named for them."""
    seen = {}
    for name, extra in (("o0", ("--order-seed", 0)), ("o1", ("--order-seed", 1)),
                        ("d0", ("--order-seed", 0, "--drop-last", "--batch-size", 9)),
                        ("d1", ("--order-seed", 1, "--drop-last", "--batch-size", 9))):
        seen[name] = _learn(store, tmp_path / ("plain" if name[0] == "o" else "drop") / name, *extra)["n_train_seen"]
    assert seen["d0"] != seen["d1"] and seen["o0"] == seen["o1"]  # the tails differ from order to order
    for folder in ("plain", "drop"):
        alone = invoke("summary", tmp_path / folder, "--group", "head,tasks")
        assert alone.exit_code == 0 and "Warning" not in alone.output, alone.output
    both = invoke("summary", tmp_path, "--group", "head,tasks")
    (warning,) = _warnings(both.output)
    assert "pools runs that differ in drop (last, none):" in warning and "--group head,tasks,drop" in warning, warning


def test_group_names_one_encoder_name_at_two_image_sizes(tmp_path, monkeypatch):
    """Stores of one encoder name at two image sizes (typed alike), otherwise the same: only the name was compared."""
    encoder = {"name": "vit-x", "fusion": "mean-cls", "image_size": 224, "normalize": True}
    for size in (224, 384):
        (tmp_path / str(size)).mkdir()
        build_store(tmp_path / str(size) / "s.zarr", attrs={"encoder": {**encoder, "image_size": size}})
        monkeypatch.chdir(tmp_path / str(size))
        _learn("s.zarr", tmp_path / "runs" / f"r{size}", "--order-seed", size % 7)
    pooled = invoke("summary", tmp_path / "runs", "--group", "head,tasks")
    assert pooled.exit_code == 0, pooled.output
    (warning,) = _warnings(pooled.output)
    assert "pools runs that differ in encoder_settings (image_size=224, image_size=384):" in warning, warning
    split = invoke("summary", tmp_path / "runs", "--group", "head,tasks,encoder_settings")
    assert split.exit_code == 0 and "Warning" not in split.output, split.output


@pytest.fixture(scope="module")
def three(store, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("three")
    for seed in (0, 1, 2):
        _learn(store, root / "runs" / f"o{seed}", "--order-seed", seed)
    return root / "runs"


@pytest.mark.parametrize("damage", ["truncated", "version"])
def test_group_refuses_an_unreadable_run_rather_than_leave_it_out_of_a_mean(three, tmp_path, damage):
    runs = tmp_path / "runs"
    shutil.copytree(three, runs)
    text = (runs / "o1" / "metrics.json").read_text()
    bad = text[:300] if damage == "truncated" else json.dumps({**json.loads(text), "format_version": 99})
    (runs / "o1" / "metrics.json").write_text(bad)
    result = invoke("summary", runs, "--group", "head,tasks")
    why = "is not valid JSON" if damage == "truncated" else "has format_version 99"
    assert_one_line_error(result, f"{runs / 'o1' / 'metrics.json'} {why}",
                          f"(or move its folder out of {runs}: --group leaves no run out of a cell's mean)")
    listed = invoke("summary", runs)  # a row per run: the missing one named, as before
    assert listed.exit_code == 0 and "Warning: skipped:" in listed.output, listed.output


def test_group_skips_an_unreadable_sweep_with_a_warning(three, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(three, runs)
    (runs / "sw").mkdir()
    (runs / "sw" / "sweep.json").write_text("{")
    result = invoke("summary", runs, "--group", "head,tasks")
    assert result.exit_code == 0 and "Warning: skipped:" in result.output, result.output
    assert re.search(r"ridge\s+3\s+3\s", result.output), result.output  # the three runs in one cell


def test_linked_run_folders_are_found_once(three, tmp_path):
    """``Path.rglob`` did not follow a linked folder: its run was left out unsaid."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "o0").symlink_to(three / "o0")
    (root / "again").symlink_to(three / "o0")  # the same run twice
    (root / "loop").symlink_to(root)  # a cycle
    found = find_runs([root])
    assert [r.path for r in found] == [root / "again"]
    assert [r.path for r in find_runs([three, three / "o1"])] == [three / f"o{k}" for k in range(3)]
    both = find_runs([root, three])
    assert sorted(r.path.name for r in both) == ["again", "o1", "o2"]
    result = invoke("summary", root, "--group", "head,tasks")
    assert result.exit_code == 0 and re.search(r"ridge\s+3\s+1\s", result.output), result.output


def test_a_linked_table_folder_is_noted(tmp_path):
    """``find_tables`` searched by ``Path.rglob`` too: a results table in a linked folder went unnoted."""
    from foal_pipe.report.discovery import find_tables

    kept = tmp_path / "kept" / "tbl"
    kept.mkdir(parents=True)
    (kept / "table.json").write_text("{}")
    root = tmp_path / "root"
    (root / ".tbl.tmp-1").mkdir(parents=True)  # a temporary: not a table
    (root / ".tbl.tmp-1" / "table.json").write_text("{}")
    (root / "linked").symlink_to(kept)
    (root / "loop").symlink_to(root)
    assert find_tables([root]) == [root / "linked" / "table.json"]
    assert find_tables([kept / "table.json"]) == [kept / "table.json"]
