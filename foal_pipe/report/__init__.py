"""Evaluate a finished run: plots (PNG), plot data for DVC (CSV), ``scores.json`` and a ``summary.md``.

A run directory is what ``foal-pipe learn --out DIR`` writes: ``metrics.json`` (required) and
``model.safetensors`` (optional here). Its sweep (``sweep.json`` from ``foal-pipe sweep``) is found in
``RUN/`` or ``RUN-sweep/``, or given explicitly. :func:`evaluate` writes, into one output directory:

=======================  ============================================================================
``accuracy_matrix.png``  heatmap of a[i][j], accuracy on task j after training through task i
``steps.png``            A_i, the newest task's and the first task's accuracy after each step
``weight_norms.png``     L2 norm of each class's column of W, coloured by task (the recency-bias figure)
``gamma.png``            test A_avg, LOO accuracy and GCV against gamma, the selected gamma marked
``fusions.png``          with ``sweep --fusions``: test A_avg against gamma per fusion, the choices marked
``*.csv``                the same data for ``dvc plots``: ``steps``, ``accuracy_matrix``,
                         ``weight_norms``, ``gamma``
``class_accuracy.csv``   the final model's accuracy on each class's test rows of the run's store
``confusion_matrix.*``   its confusion matrix on them, class names on both axes (PNG, counts in CSV)
``summary.md``           the headline metrics (beside the paper's Table 2 when comparable), the matrix,
                         the accuracy on ``--eval-features`` stores, the per-class table, how gamma was
                         chosen, the sweep (and each fusion's choice)
``scores.json``          A_avg, A_last, F, F_published_code, the sweep's selected and oracle gammas
=======================  ============================================================================

Metrics are fractions in the JSON files and percent in plots and summaries. Every headline number is
recomputed from the accuracy matrix (paper Eq. 17-18) and a disagreement is reported, not hidden.

One module per concern: :mod:`.readers` (validated reading), :mod:`.discovery` (which files belong to a
run), :mod:`.classes` (the model's classes: their tasks, per-class results), :mod:`.selection` (the sweep's
choice of gamma), :mod:`.tables` (rows, CSV, scores), :mod:`.plots`,
:mod:`.markdown` (summary.md) and :mod:`.evaluation` (all of it into one directory).
"""

from foal_pipe.protocol.schema import check_matrix
from foal_pipe.report.discovery import RunSummary, find_runs, load_run, sweep_candidates
from foal_pipe.report.evaluation import DEFAULT_OUT, OUTPUTS, SCORES_FILE, SUMMARY_FILE, Evaluation, evaluate
from foal_pipe.report.markdown import describe, gamma_text, pct, summary_markdown
from foal_pipe.report.readers import Run, consistency_warnings, read_metrics, read_sweep, read_weight_norms
from foal_pipe.report.selection import Selection, result_at, select

__all__ = [
    "DEFAULT_OUT",
    "OUTPUTS",
    "SCORES_FILE",
    "SUMMARY_FILE",
    "Evaluation",
    "Run",
    "RunSummary",
    "Selection",
    "check_matrix",
    "consistency_warnings",
    "describe",
    "evaluate",
    "find_runs",
    "gamma_text",
    "load_run",
    "pct",
    "read_metrics",
    "read_sweep",
    "read_weight_norms",
    "result_at",
    "select",
    "summary_markdown",
    "sweep_candidates",
]
