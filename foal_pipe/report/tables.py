"""The numbers behind the plots, as rows: CSV plot data for ``dvc plots`` and ``scores.json`` for ``dvc metrics``.

Accuracies are percent in the rows (what the plots show) and fractions in the scores (as in metrics.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.metrics import summary_of
from foal_pipe.io.csvrows import ENCODING, ERRORS, CsvRows, csv_dict_writer
from foal_pipe.report.classes import ClassResults, stream_order, stream_positions
from foal_pipe.report.readers import HEADLINE, Run
from foal_pipe.report.selection import has_criteria, last, result_at, select


def weight_norm_rows(run: Run) -> list[dict[str, Any]]:
    """One row per class in stream order (then classes not in this run's stream by label; for a continued model
    those come first: they were learned before this stream): position, label, task, norm."""
    if run.weight_norms is None:
        return []
    labels, norms, names = run.weight_norms
    positions = stream_positions(run)
    return [
        {
            "position": pos,
            "label": int(labels[k]),
            "name": names[k] if names else "",
            "task": positions[int(labels[k])][0] + 1 if int(labels[k]) in positions else "",
            "norm": float(norms[k]),
        }
        for pos, k in enumerate(stream_order(positions, labels.tolist(), run.metrics.continuation is not None))
    ]


def step_rows(run: Run) -> list[dict[str, Any]]:
    """After each task i: A_i, the newest task's accuracy a[i][i] and the first task's a[i][0] (percent). A
    Si-Blurry stream's a[i][i] is A_i itself (every class seen) and its a[i][0] the accuracy on the classes seen in
    task 1 (docs/streams.md): A_i and ``task_1_classes``."""
    a = run.matrix
    steps = summary_of(a, run.metrics.stream)["A_steps"]
    assert isinstance(steps, list)  # A_steps is the summary's one list
    if run.metrics.stream == "si-blurry":
        return [{"step": i + 1, "A_i": 100 * steps[i], "task_1_classes": 100 * row[0]} for i, row in enumerate(a)]
    return [
        {"step": i + 1, "A_i": 100 * steps[i], "newest_task": 100 * row[i], "first_task": 100 * row[0]}
        for i, row in enumerate(a)
    ]


def anytime_rows(run: Run) -> list[dict[str, Any]]:
    """``learn --eval-every``: the accuracy (percent) on the classes seen so far after each number of training
    rows (with ``--order-seeds``, each order's, with its seed); none without a curve."""
    curve, orders = run.metrics.anytime, run.metrics.orders
    if curve is None:
        return []
    curves = [(o.order_seed, o.anytime) for o in orders or [] if o.anytime is not None]
    if orders and len(curves) == len(orders):  # --order-seeds: every order's curve, by its seed
        return [{"order_seed": seed, "samples_seen": n, "accuracy": 100 * a}
                for seed, c in curves for n, a in zip(c.samples_seen, c.accuracy)]
    return [{"samples_seen": n, "accuracy": 100 * a} for n, a in zip(curve.samples_seen, curve.accuracy)]


def matrix_rows(run: Run) -> list[dict[str, Any]]:
    return [
        {"after_task": i + 1, "task": j + 1, "accuracy": 100 * v}
        for i, row in enumerate(run.matrix)
        for j, v in enumerate(row)
    ]


def gamma_rows(run: Run) -> list[dict[str, Any]]:
    """One row per gamma of the sweep: test A_avg, A_last, F (percent) and, when the sweep has them, GCV,
    LOO accuracy (percent) and LOO MSE at the last task boundary (``None`` where a criterion was skipped)."""
    if run.sweep is None:
        return []
    criteria = has_criteria(run.sweep)
    rows = []
    for r in run.sweep.results:
        row: dict[str, Any] = {"gamma": r.gamma, "A_avg": 100 * r.A_avg, "A_last": 100 * r.A_last, "F": 100 * r.F}
        if criteria:
            loo_accuracy = last(r.loo_accuracy)
            row.update(gcv=last(r.gcv), loo_accuracy=None if loo_accuracy is None else 100 * loo_accuracy,
                       loo_mse=last(r.loo_mse))
        rows.append(row)
    return rows


def plot_data(run: Run) -> dict[str, list[dict[str, Any]]]:
    """The CSV files ``dvc plots`` reads, by file name; those without data (no model, no sweep) are empty."""
    return {
        "steps.csv": step_rows(run),
        "accuracy_matrix.csv": matrix_rows(run),
        "weight_norms.csv": weight_norm_rows(run),
        "gamma.csv": gamma_rows(run),
        "anytime.csv": anytime_rows(run),
    }


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as CSV, floats to 6 significant digits (stable text), ``None`` as an empty cell."""
    with path.open("w", newline="", encoding=ENCODING, errors=ERRORS) as fh:
        writer = csv_dict_writer(fh, list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else "" if v is None else v for k, v in row.items()})
    return path


def write_confusion(path: Path, classes: ClassResults) -> Path:
    """The confusion counts as CSV: a header of the predicted class names, then one row per true class, each filled
    from the sparse counts as it is written (the whole matrix at once: C^2 numbers, 800 MB at 10,000 classes)."""
    counts = classes.confusion
    starts = np.searchsorted(counts.true, np.arange(counts.size + 1))  # each true class's pairs, in row order
    with path.open("w", newline="", encoding=ENCODING, errors=ERRORS) as fh:
        writer = CsvRows(fh)
        writer.writerow(["true_class", *classes.names])
        for i, name in enumerate(classes.names):
            row = np.zeros(counts.size, np.int64)
            row[counts.predicted[starts[i] : starts[i + 1]]] = counts.count[starts[i] : starts[i + 1]]
            writer.writerow([name, *row.tolist()])
    return path


def scores(run: Run) -> dict[str, float]:
    """The headline numbers (fractions) for ``dvc metrics``: the run's, and the sweep's selected gamma with its
    test A_avg beside the test oracle's (the gamma with the best test A_avg)."""
    out = {key: float(getattr(run.metrics, key)) for key in HEADLINE if getattr(run.metrics, key) is not None}
    if run.sweep is not None:
        choice = select(run.sweep)
        out.update(
            sweep_selected_gamma=choice.gamma,
            sweep_selected_A_avg=float(result_at(run.sweep, choice.gamma).A_avg),
            sweep_oracle_gamma=choice.oracle_gamma,
            sweep_oracle_A_avg=float(result_at(run.sweep, choice.oracle_gamma).A_avg),
        )
    return out
