"""Report audit (session 21b): class and folder names that matplotlib mangled or could not draw (``$`` read as
mathtext, bytes that are not UTF-8, characters its font lacks), tick labels cut to names that read alike, a confusion
matrix of many classes that named nothing and dropped rows unsaid, an accuracy-matrix figure grown with every task;
per-class numbers in summary.md checked against predictions made here from model.safetensors."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke
from safetensors import safe_open

from foal_pipe.report import evaluate, plots
from foal_pipe.report.classes import ClassResults, Confusion
from foal_pipe.report.discovery import load_run
from foal_pipe.store import open_store, write_store

NAMES = ["a$x$", "$x_{$", "100$ and 5$", "pipe|d", "*star*", "back`tick", "<script>alert(1)</script>", "new\nline",
         "L" * 40 + "1", "L" * 40 + "2", "b_c", "x^2_y"]


def _store(path: Path, names: list[str], dim: int = 8, per_class: int = 12) -> Path:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(len(names)), per_class)
    x = rng.normal(size=(y.size, dim)) + y[:, None] * 0.25
    return write_store(path, (x, y), (x[::3], y[::3]), names, chunk_rows=7, dtype="float64")


def _learn(store: Path, out: Path, *extra) -> None:
    result = invoke("learn", "--features", store, "--out", out, "--projection-dim", 40, "--seed", 3, "--backend",
                    "numpy", *extra)
    assert result.exit_code == 0, result.output




@pytest.fixture(scope="module")
def named(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("s21b")
    _learn(_store(root / "w.zarr", NAMES), root / "run", "--tasks", 3)
    return root / "run"


def _ticks(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_xticklabels()]


def test_dollar_names_are_drawn_as_written_not_as_formulas(named, tmp_path, figures):
    """``$x_{$`` stopped evaluate with mathtext's traceback; ``a$x$`` was drawn as an italic ``ax``."""
    result = invoke("evaluate", "--run", named, "--out", tmp_path / "ev")
    assert result.exit_code == 0, result.output
    by_name = {f.axes[0].get_title().split("\n")[0]: f for f in figures}
    confusion = by_name["confusion on the test split, final model"]
    norms = by_name["per-class weight norms (recency bias shows as taller late tasks)"]
    for fig in (confusion, norms):
        labels = fig.axes[0].get_xticklabels()
        assert {"a$x$", "$x_{$", "100$ and 5$"} <= {t.get_text() for t in labels}
        assert not any(t.get_parse_math() for t in labels)
        assert not fig.axes[0].title.get_parse_math()


def test_long_names_keep_distinct_tick_labels(named, tmp_path, figures):
    """Names were cut to their first 12 characters: ``LLL...1`` and ``LLL...2`` (and ``class_number_001`` and
    ``class_number_002``) read alike, and a line break split a label over two lines."""
    plots.plot_weight_norms(load_run(named), tmp_path / "w.png")
    ticks = _ticks(figures[-1])
    assert len(set(ticks)) == len(ticks) == len(NAMES)
    assert all("\n" not in t for t in ticks)
    assert plots.class_ticks(["class_number_001", "class_number_002"], [0, 1]) == ["class_n…_001", "class_n…_002"]
    long = ["L" * 40 + "1", "L" * 41 + "1", "ok"]  # alike even shortened: each with its label id
    assert plots.class_ticks(long, [7, 8, 9]) == ["7: LLLLLLL…LLL1", "8: LLLLLLL…LLL1", "9: ok"]
    assert plots.class_ticks(["new\nline", "short"], [0, 1]) == ["new line", "short"]


def test_names_that_are_not_utf8_or_lack_a_glyph_are_drawn(tmp_path, figures):
    """A class name or run folder holding bytes that are not UTF-8 (surrogates) stopped evaluate with a traceback
    from the font; a character DejaVu Sans lacks printed a warning and drew a box (or another font's glyph, where
    one is installed: PNG bytes that depend on the machine)."""
    store = _store(tmp_path / "s.zarr", ["bad\udcff", "caf\udcc3\udca9", "中文", "ok"])
    _learn(store, tmp_path / "run", "--tasks", 2)
    run = (tmp_path / "run").rename(tmp_path / "run\udcfe")  # a folder name of byte 0xfe (CliRunner prints no such path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)"
        evaluate(run, tmp_path / "ev")
    confusion = next(f for f in figures if f.axes[0].get_title().startswith("confusion"))
    assert sorted(_ticks(confusion)) == sorted(["bad\ufffd", "café", "\ufffd\ufffd", "ok"])
    assert "run\ufffd (synthetic)" in confusion.axes[0].get_title()
    assert plots.drawable("lone\ud800 x\ty") == "lone\ufffd x y"


def test_confusion_of_many_classes_says_what_it_leaves_out(named, tmp_path, figures):
    """Over 40 classes the plot had no tick labels and said nothing; over the axes' pixels "nearest" drew some rows
    and dropped the others unsaid."""
    run = load_run(named)
    for C, interpolation in ((45, "nearest"), (600, "auto")):
        counts = Confusion.of(C, np.repeat(np.arange(C), 3), np.repeat(np.arange(C), 3))  # 3 rows a class, all right
        classes = ClassResults("s", list(range(C)), [f"n{k}" for k in range(C)], [1] * C, counts, 0)
        plots.plot_confusion(run, classes, tmp_path / f"c{C}.png")
        ax = figures[-1].axes[0]
        assert f"{C} classes: names left out, each is its row in class_accuracy.csv" in ax.get_title()
        assert ax.get_xlabel() == "predicted class (row of class_accuracy.csv)"
        assert _ticks(figures[-1])[0] == "1"
        assert ax.get_images()[0].get_interpolation() == interpolation
    assert "cells averaged into pixels" in ax.get_title()  # the 600 classes'


def test_the_accuracy_matrix_of_many_tasks_stays_a_bounded_figure(tmp_path):
    """The figure grew 0.55 inch a task: 120 tasks drew a 7436 x 6732 PNG in 2 GB of memory (1,000 could not)."""
    _learn(_store(tmp_path / "s.zarr", [f"c{k}" for k in range(120)], per_class=3), tmp_path / "run", "--tasks", 120)
    plots.plot_accuracy_matrix(load_run(tmp_path / "run"), tmp_path / "a.png")
    width, height = (int.from_bytes((tmp_path / "a.png").read_bytes()[k : k + 4], "big") for k in (16, 20))
    assert width <= (1.6 + 0.55 * 20) * plots.DPI + 1 and height <= (1.2 + 0.5 * 20) * plots.DPI + 1


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells, split at ``|`` not escaped, each unescaped."""
    return [re.sub(r"\\(.)", r"\1", c).strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_summary_per_class_numbers_equal_predictions_made_here(named, tmp_path):
    """Every class's test rows and accuracy in summary.md, with names holding ``|``, backticks, ``*`` and ``<``,
    against numpy's own predictions from model.safetensors (sigmoid(X P) W, argmax)."""
    result = invoke("evaluate", "--run", named, "--out", tmp_path / "ev", "--no-plots")
    assert result.exit_code == 0, result.output
    with safe_open(str(named / "model.safetensors"), "np") as f:
        P, W, ids = f.get_tensor("projection"), f.get_tensor("W"), f.get_tensor("classes")
        assert json.loads(f.metadata()["activation"]) == "sigmoid"
    store = open_store(named.parent / "w.zarr")
    X, y = np.asarray(store.test.features[:], dtype=np.float64), np.asarray(store.test.labels)
    predicted = ids[np.argmax((1 / (1 + np.exp(-(X @ P)))) @ W, axis=1)]
    text = (tmp_path / "ev" / "summary.md").read_text()
    table = text.split("## Per-class accuracy")[1].split("\n\n")[2].splitlines()[2:]
    assert len(table) == len(NAMES)
    for line in table:
        name, task, rows, accuracy = _cells(line)
        c = NAMES.index(name.replace("new line", "new\nline"))
        assert int(rows) == (y == c).sum()
        assert float(accuracy) == round(100 * float(np.mean(predicted[y == c] == c)), 1)


def test_evaluate_twice_gives_the_same_bytes_with_odd_names(named, tmp_path):
    for out in ("a", "b"):
        assert invoke("evaluate", "--run", named, "--out", tmp_path / out).exit_code == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "confusion_matrix.png" in files and files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_continued_run_says_whose_projection_it_keeps(named, tmp_path):
    """A continued run records no seed (it draws no projection): summary.md said ``seed ?``."""
    result = invoke("learn", "--features", _store(tmp_path / "n.zarr", ["new|one", "zz"]), "--out", tmp_path / "cont",
                    "--tasks", 1, "--init-model", named / "model.safetensors")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "cont" / "metrics.json").read_text()).get("seed") is None
    assert invoke("evaluate", "--run", tmp_path / "cont", "--no-plots").exit_code == 0
    line = (tmp_path / "cont" / "eval" / "summary.md").read_text().splitlines()[2]
    assert "the continued model's projection" in line and "seed ?" not in line, line
