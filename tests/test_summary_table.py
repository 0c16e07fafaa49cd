"""``summary`` given a table's output names it a results table and where to read it, not "run dvc repro"."""

from __future__ import annotations

from helpers import build_store, invoke


def test_summary_of_a_table_names_its_table_md(tmp_path):
    store = build_store(tmp_path / "a.zarr", n_train=60)
    out = tmp_path / "t"
    assert invoke("table", "--features", store, "--heads", "ridge", "--tasks", 2, "--order-seeds", 0, "--out", out).exit_code == 0
    result = invoke("summary", out)
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (f"Error: {out} holds a results table (table.json), which `summary` does "
                                                      f"not read: open {out / 'table.md'}, or give `summary` run "
                                                      "directories of `foal-pipe learn`")

