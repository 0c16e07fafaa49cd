"""The record of many class orders: each order's accuracy, and its mean and std over the orders.

``learn --order-seeds`` and ``sweep --order-seeds`` record the first order's settings with every accuracy the mean over
the orders, position by position for the matrices, and each order's own entry beside them; ``table`` and the reports
average with :func:`mean_std` so that their digits are the same. Kept apart from the commands that walk the orders
(:mod:`foal_pipe.protocol.orders`): how orders are averaged is one concern, read by the records' checks too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from foal_pipe.protocol.internal import known
from foal_pipe.protocol.metricsparts import Accuracy, OrderMetrics
from foal_pipe.protocol.records import best_heads, choose
from foal_pipe.protocol.schema import LearnMetrics, SweepReport
from foal_pipe.protocol.sweepparts import OrderSweep

#: The metrics summarised over orders (mean and std).
SUMMARY_KEYS = ("A_avg", "A_last", "F")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and population std (ddof 0) of ``values``; identical values give that value and 0 exactly (NumPy's
    sum then divide gives 0.6687499999999998 for three 0.66875, which prints 66.87 where each order prints 66.88)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size and bool(np.all(v == v[0])):
        return float(v[0]), 0.0
    return float(v.mean()), float(v.std())


def position_means(stack: Any) -> np.ndarray:
    """The mean over the first axis, each position where every entry is the same that value exactly (:func:`mean_std`)."""
    a = np.asarray(stack, dtype=np.float64)
    return np.where(np.all(a == a[0], axis=0), a[0], a.mean(axis=0))


def summary(entries: Sequence[Accuracy]) -> dict[str, dict[str, Any]]:
    """``mean`` and ``std`` (population, ddof 0, :func:`mean_std`) of A_avg, A_last and F over the orders, and of A_auc
    where every order has one (``--eval-every``). Floats, typed Any: they fill the records' fields of those names."""
    keys = [*SUMMARY_KEYS, *(["A_auc"] if all(getattr(e, "A_auc", None) is not None for e in entries) else [])]
    stats = {key: mean_std([getattr(e, key) for e in entries]) for key in keys}
    return {"mean": {k: m for k, (m, _) in stats.items()}, "std": {k: sd for k, (_, sd) in stats.items()}}


#: The settings of a run that may differ from order to order (``--drop-last``'s tails, Si-Blurry's draws): each
#: order's entry records them where they do (:func:`order_streams`); the top level holds the first order's.
ORDER_STREAM_KEYS = ("n_train_seen", "n_test", "dropped_classes", "disjoint_classes", "blurred_rows")


def order_streams(records: Sequence[Any]) -> list[dict[str, Any]]:
    """Per order, its values of the :data:`ORDER_STREAM_KEYS` that differ between the orders' ``records``."""
    differ = [k for k in ORDER_STREAM_KEYS if len({repr(getattr(r, k)) for r in records}) > 1]
    return [{k: getattr(r, k) for k in differ} for r in records]


def order_samples(orders: Sequence[LearnMetrics]) -> list[dict[str, Any]]:
    """Per order, its sampled leave-one-out's rows and eps at each boundary where the orders' differ (as
    :func:`order_streams`; ``gamma_search`` is the first order's)."""
    samples = [{"sample_rows": m.gamma_search.sample_rows, "sample_eps": m.gamma_search.sample_eps}
               if m.gamma_search is not None and m.gamma_search.sample_rows is not None else {} for m in orders]
    return samples if len({repr(s) for s in samples}) > 1 else [{} for _ in orders]


def _order_entry(seed: int, metrics: LearnMetrics) -> OrderMetrics:
    return OrderMetrics(order_seed=seed, tasks=metrics.tasks, accuracy_matrix=metrics.accuracy_matrix,
                        A_steps=metrics.A_steps, A_avg=metrics.A_avg, A_last=metrics.A_last, F=metrics.F,
                        F_published_code=metrics.F_published_code, gammas_selected=metrics.gammas_selected,
                        A_auc=metrics.A_auc, anytime=metrics.anytime)


def order_means(entries: Sequence[Accuracy]) -> dict[str, Any]:
    """The accuracy fields of a record of many orders: the means of A_avg, A_last, F (and A_auc, :func:`summary`)
    with their ``std``, the position-wise means of ``accuracy_matrix`` and ``A_steps`` (after i tasks, on the j-th
    task of each order; :func:`check_task_counts` gives every order the same positions) and ``F_published_code``'s
    mean where every order has one. Typed Any: they fill the records' fields of those names."""
    stats = summary(entries)
    rows = [len(row) for row in known(entries[0].accuracy_matrix, "an order's accuracy matrix")]
    flat = position_means([np.concatenate(known(e.accuracy_matrix, "an order's accuracy matrix")) for e in entries])
    published = [v for e in entries if (v := e.F_published_code) is not None]
    return {**stats["mean"], "std": stats["std"],
            "accuracy_matrix": [[float(v) for v in row] for row in np.split(flat, np.cumsum(rows)[:-1])],
            "A_steps": [float(v) for v in position_means([known(e.A_steps, "an order's A_steps") for e in entries])],
            "F_published_code": mean_std(published)[0] if len(published) == len(entries) else None}


def combine(seeds: Sequence[int], orders: Sequence[LearnMetrics], one_pass: bool) -> LearnMetrics:
    """The metrics of many orders: the first order's settings and ``tasks`` (its model is the one saved; no
    ``order_seed``), the means over the orders (:func:`order_means`); ``orders`` (with :func:`order_streams` and
    :func:`order_samples`),
    ``mean`` and ``std``."""
    entries = [replace(_order_entry(s, m), **own, **sample)
               for s, m, own, sample in zip(seeds, orders, order_streams(orders), order_samples(orders))]
    first = orders[0]
    means = order_means(entries)
    return replace(first, **means, mean={k: means[k] for k in means["std"]}, order_seed=None,
                   order_seeds=[known(e.order_seed, "an order's seed") for e in entries], orders=list(entries),
                   one_pass=one_pass)


def combine_sweep(seeds: Sequence[int], reports: Sequence[SweepReport], select: str) -> SweepReport:
    """The first order's report (its settings, ``tasks``, criteria, choices and selections; no ``order_seed``) with
    each gamma's accuracy the means over the orders (:func:`order_means`), as ``learn --order-seeds`` records them,
    the test oracle's gamma (and a choice by ``test``) from those means, and every order's results (and its
    leave-one-out sample where the orders' differ)."""
    results = [replace(r, **order_means([rep.results[i] for rep in reports])) for i, r in enumerate(reports[0].results)]
    differ = len({repr(rep.leave_one_out) for rep in reports}) > 1  # each order's sample, as order_streams' keys
    orders = [OrderSweep(order_seed=s, tasks=rep.tasks, best_gamma=rep.best_gamma, results=rep.results,
                         heads=rep.heads, leave_one_out=rep.leave_one_out if differ else None, **own)
              for s, rep, own in zip(seeds, reports, order_streams(reports))]
    oracle = choose(results, "test")
    combined = replace(reports[0], results=results, orders=orders, order_seed=None, order_seeds=list(seeds),
                       best_gamma_test=oracle, best_gamma=oracle if select == "test" else reports[0].best_gamma)
    return _combine_heads(combined, reports) if reports[0].heads else combined


#: The head options ``sweep --heads`` sets from each order's gamma (dual's gamma_comp: its gamma) -> their per-order key.
PER_ORDER_OPTIONS = {"gamma": "gammas", "gamma_comp": "gamma_comps"}


def _combine_heads(report: SweepReport, reports: Sequence[SweepReport]) -> SweepReport:
    """``--heads`` over orders: each head's entry with its accuracy the means over the orders (:func:`order_means`),
    its leave-one-out accuracy their mean and each order's :data:`PER_ORDER_OPTIONS` (not the first order's alone);
    the best head by mean leave-one-out accuracy and the test oracle's by mean A_avg, as one order's are chosen."""
    heads = {}
    for name, first in known(report.heads, "the heads' entries").items():
        entries = [known(rep.heads, "an order's heads")[name] for rep in reports]
        loo = [v for e in entries if (v := e.loo_accuracy) is not None]
        options = {PER_ORDER_OPTIONS.get(k, k): [e.options[k] for e in entries] if k in PER_ORDER_OPTIONS else v
                   for k, v in first.options.items()}
        heads[name] = replace(first, **order_means(entries), options=options,
                              loo_accuracy=None if len(loo) < len(entries) else mean_std(loo)[0])
    best, oracle = best_heads(heads)
    return replace(report, heads=heads, best_head=best, best_head_selected_by=report.best_head_selected_by if best else None,
                   best_head_test=oracle)
