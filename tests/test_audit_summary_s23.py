"""Audit (summ, s23) of ``foal-pipe summary --group``: the cells' keys shown must be true, cells must never pool runs of
different settings unnamed, and a metrics.json whose numbers contradict its matrix is named as in the plain table.
(Means, population stds and --order-seeds counting are covered by test_summary_groups.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import cluster_store, invoke

COMMON = ("--projection-dim", "40", "--tasks", "3", "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("summ")
    return cluster_store(root / "s.zarr", n_classes=6, dim=16, n_test=120, chunk_rows=64, seed=0, n_train=300)


def _learn(store, out, *extra):
    result = invoke("learn", "--features", store, "--out", out, *COMMON, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _rows(output: str, first: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.split()[:1] == [first]]


def test_gammas_that_differ_are_never_shown_as_the_same_cell_key(store, tmp_path):
    """Runs of --gamma 1 and --gamma 1.0000001 are two cells (right), but both rows read "gamma 1" (`{v:g}`): the key
    shown must tell the cells apart (e.g. repr / shortest round-trip text, as the warnings' "1.0000001" do)."""
    _learn(store, tmp_path / "runs" / "a", "--gamma", "1", "--order-seed", "0")
    _learn(store, tmp_path / "runs" / "b", "--gamma", "1.0000001", "--order-seed", "1")
    result = invoke("summary", tmp_path / "runs", "--group", "head,gamma")
    assert result.exit_code == 0, result.output
    rows = _rows(result.output, "ridge")
    assert len(rows) == 2, result.output
    shown = [row[1] for row in rows]
    assert len(set(shown)) == 2, f"two cells both labelled gamma {shown}:\n{result.output}"
    assert {float(g) for g in shown} == {1.0, 1.0000001}, shown


def test_runs_of_two_gamma_grids_are_not_pooled_unnamed(store, tmp_path):
    """--gamma auto runs of --gamma-grid 0.01,1,100 and 0.0100000001,1,100 search different grids (documented key
    `grid`), yet GROUP_KEYS['grid'] formats with `:g`, so both read "0.01,1,100": one cell, no warning."""
    a = _learn(store, tmp_path / "runs" / "a", "--gamma", "auto", "--gamma-grid", "0.01,1,100", "--order-seed", "0")
    b = _learn(store, tmp_path / "runs" / "b", "--gamma", "auto", "--gamma-grid", "0.0100000001,1,100",
               "--order-seed", "1")
    assert a["gamma_grid"] != b["gamma_grid"]
    result = invoke("summary", tmp_path / "runs", "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    assert "grid" in result.output and "--group head,tasks,grid" in " ".join(result.output.split()), result.output


def test_a_continued_run_is_not_pooled_unnamed_with_a_fresh_one(store, tmp_path):
    """`learn --init-model` (recorded as `continuation.init_model`) starts from another model: pooling it with a fresh
    run of the same store passes a spread over fresh/continued as one over class orders. Seen: one cell of 2
    runs (here "ridge 3 2 75.38 +- 7.59 ...") and no warning (the continued run records no seed/init, so nothing differs)."""
    first = cluster_store(tmp_path / "first.zarr", n_classes=6, dim=16, n_test=120, chunk_rows=64, seed=1, n_train=300)
    _learn(first, tmp_path / "base", "--gamma", "1", "--order-seed", "0")
    fresh = _learn(store, tmp_path / "runs" / "fresh", "--gamma", "1", "--order-seed", "0")
    result = invoke("learn", "--features", store, "--tasks", "3", "--order-seed", "1", "--backend", "numpy",
                    "--init-model", tmp_path / "base" / "model.safetensors", "--out", tmp_path / "runs" / "cont")
    assert result.exit_code == 0, result.output
    cont = json.loads((tmp_path / "runs" / "cont" / "metrics.json").read_text())
    assert cont["continuation"]["init_model"] and "continuation" not in fresh
    assert cont["features"] == fresh["features"] and cont["gamma"] == fresh["gamma"]
    result = invoke("summary", tmp_path / "runs", "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    pooled = [row for row in _rows(result.output, "ridge") if row[2] == "2"]
    assert not pooled or "Warning:" in text, f"fresh and continued runs pooled unnamed:\n{result.output}"


def test_group_names_a_metrics_file_its_matrix_contradicts_as_the_plain_table_does(store, tmp_path):
    """Both tables show the matrix's A_avg for an edited metrics.json, but only the plain one says so; `--group`
    replaces it silently (grouped_table calls as_recomputed without consistency_warnings)."""
    _learn(store, tmp_path / "runs" / "a", "--gamma", "1", "--order-seed", "0")
    _learn(store, tmp_path / "runs" / "b", "--gamma", "1", "--order-seed", "1")
    path = tmp_path / "runs" / "b" / "metrics.json"
    record = json.loads(path.read_text())
    record["A_avg"] = 0.5
    path.write_text(json.dumps(record, indent=1))
    plain = invoke("summary", tmp_path / "runs")
    assert plain.exit_code == 0 and "A_avg in metrics.json is 0.500000" in plain.output, plain.output
    grouped = invoke("summary", tmp_path / "runs", "--group", "head,tasks")
    assert grouped.exit_code == 0, grouped.output
    assert "A_avg in metrics.json is 0.500000" in " ".join(grouped.output.split()), grouped.output


def test_cells_match_an_independent_recomputation_and_repeat_byte_for_byte(store, tmp_path):
    """Kept (passes): gamma and tasks cells over single runs, an --order-seeds run holding the same orders (counted
    once) and an ncm run, checked against a mean / ddof-0 std of each order's metrics.json numbers written out here;
    the same command twice gives the same bytes, and a copied run folder does not change any cell."""
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        _learn(store, runs / f"g1-{seed}", "--gamma", "1", "--order-seed", str(seed))
    _learn(store, runs / "g10-0", "--gamma", "10", "--order-seed", "0")
    _learn(store, runs / "multi", "--gamma", "1", "--order-seeds", "0,1,2")
    _learn(store, runs / "ncm-0", "--head", "ncm", "--order-seed", "0")
    first = invoke("summary", runs, "--group", "head,tasks,gamma")
    assert first.exit_code == 0, first.output
    assert invoke("summary", runs, "--group", "head,tasks,gamma").output == first.output
    expected = {}
    for name, key in (("g1-0", "1"), ("g1-1", "1"), ("g1-2", "1"), ("g10-0", "10"), ("ncm-0", "-")):
        expected.setdefault(key, []).append(json.loads((runs / name / "metrics.json").read_text()))
    for key, records in expected.items():
        row = next(r for r in _rows(first.output, "ncm" if key == "-" else "ridge") if r[2] == key)
        assert row[3] == str(len(records)), row
        numbers = " ".join(row[4:])
        for metric in ("A_avg", "A_last", "F"):
            values = [r[metric] for r in records]
            mean = sum(values) / len(values)
            text = f"{100 * mean:.2f}"
            if len(values) > 1:
                text += f" +- {100 * (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5:.2f}"
            assert text in numbers, (metric, text, row)
    shutil.copytree(runs / "g1-0", tmp_path / "runs" / "copy-of-g1-0")
    again = invoke("summary", runs, "--group", "head,tasks,gamma")
    assert [r[:] for r in _rows(again.output, "ridge")] == _rows(first.output, "ridge")
