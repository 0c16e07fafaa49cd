"""``summary --group``: learn runs grouped into table cells (say one per head and task count), each cell the mean and
std of its runs' A_avg, A_last and F, as ``foal-pipe table`` reports them (std with ddof 0, over the runs).

A cell's std is meant as a spread over class orders: :func:`mixed_settings` names any other recorded setting in which
a cell's runs differ, so the table never passes a spread over, say, two fusions as one over orders."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.protocol.schema import LearnMetrics, SweepReport


def fusion_of(encoder: dict[str, Any] | None) -> str | None:
    """The fusion chosen when reading a blocks store (``--fusion``; its encoder records ``blocks_dtype``), with
    ", no norm" under ``--no-fusion-norm``; None for features read as stored (extract's fusion, the store's own)."""
    if not encoder or "blocks_dtype" not in encoder:
        return None
    return f"{encoder.get('fusion')}{'' if str(encoder.get('final_norm', '')).startswith('applied') else ', no norm'}"


def sweep_fusion(sweep: SweepReport) -> str | None:
    """A sweep's fusion: ``--fusions``' chosen one (its top-level numbers and heads are that fusion's; its encoder
    records the store's own), else as :func:`fusion_of`."""
    if not sweep.fusions:
        return fusion_of(sweep.encoder)
    return f"{sweep.fusion}{'' if sweep.fusion_norm is not False else ', no norm'}"


def _options(m: LearnMetrics) -> str | None:
    """A head's options other than gamma (its own key), as ``name=value``; None for ridge or a head without any."""
    options = {k: v for k, v in (m.head_options or {}).items() if k != "gamma"}
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items())) or None


def _classes(m: LearnMetrics) -> int | None:
    """How many classes the store holds, streamed or dropped (``tasks`` and ``dropped_classes``): the same for every
    class order of one store, where the classes each task gets are not."""
    return None if m.tasks is None else len({c for t in m.tasks for c in t} | set(m.dropped_classes or ()))


def _rows(m: LearnMetrics) -> str | None:
    """``train/test`` rows the run counted; None under ``--drop-last`` or ``--drop-remainder``, whose rows differ from
    class order to class order (a batch's tail, the classes left over), so runs of several orders are not set apart."""
    if m.drop_last or m.drop_remainder or None in (m.n_train_seen, m.n_test):
        return None
    return f"{m.n_train_seen}/{m.n_test}"


def _batch(m: LearnMetrics) -> int | None:
    """``--batch-size`` where it changes the numbers: dual's (its recursion steps once a batch), ``--drop-last``'s (the
    tail it drops) and an ``--eval-every`` curve's (scored at batch ends); None where every batch size gives the same
    model (ridge's exact recursion, the other heads' per-task statistics), so such runs are not set apart."""
    return m.batch_size if m.head == "dual" or m.drop_last or m.anytime is not None else None


def _drop(m: LearnMetrics) -> str | None:
    """``--drop-last`` and ``--drop-remainder`` as ``last``, ``remainder``, ``last+remainder`` or ``none``."""
    if m.drop_last is None and m.drop_remainder is None:
        return None
    return "+".join(name for name, on in (("last", m.drop_last), ("remainder", m.drop_remainder)) if on) or "none"


def _encoder_settings(m: LearnMetrics) -> dict[str, str]:
    """The encoder's record but its name and fusion (keys of their own), each entry as JSON: two runs of one encoder
    name at another image size, normalisation or weights read other features."""
    encoder = m.encoder or {}
    fused = ("fusion", "blocks_dtype", "final_norm") if "blocks_dtype" in encoder else ("fusion",)
    return {k: json.dumps(v, sort_keys=True) for k, v in sorted(encoder.items()) if k not in ("name", *fused)}


#: Settings recorded as a mapping: a cell mixing them names only the entries that differ (:func:`mixed_settings`).
RECORDS: dict[str, Callable[[LearnMetrics], dict[str, str]]] = {"encoder_settings": _encoder_settings}

#: What runs can be grouped by: each a run's value of it. Every recorded setting but the class order (``tasks``'
#: classes) and its seed: a cell whose runs differ in one left out of ``--group`` is named (:func:`mixed_settings`).
def exact_text(value: float) -> str:
    """A float as its shortest exact text, without a trailing ``.0`` (``1``, ``1.0000001``): ``:g``'s six digits
    showed two gammas of two cells as one key."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


GROUP_KEYS: dict[str, Callable[[LearnMetrics], Any]] = {
    "head": lambda m: m.head or "ridge",
    "tasks": lambda m: len(m.accuracy_matrix) if m.n_tasks is None else m.n_tasks,
    "dataset": lambda m: m.dataset,
    "encoder": lambda m: (m.encoder or {}).get("name"),
    "stream": lambda m: m.stream or "disjoint",
    "D": lambda m: m.projection_dim,
    "gamma": lambda m: m.gamma if m.head is None else (m.head_options or {}).get("gamma"),
    "fusion": lambda m: fusion_of(m.encoder) or (m.encoder or {}).get("fusion"),
    "activation": lambda m: m.activation,
    "init": lambda m: m.projection_init,
    "seed": lambda m: m.seed,
    "select": lambda m: m.selected_by,
    "options": _options,
    "ratios": lambda m: None if m.disjoint_ratio is None else f"{m.disjoint_ratio}/{m.blurry_ratio}",
    "mask": lambda m: m.mask_unseen,
    "dtype": lambda m: m.dtype,
    "store": lambda m: m.features,
    # a continued run (learn --init-model) starts from its model's state: not another class order of a fresh run
    "init_model": lambda m: (m.continuation.init_model if m.continuation is not None else None) or "none",
    "dim": lambda m: m.feature_dim,
    "classes": _classes,
    "rows": _rows,
    "drop": _drop,
    "batch": _batch,
    "encoder_settings": lambda m: ", ".join(f"{k}={v}" for k, v in _encoder_settings(m).items()) if m.encoder else None,
    # --gamma auto's search beyond its criterion: runs of another grid or density choose other gammas
    "grid": lambda m: None if m.gamma_grid is None else ",".join(map(exact_text, m.gamma_grid)),
    "per_decade": lambda m: None if m.gamma_search is None else m.gamma_search.per_decade,
    "loo_sample": lambda m: None if m.gamma_search is None else m.gamma_search.loo_sample,
}
METRICS = ("A_avg", "A_last", "F")
DDOF = 0


def parse_group(text: str) -> tuple[str, ...]:
    """``"head,tasks"`` -> ``("head", "tasks")``; an unknown or repeated key refused."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if not keys:
        raise FoalPipeError(f"{param('group')} names no key; write e.g. head,tasks (keys: {', '.join(GROUP_KEYS)})")
    for k in keys:
        if k not in GROUP_KEYS:
            raise FoalPipeError(f"unknown {param('group')} key {k!r}; choose from {', '.join(GROUP_KEYS)}")
    if len(set(keys)) < len(keys):
        raise FoalPipeError(f"{param('group')} names a key twice; name each once")
    return keys


def group_cells(runs: Sequence[LearnMetrics], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One cell per distinct value of ``keys`` (in order of first appearance): ``key values``, ``n`` runs, each
    metric's ``mean``, ``std`` (ddof :data:`DDOF`) and ``values``, and ``mixed``: :func:`mixed_settings` of its
    runs. A ``learn --order-seeds`` run counts as its class orders, each a run (as the separate ``--order-seed``
    runs would), not as their mean; a class order found twice with the same settings counts once (``repeated``:
    how many were left out, :func:`repeated_warning`)."""
    from foal_pipe.protocol.ordermeans import mean_std  # as table and learn --order-seeds average: the same digits

    groups: dict[tuple, list[LearnMetrics]] = {}
    for m in runs:
        groups.setdefault(tuple(GROUP_KEYS[k](m) for k in keys), []).append(m)
    cells = []
    for values, grouped in groups.items():
        members, repeated = _distinct_orders(grouped)
        cell: dict[str, Any] = {"key": dict(zip(keys, values, strict=True)), "n": len(members),
                                "mixed": mixed_settings(grouped, keys), "repeated": repeated}
        for metric in METRICS:
            numbers = [float(getattr(m, metric)) for m in members]
            mean, std = mean_std(numbers)
            cell[metric] = {"mean": mean, "std": std, "values": numbers}
        cells.append(cell)
    return cells


def _distinct_orders(runs: Sequence[LearnMetrics]) -> tuple[list[Any], int]:
    """The class orders of ``runs`` (a ``learn --order-seeds`` run's each), each counted once, and how many were left
    out: an order recorded again with every setting and its accuracy matrix the same (a copied run folder, or an
    ``--order-seeds`` run beside its orders' own runs) is the same run, which would count twice in the cell's mean and
    std. Runs that record no class order are all kept."""
    members, seen, repeated = [], set(), 0
    for m in runs:
        settings = tuple(str(value(m)) for value in GROUP_KEYS.values())
        for order in m.orders if m.orders else (m,):
            identity = None if order.tasks is None else (settings, order.order_seed, str(order.tasks),
                                                         str(order.accuracy_matrix))
            if identity is not None and identity in seen:
                repeated += 1
                continue
            seen.add(identity)
            members.append(order)
    return members, repeated


def repeated_warning(cell: dict[str, Any]) -> str | None:
    """One line naming a cell in which a class order was recorded more than once (counted once)."""
    if not cell["repeated"]:
        return None
    where = ", ".join(f"{k} {v}" for k, v in cell["key"].items())
    return (f"the cell {where} found {cell['repeated']} run(s) of a class order it already holds, with the same "
            "settings (a copied run folder, or an --order-seeds run beside its orders' own runs): each order is "
            "counted once; remove the copies to silence this")


def mixed_settings(runs: Sequence[LearnMetrics], keys: Sequence[str]) -> dict[str, list[str]]:
    """The keys outside ``keys`` whose recorded values differ between ``runs`` (runs not recording one are not
    counted), each with its values, sorted: a cell pooling them spreads over that setting, not class orders alone."""
    found = {name: sorted({str(v) for m in runs if (v := value(m)) is not None})
             for name, value in GROUP_KEYS.items() if name not in keys}
    for name, record in RECORDS.items():  # the entries that differ, not whole records
        if len(found.get(name, ())) > 1:
            shown = [record(m) for m in runs if m.encoder]
            differ = sorted({k for r in shown for k in r if len({r.get(k) for r in shown}) > 1})
            found[name] = sorted({", ".join(f"{k}={r.get(k, '-')}" for k in differ) for r in shown})
    return {name: values for name, values in found.items() if len(values) > 1}


def mixed_warning(cell: dict[str, Any], keys: Sequence[str]) -> str | None:
    """One line naming a cell whose runs differ in settings outside ``keys``, the settings and values, and the fix."""
    mixed = cell["mixed"]
    if not mixed:
        return None
    where = ", ".join(f"{k} {v}" for k, v in cell["key"].items())
    what = " and ".join(f"{k} ({', '.join(v)})" for k, v in mixed.items())
    return (f"the cell {where} pools runs that differ in {what}: its +- is a spread over {' and '.join(mixed)} too, "
            f"not over class orders alone; split it: --group {','.join((*keys, *mixed))}")
