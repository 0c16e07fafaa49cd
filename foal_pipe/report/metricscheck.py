"""The keys of a ``metrics.json`` that must agree with one another, beyond each key's type.

:func:`check_metrics` refuses, in one line naming the fix, a file whose structure contradicts itself (a count
of tasks other than the accuracy matrix's rows, an order of another seed or of fewer tasks, a gamma search that
chose other gammas than the run records, an ``all_classes`` part of rows the run did not count): a hand edit,
which the tables and plots would otherwise show, or die on. A number that can be derived from others is not
refused but shown recomputed with a warning (:func:`std_warnings`, :func:`all_classes_recomputed`), as
:func:`~foal_pipe.report.readers.consistency_warnings` does the headline numbers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.metrics import summary_of
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.metricsparts import AllClasses, AnytimeCurve, OrderMetrics, StoreScore
from foal_pipe.protocol.schema import LearnMetrics, same_gamma

#: Largest disagreement tolerated between a stored metric and its recomputation from the matrix (or curve).
TOLERANCE = 1e-6
#: ``gamma_search``'s lists of one entry per task boundary (``evaluated``, ``sample_*``: where recorded).
_SEARCH_LISTS = ("values", "evaluated", "at_edge", "gammas_selected", "sample_rows", "sample_eps", "resolution_floor")


def headline_numbers(matrix: list[list[float]], stream: str | None, curve: AnytimeCurve | None) -> dict[str, Any]:
    """The headline numbers as ``learn`` and ``sweep`` compute them: from the accuracy matrix, and A_auc
    (``--eval-every``) as the mean of the anytime curve's accuracies, where it has points."""
    out: dict[str, Any] = summary_of(matrix, stream)
    if curve is not None and curve.accuracy:
        out["A_auc"] = float(np.mean(curve.accuracy))
    return out


def differs(stored: float, recomputed: float) -> bool:
    """Whether a stored number disagrees with its recomputation (NaN, which no comparison holds for, does)."""
    return not abs(stored - recomputed) <= TOLERANCE


def check_metrics(metrics: LearnMetrics, path: Path) -> None:
    """Refuse a ``metrics.json`` whose keys contradict one another (see the module's docstring)."""
    _check_counts(metrics, path)
    _check_orders(metrics, path)
    _check_search(metrics, path)
    _check_parts(metrics, path)


def _refuse(path: Path, problem: str) -> FoalPipeError:
    return FoalPipeError(f"{path}: {problem}; {LearnMetrics.FIX}")


def _check_orders(metrics: LearnMetrics, path: Path) -> None:
    """``--order-seeds``: one entry per seed of ``order_seeds``, in its order, each seed once; every order of the
    top level's number of tasks (the plots stack the orders' rows), with a gamma per boundary under ``--gamma auto``."""
    orders, seeds = metrics.orders, metrics.order_seeds
    if orders is None:
        return
    if seeds is not None and len(seeds) != len(orders):
        raise _refuse(path, f"'order_seeds' has {len(seeds)} seeds but 'orders' has {len(orders)} entries (one per seed)")
    named = [o.order_seed for o in orders] if seeds is None else seeds
    for i, order in enumerate(orders):
        if seeds is not None and order.order_seed is not None and order.order_seed != seeds[i]:
            raise _refuse(path, f"orders[{i}]: 'order_seed' is {order.order_seed} but 'order_seeds'[{i}] is {seeds[i]}")
        if (seed := named[i]) is not None and seed in named[:i]:
            raise _refuse(path, f"order seed {seed} appears twice in '{'orders' if seeds is None else 'order_seeds'}' "
                                "(each class order once)")
    rows = len(metrics.accuracy_matrix)
    for i, order in enumerate(orders):
        if len(order.accuracy_matrix) != rows:
            raise _refuse(path, f"orders[{i}]: 'accuracy_matrix' has {len(order.accuracy_matrix)} rows but the top "
                                f"level's has {rows} (every order learns the same number of tasks)")
        chosen = order.gammas_selected
        if metrics.gamma == "auto" and (chosen is None or len(chosen) != rows or not all(g > 0 for g in chosen)):
            raise _refuse(path, f"orders[{i}]: gamma is \"auto\" but its 'gammas_selected' is not a list of {rows} "
                                "positive numbers (one per task boundary)")


def _check_counts(metrics: LearnMetrics, path: Path) -> None:
    """One task per row of the accuracy matrix, where recorded: ``n_tasks``, the lists of ``tasks`` and of
    ``gammas_selected`` (a gamma per task boundary), the top level's and each order's own (files of every version
    record them so; older ones may lack ``n_tasks`` and ``tasks``), and ``gammas_at_grid_edge``."""
    records: list[tuple[str, LearnMetrics | OrderMetrics]] = [("", metrics)]
    for where, record in records + [(f"orders[{i}]: ", o) for i, o in enumerate(metrics.orders or [])]:
        rows = len(record.accuracy_matrix)
        counts = {"n_tasks": getattr(record, "n_tasks", None), "tasks": None if record.tasks is None else len(record.tasks),
                  "gammas_selected": None if record.gammas_selected is None else len(record.gammas_selected),
                  "gammas_at_grid_edge": None if (edge := getattr(record, "gammas_at_grid_edge", None)) is None
                  else len(edge)}
        for key, n in counts.items():
            if n is not None and n != rows:
                said = f"'n_tasks' is {n}" if key == "n_tasks" else f"{key!r} has {n} entries"
                raise _refuse(path, f"{where}{said} but 'accuracy_matrix' has {rows} rows (one per task)")


def _check_search(metrics: LearnMetrics, path: Path) -> None:
    """``--gamma auto``'s ``gamma_search``: a list per task boundary, choosing the run's ``gammas_selected`` by its
    ``selected_by`` (with ``--order-seeds``, the first order's, as the top level's)."""
    search = metrics.gamma_search
    if search is None:
        return
    rows = len(metrics.accuracy_matrix)
    for name in _SEARCH_LISTS:
        if (values := getattr(search, name)) is not None and len(values) != rows:
            raise _refuse(path, f"'gamma_search.{name}' has {len(values)} entries but 'accuracy_matrix' has {rows} rows "
                                "(one per task boundary)")
    chosen = metrics.gammas_selected
    if chosen is not None and not (len(chosen) == len(search.gammas_selected)
                                   and all(same_gamma(a, b) for a, b in zip(chosen, search.gammas_selected))):
        raise _refuse(path, "'gammas_selected' differs from 'gamma_search.gammas_selected' (the gammas its search chose)")
    if metrics.selected_by is not None and metrics.selected_by != search.criterion:
        raise _refuse(path, f"'selected_by' is {metrics.selected_by!r} but 'gamma_search.criterion' is "
                            f"{search.criterion!r} (the criterion that chose the gammas)")


def _check_parts(metrics: LearnMetrics, path: Path) -> None:
    """``--init-model``: each class named once in ``task_names``, no store with more unknown rows than rows, and
    ``all_classes``' parts: ``T1`` ... ``Tn``, one per task of the matrix, whose rows add up to the run's
    ``n_test``, then an ``eval`` part per ``--eval-features`` store scored, its rows those of the classes the model
    knows (the store's ``n_test`` less its ``unknown_class_rows``)."""
    cont = metrics.continuation
    if cont is None:
        return
    seen: set[str] = set()
    for names in cont.task_names or ():
        for name in names:
            if name in seen:
                raise _refuse(path, f"'task_names' names class {name!r} twice (each class is learned in one task)")
            seen.add(name)
    for i, score in enumerate(cont.eval_features or ()):
        if score.unknown_class_rows > score.n_test:
            raise _refuse(path, f"eval_features[{i}]: 'unknown_class_rows' is {score.unknown_class_rows} but the store "
                                f"has {score.n_test} test rows")
    stores = _eval_stores(metrics)
    everything, n = cont.all_classes, len(metrics.accuracy_matrix)
    if everything is None:
        return
    labels = [p.task for p in everything.tasks]
    if labels[:n] != [f"T{k + 1}" for k in range(n)] or any(label != "eval" for label in labels[n:]):
        raise _refuse(path, f"'all_classes.tasks' should be the parts T1 ... T{n} (one per task) then 'eval' parts, "
                            f"got {', '.join(labels) or 'none'}")
    own = sum(p.n_test for p in everything.tasks[:n])
    if metrics.n_test is not None and own != metrics.n_test:
        raise _refuse(path, f"the parts T1 ... T{n} of 'all_classes' count {own} test rows but 'n_test' is {metrics.n_test}")
    for i, part in enumerate(everything.tasks[n:], start=n):
        entry = stores.get(part.features)
        if entry is None:
            raise _refuse(path, f"all_classes.tasks[{i}] scores {part.features!r}, which 'eval_features' does not name")
        if part.n_test != entry.n_test - entry.unknown_class_rows:
            raise _refuse(path, f"all_classes.tasks[{i}] counts {part.n_test} test rows of {part.features!r} but its "
                                f"'eval_features' entry has {entry.n_test - entry.unknown_class_rows} of known classes")


def _eval_stores(metrics: LearnMetrics) -> dict[str, StoreScore]:
    """``--eval-features``' scores by store, the first of a store named twice."""
    stores: dict[str, StoreScore] = {}
    for score in (metrics.continuation.eval_features if metrics.continuation else None) or ():
        stores.setdefault(score.features, score)
    return stores


def all_classes_recomputed(metrics: LearnMetrics) -> tuple[AllClasses | None, list[str]]:
    """``all_classes`` as its sources give it (None: as stored), and a warning per number replaced: a part ``Tk``'s
    accuracy is the last row of the accuracy matrix at task k, an ``eval`` part's its store's correct rows (of
    ``eval_features``, where unknown classes count as wrong) over its rows of known classes, and ``A_last`` and
    ``n_test`` the parts' row-weighted mean and sum. Call on a file :func:`check_metrics` has passed."""
    cont = metrics.continuation
    everything = cont.all_classes if cont is not None else None
    if cont is None or everything is None:
        return None, []
    last, n, warnings = metrics.accuracy_matrix[-1], len(metrics.accuracy_matrix), []
    stores = _eval_stores(metrics)
    parts = []
    for k, part in enumerate(everything.tasks):
        if k < n:
            true, source = last[k], f"the accuracy matrix's last row gives for task {k + 1}"
        else:
            score = stores[part.features]
            true, source = score.accuracy * score.n_test / max(part.n_test, 1), "its 'eval_features' entry gives"
        if part.n_test and differs(part.accuracy, true):
            warnings.append(f"all_classes part {part.task} ({part.features}) in metrics.json is {part.accuracy:.6f} but "
                            f"{source} {true:.6f} (shown)")
            part = replace(part, accuracy=true)
        parts.append(part)
    rows = sum(p.n_test for p in parts)
    a_last = sum(p.accuracy * p.n_test for p in parts) / max(rows, 1)
    if everything.n_test != rows:
        warnings.append(f"all_classes n_test in metrics.json is {everything.n_test} but its parts add up to {rows} (shown)")
    if differs(everything.A_last, a_last):
        warnings.append(f"all_classes A_last in metrics.json is {everything.A_last:.6f} but its parts give {a_last:.6f} "
                        "(shown)")
    if not warnings:
        return None, []
    return replace(everything, A_last=a_last, n_test=rows, tasks=parts), warnings


def std_warnings(metrics: LearnMetrics, orders: list[OrderMetrics], keys: tuple[str, ...]) -> list[str]:
    """``--order-seeds``: each of ``keys`` whose stored ``std`` is not the population std (ddof 0) of ``orders``'
    values (the orders as their matrices give them)."""
    from foal_pipe.protocol.ordermeans import mean_std

    out = []
    for key in keys:
        values = [getattr(o, key) for o in orders]
        stored = (metrics.std or {}).get(key)
        if stored is not None and values and None not in values and differs(stored, spread := mean_std(values)[1]):
            out.append(f"std of {key} in metrics.json is {stored:.6f} but its orders give {spread:.6f} (shown)")
    return out
