"""The PNG plots of a run, drawn with matplotlib's Agg canvas (no pyplot, no global backend change).

Byte-stable: the same run gives the same PNG bytes, so DVC sees an unchanged output. Every figure is drawn
under matplotlib's default style (a user's matplotlibrc does not leak in), at a fixed size and dpi, and saved
without the ``Software`` text chunk (which names the matplotlib version).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.metrics import SHOWN, summary_of
from foal_pipe.errors import FoalPipeError
from foal_pipe.io.pathtext import os_path, path_text
from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.schema import RunSettings
from foal_pipe.report.classes import ClassResults, Confusion
from foal_pipe.report.paper import GAMMAS, PaperMatch
from foal_pipe.report.readers import Run
from foal_pipe.report.selection import result_at, select
from foal_pipe.report.tables import anytime_rows, gamma_rows, step_rows, weight_norm_rows

DPI = 110


def _title(run: Run) -> str:
    """The run, its encoder, its head other than ridge with the head's own gamma (none for a head without one), and D."""
    from foal_pipe.report.markdown import gamma_text

    m = run.metrics
    if m.head in (None, "ridge"):
        return f"{_label(run)} · {_encoder(m)} · γ={_or(m.gamma)} · D={_or(m.projection_dim)}"
    gamma = gamma_text(m)
    return " · ".join([_label(run), _encoder(m), str(m.head), *([f"γ={gamma}"] if gamma != "-" else []),
                       f"D={_or(m.projection_dim)}"])


#: Surrogates that stand for no byte (``surrogateescape`` reads byte b as U+DC00 + b, b >= 128): JSON's ``"\ud800"``.
_NO_BYTE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def drawable(text: Any) -> str:
    """``text`` (a class, folder or encoder name) as the plots' font draws it, on one line: a line break or tab as a space;
    bytes that are not UTF-8 (read as surrogates, which the font refuses: a traceback) as UTF-8 where they are; a
    character that matplotlib's own DejaVu Sans lacks as U+FFFD (drawn as a box with a warning, or from another font
    where one is installed, which would make the PNG's bytes depend on the machine)."""
    text = _NO_BYTE.sub("\ufffd", " ".join(str(text).split()))
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    glyphs = _glyphs()
    return "".join(c if ord(c) in glyphs else "\ufffd" for c in text)


@functools.cache
def _glyphs() -> frozenset[int]:
    """The characters of the font the default style draws text in, DejaVu Sans (matplotlib ships it)."""
    from matplotlib import font_manager

    return frozenset(font_manager.get_font(font_manager.findfont("DejaVu Sans", fallback_to_default=False)).get_charmap())


def class_ticks(names: list[str], labels: list[int], width: int = 12) -> list[str]:
    """Class names as tick labels of at most ``width`` characters, a long one's middle left out (``class_n…_001``);
    where two still read alike, each is prefixed by its label id (class_accuracy.csv's ``class``)."""
    short = [n if len(n) <= width else f"{n[: width - 5]}…{n[-4:]}" for n in map(drawable, names)]
    return short if len(set(short)) == len(short) else [f"{label}: {s}" for label, s in zip(labels, short, strict=True)]


def _label(run: Run) -> str:
    """The run's label; an image folder (``--dataset imagefolder``) named by its folder, which the store records
    as its ``source`` (what ``info`` shows), while the store can be read."""
    from foal_pipe.store import read_meta

    if run.dataset != "imagefolder" or run.metrics.features is None:
        return drawable(run.label)
    try:
        source = read_meta(os_path(run.metrics.features))[1].extra.get("source")
    except FoalPipeError:
        return drawable(run.label)
    if not isinstance(source, str) or not Path(source).name:
        return drawable(run.label)
    name, folder = path_text(run.path.resolve().name), Path(source).name
    return drawable(name if name == folder else f"{name} ({folder})")


def _or(value: Any) -> Any:
    return "?" if value is None else value


def _encoder(settings: RunSettings) -> str:
    return drawable((settings.encoder or {}).get("name", "?"))


def draw(path: Path, size: tuple[float, float], paint: Callable[[Any], None]) -> Path:
    """Create a figure of ``size`` inches, let ``paint(fig)`` draw on it, save it as PNG at ``path``."""
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.style.context("default"):
        fig = Figure(figsize=size, dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        paint(fig)
        fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


def plot_accuracy_matrix(run: Run, path: Path) -> Path:
    a = run.matrix
    T = len(a)
    grid = np.full((T, T), np.nan)
    for i, row in enumerate(a):
        grid[i, : i + 1] = 100 * np.asarray(row)

    low, high = colour_scale(grid)
    orders = len(run.metrics.orders or ())
    over = f", position-wise mean over {orders} class orders" if orders > 1 else ""
    title = f"accuracy a[i][j]{over}\n{_title(run)}"

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        # resampled as values, then coloured: cells of a few pixels blended as colours (the RGBA stage, matplotlib's
        # choice there) come out in colours that are not on the colour bar (0% beside 100%: brown)
        image = ax.imshow(grid, vmin=low, vmax=high, cmap="viridis", origin="upper", interpolation_stage="data")
        fig.colorbar(image, ax=ax, label="accuracy (%)", shrink=0.85)
        if T <= SHOWN:
            for i in range(T):
                for j in range(i + 1):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=8,
                            color="white" if grid[i, j] < low + 0.6 * (high - low) else "black")
        ticks = range(T) if T <= SHOWN else range(0, T, max(1, T // 10))
        ax.set_xticks(list(ticks), [str(t + 1) for t in ticks])
        ax.set_yticks(list(ticks), [str(t + 1) for t in ticks])
        ax.set_xlabel("evaluated on task j")
        ax.set_ylabel("after training through task i")
        ax.set_title(title, fontsize=9, parse_math=False)

    # cells wide enough for their numbers up to SHOWN tasks; past them the cells shrink (a figure grown with every task
    # took 2 GB to draw 120 tasks, and could not draw 1,000)
    n = min(max(T, 4), SHOWN)
    return draw(path, (max(1.6 + 0.55 * n, title_width(title)), 1.2 + 0.5 * n), paint)


def colour_scale(grid: np.ndarray) -> tuple[float, float]:
    """The colour range of an accuracy grid (percent): from the lowest value's ten below (0 at least) to 100, so
    that 93 and 100 do not share one colour on a 0-100 scale."""
    values = grid[np.isfinite(grid)]
    low = float(np.floor(values.min() / 10) * 10) if values.size else 0.0
    return (min(low, 90.0), 100.0)


def title_width(title: str, fontsize: float = 9) -> float:
    """Inches a figure needs for ``title`` (its longest line) at ``fontsize`` points, with a margin: about 0.6 em
    per character."""
    longest = max((len(line) for line in title.splitlines()), default=0)
    return 0.6 * fontsize / 72 * longest + 0.6


def plot_steps(run: Run, path: Path) -> Path:
    rows = step_rows(run)
    x = [r["step"] for r in rows]

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        band = order_band(run)
        blurry = run.metrics.stream == "si-blurry"  # A_i is a[i][i], every class seen (docs/streams.md)
        if band is None:
            ax.plot(x, [r["A_i"] for r in rows], "o-", lw=2,
                    label="A_i = a[i][i] (every class seen so far)" if blurry else "A_i (mean over tasks seen)")
        else:
            mean, std = band
            assert run.metrics.orders is not None  # order_band drew the band from them
            ax.plot(x, mean, "o-", label=f"A_i, mean over {len(run.metrics.orders)} class orders", lw=2)
            ax.fill_between(x, mean - std, mean + std, alpha=0.25, label="+- std over orders")
        if not blurry:
            ax.plot(x, [r["newest_task"] for r in rows], "s--", label="newest task a[i][i]")
        ax.plot(x, [r["task_1_classes" if blurry else "first_task"] for r in rows], "^:",
                label="classes seen in task 1, a[i][1]" if blurry else "first task a[i][1]")
        ax.set_xlabel("task (step i)")
        ax.set_ylabel("accuracy (%)")
        ax.set_xticks(x if len(x) <= SHOWN else x[:: max(1, len(x) // 10)])
        low = min(min(v for k, v in r.items() if k != "step") for r in rows)
        if band is not None:
            low = min(low, float(np.min(band[0] - band[1])))
        ax.set_ylim(max(0.0, low - 5), 100.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
        m = run.metrics
        ax.set_title(f"A_avg {100 * m.A_avg:.1f}%, A_last {100 * m.A_last:.1f}%, F {100 * m.F:.1f}%\n"
                     f"{_title(run)}", fontsize=9, parse_math=False)

    return draw(path, (6.4, 4.0), paint)


def plot_anytime(run: Run, path: Path) -> Path:
    """``learn --eval-every``: accuracy on the classes seen so far against the training rows seen."""
    rows = anytime_rows(run)
    m = run.metrics
    curve = m.anytime
    assert curve is not None  # evaluate plots it only for a run with a curve

    seeds = list(dict.fromkeys(r["order_seed"] for r in rows)) if rows and "order_seed" in rows[0] else [None]
    many = len(seeds) > LABELLED_ORDERS

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        for k, seed in enumerate(seeds):
            mine = [r for r in rows if r.get("order_seed") == seed]
            label = f"every {curve.eval_every} rows" + ("" if seed is None else f", order seed {seed}")
            if many:
                label = f"each of the {len(seeds)} class orders, every {curve.eval_every} rows" if k == 0 else "_"
            ax.plot([r["samples_seen"] for r in mine], [r["accuracy"] for r in mine], "-", label=label,
                    **({"lw": 0.6, "color": "tab:gray", "alpha": 0.5} if many else {"lw": 1.5 if seed is None else 1}))
        if many:
            x, mean = order_mean(rows)
            ax.plot(x, mean, "-", lw=2, color="tab:blue", label="their mean")
        ax.set_xlabel("training rows seen")
        ax.set_ylabel("accuracy on the classes seen so far (%)")
        ax.set_ylim(max(0.0, min(r["accuracy"] for r in rows) - 5), 100.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        stream = m.stream or "disjoint"
        over = "" if seeds == [None] else f", means over {len(seeds)} class orders"
        auc = "" if m.A_auc is None else f"A_auc {100 * m.A_auc:.1f}%, "  # None: an order's curve without points
        ax.set_title(f"{auc}A_last {100 * m.A_last:.1f}% ({stream} stream{over})\n{_title(run)}",
                     fontsize=9, parse_math=False)

    return draw(path, (6.4, 4.0), paint)


#: The most class orders whose anytime curves each get a colour and a legend entry; past them that legend ran off the
#: figure (30 orders), so each order is a thin grey curve under their mean, two legend entries in all.
LABELLED_ORDERS = 5


def order_mean(rows: list[dict[str, Any]]) -> tuple[list[int], np.ndarray]:
    """The orders' mean anytime accuracy (%) at each point every order reached (orders of fewer rows stop earlier)."""
    curves: dict[int, dict[int, float]] = {}
    for r in rows:
        curves.setdefault(r["order_seed"], {})[r["samples_seen"]] = r["accuracy"]
    x = sorted(set.intersection(*(set(c) for c in curves.values())))
    return x, np.array([[c[n] for n in x] for c in curves.values()]).mean(axis=0)


def order_band(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """With ``orders`` (``learn --order-seeds``): the mean and std (percent) of A_i over the orders at each step."""
    orders = run.metrics.orders
    if not orders:
        return None
    steps = np.array([summary_of(o.accuracy_matrix, run.metrics.stream)["A_steps"] for o in orders]) * 100
    return steps.mean(axis=0), steps.std(axis=0)


def plot_weight_norms(run: Run, path: Path) -> Path:
    rows = weight_norm_rows(run)
    tasks = sorted({r["task"] for r in rows if r["task"] != ""})
    outside = "learned before this run" if run.metrics.continuation is not None else "not in stream"

    def paint(fig: Any) -> None:
        import matplotlib

        ax = fig.add_subplot()
        cmap = matplotlib.colormaps["tab10" if len(tasks) <= 10 else "viridis"]
        color = {t: cmap(k % 10 if len(tasks) <= 10 else k / max(1, len(tasks) - 1)) for k, t in enumerate(tasks)}
        for t in tasks + [""]:
            sel = [r for r in rows if r["task"] == t]
            if sel:
                ax.bar([r["position"] for r in sel], [r["norm"] for r in sel], width=0.85,
                       color=color.get(t, "lightgray"), label=f"task {t}" if t != "" else outside)
        ax.axhline(float(np.mean([r["norm"] for r in rows])), color="black", lw=0.8, ls="--", label="mean")
        if len(rows) <= 40:
            ticks = class_ticks([r["name"] or str(r["label"]) for r in rows], [r["label"] for r in rows])
            upright = len(rows) <= 12 and max(map(len, ticks)) <= 8  # wider names overlap their neighbours
            ax.set_xticks([r["position"] for r in rows], ticks, fontsize=7, rotation=0 if upright else 90,
                          parse_math=False)
        ax.set_xlabel("class, in stream order")
        ax.set_ylabel("‖W[:, c]‖₂")
        ax.set_title(f"per-class weight norms (recency bias shows as taller late tasks)\n{_title(run)}", fontsize=9,
                     parse_math=False)
        if len(tasks) <= 12:
            # a figure legend "outside": the constrained layout makes room for it below the x label and tick
            # labels (an axes legend placed below the axes overlapped them and pushed text off the canvas)
            fig.legend(fontsize=7, ncol=min(6, len(tasks) + 1), loc="outside lower center")

    return draw(path, (7.2, 3.8), paint)


def _values(rows: list[dict[str, Any]], key: str) -> np.ndarray | None:
    """A column as floats (NaN where missing), or ``None`` when it has no value at all."""
    values = np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=float)
    return values if np.isfinite(values).any() else None


def plot_gamma(run: Run, path: Path, paper: PaperMatch | None) -> Path:
    """Test A_avg and A_last, LOO accuracy (same axis, %) and GCV (own axis) against gamma; the selected gamma
    and the test oracle's are marked; the paper's gamma table is overlaid when the sweep is comparable."""
    s = run.sweep
    assert s is not None  # evaluate plots it only for a run with a sweep
    rows = gamma_rows(run)
    choice = select(s)
    g = np.array([r["gamma"] for r in rows], dtype=float)
    loo, gcv = _values(rows, "loo_accuracy"), _values(rows, "gcv")

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.plot(g, [r["A_avg"] for r in rows], "o-", lw=2, label="test A_avg")
        ax.plot(g, [r["A_last"] for r in rows], "s--", lw=1, alpha=0.7, label="test A_last")
        if loo is not None:
            ax.plot(g, loo, "D-.", color="tab:green", label="LOO accuracy (train rows seen)")
        if paper is not None and paper.comparable and paper.row.gamma_A_avg:
            ax.plot(GAMMAS, paper.row.gamma_A_avg, "x-.", color="black", label="A_avg (paper, appendix gamma table)")
        ax.axvline(choice.gamma, color="tab:red", lw=1.2, ls="--",
                   label=f"selected γ = {choice.gamma:g} ({choice.short})")
        if choice.oracle_gamma != choice.gamma:
            ax.axvline(choice.oracle_gamma, color="gray", lw=0.8, ls=":",
                       label=f"test oracle γ = {choice.oracle_gamma:g}")
        ax.set_xscale("log")
        ax.set_xlabel("γ (ridge regularisation, R0 = I/γ)")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3, which="both")
        handles, labels = ax.get_legend_handles_labels()
        if gcv is not None:
            right = ax.twinx()
            right.plot(g, gcv, "^:", color="tab:purple", label="GCV, last task (right axis)")
            finite = gcv[np.isfinite(gcv)]
            if finite.min() > 0 and finite.max() / finite.min() > 100:
                right.set_yscale("log")
            right.set_ylabel("GCV (lower is better)")
            more_handles, more_labels = right.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=3)
        title = f"gamma sweep · {_label(run)} · {_encoder(s)} · D={_or(s.projection_dim)}"
        if choice.at_edge:
            title += f"\nselected γ is the {choice.at_edge} tried: the best may lie beyond the grid"
        ax.set_title(title, fontsize=9, parse_math=False)

    return draw(path, (7.2, 5.0), paint)


def plot_fusions(run: Run, path: Path) -> Path:
    """``sweep --fusions``: test A_avg against gamma, one line per fusion, each fusion's selected gamma marked
    (filled) and the (fusion, gamma) chosen over all of them starred."""
    s = run.sweep
    assert s is not None and s.fusions is not None  # evaluate plots it only for a sweep --fusions
    fusions, best = s.fusions, s.best
    assert best is not None  # read_sweep refuses fusions without the choice over them
    short = CRITERIA[s.selected_by].short if s.selected_by in CRITERIA else "?"
    shown = labelled_fusions(s)
    others = len(fusions) - len(shown)

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        for entry in fusions:
            assert entry.best_gamma is not None  # sweep --fusions writes each fusion's choice
            g = np.array([r.gamma for r in entry.results], dtype=float)
            a = np.array([100 * r.A_avg for r in entry.results])
            at = int(np.argmin(np.abs(np.log(g) - np.log(entry.best_gamma))))
            if entry.fusion not in shown:  # behind the labelled ones
                ax.plot(g, a, "-", lw=0.8, color="lightgray", zorder=1)
                ax.plot(g[at], a[at], "o", color="darkgray", ms=4, zorder=1)
                continue
            (line,) = ax.plot(g, a, "o-", lw=1.5, mfc="none", label=f"{entry.fusion} (selected γ {entry.best_gamma:g})")
            ax.plot(g[at], a[at], "o", color=line.get_color(), ms=8)
            if entry.fusion == best.fusion:
                ax.plot(g[at], a[at], "*", color="tab:red", ms=16, zorder=5,
                        label=f"chosen: {best.fusion}, γ = {best.gamma:g} ({short})")
        if others:
            ax.plot([], [], "-", lw=0.8, color="lightgray", label=f"{others} other fusions (summary.md lists each)")
        ax.set_xscale("log")
        ax.set_xlabel("γ (ridge regularisation, R0 = I/γ)")
        ax.set_ylabel("test A_avg (%)")
        ax.grid(alpha=0.3, which="both")
        fig.legend(fontsize=7, loc="outside lower center", ncol=2)
        ax.set_title(f"fusion ablation · {_label(run)} · {_encoder(s)} · D={_or(s.projection_dim)}\n"
                     "filled: each fusion's selected γ (training rows only)", fontsize=9, parse_math=False)

    return draw(path, (7.2, 5.0), paint)


#: The most fusions each drawn in a colour of its own with a legend entry (matplotlib's cycle has 10 colours); past
#: them the legend outgrew the figure and covered the axes (60 fusions), so only :func:`labelled_fusions` are.
LABELLED_FUSIONS = 10


def labelled_fusions(sweep: Any) -> list[str]:
    """The fusions the plot labels: every one up to :data:`LABELLED_FUSIONS`; past them the chosen one, the test
    oracle's and the best by test A_avg at their selected gamma, five in all."""
    fusions = sweep.fusions
    if len(fusions) <= LABELLED_FUSIONS:
        return [e.fusion for e in fusions]
    at = {e.fusion: result_at(e, e.best_gamma).A_avg for e in fusions}
    first = [sweep.best.fusion, *([sweep.best_test.fusion] if sweep.best_test is not None else [])]
    return list(dict.fromkeys([*first, *sorted(at, key=lambda f: -at[f])]))[:5]


def plot_heads(run: Run, path: Path) -> Path:
    """``sweep --heads``: A_i (the mean accuracy over the tasks seen after task i) against the task, one line per
    head; the head chosen on the training rows (leave-one-out) drawn bold, the test oracle's dashed."""
    s = run.sweep
    assert s is not None and s.heads is not None  # evaluate plots it only for a sweep --heads
    heads = s.heads

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        for name, entry in sorted(heads.items()):
            steps = 100 * np.array(entry.A_steps or [float(np.mean(row)) for row in entry.accuracy_matrix])
            marks = [m for m, chosen in (("chosen by " + str(s.best_head_selected_by), s.best_head),
                                         ("test oracle", s.best_head_test)) if chosen == name]
            label = f"{name}: A_avg {100 * entry.A_avg:.2f}" + (f" ({', '.join(marks)})" if marks else "")
            ax.plot(np.arange(1, steps.size + 1), steps, marker="o", lw=2.5 if name == s.best_head else 1.2,
                    ls="--" if name == s.best_head_test and name != s.best_head else "-", label=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("task")
        ax.set_ylabel("A_i: mean test accuracy over the tasks seen (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"heads · {_label(run)} · {_encoder(s)}", fontsize=9, parse_math=False)

    return draw(path, (7.2, 5.0), paint)


#: The most cells a side the confusion plot hands matplotlib: fewer than its axes' pixels (about 1,150 a side), so
#: more classes are averaged in blocks first, each block a pixel or more (all C x C shares: 8.5 s at 4,000 classes).
CONFUSION_CELLS = 1000


def block_shares(counts: Confusion, block: int) -> np.ndarray:
    """The mean, over the cells of each ``block`` x ``block`` classes (the last ones narrower), of the share (%) of
    the true class's test rows; NaN where those true classes have no test rows. ``block`` 1: each cell's share."""
    totals = counts.totals()
    n = -(-counts.size // block)
    sums = np.zeros((n, n))
    np.add.at(sums, (counts.true // block, counts.predicted // block), 100.0 * counts.count / totals[counts.true])
    rows = np.bincount(np.flatnonzero(totals) // block, minlength=n)  # true classes with test rows, block by block
    widths = np.minimum(block, counts.size - block * np.arange(n))
    return np.divide(sums, rows[:, None] * widths[None, :], out=np.full((n, n), np.nan), where=rows[:, None] > 0)


def plot_confusion(run: Run, classes: ClassResults, path: Path) -> Path:
    """The final model's confusion matrix on the store's test split: each true class's row as percent of its test
    rows (counts written in when there are few classes), classes in stream order; over :data:`CONFUSION_CELLS`
    classes, blocks of classes, each the mean of its cells."""
    counts = classes.confusion
    C = counts.size
    block = -(-C // CONFUSION_CELLS)
    share = block_shares(counts, block)
    edge = len(share) * block - 0.5  # the last block may reach past the last class: the axes end at it

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        if block == 1:
            # each cell its own pixels while there are at least two per cell; more classes are averaged into pixels
            # (matplotlib's anti-aliasing), where "nearest" would show some rows and columns and drop the rest unsaid
            image = ax.imshow(share, vmin=0, vmax=100, cmap="Blues", interpolation="nearest" if C <= 500 else "auto")
        else:  # a pixel or more a block: "nearest" shows each block's mean as it is
            image = ax.imshow(share, vmin=0, vmax=100, cmap="Blues", interpolation="nearest",
                              extent=(-0.5, edge, edge, -0.5))
            ax.set_xlim(-0.5, C - 0.5)
            ax.set_ylim(C - 0.5, -0.5)
        fig.colorbar(image, ax=ax, label="share of the true class's test rows (%)", shrink=0.85)
        if C <= 15:
            for i, j, n in zip(counts.true, counts.predicted, counts.count):
                ax.text(j, i, str(n), ha="center", va="center", fontsize=7, color="white" if share[i, j] > 60 else "black")
        if C <= 40:
            names = class_ticks(classes.names, classes.labels)
            ax.set_xticks(range(C), names, fontsize=7, rotation=90, parse_math=False)
            ax.set_yticks(range(C), names, fontsize=7, parse_math=False)
            where = ""
        else:  # too many to name: positions in stream order, as class_accuracy.csv's rows
            ticks = range(0, C, max(1, C // 10))
            ax.set_xticks(list(ticks), [str(k + 1) for k in ticks])
            ax.set_yticks(list(ticks), [str(k + 1) for k in ticks])
            where = " (row of class_accuracy.csv)"
        ax.set_xlabel(f"predicted class{where}")
        ax.set_ylabel(f"true class{where}")
        left = f"\n{C} classes: names left out, each is its row in class_accuracy.csv" if C > 40 else ""
        left += ", cells averaged into pixels" if 500 < C <= CONFUSION_CELLS else ""
        left += f", cells averaged in blocks of {block} x {block}" if block > 1 else ""
        ax.set_title(f"confusion on the test split, final model\n{_title(run)}{left}", fontsize=9, parse_math=False)

    side = 3.0 + 0.22 * min(max(C, 8), 40)
    return draw(path, (side + 1.2, side), paint)
