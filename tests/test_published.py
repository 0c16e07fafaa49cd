"""The registry of published results: well-formed rows, Table 2 as the paper prints it, and ``table.md`` printing a
row beside a store whose recorded dataset, encoder and task count match it (and saying why not otherwise)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import build_store, invoke

from foal_pipe.datasets.registry import DATASETS
from foal_pipe.report.paper import PAPER_BACKBONE, TABLE2, dataset_key
from foal_pipe.report.published import F_OAL_TABLE2, PUBLISHED, PublishedRow, references
from foal_pipe.report.resultstable import latex, markdown

PAPER_TEX = "shared/paper/f-oal-neurips2024.tex"


def test_every_row_is_well_formed():
    known = {dataset_key(name) for name in DATASETS} | {row.dataset for row in TABLE2}
    keys = set()
    for row in PUBLISHED:
        assert row.method and row.source and row.setting, row
        assert dataset_key(row.benchmark) in known, f"{row.benchmark} is neither a registered nor a paper dataset"
        assert row.tasks >= 1
        assert row.A_last is not None or row.A_avg is not None, row
        for value in (row.A_last, row.A_avg):
            assert value is None or 0 <= value <= 100, row
        assert isinstance(row.replay, bool)
        # a backbone is a full timm tag (architecture.pretrained_tag) or a description no store's encoder can equal
        assert "." in row.backbone.split()[0] or " " in row.backbone, row.backbone
        key = (row.method, dataset_key(row.benchmark), row.backbone, row.tasks, row.source)
        assert key not in keys, f"{key} listed twice"
        keys.add(key)


def test_table2_has_every_method_on_every_dataset_and_f_oal_is_papers_row():
    table2 = [row for row in PUBLISHED if row.source == F_OAL_TABLE2]
    methods = {row.method for row in table2}
    assert methods == {"F-OAL", "iCaRL", "ER", "ASER", "SCR", "DVC", "PCR", "LwF", "EWC", "EASE", "LAE", "SLCA"}
    assert len(table2) == len(methods) * len(TABLE2)
    for paper in TABLE2:
        foal = next(r for r in table2 if r.method == "F-OAL" and r.benchmark == paper.dataset)
        assert (foal.A_last, foal.A_avg, foal.tasks, foal.backbone) == (paper.A_last, paper.A_avg, paper.n_tasks,
                                                                       PAPER_BACKBONE)
    assert {r.method for r in table2 if r.replay} == {"iCaRL", "ER", "ASER", "SCR", "DVC", "PCR"}


def _paper_tex() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / PAPER_TEX).is_file():
            return parent / PAPER_TEX
    return None


def _parse_table2(tex: str) -> dict[tuple[str, str], list[float]]:
    """Table 2 (``tab:performance``) of the paper's LaTeX: (metric, method) -> its six numbers, marks removed."""
    body = tex[tex.index(r"\textbf{Metric} & \textbf{Method}"):tex.index(r"\label{tab:performance}")]
    parsed, metric = {}, None
    for line in body.splitlines():
        found = re.search(r"\{\$\{?A_\{(avg|last)\}\}?\(", line) or re.search(r"\{\$\{F\}\(", line)
        if found:
            metric = f"A_{found.group(1)}" if found.groups() and found.group(1) else "F"
        cells = [c.strip() for c in line.split("&")]
        if len(cells) == 9 and metric:
            method = re.match(r"[A-Za-z-]+", cells[1]).group(0)
            numbers = [re.sub(r"\\(underline|textbf)\{|\}|\\\\", "", c).strip() for c in cells[3:]]
            parsed[(metric, method)] = [float(n) for n in numbers]
    return parsed


def test_table2_rows_are_the_papers_numbers():
    path = _paper_tex()
    if path is None:
        pytest.skip(f"{PAPER_TEX} is not beside this checkout")
    parsed = _parse_table2(path.read_text())
    assert len(parsed) == 3 * 12
    for row in (r for r in PUBLISHED if r.source == F_OAL_TABLE2):
        column = [paper.dataset for paper in TABLE2].index(row.benchmark)
        assert row.A_avg == parsed[("A_avg", row.method)][column], row
        assert row.A_last == parsed[("A_last", row.method)][column], row


def _cell(dataset, encoder, n_tasks, store="s.zarr"):
    values = {"mean": 0.9, "std": 0.01, "values": [0.89, 0.91]}
    return {"store": store, "dataset": dataset, "encoder": encoder, "head": "ridge", "tasks": n_tasks,
            "n_tasks": n_tasks, "order_seeds": [0, 1], "A_avg": values, "A_last": values, "F": values}


def test_rows_match_on_benchmark_backbone_and_tasks_only():
    mine = PublishedRow("M", "dtd", "vit_x.tag", 5, 50.0, 60.0, "S", False, "setting")
    other = PublishedRow("N", "cifar100", "vit_x.tag", 5, 50.0, 60.0, "S", True, "setting")
    rows = (mine, other)
    matched, why = references([_cell("DTD", "vit_x.tag", 5)], rows)  # the dataset in any spelling
    assert [(r.row, r.store, r.tasks) for r in matched] == [(mine, "s.zarr", 5)] and why == []
    matched, why = references([_cell("dtd", "vit_x.tag", 10)], rows)
    assert matched == [] and why == ["M (S): dtd, 5 tasks, vit_x.tag; s.zarr: 10 tasks, vit_x.tag; the task count "
                                     "differs, not comparable"]
    matched, why = references([_cell("dtd", "vit_y.tag", 10)], rows)
    assert matched == [] and why == ["M (S): dtd, 5 tasks, vit_x.tag; s.zarr: 10 tasks, vit_y.tag; the backbone and "
                                     "the task count differ, not comparable"]
    assert references([_cell("digits", "pixels", 5)], rows) == ([], [])


def test_reference_rows_carry_mean_replay_mark_and_note():
    row = next(r for r in PUBLISHED if r.method == "iCaRL" and r.benchmark == "cifar100")
    table = {"features": ["c.zarr"], "heads": ["ridge"], "order_seeds": [0, 1], "tasks": [row.tasks], "std_ddof": 0,
             "cells": [_cell("cifar100", row.backbone, row.tasks, "c.zarr")]}
    md = markdown(table)
    (line,) = [x for x in md.splitlines() if x.startswith(f"| *{row.method} (replay) [")]
    note = re.search(r"\[(\d+)\]", line).group(1)
    assert line.endswith(f"* | {row.A_last} | {row.A_avg} |")
    assert f"\n{note}. {row.source}; {row.setting}\n" in md
    assert f"\\textit{{{row.method} (replay) [{note}]}} & {row.A_last} & {row.A_avg}" in latex(table)
    foal = next(x for x in md.splitlines() if x.startswith("| *F-OAL ["))
    assert "(replay)" not in foal


def _table(stores, out, tasks):
    return invoke("table", *(x for s in stores for x in ("--features", s)), "--heads", "ncm", "--order-seeds", "0",
                  "--tasks", tasks, "--out", out)


def test_table_prints_the_row_whose_protocol_the_store_records(tmp_path):
    row = next(r for r in PUBLISHED if r.method == "SLCA" and r.benchmark == "dtd")
    match = build_store(tmp_path / "dtd.zarr", n_train=1200, n_classes=row.classes,
                        attrs={"dataset": "DTD", "encoder": {"name": row.backbone,
                                                             "fusion": "none", "image_size": 0, "normalize": False}})
    other = build_store(tmp_path / "tiny.zarr", seed=1, n_train=1200, n_classes=row.classes,
                        attrs={"dataset": "dtd", "encoder": {"name": "vit_tiny_patch16_224",
                                                             "fusion": "none", "image_size": 0, "normalize": False}})
    result = _table((match, other), tmp_path / "out", f"{row.tasks},3")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "out" / "table.md").read_text()
    at_tasks, at_3 = md.split(f"## {row.tasks} tasks")[1].split("## 3 tasks")
    assert re.search(rf"\| \*{row.method} \[\d+\]\* \| {row.A_last} \| {row.A_avg} \|  \|  \|", at_tasks)
    assert f"*{row.method} " not in at_3.split("## Published results")[0]
    assert (f"; {other.resolve()}: {row.tasks} tasks, vit_tiny_patch16_224; the backbone differs, not comparable"
            in md)
    assert f"; {match.resolve()}: 3 tasks, {row.backbone}; the task count differs, not comparable" in md


def test_ranpac_frozen_rows_match_only_their_in21k_tag():
    ranpac = [r for r in PUBLISHED if r.source.startswith("RanPAC/RanPAC ")]
    assert {r.benchmark for r in ranpac} == {"cifar100", "imagenet-r", "imagenet-a", "cub200", "omnibenchmark", "vtab"}
    assert all(r.A_avg is None and not r.replay for r in ranpac)  # RanPAC's tables give the final accuracy only
    tagged = next(r for r in ranpac if r.benchmark == "cifar100" and r.method == "RanPAC (no Phase 1)")
    matched, _ = references([_cell("cifar100", "vit_base_patch16_224.augreg_in21k", tagged.tasks)])
    assert {ref.row.source for ref in matched} == {tagged.source} and len(matched) == 3
    table = {"features": ["c.zarr"], "heads": ["ridge"], "order_seeds": [0], "tasks": [tagged.tasks], "std_ddof": 0,
             "cells": [_cell("cifar100", tagged.backbone, tagged.tasks, "c.zarr")]}
    assert re.search(rf"\| \*RanPAC \(no Phase 1\) \[\d\]\* \| {tagged.A_last} \| - \|", markdown(table))
    untagged = next(r for r in ranpac if r.benchmark == "imagenet-r")
    for tag in ("vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit_base_patch16_224.augreg_in21k_ft_in1k"):
        matched, why = references([_cell("imagenet-r", tag, untagged.tasks)])
        assert matched == [] and any("the backbone differs" in w for w in why)
