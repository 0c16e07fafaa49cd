"""Large counts, not large data: many tasks, many classes, many class orders, many fusions, through `learn`, `sweep` and
`evaluate`. Each test asserts a structural property that should hold whatever the count (memory that grows with the
data, not with its square; a report whose width does not grow with the tasks; plot colours on their scale; legends on
the canvas and clear of the axes), never a wall time. Measured on the audit machine (2 cores): a 10,000-class run of
10,000 test rows learns in 3.6 s at 357 MB peak RSS, while `evaluate` takes 57 s at 7.6 GB and writes a 200 MB
confusion_matrix.csv (--no-plots: 14 s, 1.65 GB); a 1,000-task run's summary.md is 5.4 MB (a 1,001-column table)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
from helpers import make_metrics, make_run, runner

from foal_pipe.cli import app
from foal_pipe.core.metrics import summarize
from foal_pipe.report import evaluate
from foal_pipe.store import write_store


def balanced_store(path: Path, n_classes: int, per_train: int, per_test: int, dim: int = 8, seed: int = 0) -> Path:
    """``n_classes`` Gaussian clusters, ``per_train`` / ``per_test`` rows of each, shuffled, in chunks of 64 rows (so
    scoring a chunk holds 64 x classes scores, not rows x classes)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, dim))
    y_train = rng.permutation(np.repeat(np.arange(n_classes), per_train))
    y_test = rng.permutation(np.repeat(np.arange(n_classes), per_test))
    x_train = (centres[y_train] + 0.3 * rng.normal(size=(y_train.size, dim))).astype(np.float32)
    x_test = (centres[y_test] + 0.3 * rng.normal(size=(y_test.size, dim))).astype(np.float32)
    return write_store(path, (x_train, y_train), (x_test, y_test), [f"c{k}" for k in range(n_classes)], chunk_rows=64)


def cli(*args) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def synthetic_run(path: Path, T: int) -> Path:
    """A run of ``T`` one-class tasks whose accuracy matrix alternates 0 and 1 at random (no model file)."""
    rng = np.random.default_rng(0)
    acc = [[float(v) for v in rng.choice([0.0, 1.0], size=i + 1)] for i in range(T)]
    metrics = make_metrics(accuracy_matrix=acc, tasks=[[t] for t in range(T)], n_tasks=T, **summarize(acc))
    return make_run(path, metrics, model=False)


def captured_figures(monkeypatch) -> dict[str, object]:
    """Every figure `evaluate` draws, by file name, kept after it was saved (so its layout has been computed)."""
    import foal_pipe.report.plots as plots

    figures: dict[str, object] = {}
    real = plots.draw

    def spy(path, size, paint):
        def keep(fig):
            paint(fig)
            figures[Path(path).name] = fig
        return real(path, size, keep)

    monkeypatch.setattr(plots, "draw", spy)
    return figures


def legends(fig) -> list:
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


# --- many classes: the confusion matrix ---------------------------------------------------------------------------

def evaluate_peak(tmp_path: Path, n_classes: int) -> int:
    """Peak traced bytes of `evaluate --no-plots` on a run of ``n_classes`` classes with one test row each."""
    root = tmp_path / f"c{n_classes}"
    store = balanced_store(root / "s.zarr", n_classes, 2, 1)
    cli("learn", "--features", store, "--out", root / "run", "--tasks", 5, "--projection-dim", 16, "--gamma", 1)
    tracemalloc.start()
    try:
        evaluate(root / "run", plots=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_evaluate_memory_grows_with_the_classes_not_their_square(tmp_path):
    """classes.class_results counts predictions into a dense C x C int64 matrix and tables.write_confusion turns it
    into C lists of C Python ints (`.tolist()`): with 3x the classes and test rows `evaluate --no-plots` takes ~8x
    the memory. At 10,000 classes of one test row each, `evaluate` peaks at 7.6 GB (learn: 357 MB; --no-plots:
    1.65 GB) and writes a 200 MB confusion_matrix.csv of zeros, with no memory check: beyond ~20,000 classes it
    would be killed without a word. A true class holds at most its few test rows' predictions, so the counts are
    sparse (at most one per test row): the memory should grow with rows + classes."""
    small, large = evaluate_peak(tmp_path, 500), evaluate_peak(tmp_path, 1500)
    assert large < 4.5 * small, f"3x classes took {large / small:.1f}x the memory ({small:,} -> {large:,} bytes)"


def test_confusion_plot_draws_no_more_cells_than_it_has_pixels(tmp_path, monkeypatch):
    """plots.plot_confusion hands matplotlib the whole C x C share matrix (float64) and lets it average the cells
    into the ~1,000 x 1,000 pixels of its axes: at 4,000 classes it is 8.5 s of evaluate's 15 s (learn: 1.5 s), at
    10,000 classes the plots add 43 s and ~6 GB to evaluate. Counts summed into pixel-sized blocks first (shares per
    block: the average the title promises, in data and not in colour space) cost C + pixels."""
    import matplotlib.axes

    from foal_pipe.report.classes import ClassResults, Confusion
    from foal_pipe.report.discovery import load_run
    from foal_pipe.report.plots import plot_confusion

    C = 2000
    run = load_run(synthetic_run(tmp_path / "run", 3))
    rng = np.random.default_rng(0)
    confusion = Confusion.of(C, np.arange(C), rng.integers(0, C, C))
    classes = ClassResults("s.zarr", list(range(C)), [f"c{k}" for k in range(C)], [k % 3 + 1 for k in range(C)],
                           confusion, 0)
    shapes: list[tuple[int, ...]] = []
    real = matplotlib.axes.Axes.imshow

    def spy(self, X, *args, **kwargs):
        shapes.append(np.shape(X))
        return real(self, X, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", spy)
    plot_confusion(run, classes, tmp_path / "confusion.png")
    from PIL import Image

    width, height = Image.open(tmp_path / "confusion.png").size
    assert shapes and all(s[0] * s[1] <= width * height for s in shapes), (shapes, (width, height))


# --- many tasks: summary.md and the heatmap -----------------------------------------------------------------------

def test_summary_md_does_not_hold_a_task_by_task_table_for_hundreds_of_tasks(tmp_path):
    """markdown._matrix writes the whole T x T matrix as a Markdown table (T + 2 columns), while the heatmap caps its
    cells at 20 tasks and the "Classes per task" line at 20 tasks: a 300-task run's summary.md is 460 KB with
    1,500-character table rows (1,000 tasks: 5.4 MB, 7,600-character rows): nobody reads a 302-column table;
    accuracy_matrix.csv holds every entry already."""
    run = synthetic_run(tmp_path / "run", 300)
    evaluate(run, plots=False)
    text = (run / "eval" / "summary.md").read_text(encoding="utf-8")
    widest = max(line.count("|") for line in text.splitlines())
    assert widest <= 60, f"a table row of {widest - 1} cells"
    assert len(text) < 100_000, f"summary.md of {len(text):,} characters for 300 tasks"


def test_accuracy_heatmap_of_many_tasks_keeps_to_its_colour_scale(tmp_path):
    """plots.plot_accuracy_matrix caps the figure at 20 cells a side, so past ~350 tasks each cell is under 3 pixels
    and matplotlib's default interpolation ("auto": antialiasing in RGBA space) blends neighbouring cells' colours:
    a 0% cell beside a 100% one (viridis purple and yellow) comes out brown, a colour that is nowhere on the
    colour bar (30,435 such pixels at 500 tasks; 9,451 for a real 1,000-task learn). Viridis has no colour whose red
    exceeds both green and blue by 50."""
    from PIL import Image

    run = synthetic_run(tmp_path / "run", 500)
    evaluate(run)
    rgb = np.asarray(Image.open(run / "eval" / "accuracy_matrix.png").convert("RGB")).astype(int)
    off_scale = (rgb[..., 0] > rgb[..., 1] + 50) & (rgb[..., 0] > rgb[..., 2] + 50)
    assert int(off_scale.sum()) == 0, f"{int(off_scale.sum()):,} pixels of colours not on the viridis scale"


# --- many class orders, many fusions: legends ----------------------------------------------------------------------

def test_anytime_legend_of_many_orders_stays_on_the_canvas(tmp_path, monkeypatch):
    """plots.plot_anytime gives every order's curve a legend entry inside a 6.4 x 4 inch axes: with 30 orders
    (`--order-seeds 0..29 --eval-every`) the legend is taller than the figure, its first entries and the title are
    cut off or covered, and the curves hidden (50 orders: a 960-pixel legend on a 440-pixel figure)."""
    store = balanced_store(tmp_path / "s.zarr", 20, 10, 4)
    seeds = ",".join(map(str, range(30)))
    cli("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 5, "--projection-dim", 16, "--gamma", 1,
        "--order-seeds", seeds, "--eval-every", 50)
    figures = captured_figures(monkeypatch)
    evaluate(tmp_path / "run")
    fig = figures["anytime.png"]
    renderer = fig.canvas.get_renderer()
    for legend in legends(fig):
        box = legend.get_window_extent(renderer)
        assert box.y0 >= -1 and box.y1 <= fig.bbox.y1 + 1, f"legend spans y {box.y0:.0f}..{box.y1:.0f} of 0..{fig.bbox.y1:.0f}"


def blocks_store(path: Path, blocks: int = 12) -> Path:
    """A blocks store of ``blocks`` blocks of 6 dims, 4 classes (240 train and 80 test rows)."""
    from foal_pipe.store.blockfusion import FinalNorm, fuse

    rng = np.random.default_rng(4)
    y = np.tile(np.arange(4), 80)
    x = (rng.normal(size=(y.size, blocks, 6))
         + np.linspace(0.3, 1, blocks)[None, :, None] * rng.normal(size=(4, 1, 6))[y] * 0.9).astype(np.float16)
    norm = FinalNorm("layernorm", 1e-6, np.linspace(0.5, 2, 6, dtype=np.float32), np.zeros(6, np.float32))
    splits = [(fuse(b, "mean-cls", norm), t) for b, t in ((x[:240], y[:240]), (x[240:], y[240:]))]
    return write_store(path, *splits, [f"c{i}" for i in range(4)],
                       encoder={"name": "synthetic-vit-s", "fusion": "mean-cls", "image_size": 0, "normalize": False},
                       chunk_rows=64, blocks=(x[:240], x[240:]), norm=norm)


def test_fusions_legend_of_many_fusions_stays_clear_of_the_axes(tmp_path, monkeypatch):
    """plots.plot_fusions puts one legend entry per fusion "outside lower center" in a fixed 7.2 x 5 inch figure: an
    ablation over block ranges (`--fusions mean:a-b,...`, 60 of a 12-block ViT's 66 ranges) makes the legend taller
    than the room below the axes, and the constrained layout gives up: the legend covers the curves, the title and
    the x label (22 fusions already squeeze the axes to a third of the figure, colours repeating every 10 lines)."""
    store = blocks_store(tmp_path / "b.zarr")
    ranges = [f"mean:{a}-{b}" for a in range(1, 12) for b in range(a + 1, 13) if (a, b) != (1, 12)]
    common = ("--tasks", 2, "--projection-dim", 16)
    cli("sweep", "--features", store, "--out", tmp_path / "sweep", "--fusions", ",".join(["mean-cls", *ranges[:59]]),
        *common)
    cli("learn", "--features", store, "--out", tmp_path / "run", "--fusion", "mean-cls", "--gamma", 1, *common)
    figures = captured_figures(monkeypatch)
    evaluate(tmp_path / "run", sweep=tmp_path / "sweep")
    fig = figures["fusions.png"]
    renderer = fig.canvas.get_renderer()
    axes = fig.axes[0].get_window_extent(renderer)
    for legend in legends(fig):
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(axes), (f"the legend (y {box.y0:.0f}..{box.y1:.0f} px) covers the axes "
                                        f"(y {axes.y0:.0f}..{axes.y1:.0f} px)")


# --- the sparse counts give what the dense matrix gave --------------------------------------------------------------

def test_sparse_confusion_writes_the_dense_matrix_and_its_block_means(tmp_path):
    """confusion_matrix.csv from the sparse counts is the dense matrix's CSV, byte for byte (csv module on the full
    matrix), and each block of the plot is the plain mean of its cells' shares, NaN cells (classes without test rows)
    left out; blocks of one class are the cells' shares exactly."""
    import csv

    from foal_pipe.report.classes import ClassResults, Confusion
    from foal_pipe.report.plots import block_shares
    from foal_pipe.report.tables import write_confusion

    rng = np.random.default_rng(3)
    C, rows = 7, 40
    true, predicted = rng.integers(0, C, rows), rng.integers(0, C, rows)
    true[true == 4] = 5  # class 4 has no test rows
    dense = np.zeros((C, C), dtype=np.int64)
    np.add.at(dense, (true, predicted), 1)
    names = [f"c,{k}" for k in range(C)]
    counts = Confusion.of(C, true, predicted)
    write_confusion(tmp_path / "sparse.csv", ClassResults("s", list(range(C)), names, [1] * C, counts, 0))
    with (tmp_path / "dense.csv").open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["true_class", *names])
        writer.writerows([name, *row] for name, row in zip(names, dense.tolist()))
    assert (tmp_path / "sparse.csv").read_bytes() == (tmp_path / "dense.csv").read_bytes()

    totals = dense.sum(axis=1, keepdims=True)
    share = np.divide(100.0 * dense, totals, out=np.full(dense.shape, np.nan), where=totals > 0)
    np.testing.assert_array_equal(block_shares(counts, 1), share)
    means = block_shares(counts, 3)
    assert means.shape == (3, 3)
    for bi in range(3):
        for bj in range(3):
            cells = share[3 * bi : 3 * bi + 3, 3 * bj : 3 * bj + 3]
            expected = np.nan if np.isnan(cells).all() else np.nanmean(cells)
            np.testing.assert_allclose(means[bi, bj], expected, rtol=1e-12)


def test_summary_names_twenty_classes_a_task_and_keeps_small_matrices_whole(tmp_path):
    """A task of 30 classes is named by its first 20 and its count (10 tasks of 1,000 classes wrote 10,000 names on
    one line); a run of 20 tasks keeps its full table, the 21st task gives A_i and the last row."""
    store = balanced_store(tmp_path / "s.zarr", 60, 2, 1)
    cli("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 2, "--projection-dim", 16, "--gamma", 1)
    evaluate(tmp_path / "run", plots=False)
    text = (tmp_path / "run" / "eval" / "summary.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith("Classes per task")]
    assert line.count(", ... (30 classes)") == 2 and line.count(", ") == 2 * (19 + 1)  # 20 names a task, then "..."

    for T, columns in ((20, 20 + 2), (21, 2)):
        run = synthetic_run(tmp_path / f"t{T}", T)
        evaluate(run, plots=False)
        text = (run / "eval" / "summary.md").read_text(encoding="utf-8")
        table = [line for line in text.split("## Accuracy matrix")[1].splitlines() if line.startswith("| after task")]
        assert table == [table[0]] and table[0].count("|") == columns + 1
        last = [line for line in text.splitlines() if line.startswith(f"Last row, after task {T}:")]
        assert len(last) == (T > 20)
        if last:
            final = json.loads((run / "metrics.json").read_text())["accuracy_matrix"][-1]
            assert last[0].split(": ", 1)[1] == ", ".join(f"T{j + 1} {100 * v:.1f}" for j, v in enumerate(final)) + "."
