"""The plots' text stays on the canvas and names the run's data as ``info`` does."""

from __future__ import annotations

import shutil

import numpy as np
from helpers import make_image_tree
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.report import plots
from foal_pipe.report.discovery import load_run
from foal_pipe.store import write_store

runner = CliRunner()


def learn(*args):
    result = runner.invoke(app, ["learn", *map(str, args)])
    assert result.exit_code == 0, result.output




def _inside(box, canvas) -> bool:
    return box.x0 >= canvas.x0 and box.y0 >= canvas.y0 and box.x1 <= canvas.x1 and box.y1 <= canvas.y1


def test_weight_norms_text_lies_inside_the_figure_and_apart(tmp_path, figures):
    """30 classes with long names in 10 tasks: the y and x labels, the title and the legend are on the canvas,
    and the legend covers neither the x label nor a class name (it was placed over both before)."""
    names = [f"class_number_{i:03d}" for i in range(30)]
    y = np.repeat(np.arange(30), 6)
    x = np.random.default_rng(0).normal(size=(y.size, 8)) + y[:, None] * 0.3
    write_store(tmp_path / "s.zarr", (x, y), (x[::3], y[::3]), names, chunk_rows=7, dtype="float64")
    learn("--features", tmp_path / "s.zarr", "--out", tmp_path / "run", "--tasks", 10)
    plots.plot_weight_norms(load_run(tmp_path / "run"), tmp_path / "weight_norms.png")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    ax, canvas = fig.axes[0], fig.bbox
    (legend,) = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    box = legend.get_window_extent(renderer)
    for text in (ax.yaxis.label, ax.xaxis.label, ax.title):
        assert text.get_text() and _inside(text.get_window_extent(renderer), canvas)
    assert _inside(box, canvas)
    assert not box.overlaps(ax.xaxis.label.get_window_extent(renderer))
    ticks = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
    assert len(ticks) == 30 and not any(box.overlaps(t) for t in ticks)


def test_plot_titles_name_the_image_folder(tmp_path, figures):
    """A store of ``--dataset imagefolder`` records its folder (``source``, shown by ``info``): titles name the
    folder, not "imagefolder"; without the store they fall back to the dataset's name."""
    tree = make_image_tree(tmp_path / "flowers", {"rose": 4, "iris": 4})
    result = runner.invoke(app, ["extract", "--dataset", "imagefolder", "--data-dir", str(tree), "--model", "pixels",
                                 "--image-size", "8", "--out", str(tmp_path / "px.zarr"), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    learn("--features", tmp_path / "px.zarr", "--out", tmp_path / "run", "--tasks", 2, "--projection-dim", 16)
    run = load_run(tmp_path / "run")
    assert run.label == "run (imagefolder)"
    plots.plot_steps(run, tmp_path / "steps.png")
    title = figures[-1].axes[0].get_title()
    assert "run (flowers) · pixels" in title and "imagefolder" not in title
    shutil.rmtree(tmp_path / "px.zarr")
    plots.plot_steps(run, tmp_path / "steps.png")
    assert "run (imagefolder) · pixels" in figures[-1].axes[0].get_title()
