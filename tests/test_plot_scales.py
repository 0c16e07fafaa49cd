"""The accuracy matrix plot: its colour range shows the spread of high accuracies, and its width fits its title."""

from __future__ import annotations

import numpy as np

from foal_pipe.report.plots import colour_scale, title_width


def test_colour_scale_starts_below_the_lowest_value():
    grid = np.array([[100.0, np.nan], [93.0, 97.0]])
    assert colour_scale(grid) == (90.0, 100.0)  # 93 and 100 get distinct colours (0-100 hid them)
    assert colour_scale(np.array([[45.0]])) == (40.0, 100.0)
    assert colour_scale(np.array([[100.0]])) == (90.0, 100.0)  # never an empty range
    assert colour_scale(np.array([[0.0]])) == (0.0, 100.0)


def test_figure_width_fits_the_title():
    title = "accuracy a[i][j]\nruns/digits · vit_base_patch16_224.augreg2_in21k_ft_in1k · γ=auto · D=1000"
    longest = len(title.splitlines()[1])
    assert title_width(title) == 0.6 * 9 / 72 * longest + 0.6
    assert title_width(title) > 1.6 + 0.55 * 4  # wider than the old 2-task figure, which clipped it
