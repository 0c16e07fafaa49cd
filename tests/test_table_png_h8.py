"""``table.png`` keeps its text apart and on the canvas: long store names were drawn whole (a smear running off the
figure, matplotlib's "constrained_layout not applied" warning), the title was cut at both ends and the legend lay on
it. The figure's width comes from its measured text, under matplotlib's default style as it is drawn, so a user's
matplotlibrc changes no byte."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest

from foal_pipe.heads import HEADS
from foal_pipe.report.resultstable import ROW_INCHES, _orders_note, plot, tick_labels

LONG = [f"vit_base_patch16_224_augreg2_in21k_ft_in1k_cifar100_seed{k}.zarr" for k in range(2)]
MIDDLE = [f"common_prefix_{c}_common_suffix_that_is_long_enough.zarr" for c in "AB"]


def _table(stores: list[str], heads: list[str], tasks: list[int], seeds: list[int]) -> dict[str, Any]:
    """A ``table.json`` document of ``stores`` x ``heads`` x ``tasks``, every cell at 60 +- 1 percent."""
    metric = {"mean": 0.6, "std": 0.01, "values": [0.6] * len(seeds)}
    cells = [{"A_avg": metric, "A_last": metric, "store": s, "head": h, "tasks": t, "n_tasks": t, "order_seeds": seeds}
             for s in stores for h in heads for t in tasks]
    return {"cells": cells, "features": stores, "heads": heads, "tasks": tasks, "order_seeds": seeds, "std_ddof": 1}


def test_short_store_labels_are_drawn_whole():
    assert tick_labels(["s", "a/x", "mmmmmmmmmmmmmmmmmmmmmmmm"]) == ["s", "a/x", "mmmmmmmmmmmmmmmmmmmmmmmm"]


def test_a_long_label_loses_its_middle_and_two_stay_apart():
    """24 characters: the first 11, an ellipsis, the last 12 (where seed names differ)."""
    assert tick_labels([n.removesuffix(".zarr") for n in LONG]) == ["vit_base_pa…far100_seed0", "vit_base_pa…far100_seed1"]


def test_labels_that_differ_in_the_middle_are_cut_no_shorter_than_keeps_them_apart():
    """They differ at their 15th character: a cut to w characters keeps w - 1 - w // 2 in front, 15 from w = 31."""
    short = tick_labels([n.removesuffix(".zarr") for n in MIDDLE])
    assert [len(s) for s in short] == [31, 31] and short[0] != short[1]
    assert [s[:15] for s in short] == ["common_prefix_A", "common_prefix_B"] and all("…" in s for s in short)


def test_labels_that_drawing_makes_alike_get_their_column_number():
    assert tick_labels(["a\tb", "a b", "c"]) == ["1: a b", "2: a b", "3: c"]


def _boxes(fig) -> tuple[list, list, Any, Any]:
    renderer = fig.canvas.get_renderer()
    ticks = [label.get_window_extent(renderer) for ax in fig.axes for label in ax.get_xticklabels() if label.get_text()]
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes]
    return (ticks, titles, fig._suptitle.get_window_extent(renderer), fig.legends[0].get_window_extent(renderer))


@pytest.mark.parametrize(("stores", "heads", "tasks", "seeds"), [
    (["s.zarr"], 2, [3], [0, 1]),
    (LONG, 1, [3], [0]),
    (["s.zarr", *LONG, "M" * 60], len(HEADS), [5, 10, 20], list(range(30))),
    ([*MIDDLE, "a\tb", "a b"], 3, [3], [0, 1, 2]),
    (["s.zarr", "t.zarr"], 2, list(range(2, 42)), [0, 1]),  # 40 task counts: rows of panels
])
def test_the_figures_text_lies_inside_it_and_apart(tmp_path, figures, stores, heads, tasks, seeds):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # constrained_layout's "not applied" among them
        plot(_table(stores, list(HEADS)[:heads], tasks, seeds), tmp_path / "table.png")
    (fig,) = figures
    ticks, titles, suptitle, legend = _boxes(fig)
    assert len(ticks) == len(stores) * len(tasks) and len(titles) == len(tasks)
    for box in (*ticks, *titles, suptitle, legend):
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    for a, b in itertools.chain(itertools.combinations([*ticks, legend], 2), itertools.combinations([*titles, legend], 2),
                                [(suptitle, legend)]):
        assert not a.overlaps(b), (a, b)


def test_a_matplotlibrc_changes_no_byte(tmp_path):
    """The widths are measured in the style the figure is drawn in, not the user's."""
    import matplotlib

    table = _table(LONG, ["ridge", "ncm"], [3, 6], [0, 1])
    plot(table, tmp_path / "a.png")
    with matplotlib.rc_context({"font.size": 30, "xtick.labelsize": 5, "figure.titlesize": 40}):
        plot(table, tmp_path / "b.png")
    plot(table, tmp_path / "c.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes() == (tmp_path / "c.png").read_bytes()


def test_the_title_wraps_at_spaces_to_the_figures_width(tmp_path, figures):
    table = _table(["s.zarr"], ["ridge", "ncm"], [3], list(range(12)))
    plot(table, tmp_path / "table.png")
    (fig,) = figures
    lines = fig._suptitle.get_text().splitlines()
    assert len(lines) > 1 and " ".join(lines) == "A_last, " + _orders_note(table).replace("±", "+-")


def test_many_task_counts_wrap_into_rows_no_wider_than_row_inches(tmp_path, figures):
    """40 task counts drew one row of 40 panels, 7,600 pixels wide; they now wrap into rows at most ROW_INCHES wide,
    every panel drawn once, the figure growing in height instead."""
    tasks = list(range(2, 42))
    plot(_table(["s.zarr", "t.zarr"], ["ridge", "ncm"], tasks, [0, 1]), tmp_path / "table.png")
    (fig,) = figures
    width, height = fig.get_size_inches()
    assert width <= ROW_INCHES and height > 2 * 3.6
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert len(titles) == len(tasks) and len(set(titles)) == len(tasks)
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes}
    assert 1 < len(rows) < len(tasks)
