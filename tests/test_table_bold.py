"""table.md and table.tex bold every head whose mean shows as the column's best, not only the one ahead in digits
the table does not show."""

from __future__ import annotations

from foal_pipe.report.resultstable import latex, markdown


def _cell(head: str, mean: float) -> dict:
    values = {"mean": mean, "std": 0.01, "values": [mean - 0.01, mean + 0.01]}
    return {"store": "s.zarr", "dataset": "blobs", "encoder": "synthetic", "head": head, "tasks": 5, "n_tasks": 5,
            "order_seeds": [0, 1], "A_avg": values, "A_last": values, "F": values}


def _table(means: dict[str, float]) -> dict:
    return {"features": ["s.zarr"], "heads": list(means), "order_seeds": [0, 1], "tasks": [5], "std_ddof": 0,
            "cells": [_cell(head, mean) for head, mean in means.items()]}


def test_means_that_show_the_same_digits_are_both_bold():
    md = markdown(_table({"ridge": 0.812341, "ncm": 0.812339, "slda": 0.7}))  # 81.23 both
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "**81.23 ± 1.00**" in rows["ridge"] and "**81.23 ± 1.00**" in rows["ncm"]
    assert "**" not in rows["slda"]
    tex = latex(_table({"ridge": 0.812341, "ncm": 0.812339, "slda": 0.7}))
    assert tex.count(r"\mathbf{81.23") == 4  # two heads, A_last and A_avg


def test_a_mean_ahead_in_the_shown_digits_is_bold_alone():
    md = markdown(_table({"ridge": 0.8124, "ncm": 0.8122}))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "**81.24 ± 1.00**" in rows["ridge"] and "**" not in rows["ncm"]
