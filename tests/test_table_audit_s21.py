"""The table audit s21's faults: a store name that starts like a spreadsheet formula is written to table.csv as text
(a quote in front, CSV injection), with commas and quotes read back whole; a ``$`` in a store's name is drawn as
itself in table.png, not parsed as a formula (a traceback after every run before); ``a.zarr`` beside ``a`` get two
columns, not two named ``a``; a store's refusal names the store even when its name is in the message's letters; the
text files are UTF-8 in any locale and a path's bytes that are not UTF-8 are written (a traceback after every run); a
task count whose runs stream fewer tasks says so in its headings."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_clean_error, build_store, invoke

from foal_pipe.report.resultstable import FORMULA_STARTS, csv_text, store_labels

SMALL = {"n_train": 200, "n_test": 80}


@pytest.mark.parametrize("start", FORMULA_STARTS)
def test_a_name_that_starts_like_a_formula_gets_a_quote_in_front(start):
    assert csv_text(f"{start}HYPERLINK(1)") == f"'{start}HYPERLINK(1)"


@pytest.mark.parametrize("name", ["data/a.zarr", "/abs/a=b.zarr", "a,b", None])
def test_other_names_are_written_as_they_are(name):
    assert csv_text(name) == name


def test_table_csv_writes_formula_names_as_text_and_reads_back_commas_and_quotes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = ["=1+1.zarr", '@x,"q".zarr']
    for seed, name in enumerate(names):
        build_store(tmp_path / name, seed=seed, attrs={"dataset": "=cmd|' /C calc'!A0"}, **SMALL)
    result = invoke("table", *(x for n in names for x in ("--features", n)), "--heads", "ncm", "--order-seeds", "0",
                    "--tasks", "2", "--out", "t")
    assert result.exit_code == 0, result.output
    doc = json.loads(Path("t/table.json").read_text())
    with open("t/table.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["store"] for r in rows} == {"'" + n for n in names}
    assert {r["dataset"] for r in rows} == {"'=cmd|' /C calc'!A0"}
    assert [c["store"] for c in doc["cells"]] == names  # table.json keeps the names as they are
    for row in rows:
        cell = next(c for c in doc["cells"] if "'" + c["store"] == row["store"])
        assert float(row["mean"]) == cell[row["metric"]]["mean"]


def test_a_dollar_in_a_store_name_is_drawn_not_parsed(tmp_path):
    store = build_store(tmp_path / r"r$\foo{$.zarr", seed=0, **SMALL)
    out = tmp_path / "t"
    result = invoke("table", "--features", store, "--heads", "ncm", "--order-seeds", "0", "--tasks", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("stores", [["a.zarr", "a"], ["/t/a.zarr", "/t/a"], ["x/a.zarr", "a"]])
def test_a_store_beside_its_name_with_zarr_gets_its_own_column(stores):
    labels = store_labels(stores)
    assert len(set(labels.values())) == len(stores), labels


def test_a_zarr_store_beside_the_same_name_gets_distinct_md_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed, name in enumerate(("a.zarr", "a")):
        build_store(tmp_path / name, seed=seed, **SMALL)
    result = invoke("table", "--features", "a.zarr", "--features", "a", "--heads", "ncm", "--order-seeds", "0",
                    "--tasks", "2", "--out", "t")
    assert result.exit_code == 0, result.output
    assert "| head | a.zarr A_last | a.zarr A_avg | a A_last | a A_avg |" in Path("t/table.md").read_text()


def test_a_refusal_names_its_store_whose_name_is_in_the_messages_letters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build_store(tmp_path / "a.zarr", seed=0, **SMALL)
    build_store(tmp_path / "s", seed=1, n_classes=4, **SMALL)
    result = invoke("table", "--features", "a.zarr", "--features", "s", "--tasks", "6", "--out", "t")
    assert_clean_error(result, "Error: s: --tasks 6 is larger than the number of classes (4)", tmp_path / "t")


def test_a_task_count_whose_runs_stream_fewer_tasks_says_so(tmp_path):
    """Si-Blurry leaves out a task that receives no row: the headings said ``6 tasks`` over runs of 5."""
    store = build_store(tmp_path / "a.zarr", seed=0)
    out = tmp_path / "t"
    result = invoke("table", "--features", store, "--stream", "si-blurry", "--order-seeds", "1", "--tasks", "6,3",
                    "--out", out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "table.json").read_text())
    streamed = {r["tasks"]: r["n_tasks"] for r in doc["runs"]}
    assert streamed[6] < 6 and streamed[3] == 3  # the case this test is about: one count short, one whole
    heading = f"6 tasks ({streamed[6]} streamed)"
    assert f"## {heading}\n" in (out / "table.md").read_text()
    assert f"\\caption{{{heading}}}" in (out / "table.tex").read_text()
    assert "## 3 tasks\n" in (out / "table.md").read_text() and heading in result.output


FILES = ("table.md", "table.tex", "table.csv", "table.png")


def test_the_files_are_the_same_bytes_in_an_ascii_locale(tmp_path):
    """In an ASCII locale table.md's ``±`` stopped the table with a traceback after every run (and a Latin-1 locale
    wrote other bytes); the path, read there as surrogates, is written as its own bytes."""
    store = build_store(tmp_path / "café.zarr", seed=0, **SMALL)
    args = ["table", "--features", str(store), "--heads", "ncm", "--order-seeds", "0,1", "--tasks", "2"]
    assert invoke(*args, "--out", tmp_path / "here").exit_code == 0
    ascii_locale = {"PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONIOENCODING": ""}
    done = subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", *args, "--out",
                           str(tmp_path / "c")], capture_output=True, timeout=300, env=os.environ | ascii_locale)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    for name in FILES:
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name
    md = (tmp_path / "c" / "table.md").read_bytes()
    assert "café A_last".encode() in md and " ± ".encode() in md


def test_a_store_path_that_is_not_utf8_is_written_as_its_bytes(tmp_path):
    store = build_store(tmp_path / os.fsdecode(b"x\xff.zarr"), seed=0, **SMALL)
    out = tmp_path / "t"
    result = invoke("table", "--features", store, "--heads", "ncm", "--order-seeds", "0", "--tasks", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(("table.json", *FILES))
    assert b"x\xff" in (out / "table.md").read_bytes() and b"x\xff" in (out / "table.tex").read_bytes()
    assert os.fsencode(store) in (out / "table.csv").read_bytes()
