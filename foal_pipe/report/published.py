"""Published results beside ours: a small registry of numbers from papers, each with its source, and the rule that
says when one may stand beside a table's cell.

A published row is printed as a reference only where its protocol matches what the stores record: the benchmark
(the store's dataset), the backbone (the store's encoder) and the task count. Otherwise the table says why not.
Only numbers read in a source are listed; a method whose numbers were not sourced is left out
(docs/results-table.md lists which and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from foal_pipe.report.paper import PAPER_BACKBONE, TABLE2, dataset_key


@dataclass(frozen=True)
class PublishedRow:
    """One method's published numbers on one benchmark, in percent (None: not published)."""

    method: str
    benchmark: str  # a dataset name as stores record it (matched by :func:`~foal_pipe.report.paper.dataset_key`)
    backbone: str  # a timm tag, as stores record their encoder
    tasks: int
    A_last: float | None
    A_avg: float | None
    source: str  # paper and table


#: F-OAL's own Table 2 row of every dataset (mean of 3 runs; :data:`foal_pipe.report.paper.TABLE2`).
PUBLISHED: tuple[PublishedRow, ...] = tuple(
    PublishedRow("F-OAL", row.dataset, PAPER_BACKBONE, row.n_tasks, row.A_last, row.A_avg,
                 "Zhuang et al., F-OAL, NeurIPS 2024, Table 2")
    for row in TABLE2
)


def references(cells: Sequence[dict[str, Any]], rows: Sequence[PublishedRow] = PUBLISHED
               ) -> tuple[list[tuple[PublishedRow, str]], list[str]]:
    """The published rows that match a cell's protocol, each with the cell's store (by benchmark, backbone and
    task count), and one line per benchmark some cell shares with a published row that does not match, saying
    why."""
    matched: list[tuple[PublishedRow, str]] = []
    why: list[str] = []
    seen = set()
    for cell in cells:
        key = (cell["store"], cell["tasks"])
        if key in seen:
            continue
        seen.add(key)
        for row in rows:
            if dataset_key(row.benchmark) != dataset_key(cell.get("dataset") or ""):
                continue
            if cell.get("encoder") != row.backbone:
                why.append(f"{row.method} on {row.benchmark} ({row.source}) used {row.backbone}; "
                           f"{cell['store']} holds {cell.get('encoder')}")
            elif cell["n_tasks"] != row.tasks:
                why.append(f"{row.method} on {row.benchmark} ({row.source}) has {row.tasks} tasks; this cell "
                           f"{cell['n_tasks']}")
            elif (row, cell["store"]) not in matched:
                matched.append((row, cell["store"]))
    return matched, sorted(set(why))
