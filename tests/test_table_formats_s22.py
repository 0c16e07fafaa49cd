"""Randomized audit: ``foal-pipe table``'s table.md, table.tex, table.csv and printed table state the numbers of its
table.json (and table.json's cells those of its runs' matrices), rounded as docs/results-table.md says, with the same
labels and bold marks and store names escaped; ``evaluate``'s summary.md and scores.json state those of metrics.json.

Every expected number comes from an independent closed form (the matrix's means, a population std by ``math.fsum``,
percent rounded half to even at the binary value as ``learn`` prints it), every file is parsed back, not searched."""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_metrics, make_run, runner

from foal_pipe.cli import app
from foal_pipe.report.resultstable import csv_rows, latex, markdown, store_labels
from foal_pipe.store import write_store

# --- independent closed forms ------------------------------------------------------------------------------------


def shown(x: float, digits: int = 2) -> str:
    """A fraction as the docs print it: percent (100 x, as ``learn`` prints it), rounded half to even at its binary
    value; a value that rounds to zero is ``0.00``, never ``-0.00``."""
    d = Decimal(100 * x).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_EVEN)
    return str(abs(d) if d == 0 else d)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std; identical values give that value and 0 exactly (docs/results-table.md)."""
    if all(v == values[0] for v in values):
        return values[0], 0.0
    m = math.fsum(values) / len(values)
    return m, math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def disjoint_summary(acc: list[list[float]]) -> dict[str, float]:
    """A_avg, A_last, F (paper Eq. 17-18) of a lower-triangular matrix, written out with ``math.fsum``."""
    T = len(acc)
    steps = [math.fsum(row[: i + 1]) / (i + 1) for i, row in enumerate(acc)]
    forgetting = [max(acc[k][j] for k in range(j, T - 1)) - acc[-1][j] for j in range(T - 1)]
    return {"A_avg": math.fsum(steps) / T, "A_last": steps[-1],
            "F": math.fsum(forgetting) / len(forgetting) if forgetting else 0.0}


def cell_text(cell: dict[str, Any], metric: str, pm: str, space: str = " ") -> str:
    """``mean pm std``, the mean alone for one class order."""
    mean = shown(cell[metric]["mean"])
    return mean if len(cell["order_seeds"]) == 1 else f"{mean}{space}{pm}{space}{shown(cell[metric]['std'])}"


def is_best(table: dict[str, Any], cell: dict[str, Any], metric: str) -> bool:
    """Bold: the shown mean equals the best shown mean of its column (every head that shows it)."""
    column = [c for c in table["cells"] if (c["store"], c["tasks"]) == (cell["store"], cell["tasks"])]
    return Decimal(shown(cell[metric]["mean"])) == max(Decimal(shown(c[metric]["mean"])) for c in column)


# --- Markdown and LaTeX read back ----------------------------------------------------------------------------------

_PUNCT = r"""!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~"""


def md_cells(line: str) -> list[str]:
    """A GFM table row split at its unescaped ``|``, each cell stripped, escapes kept."""
    cells, cur, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            cur, i = cur + line[i: i + 2], i + 2
        elif line[i] == "|":
            cells.append(cur.strip())
            cur, i = "", i + 1
        else:
            cur, i = cur + line[i], i + 1
    assert cur.strip() == "" and cells[0] == "", line
    return cells[1:]


def md_plain(text: str) -> str:
    """CommonMark's text of ``text``, asserting that no markup character is left unescaped: ``|``, emphasis, code,
    links, HTML, math, backslashes, and an underscore not between word characters."""
    bare = re.sub(r"\\[" + re.escape(_PUNCT) + "]", "", text)
    assert not re.search(r"[\\`*|\[\]<>$]", bare), text
    assert not re.search(r"(?<![^\W_])_|_(?![^\W_])", re.sub(r"\w_+\w", "", bare)), text
    return re.sub(r"\\([" + re.escape(_PUNCT) + "])", r"\1", text)


_TEX_BACK = {r"\textbackslash{}": "\\", r"\textasciitilde{}": "~", r"\textasciicircum{}": "^", r"\textless{}": "<",
             r"\textgreater{}": ">", r"\textbar{}": "|", r"\textasciigrave{}": "`", r"\textquotedbl{}": '"', "-{}": "-",
             "{'}": "'"}


def tex_plain(text: str) -> str:
    """The text LaTeX prints for ``text`` (a label), asserting that no special character is left unescaped."""
    words = re.sub("|".join(map(re.escape, _TEX_BACK)), lambda m: "\0", text)
    assert not re.search(r"(?<!\\)[_%&#${}~^]|\\(?![_%&#${}])", words), text
    out = re.sub("|".join(map(re.escape, _TEX_BACK)), lambda m: _TEX_BACK[m.group()], text)
    return re.sub(r"\\([_%&#${}])", r"\1", out)


def tex_balanced(tex: str) -> None:
    depth = 0
    for m in re.finditer(r"\\textbackslash\{\}|\\.|[{}]", tex):
        depth += {"{": 1, "}": -1}.get(m.group(), 0)
        assert depth >= 0, tex
    assert depth == 0


def tex_cells(line: str) -> list[str]:
    """A tabular row (``... \\\\``) split at its unescaped ``&``."""
    assert line.endswith(r" \\"), line
    return [c.strip() for c in re.split(r"(?<!\\)&", line[: -3])]


def tex_span(cells: list[str]) -> int:
    return sum(int(m.group(1)) if (m := re.match(r"\\multicolumn\{(\d+)\}", c)) else 1 for c in cells)


def label_text(label: str) -> str:
    return " ".join(label.splitlines())


# --- one table's files against its table.json -------------------------------------------------------------------


def check_markdown(table: dict[str, Any], md: str) -> None:
    labels = store_labels(table["features"])
    sections = re.split(r"^## ", md, flags=re.M)[1:]
    assert [s.split("\n", 1)[0] for s in sections][: len(table["tasks"])] == \
        [f"{t} task{'s' if t != 1 else ''}" + streamed_note(table, t) for t in table["tasks"]]
    for tasks, section in zip(table["tasks"], sections, strict=False):
        lines = [line for line in section.splitlines() if line.startswith("|")]
        header = [md_plain(c) for c in md_cells(lines[0])]
        assert header == ["head", *(f"{label_text(labels[s])} {m}" for s in table["features"] for m in ("A_last", "A_avg"))]
        assert md_cells(lines[1]) == ["---", *["---:"] * (len(header) - 1)]
        ours = [md_cells(line) for line in lines[2:] if not line.startswith("| *")]
        assert [r[0] for r in ours] == table["heads"]
        for row in ours:
            assert len(row) == len(header)
            values = iter(row[1:])
            for store in table["features"]:
                cell = next(c for c in table["cells"] if (c["store"], c["head"], c["tasks"]) == (store, row[0], tasks))
                for metric in ("A_last", "A_avg"):
                    text = cell_text(cell, metric, "±")
                    assert next(values) == (f"**{text}**" if is_best(table, cell, metric) else text), (store, row[0])


def streamed_note(table: dict[str, Any], tasks: int) -> str:
    streamed = sorted({c["n_tasks"] for c in table["cells"] if c["tasks"] == tasks})
    return "" if streamed == [tasks] else f" ({' or '.join(map(str, streamed))} streamed)"


def check_latex(table: dict[str, Any], tex: str) -> None:
    tex_balanced(tex)
    labels, stores = store_labels(table["features"]), table["features"]
    blocks = tex.split(r"\begin{table}[t]")[1:]
    assert len(blocks) == len(table["tasks"])
    for tasks, block in zip(table["tasks"], blocks, strict=True):
        lines = block.strip().splitlines()
        assert lines[1] == f"\\caption{{{tasks} task{'s' if tasks != 1 else ''}{streamed_note(table, tasks)}}}"
        assert lines[2] == "\\begin{tabular}{l" + " cc" * len(stores) + "}"
        width = 1 + 2 * len(stores)
        rows = [line for line in lines if line.endswith(r" \\")]
        top = tex_cells(rows[0])
        assert tex_span(top) == width and top[0] == ""
        assert [tex_plain(re.fullmatch(r"\\multicolumn\{2\}\{c\}\{(.*)\}", c, re.S).group(1)) for c in top[1:]] == \
            [label_text(labels[s]) for s in stores]
        assert tex_cells(rows[1]) == ["Head", *["$A_{last}$", "$A_{avg}$"] * len(stores)]
        ours = [tex_cells(r) for r in rows[2:] if not r.startswith(r"\textit")]
        assert [tex_plain(r[0]) for r in ours] == table["heads"]
        for row in ours:
            assert tex_span(row) == width
            values = iter(row[1:])
            for store in stores:
                cell = next(c for c in table["cells"] if (c["store"], c["head"], c["tasks"]) == (store, row[0], tasks))
                for metric in ("A_last", "A_avg"):
                    text = cell_text(cell, metric, r"\pm")
                    assert next(values) == (f"$\\mathbf{{{text}}}$" if is_best(table, cell, metric) else f"${text}$")


def check_csv(table: dict[str, Any], rows: list[dict[str, str]]) -> None:
    expected = [(c, m) for c in table["cells"] for m in ("A_avg", "A_last", "F", "A_auc") if m in c]
    assert len(rows) == len(expected)
    for row, (cell, metric) in zip(rows, expected, strict=True):
        assert row["store"].removeprefix("'") == cell["store"] and row["head"] == cell["head"]
        assert (int(row["tasks"]), int(row["n_tasks"]), int(row["orders"]), row["metric"]) == \
            (cell["tasks"], cell["n_tasks"], len(cell["order_seeds"]), metric)
        assert float(row["mean"]) == cell[metric]["mean"] and float(row["std"]) == cell[metric]["std"]
        assert [float(v) for v in row["values"].split(" ")] == cell[metric]["values"]


def check_cells(table: dict[str, Any]) -> None:
    """Each cell's values are its runs' (in ``order_seeds`` order), with the mean and std of those values."""
    assert len(table["cells"]) == len(table["features"]) * len(table["heads"]) * len(table["tasks"])
    for cell in table["cells"]:
        assert cell["order_seeds"] == table["order_seeds"]
        for metric in ("A_avg", "A_last", "F"):
            values = cell[metric]["values"]
            mean, std = mean_std(values)
            assert cell[metric]["mean"] == pytest.approx(mean, abs=1e-13)
            assert cell[metric]["std"] == pytest.approx(std, abs=1e-13)
            if len(set(values)) == 1:
                assert (cell[metric]["mean"], cell[metric]["std"]) == (values[0], 0.0)


def check_runs(table: dict[str, Any]) -> None:
    """Each run's A_avg, A_last and F are its matrix's, and each cell holds its runs' values."""
    for run in table["runs"]:
        expected = disjoint_summary(run["accuracy_matrix"])
        for metric in ("A_avg", "A_last", "F"):
            assert run[metric] == pytest.approx(expected[metric], abs=1e-12)
    for cell in table["cells"]:
        runs = {r["order_seed"]: r for r in table["runs"]
                if (r["store"], r["head"], r["tasks"]) == (cell["store"], cell["head"], cell["tasks"])}
        assert sorted(runs) == sorted(cell["order_seeds"])
        for metric in ("A_avg", "A_last", "F"):
            assert cell[metric]["values"] == [runs[s][metric] for s in cell["order_seeds"]]


def check_printed(table: dict[str, Any], output: str) -> None:
    """The printed tables (a terminal wide enough for one line per row): per task count a row per head, each store's
    ``A_last / A_avg`` as ``mean+-std``."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]
    expected = []
    for tasks in table["tasks"]:
        for head in table["heads"]:
            cells = [next(c for c in table["cells"] if (c["store"], c["head"], c["tasks"]) == (s, head, tasks))
                     for s in table["features"]]
            expected.append([head, *(f"{cell_text(c, 'A_last', '+-', '')} / {cell_text(c, 'A_avg', '+-', '')}"
                                     for c in cells)])
    assert rows == expected


def check_files(table: dict[str, Any], md: str, tex: str, csv_text: str) -> None:
    check_cells(table)
    check_markdown(table, md)
    check_latex(table, tex)
    check_csv(table, list(csv.DictReader(io.StringIO(csv_text))))


# --- synthetic table documents: rounding edges and names --------------------------------------------------------

#: Means at the edges of two-decimal percent: x.xx5 values, 100 %, 0, and pairs one ulp apart.
EDGES = [0.66875, 0.123445, 0.123455, 0.5, 1.0, 0.0, 0.99995, 0.00005, 0.812345, 0.81235, 0.1 + 0.2, 0.3]
#: Store names with every character LaTeX or Markdown reads as markup.
NAMES = ["a_b.zarr", "x%y&z#w.zarr", "d$o{l}l~a^r.zarr", "back\\slash.zarr", "p|i|pe.zarr", "*em*_ph_.zarr",
         "`code`.zarr", "<b>[l](u).zarr", "plain", "line\nbreak.zarr", "_lead.zarr", "c_d"]


def random_document(rng: random.Random) -> dict[str, Any]:
    stores = rng.sample(NAMES, rng.randint(1, 3))
    heads = rng.sample(["ridge", "ncm", "slda", "fecam", "cosine", "balanced", "dual"], rng.randint(1, 4))
    seeds = rng.sample(range(10), rng.randint(1, 3))
    tasks = sorted(rng.sample(range(1, 11), rng.randint(1, 3)))
    cells = []
    for store in stores:
        for head in heads:
            for t in tasks:
                cell = {"store": store, "dataset": "d", "encoder": "e", "head": head, "tasks": t, "n_tasks": t,
                        "order_seeds": seeds, "stream": "disjoint", "n_classes": 10}
                for metric in ("A_avg", "A_last", "F"):
                    tied = rng.random() < 0.4
                    base = rng.choice(EDGES) if rng.random() < 0.6 else rng.random()
                    values = [base if tied else min(1.0, max(0.0, base + rng.uniform(-1e-3, 1e-3))) for _ in seeds]
                    mean, std = mean_std(values)
                    cell[metric] = {"mean": mean, "std": std, "values": values}
                cells.append(cell)
    return {"features": stores, "heads": heads, "order_seeds": seeds, "tasks": tasks, "std_ddof": 0, "cells": cells}


def test_random_documents_print_every_cell_alike_in_md_tex_and_csv():
    rng = random.Random(22)
    for _ in range(300):
        table = random_document(rng)
        text = io.StringIO()
        writer = csv.DictWriter(text, list(csv_rows(table)[0]))
        writer.writeheader()
        writer.writerows(csv_rows(table))
        check_files(table, markdown(table), latex(table), text.getvalue())


def test_a_tie_in_the_shown_digits_bolds_both_and_x_xx5_rounds_as_learn_prints():
    """0.66875 prints 66.88 (learn's digits); 0.81235 and 0.812345 are one ulp either side of a half: both bold where
    they show the same digits."""
    table = random_document(random.Random(0))
    table |= {"features": ["s"], "heads": ["ridge", "ncm"], "tasks": [5], "order_seeds": [0, 1]}
    table["cells"] = [{"store": "s", "head": h, "tasks": 5, "n_tasks": 5, "order_seeds": [0, 1], "dataset": "d",
                       "encoder": "e", **{m: {"mean": v, "std": 0.0, "values": [v, v]} for m in ("A_avg", "A_last", "F")}}
                      for h, v in (("ridge", 0.66875), ("ncm", 0.668749))]
    md = markdown(table)
    assert "| ridge | **66.88 ± 0.00** | **66.88 ± 0.00** |" in md and "| ncm | 66.87 ± 0.00 | 66.87 ± 0.00 |" in md
    check_files(table, md, latex(table), "".join(
        [",".join(csv_rows(table)[0]) + "\n"] + [",".join(str(v) for v in r.values()) + "\n" for r in csv_rows(table)]))


def test_latex_prints_backticks_and_double_quotes_as_typed():
    table = random_document(random.Random(1))
    table |= {"features": ['p`q".zarr'], "heads": ["ridge"], "tasks": [2]}
    table["cells"] = [c | {"store": 'p`q".zarr', "head": "ridge", "tasks": 2} for c in table["cells"][:1]]
    header = next(line for line in latex(table).splitlines() if "multicolumn" in line)
    assert "`" not in header and '"' not in header  # as \textasciigrave{} and \textquotedbl{} (with T1 encoding)


# --- real tables ------------------------------------------------------------------------------------------------


def _store(path: Path, n_classes: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    centres = 2.0 * rng.normal(size=(n_classes, 10))

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.tile(np.arange(n_classes), n // n_classes)
        return (centres[y] + rng.normal(size=(y.size, 10))).astype(np.float32), y

    return write_store(path, rows(24 * n_classes), rows(8 * n_classes), [f"c{i}" for i in range(n_classes)], chunk_rows=64)


def _run_table(tmp_path: Path, rng: random.Random) -> tuple[dict[str, Any], Path, str]:
    """A random table: 1-3 stores of other class counts and names, heads, orders, task counts and gamma."""
    names = rng.sample(["a_b%c", "x&y#z", "d$o{l}~^", "back\\sl", "plain", "p|q"], rng.randint(1, 3))
    classes = [rng.randint(4, 7) for _ in names]
    stores = [_store(tmp_path / f"{n}.zarr", c, rng.randint(0, 99)) for n, c in zip(names, classes, strict=True)]
    fewest = min(classes)
    heads = rng.sample(["ridge", "ncm", "slda", "cosine", "fecam", "balanced", "dual"], rng.randint(1, 3))
    gamma = rng.choice(["auto", "1", "0.3"]) if "ridge" in heads else rng.choice(["1", "0.3"])
    args = ["table", *(x for s in stores for x in ("--features", str(s))), "--heads", ",".join(heads),
            "--order-seeds", ",".join(map(str, rng.sample(range(6), rng.randint(1, 3)))),
            "--out", str(tmp_path / "t")]
    if rng.random() < 0.8:  # else learn's default: the fewest classes of any store
        args += ["--tasks", ",".join(map(str, sorted(rng.sample(range(1, fewest + 1), rng.randint(1, 2)))))]
    if gamma == "auto":
        args += ["--select", rng.choice(["loo", "gcv", "loo_accuracy"])]
    if any(h in heads for h in ("ridge", "balanced", "dual")):
        args += ["--gamma", gamma, "--projection-dim", str(rng.choice([16, 40])), "--backend", "numpy"]
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, (args, result.output)
    return json.loads((tmp_path / "t" / "table.json").read_text()), tmp_path / "t", result.output


def _check_table(tmp_path: Path, seed: int) -> None:
    table, out, output = _run_table(tmp_path, random.Random(seed))
    check_runs(table)
    check_files(table, (out / "table.md").read_text(encoding="utf-8"), (out / "table.tex").read_text(encoding="utf-8"),
                (out / "table.csv").read_text(encoding="utf-8"))
    check_printed(table, output)


def test_a_random_table_states_its_runs_numbers_in_every_file(tmp_path):
    _check_table(tmp_path, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 9))
def test_random_tables_state_their_runs_numbers_in_every_file(tmp_path, seed):
    _check_table(tmp_path, seed)


# --- evaluate's summary.md and scores.json --------------------------------------------------------------------

#: Class names with Markdown's markup characters.
CLASSES = ["a|b", "*g*", "back\\slash", "_u_", "x`y", "<b>", "[l](u)", "c_d", "$m$", "~s~"]


def md_table(md: str, first: str) -> list[list[str]]:
    """The rows of the Markdown table whose header starts with ``| first |``, escapes kept."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(md_cells(line))
    return rows


def check_evaluation(run: Path, sweep: Path | None) -> None:
    """summary.md's results, per-order and matrix tables, its class names, and scores.json, against metrics.json's
    matrices (and the sweep's results)."""
    metrics = json.loads((run / "metrics.json").read_text())
    md = (run / "eval" / "summary.md").read_text(encoding="utf-8")
    scores = json.loads((run / "eval" / "scores.json").read_text())
    orders = metrics.get("orders") or [metrics]
    each = [disjoint_summary(o["accuracy_matrix"]) for o in orders]
    results = {r[0]: r[1] for r in md_table(md, "metric")}
    for metric, label in (("A_avg", "A_avg (%)"), ("A_last", "A_last (%)"), ("F", "F (%)")):
        mean, std = mean_std([e[metric] for e in each])
        assert scores[metric] == pytest.approx(mean, abs=1e-12)
        assert results[label] == shown(mean) + ("" if len(orders) == 1 else f" ± {shown(std)}")
    if len(orders) > 1:
        per_order = md_table(md, "order seed")
        assert per_order == [[str(o["order_seed"]), *(shown(e[m]) for m in ("A_avg", "A_last", "F"))]
                             for o, e in zip(orders, each, strict=True)]
    matrix = metrics["accuracy_matrix"][-1]  # with orders, their position-wise mean
    assert matrix == pytest.approx(np.mean([o["accuracy_matrix"][-1] for o in orders], axis=0), abs=1e-12)
    last = md_table(md, "after task")[-1]
    assert last[1:-1] == [shown(v, 1) for v in matrix] and last[-1] == shown(math.fsum(matrix) / len(matrix))
    names = [md_plain(r[0]) for r in md_table(md, "class")]
    assert sorted(names) == sorted(metrics_names(run))
    if sweep is not None:
        report = json.loads((sweep / "sweep.json").read_text())
        at = {r["gamma"]: r for r in report["results"]}
        assert scores["sweep_selected_gamma"] == report["best_gamma"]
        assert scores["sweep_selected_A_avg"] == pytest.approx(at[report["best_gamma"]]["A_avg"], abs=1e-12)
        oracle = max(report["results"], key=lambda r: r["A_avg"])["A_avg"]
        assert scores["sweep_oracle_A_avg"] == pytest.approx(oracle, abs=1e-12)
        swept = {float(r[0]): r for r in md_table(md, "gamma")}
        for g, r in at.items():
            assert swept[g][1:4] == [shown(r[m]) for m in ("A_avg", "A_last", "F")]


def metrics_names(run: Path) -> list[str]:
    with open(run / "eval" / "class_accuracy.csv", encoding="utf-8", newline="") as fh:
        return [row["name"] for row in csv.DictReader(fh)]


def _class_store(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    centres = 1.5 * rng.normal(size=(len(CLASSES), 12))

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, len(CLASSES), n)
        return (centres[y] + rng.normal(size=(n, 12))).astype(np.float32), y

    return write_store(path, rows(400), rows(160), CLASSES, chunk_rows=64)


def _check_evaluate(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = _class_store(tmp_path / "s.zarr", seed)
    common = ["--features", str(store), "--tasks", str(rng.choice([2, 3, 5])), "--projection-dim", str(rng.choice([20, 40])),
              "--backend", "numpy", *(["--order-seeds", "0,1,2"] if rng.random() < 0.6 else [])]
    run = tmp_path / "run"
    learn = runner.invoke(app, ["learn", *common, "--out", str(run), "--gamma", rng.choice(["auto", "1", "0.05"])])
    assert learn.exit_code == 0, learn.output
    sweep = tmp_path / "run-sweep" if rng.random() < 0.7 else None
    if sweep is not None:
        result = runner.invoke(app, ["sweep", *common, "--out", str(sweep)])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["evaluate", "--run", str(run)])
    assert result.exit_code == 0, result.output
    check_evaluation(run, sweep)


def test_evaluate_states_metrics_numbers_and_escapes_class_names(tmp_path):
    _check_evaluate(tmp_path, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
def test_random_evaluations_state_metrics_numbers(tmp_path, seed):
    _check_evaluate(tmp_path, seed)


def test_a_forgetting_of_zero_prints_unsigned(tmp_path):
    """Task 1 loses 3 of 11 test rows, task 2 gains 3 of 11: F is 0 exactly, its float mean -2.8e-17."""
    matrix = [[1 / 11], [10 / 11, 5 / 11], [7 / 11, 8 / 11, 1 / 11]]
    numbers = disjoint_summary(matrix)
    steps = [math.fsum(row) / len(row) for row in matrix]
    run = make_run(tmp_path / "run", make_metrics(accuracy_matrix=matrix, A_steps=steps, F_published_code=1 / 11,
                                                  **numbers))
    result = runner.invoke(app, ["evaluate", "--run", str(run)])
    assert result.exit_code == 0, result.output
    results = {r[0]: r[1] for r in md_table((run / "eval" / "summary.md").read_text(encoding="utf-8"), "metric")}
    assert results["F (%)"] == "0.00"
