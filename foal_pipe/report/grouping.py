"""``summary --group``: learn runs grouped into table cells (say one per head and task count), each cell the mean and
std of its runs' A_avg, A_last and F, as ``foal-pipe table`` reports them (std with ddof 0, over the runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.protocol.schema import LearnMetrics

#: What runs can be grouped by: each a run's value of it.
GROUP_KEYS: dict[str, Callable[[LearnMetrics], Any]] = {
    "head": lambda m: m.head or "ridge",
    "tasks": lambda m: len(m.accuracy_matrix) if m.n_tasks is None else m.n_tasks,
    "dataset": lambda m: m.dataset,
    "encoder": lambda m: (m.encoder or {}).get("name"),
    "stream": lambda m: m.stream or "disjoint",
    "D": lambda m: m.projection_dim,
    "gamma": lambda m: m.gamma if m.head is None else (m.head_options or {}).get("gamma"),
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
    """One cell per distinct value of ``keys`` (in order of first appearance): ``key values``, ``n`` runs and each
    metric's ``mean``, ``std`` (ddof :data:`DDOF`) and ``values``. A ``learn --order-seeds`` run counts as its
    class orders, each a run (as the separate ``--order-seed`` runs would), not as their mean."""
    from foal_pipe.protocol.orders import mean_std  # as table and learn --order-seeds average: the same digits

    groups: dict[tuple, list[Any]] = {}
    for m in runs:
        groups.setdefault(tuple(GROUP_KEYS[k](m) for k in keys), []).extend(m.orders or [m])
    cells = []
    for values, members in groups.items():
        cell: dict[str, Any] = {"key": dict(zip(keys, values, strict=True)), "n": len(members)}
        for metric in METRICS:
            values = [float(getattr(m, metric)) for m in members]
            mean, std = mean_std(values)
            cell[metric] = {"mean": mean, "std": std, "values": values}
        cells.append(cell)
    return cells
