"""What ``learn`` and ``sweep`` record: ``metrics.json`` and ``sweep.json`` contents, and the gamma (and
fusion) each selection criterion chooses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from foal_pipe.core.metrics import summarize
from foal_pipe.protocol.config import CRITERIA, ModelConfig, StreamConfig
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary


def ragged(acc: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in acc[i, : i + 1]] for i in range(acc.shape[0])]


def accuracy_report(acc: np.ndarray) -> dict[str, Any]:
    matrix = ragged(acc)
    return {**summarize(matrix), "accuracy_matrix": matrix}


def run_info(run: Run, stream_config: StreamConfig) -> dict[str, Any]:
    return {
        "tasks": run.stream.tasks,
        "n_tasks": run.stream.n_tasks,
        "dropped_classes": run.stream.dropped,
        "drop_remainder": stream_config.drop_remainder,
        "projection_dim": run.model.projection_dim,
        "projection_init": run.model.projection_init,
        "activation": run.model.resolved_activation,
        "batch_size": stream_config.batch_size,
        "drop_last": stream_config.drop_last,
        "mask_unseen": run.evaluation.mask_unseen,
        "seed": stream_config.seed,
        "order_seed": stream_config.resolved_order_seed,
        "backend": run.backend,
        "dtype": run.model.dtype,
        "n_train_seen": int(sum(rows.size for rows in run.stream.rows)),
        "n_test": int(run.test_totals.sum()),
        "feature_dim": int(run.store.dim),
        "dataset": run.store.meta.dataset,
        "encoder": run.store.meta.encoder,
        "features": str(run.store.path),
    }


def _finite_or_none(values: np.ndarray | None) -> list[float | None] | None:
    return None if values is None else [float(v) if np.isfinite(v) else None for v in values]


def sweep_entry(gammas: Sequence[float], boundaries: Sequence[Boundary], acc: np.ndarray, loo: bool,
                 select: str) -> dict[str, Any]:
    """One feature set's sweep: its choices and every gamma's results (the keys of a single sweep.json)."""
    results = []
    for m, g in enumerate(gammas):
        results.append({
            "gamma": g,
            **accuracy_report(acc[m]),
            "gcv": _finite_or_none(np.array([b.gcv[m] for b in boundaries])),
            "loo_accuracy": [float(b.loo_accuracy[m]) for b in boundaries] if loo else None,
            "loo_mse": _finite_or_none(np.array([b.loo_mse[m] for b in boundaries])) if loo else None,
        })
    return {"best_gamma": choose(results, select), "best_gamma_test": choose(results, "test"), "selected_by": select,
            "results": results}


def fusions_report(gammas: Sequence[float], entries: Sequence[dict[str, Any]], select: str,
                    model: ModelConfig) -> dict[str, Any]:
    """``sweep --fusions``: the single-sweep keys of the fusion chosen overall (readers of one sweep read it),
    with every fusion's entry, the choice over every fusion x gamma, and the test oracle's, labelled as such."""
    fusion, gamma = choose_fusion(entries, select)
    oracle_fusion, oracle_gamma = choose_fusion(entries, "test")
    chosen = next(e for e in entries if e["fusion"] == fusion)
    per_fusion = [{k: e[k] for k in ("fusion", "best_gamma", "best_gamma_test", "results")} for e in entries]
    return {"gammas": gammas, "best_gamma": gamma, "best_gamma_test": chosen["best_gamma_test"], "selected_by": select,
            "results": chosen["results"], "fusion": fusion, "fusion_norm": model.fusion_norm,
            "best": {"fusion": fusion, "gamma": gamma, "selected_by": select},
            "best_test": {"fusion": oracle_fusion, "gamma": oracle_gamma, "selected_by": "test"},
            "fusions": per_fusion}


def _best_index(results: Sequence[dict[str, Any]], criterion: str) -> int:
    """The result that ``criterion`` prefers at the last task boundary (first of equals, in the given order)."""
    key, larger = CRITERIA[criterion]

    def value(r: dict[str, Any]) -> float:
        v = r[key][-1] if isinstance(r[key], list) else r[key]
        if v is None:
            return -np.inf if larger else np.inf
        return v

    scores = np.array([value(r) for r in results], dtype=np.float64)
    return int(np.argmax(scores) if larger else np.argmin(scores))


def choose(results: Sequence[dict[str, Any]], criterion: str) -> float:
    """The gamma that ``criterion`` prefers at the last task boundary (first of equals, in the given order)."""
    return float(results[_best_index(results, criterion)]["gamma"])


def choose_fusion(entries: Sequence[dict[str, Any]], criterion: str) -> tuple[str, float]:
    """The ``(fusion, gamma)`` that ``criterion`` prefers over every fusion's results (``entries``: ``fusion``
    and ``results`` each; first of equals, fusions in the given order). LOO MSE and GCV compare across fusions:
    the same rows, the same one-hot targets, the same projection size."""
    flat = [(e["fusion"], r) for e in entries for r in e["results"]]
    fusion, result = flat[_best_index([r for _, r in flat], criterion)]
    return fusion, float(result["gamma"])


def learn_metrics(run: Run, stream: StreamConfig, acc: np.ndarray, boundaries: Sequence[Boundary]) -> dict[str, Any]:
    """``metrics.json`` of one learned stream: the accuracy report, the run's settings and, with ``--gamma auto``,
    the gamma chosen at each boundary."""
    model = run.model
    metrics: dict[str, Any] = {**accuracy_report(acc), "gamma": "auto" if model.gamma == "auto" else float(model.gamma),
                               "engine": model.engine, **run_info(run, stream)}
    if model.gamma == "auto":
        chosen = [float(b.gammas[0]) for b in boundaries]
        metrics.update(gammas_selected=chosen, selected_by=model.select, gamma_grid=[float(g) for g in model.gamma_grid],
                       gammas_at_grid_edge=[grid_edge(g, model.gamma_grid) is not None for g in chosen])
    return metrics


def grid_edge(gamma: float, grid: Sequence[float]) -> str | None:
    """``"smallest"`` or ``"largest"`` when ``gamma`` is that end of ``grid`` (of two values or more), else None:
    a gamma chosen there may be bettered beyond the grid."""
    lo, hi = min(grid), max(grid)
    if lo == hi:
        return None
    return "smallest" if gamma == lo else "largest" if gamma == hi else None
