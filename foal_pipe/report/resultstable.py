"""The files of ``foal-pipe table`` from its ``table.json`` document: ``table.md``, ``table.csv``, ``table.tex`` and
``table.png``.

The printed tables are the field's: per task count, a row per head and, per store, A_last and A_avg in percent as
mean +- std over the class orders (std with the ddof ``table.json`` records), the best mean of each column in bold;
published rows whose protocol matches a store's (:mod:`foal_pipe.report.published`) follow as marked reference rows.
The CSV holds every cell and metric as fractions, as ``table.json``; a name that starts like a spreadsheet
formula is written with a single quote in front (:func:`csv_text`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foal_pipe.io.csvrows import ENCODING, ERRORS, csv_dict_writer
from foal_pipe.protocol.stream import counted
from foal_pipe.report.markdown import md
from foal_pipe.report.published import Reference, references

#: The columns of the printed tables, per store.
SHOWN = (("A_last", "A_last", "$A_{last}$"), ("A_avg", "A_avg", "$A_{avg}$"))
CSV_FIELDS = ("store", "dataset", "encoder", "head", "tasks", "n_tasks", "orders", "metric", "mean", "std", "values")


def store_labels(stores: Sequence[str]) -> dict[str, str]:
    """Each store's column name: its folder name without ``.zarr``, or, where another store's folder has the same
    name, the fewest trailing parts of its path that tell it apart (``x/s``, ``y/s``), with ``.zarr`` kept where only
    it does (``a.zarr`` beside ``a``), so no two columns share one."""
    def label(store: str, k: int, strip: bool) -> str:
        path = Path(*Path(store).parts[-k:]).as_posix()
        return (path.removesuffix(".zarr") or path) if strip else path

    labels = {}
    for store in stores:
        others = [o for o in stores if o != store]
        for strip in (True, False):
            k = 1
            while k < len(Path(store).parts) and any(label(o, k, strip) == label(store, k, strip) for o in others):
                k += 1
            clash = any(label(o, k, strip) == label(store, k, strip) for o in others)
            if strip or not clash:
                labels[store] = label(store, k, strip)
            if not clash:
                break
    return labels


def _cell(table: dict[str, Any], store: str, head: str, tasks: int) -> dict[str, Any]:
    """The cell of ``(store, head, tasks)``: a table holds one for every store x head x task count it ran."""
    return next(c for c in table["cells"] if (c["store"], c["head"], c["tasks"]) == (store, head, tasks))


def _best(table: dict[str, Any], store: str, tasks: int, metric: str) -> str:
    """The best mean of a column as shown (percent, 2 decimals): every head that shows it is bold, not only the one
    ahead in digits the table does not show."""
    means = [c[metric]["mean"] for c in table["cells"] if c["store"] == store and c["tasks"] == tasks]
    return _percent(max(means))


def tasks_title(table: dict[str, Any], tasks: int) -> str:
    """The heading of task count ``tasks``, with the counts its runs streamed where they differ (Si-Blurry leaves out a
    task that receives no row): ``6 tasks (5 streamed)``, so the table does not claim runs it did not make."""
    streamed = sorted({c["n_tasks"] for c in table["cells"] if c["tasks"] == tasks})
    title = counted(tasks, "task")
    return title if streamed == [tasks] else f"{title} ({' or '.join(map(str, streamed))} streamed)"


def _percent(mean: float) -> str:
    return f"{100 * mean:.2f}"


def _columns(table: dict[str, Any]) -> list[tuple[str, str]]:
    return [(store, metric) for store in table["features"] for metric, _, _ in SHOWN]


def mean_text(cell: dict[str, Any], metric: str, pm: str, space: str = " ") -> str:
    """``mean pm std`` in percent; the mean alone for one class order, whose std says nothing."""
    mean = _percent(cell[metric]["mean"])
    return mean if len(cell["order_seeds"]) == 1 else f"{mean}{space}{pm}{space}{100 * cell[metric]['std']:.2f}"


def _ours(table: dict[str, Any], tasks: int, bold: Any, pm: str) -> list[list[str]]:
    rows = []
    for head in table["heads"]:
        row = [head]
        for store, metric in _columns(table):
            cell = _cell(table, store, head, tasks)
            text = mean_text(cell, metric, pm)
            row.append(bold(text) if _percent(cell[metric]["mean"]) == _best(table, store, tasks, metric) else text)
        rows.append(row)
    return rows


def _notes(matched: Sequence[Reference]) -> list[tuple[str, str]]:
    """The footnotes of the reference rows: one per (source, setting), numbered in the registry's order."""
    notes: list[tuple[str, str]] = []
    for ref in matched:
        if (ref.row.source, ref.row.setting) not in notes:
            notes.append((ref.row.source, ref.row.setting))
    return notes


def _published(table: dict[str, Any], tasks: int, matched: Sequence[Reference]) -> list[list[str]]:
    """The reference rows of one task count: the published mean in each matching store's columns, ``-`` where the
    source gives none, empty for the stores it does not match; the label marks replay methods and the footnote."""
    notes = _notes(matched)
    rows = []
    for row in dict.fromkeys(ref.row for ref in matched if ref.tasks == tasks):
        stores = {ref.store for ref in matched if ref.row == row and ref.tasks == tasks}
        values = []
        for store, metric in _columns(table):
            value = getattr(row, metric)
            values.append("" if store not in stores else "-" if value is None else f"{value}")
        label = f"{row.method}{' (replay)' if row.replay else ''} [{notes.index((row.source, row.setting)) + 1}]"
        rows.append([label, *values])
    return rows


def _orders_note(table: dict[str, Any]) -> str:
    n = len(table["order_seeds"])
    if n == 1:
        return f"one class order (seed {table['order_seeds'][0]}; no std), percent"
    return (f"mean ± std over {n} class orders (seeds {', '.join(map(str, table['order_seeds']))}; "
            f"std with ddof {table['std_ddof']}), percent")


def markdown(table: dict[str, Any]) -> str:
    """``table.md``: a table per task count, the published reference rows under ours, and why other published rows
    are not shown."""
    matched, why = references(table["cells"])
    lines = ["# Results table", "", f"A_last and A_avg, {_orders_note(table)}; the best mean of each column in bold. "
             "Rows in italics with a note number [n] are published references (their mean only, from the source the "
             "note names), shown where their benchmark, backbone, task count, stream and class count match what the "
             "store records; *(replay)* marks methods that keep exemplars.", ""]
    labels = {store: md(label) for store, label in store_labels(table["features"]).items()}  # a | would split a cell
    header = ["head", *[f"{labels[s]} {label}" for s, m in _columns(table) for mm, label, _ in SHOWN if mm == m]]
    for tasks in table["tasks"]:
        lines += [f"## {tasks_title(table, tasks)}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in _ours(table, tasks, lambda t: f"**{t}**", "±")]
        lines += ["| *" + r[0] + "* | " + " | ".join(r[1:]) + " |" for r in _published(table, tasks, matched)]
        lines.append("")
    lines += ["## Published results", ""]
    if not matched and not why:
        lines.append("No published row shares a benchmark with these stores (foal_pipe/report/published.py lists them).")
    lines += [f"{i}. {source}; {setting}" for i, (source, setting) in enumerate(_notes(matched), 1)]
    if matched and why:
        lines.append("")
    lines += [f"- not shown: {md(w)}" for w in why]
    return "\n".join(lines).rstrip() + "\n"


#: LaTeX's special characters as text (in the default OT1 encoding ``<``, ``>`` and ``|`` print other glyphs).
_TEX = {"\\": r"\textbackslash{}", "_": r"\_", "&": r"\&", "%": r"\%", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
        "`": r"\textasciigrave{}", '"': r"\textquotedbl{}", "-": "-{}", "'": "{'}"}


def _tex_escape(text: str) -> str:
    """``text`` (a store's label) as LaTeX text: its special characters escaped, the ligatures of ``--`` and of
    quotes broken, and a line break or other control character as a space (a blank line would end the paragraph
    inside ``\\multicolumn``; the others are not text to LaTeX)."""
    return "".join(_TEX.get(c, " " if unicodedata.category(c) == "Cc" else c) for c in " ".join(text.splitlines()))


def latex(table: dict[str, Any]) -> str:
    """``table.tex``: a booktabs tabular per task count, ``mean $\\pm$ std``, the best mean per column in bold."""
    matched, _ = references(table["cells"])
    stores, labels = table["features"], store_labels(table["features"])
    out = [f"% foal-pipe table: A_last and A_avg, {_orders_note(table).replace('±', '+-')}; needs \\usepackage{{booktabs}}"]
    for tasks in table["tasks"]:
        spec = "l" + " cc" * len(stores)
        out += [r"\begin{table}[t]", r"\centering", f"\\caption{{{tasks_title(table, tasks)}}}", f"\\begin{{tabular}}{{{spec}}}",
                r"\toprule",
                " & " + " & ".join(f"\\multicolumn{{2}}{{c}}{{{_tex_escape(labels[s])}}}" for s in stores) + r" \\",
                " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(stores))),
                "Head & " + " & ".join(tex for _ in stores for _, _, tex in SHOWN) + r" \\", r"\midrule"]
        for row in _ours(table, tasks, lambda t: f"$\\mathbf{{{t}}}$", r"\pm"):
            out.append(_tex_escape(row[0]) + " & " + " & ".join(v if v.startswith("$") else f"${v}$" for v in row[1:])
                       + r" \\")
        published = _published(table, tasks, matched)
        if published:
            out.append(r"\midrule")
            out += [r"\textit{" + _tex_escape(r[0]) + "} & " + " & ".join(r[1:]) + r" \\" for r in published]
        out += [r"\bottomrule", r"\end{tabular}"]
        if published:
            used = {(ref.row.source, ref.row.setting) for ref in matched if ref.tasks == tasks}
            out += [r"\par\footnotesize " + " ".join(f"[{i}] {_tex_escape(source)}: {_tex_escape(setting)}."
                                                     for i, (source, setting) in enumerate(_notes(matched), 1)
                                                     if (source, setting) in used)]
        out += [r"\end{table}", ""]
    return "\n".join(out)


#: How a cell a spreadsheet reads as a formula starts (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(name: str | None) -> str | None:
    """A name the user chose (a store's path, the dataset and encoder its metadata records) as a ``table.csv`` cell a
    spreadsheet shows as text: one that starts like a formula (``=HYPERLINK(...)``, ``-2+3``) gets a single quote in
    front, OWASP's advice against CSV injection; ``,``, ``"`` and line breaks are quoted by the writer (RFC 4180).
    ``table.json`` keeps the name as it is."""
    return f"'{name}" if name is not None and name.startswith(FORMULA_STARTS) else name


def csv_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell's metrics, one row each: mean, std and the values over the orders (fractions); the names as
    :func:`csv_text` writes them."""
    rows = []
    for c in table["cells"]:
        for metric in ("A_avg", "A_last", "F", "A_auc"):
            if metric in c:
                rows.append({"store": csv_text(c["store"]), "dataset": csv_text(c["dataset"]),
                             "encoder": csv_text(c["encoder"]), "head": c["head"],
                             "tasks": c["tasks"], "n_tasks": c["n_tasks"], "orders": len(c["order_seeds"]),
                             "metric": metric, "mean": repr(c[metric]["mean"]), "std": repr(c[metric]["std"]),
                             "values": " ".join(repr(v) for v in c[metric]["values"])})
    return rows


#: The fewest characters a long store label is cut to under its bars (:func:`tick_labels`).
TICK_CHARS = 24


def tick_labels(labels: Sequence[str], width: int = TICK_CHARS) -> list[str]:
    """Store labels as ``table.png`` draws them under their bars: on one line, a long one's middle left out
    (``vit_base_pa…far100_seed0``), at the fewest characters (``width`` at least) that keep them apart; where
    drawing alone makes two alike (a tab beside a space), each is prefixed by its column number."""
    from foal_pipe.report.plots import drawable

    names = [drawable(label) for label in labels]
    if len(set(names)) < len(names):
        names = [f"{i}: {n}" for i, n in enumerate(names, 1)]

    def cut(w: int) -> list[str]:
        return [n if len(n) <= w else f"{n[: w - 1 - w // 2]}…{n[-(w // 2):]}" for n in names]

    w = width
    while len(set(cut(w))) < len(names):  # ends: uncut, the names differ
        w += 1
    return cut(w)


def _inches(texts: Sequence[str], size: str) -> list[float]:
    """How wide each text is drawn at ``size`` (a name of matplotlib's default style, where the figure is drawn), in
    inches: the figure's size is set from them, so no label runs into the next or off the figure."""
    import matplotlib.style
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    with matplotlib.style.context("default"):
        font, path = FontProperties(size=size), TextToPath()
        return [path.get_text_width_height_descent(t, font, ismath=False)[0] / 72 for t in texts]


def _wrapped(text: str, width: float) -> str:
    """``text`` (the figure's title, at the ``small`` size) broken at spaces into lines at most ``width`` inches wide
    where its words allow."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and _inches([f"{lines[-1]} {word}"], "small")[0] <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


#: The widest row of task-count panels ``table.png`` draws, in inches: more panels go on further rows (40 task counts
#: in one row drew a figure 7,600 pixels wide). A single panel wider than this still gets its own row.
ROW_INCHES = 24.0


def plot(table: dict[str, Any], path: Path) -> Path:
    """``table.png``: per task count, A_last (mean, std as error bars) of every head on every store; each panel as
    wide as its store labels and task title need, the panels in rows at most :data:`ROW_INCHES` wide beside the
    legend, the title wrapped to the figure."""
    import math

    import numpy as np

    from foal_pipe.report.plots import draw

    stores, heads, tasks = table["features"], table["heads"], table["tasks"]
    labels = store_labels(stores)
    ticks = tick_labels([labels[s] for s in stores])
    titles = [tasks_title(table, t) for t in tasks]
    group = max([0.3 * len(heads), *_inches(ticks, "medium")]) + 0.3  # a store's bars and label
    panel = max([len(stores) * group, *_inches(titles, "large")]) + 0.8  # with the A_last ticks and label
    title = f"A_last, {_orders_note(table).replace('±', '+-')}"
    legend = max(_inches(heads, "small")) + 0.8
    columns = max(1, min(len(tasks), int((ROW_INCHES - legend) // panel)))
    rows = math.ceil(len(tasks) / columns)
    width = max(4.0, columns * panel + legend, max(_inches(title.split(" "), "small")) + 0.4)

    def paint(fig: Any) -> None:
        grid = fig.subplots(rows, columns, squeeze=False).ravel()
        for unused in grid[len(tasks):]:
            unused.remove()
        axes = grid[: len(tasks)]
        bar = 0.8 / len(heads)
        for ax, t, heading in zip(axes, tasks, titles, strict=True):
            x = np.arange(len(stores))
            for i, head in enumerate(heads):
                cells = [_cell(table, s, head, t) for s in stores]
                ax.bar(x + (i - (len(heads) - 1) / 2) * bar, [100 * c["A_last"]["mean"] for c in cells], bar,
                       yerr=[100 * c["A_last"]["std"] for c in cells], capsize=3, label=head)
            ax.set_xticks(x, ticks, parse_math=False)  # a $ in a name is no formula
            ax.set_xlim(-0.5, len(stores) - 0.5)  # a store per unit: its label has its group's width
            ax.set_title(heading)
            ax.set_ylabel("A_last %")
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize="small", loc="outside right center")  # clear of the title above
        fig.suptitle(_wrapped(title, width - 0.4), fontsize="small")

    return draw(path, (width, 3.6 + 3.0 * (rows - 1)), paint)


def write_files(tmp: Path, table: dict[str, Any]) -> None:
    """The table's files beside ``table.json`` in the directory ``tmp``."""
    (tmp / "table.md").write_text(markdown(table), encoding=ENCODING, errors=ERRORS)
    (tmp / "table.tex").write_text(latex(table), encoding=ENCODING, errors=ERRORS)
    with open(tmp / "table.csv", "w", newline="", encoding=ENCODING, errors=ERRORS) as fh:
        writer = csv_dict_writer(fh, CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(table))
    plot(table, tmp / "table.png")
