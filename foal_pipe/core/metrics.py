"""Continual-learning metrics from an accuracy matrix (paper section 4.2, Eq. 17-18)."""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from foal_pipe.errors import FoalPipeError


def _triangle(acc: np.ndarray | list[list[float]]) -> list[list[float]]:
    """The lower triangle of ``acc``, checked, so a malformed matrix is refused rather than summarised wrongly:
    at least one row; row i holds i+1 entries (ragged) or every row T (square; entries above the diagonal are
    ignored); each a finite fraction in [0, 1]."""
    sequence = (list, tuple, np.ndarray)
    if not isinstance(acc, sequence) or len(acc) == 0 or not all(isinstance(row, sequence) for row in acc):
        raise FoalPipeError("the accuracy matrix is not a non-empty list of rows: pass a[i][j] (task j after training "
                            "task i), row i a list of i+1 fractions")
    T = len(acc)
    square = all(len(row) == T for row in acc)
    rows = []
    for i, row in enumerate(acc):
        if not square and len(row) != i + 1:
            raise FoalPipeError(f"row {i} of the accuracy matrix has {len(row)} entries, not {i + 1}: pass a lower-triangular "
                                f"matrix (row i holds a[i][j] for tasks j <= i) or a {T} x {T} one")
        items = list(row[: i + 1])
        if not all(isinstance(v, Real) and not isinstance(v, bool) for v in items):  # NumPy casts "0.5", True, 1j
            raise FoalPipeError(f"row {i} of the accuracy matrix is not all numbers: pass accuracies as fractions in [0, 1]")
        bad = [v for v in items if not 0 <= v <= 1]  # NaN too; compared as given, so an int beyond float range is named
        if bad:
            raise FoalPipeError(f"row {i} of the accuracy matrix holds {bad[0]}, not a fraction in [0, 1]: pass accuracies "
                                "as fractions (not percent), each finite")
        rows.append([float(v) for v in items])
    return rows


def summarize(acc: np.ndarray | list[list[float]]) -> dict[str, float | list[float]]:
    """A_i per step, A_avg, A_last and forgetting from ``a[i][j]`` (task j after training task i).

    ``acc`` is a T x T lower-triangular matrix of fractions (ragged lists are accepted; entries above the diagonal
    are ignored; anything else is refused with a :class:`~foal_pipe.errors.FoalPipeError`). F follows the paper:
    mean over j < T of ``max_{l<T} a[l][j] - a[T][j]``, with l ranging over the steps where task j had been seen.
    ``F_published_code`` is what the authors' code computes: the max over every row including the last, averaged over all T tasks.
    """
    rows = _triangle(acc)
    T = len(rows)
    steps = [float(np.mean(row)) for row in rows]
    last = rows[-1]
    forgetting = [max(rows[k][j] for k in range(j, T - 1)) - last[j] for j in range(T - 1)]
    published = [max(rows[k][j] for k in range(j, T)) - last[j] for j in range(T)]
    return {
        "A_steps": steps,
        "A_avg": float(np.mean(steps)),
        "A_last": float(np.mean(last)),
        "F": float(np.mean(forgetting)) if forgetting else 0.0,
        "F_published_code": float(np.mean(published)),
    }


def summarize_seen(acc: np.ndarray | list[list[float]]) -> dict[str, float | list[float]]:
    """A_t per step, A_avg and A_last of a stream whose classes recur (Si-Blurry, docs/streams.md), from its
    matrix ``a[i][j]``: accuracy after task i on the test rows of the classes seen by the end of task j. A_t is
    ``a[t][t]``, the accuracy on every class seen so far (Moon et al., ICCV 2023); F needs per-class accuracies
    and is not derived here."""
    steps = [row[i] for i, row in enumerate(_triangle(acc))]
    return {"A_steps": steps, "A_avg": float(np.mean(steps)), "A_last": steps[-1]}


#: How each stream's accuracy matrix is summarised (``metrics.json``'s ``stream``; absent: disjoint).
SUMMARIES = {"disjoint": summarize, "si-blurry": summarize_seen}


def summary_of(acc: np.ndarray | list[list[float]], stream: str | None) -> dict[str, float | list[float]]:
    """The summary of ``stream``'s accuracy matrix (None: the disjoint stream, files that do not record one)."""
    return SUMMARIES[stream or "disjoint"](acc)


#: The most entries a report writes out one by one (tasks of summary.md's matrix and the heatmap's numbered cells,
#: classes named per task, gammas of a result line): past them a line grows with every task or class (a 1,000-task
#: run's table: 1,001 columns, 5.4 MB); the CSV files hold every entry.
SHOWN = 20


def capped(texts: list[str], rest: str, shown: int = SHOWN) -> str:
    """``texts`` joined by commas; past ``shown`` of them, the first half of ``shown`` and the last five, then
    ``rest`` (where the others are) in brackets: one entry per task boundary grew a line by each task (5,600
    characters at 400 tasks)."""
    if len(texts) <= shown:
        return ", ".join(texts)
    return f"{', '.join(texts[:shown // 2])}, ..., {', '.join(texts[-5:])} ({rest})"


def pct(x: float | None, digits: int = 2) -> str:
    """A fraction as a percent string; ``-`` for missing or NaN, and no ``-0.00``: a forgetting of exactly 0 sums
    differences whose rounding leaves -2.8e-17."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    text = f"{100 * x:.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text
