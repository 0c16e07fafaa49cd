"""Continual-learning metrics from an accuracy matrix (paper section 4.2, Eq. 17-18)."""

from __future__ import annotations

import numpy as np


def summarize(acc: np.ndarray | list[list[float]]) -> dict[str, float | list[float]]:
    """A_i per step, A_avg, A_last and forgetting from ``a[i][j]`` (task j after training task i).

    ``acc`` is a T x T lower-triangular matrix (ragged lists are accepted; entries above the diagonal
    are ignored). F follows the paper: mean over j < T of ``max_{l<T} a[l][j] - a[T][j]``, with l
    ranging over the steps where task j had been seen. ``F_published_code`` is what the authors'
    code computes: the max over every row including the last, averaged over all T tasks.
    """
    rows = [list(map(float, row[: i + 1])) for i, row in enumerate(acc)]
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
