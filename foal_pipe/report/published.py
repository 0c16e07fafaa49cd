"""Published results beside ours: a small registry of numbers read in papers and repositories, each with its source,
and the rule that says when one may stand beside a table's cell.

Rule: a published row is printed as a reference only where the benchmark (the store's dataset, by
:func:`~foal_pipe.report.paper.dataset_key`), the backbone (the store's encoder, a full timm tag), the task count
(the cell's ``n_tasks``), the stream (every row here streams disjoint tasks) and the number of classes streamed all
match; its ``setting`` (online or offline, base session, runs) is printed with it, because the rule does not check
those. Where the benchmark matches but another of them does not, the table says which differs. Only numbers read in a
source are listed (docs/results-table.md says which sources were searched and which methods are missing).
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
    backbone: str  # a full timm tag as stores record their encoder; otherwise a description that matches no store
    tasks: int
    A_last: float | None
    A_avg: float | None
    source: str  # paper and table, or repository, path and commit
    replay: bool  # the method keeps exemplars of past classes
    setting: str  # the protocol the match rule does not check: online/offline, base session, class order, runs
    classes: int | None = None  # the classes streamed (None: not checked)


F_OAL_TABLE2 = "Zhuang et al., F-OAL, NeurIPS 2024, Table 2"
#: The classes each Table 2 benchmark streams, from the paper's dataset descriptions (:data:`_TABLE2_SPLITS`).
_TABLE2_CLASSES = {"cifar100": 100, "core50": 50, "fgvcaircraft": 100, "dtd": 40, "tinyimagenet": 200, "country211": 210}
#: The task split of each Table 2 benchmark, from the paper's dataset descriptions.
_TABLE2_SPLITS = {
    "cifar100": "10 tasks of 10 classes",
    "core50": "9 tasks: 10 classes, then 8 of 5",
    "fgvcaircraft": "100 of the 102 classes in 10 tasks",
    "dtd": "40 of the 47 classes in 10 tasks",
    "tinyimagenet": "200 classes in 10 tasks",
    "country211": "210 of the 211 classes in 10 tasks",
}
_TABLE2_SETTING = ("online class-incremental: one pass, batch 10, {tasks}, one data stream for all "
                   "methods; ViT-B (the paper says pre-trained on IN-1k; its code's timm vit_base_patch16_224 resolves to "
                   "this tag, docs/protocol.md); {how}; mean of 3 runs")
_TABLE2_HOW = {
    True: "a 5,000-exemplar replay buffer, trained by SGD (lr 0.001)",
    False: "exemplar-free, trained by SGD (lr 0.001)",
}

#: Table 2's baselines (``tab:performance``): replay flag, then A_avg and A_last in the order of
#: :data:`~foal_pipe.report.paper.TABLE2`'s columns (CIFAR-100, CORe50, FGVCAircraft, DTD, Tiny-ImageNet,
#: Country211), as printed.
TABLE2_BASELINES: dict[str, tuple[bool, tuple[float, ...], tuple[float, ...]]] = {
    "iCaRL": (True, (91.6, 95.6, 36.4, 74.1, 91.3, 12.2), (87.5, 93.2, 29.8, 66.3, 87.8, 6.5)),
    "ER": (True, (90.1, 94.8, 35.7, 65.4, 87.3, 14.0), (84.6, 92.1, 28.6, 54.3, 81.6, 6.8)),
    "ASER": (True, (87.2, 87.1, 25.2, 57.4, 85.8, 13.2), (82.0, 82.1, 14.8, 49.4, 80.0, 6.7)),
    "SCR": (True, (91.9, 95.3, 55.6, 75.0, 82.6, 14.7), (87.7, 93.6, 50.3, 68.7, 75.8, 8.0)),
    "DVC": (True, (92.4, 97.1, 33.7, 67.3, 91.5, 16.1), (87.8, 96.0, 27.0, 57.2, 87.2, 9.2)),
    "PCR": (True, (89.1, 95.7, 10.1, 35.0, 91.0, 9.7), (81.4, 93.9, 9.0, 34.6, 86.1, 6.1)),
    "LwF": (False, (69.3, 47.0, 14.2, 40.2, 82.5, 1.4), (64.8, 26.3, 5.8, 18.3, 72.5, 0.5)),
    "EWC": (False, (49.9, 47.9, 12.0, 27.6, 60.5, 6.1), (25.2, 21.1, 3.0, 13.3, 44.6, 1.9)),
    "EASE": (False, (91.1, 85.0, 38.2, 76.0, 92.0, 15.9), (85.4, 78.3, 29.3, 67.6, 89.3, 10.5)),
    "LAE": (False, (79.1, 73.3, 13.5, 63.5, 86.7, 14.5), (75.6, 67.1, 6.3, 53.6, 82.4, 9.3)),
    "SLCA": (False, (90.4, 93.7, 34.3, 70.9, 88.6, 17.8), (85.6, 88.2, 32.1, 63.3, 85.4, 12.9)),
}


def _table2() -> list[PublishedRow]:
    rows = []
    for i, paper in enumerate(TABLE2):
        rows.append(PublishedRow("F-OAL", paper.dataset, PAPER_BACKBONE, paper.n_tasks, paper.A_last, paper.A_avg,
                                 F_OAL_TABLE2, False, _TABLE2_SETTING.format(
                                     tasks=_TABLE2_SPLITS[paper.dataset],
                                     how="exemplar-free, frozen backbone, gamma 1, D 1000"),
                                 _TABLE2_CLASSES[paper.dataset]))
        for method, (replay, avg, last) in TABLE2_BASELINES.items():
            rows.append(PublishedRow(method, paper.dataset, PAPER_BACKBONE, paper.n_tasks, last[i], avg[i],
                                     F_OAL_TABLE2, replay,
                                     _TABLE2_SETTING.format(tasks=_TABLE2_SPLITS[paper.dataset],
                                                            how=_TABLE2_HOW[replay]), _TABLE2_CLASSES[paper.dataset]))
    return rows


RANPAC_COMMIT = "012927f86e8d95dc9e7c6015a5e1048e6604c8b6"
#: RanPAC's timm names, as its ``inc_net.py`` creates them. ``vit_base_patch16_224_in21k`` is timm's deprecated alias
#: of ``vit_base_patch16_224.augreg_in21k`` (timm 1.0's ``vision_transformer.py``). The untagged
#: ``vit_base_patch16_224`` is IN-21k pretrained and IN-1k fine-tuned, but which weights depends on the timm version
#: (``augreg2_in21k_ft_in1k`` since timm 0.9, docs/protocol.md) and RanPAC pins none: no store can claim it.
RANPAC_BACKBONES = {
    "pretrained_vit_b16_224_in21k": "vit_base_patch16_224.augreg_in21k",
    "pretrained_vit_b16_224": "timm vit_base_patch16_224 untagged (IN-21k pretrain, IN-1k fine-tune; weights vary "
                              "with the timm version, which RanPAC does not pin)",
}
#: RanPAC's frozen-backbone rows (its ``main_tables.py``: "data in Table 1 and Table 2"): the row name in
#: ``paper_tables/Table_data_main_{key}.csv``, and ours.
RANPAC_METHODS = {"No Phase 1": "RanPAC (no Phase 1)", "No RPs or Phase 1": "RanPAC (no RP, no Phase 1)",
                  "NCM only": "cosine NCM (RanPAC's)"}
#: The classes of each RanPAC benchmark (its ``utils/data.py``; VTAB: its 5 datasets of 10 classes).
RANPAC_CLASSES = {"cifar100": 100, "imagenet-r": 200, "imagenet-a": 200, "cub200": 200, "omnibenchmark": 300, "vtab": 50}
#: Per benchmark: RanPAC's dataset key, its task count (``args/{key}_publish.csv``: init_cls = increment),
#: ``convnet_type``, whether the classes are shuffled (seed 1993), and the final accuracies of
#: :data:`RANPAC_METHODS` in order, as the CSV prints them.
RANPAC_TABLES: dict[str, tuple[str, int, str, bool, tuple[float, float, float]]] = {
    "cifar100": ("cifar224", 10, "pretrained_vit_b16_224_in21k", True, (89.0, 87.0, 83.4)),
    "imagenet-r": ("imagenetr", 10, "pretrained_vit_b16_224", True, (71.8, 67.6, 61.2)),
    "imagenet-a": ("imageneta", 10, "pretrained_vit_b16_224", True, (58.2, 54.4, 49.3)),
    "cub200": ("cub", 10, "pretrained_vit_b16_224", True, (88.7, 86.8, 85.1)),
    "omnibenchmark": ("omnibenchmark", 10, "pretrained_vit_b16_224_in21k", True, (78.2, 73.1, 73.1)),
    "vtab": ("vtab", 5, "pretrained_vit_b16_224", False, (92.2, 91.9, 88.4)),
}
_RANPAC_SETTING = ("offline per task: frozen backbone, class statistics over each whole task, {tasks} tasks; "
                   "{order}; no input normalisation; {how}; final accuracy = the mean over tasks of each task's "
                   "accuracy after the last (foal-pipe's A_last); one run")
_RANPAC_HOW = {
    "No Phase 1": "ReLU of a Gaussian random projection to M = 10,000, then ridge with lambda chosen per task from "
                  "1e-8..1e8 on an 80:20 split of that task's rows",
    "No RPs or Phase 1": "ridge on the 768 features, lambda chosen per task from 1e-8..1e8 on an 80:20 split",
    "NCM only": "cosine similarity to the class means (SimpleCIL's classifier, as RanPAC.py runs it)",
}


def _ranpac() -> list[PublishedRow]:
    rows = []
    for benchmark, (key, tasks, convnet, shuffled, values) in RANPAC_TABLES.items():
        order = "classes shuffled by seed 1993 (--class-order pilot)" if shuffled else "classes in dataset order"
        source = f"RanPAC/RanPAC paper_tables/Table_data_main_{key}.csv, commit {RANPAC_COMMIT}"
        for (name, method), value in zip(RANPAC_METHODS.items(), values, strict=True):
            rows.append(PublishedRow(method, benchmark, RANPAC_BACKBONES[convnet], tasks, value, None, source, False,
                                     _RANPAC_SETTING.format(tasks=tasks, order=order, how=_RANPAC_HOW[name]),
                                     RANPAC_CLASSES[benchmark]))
    return rows


ACIL_README = ("ZHUANGHP/Analytic-continual-learning README.md, table 'Benchmarks (B50, 25 phases)', "
               "commit 16c49d9f65d779a84feb655304422007869298be")

#: The registry: F-OAL's Table 2 (every method), RanPAC's frozen-backbone rows, then the ACIL repository's own
#: CIFAR-100 benchmark.
PUBLISHED: tuple[PublishedRow, ...] = (
    *_table2(),
    *_ranpac(),
    PublishedRow("ACIL", "cifar100", "resnet32 base-trained on CIFAR-100's first 50 classes (ACIL's release)", 26,
                 63.384, 71.047, ACIL_README, False,
                 "offline: base training on 50 classes, then 25 phases of 2 (B50, 26 sessions); the repository's "
                 "implementation with TrivialAugmentWide, which its README says scores about 2-5% above the ACIL "
                 "paper; accuracy over all classes seen (A_last: after the last phase; A_avg: mean over phases); "
                 "mean of a 95% interval", 100),
)


@dataclass(frozen=True)
class Reference:
    """A published row that matches a store's cells at one requested task count."""

    row: PublishedRow
    store: str
    tasks: int


def _differences(row: PublishedRow, cell: dict[str, Any]) -> list[str]:
    """What of the backbone, the task count, the stream and the class count differs between a published row and a
    cell (empty: they match). Every published row streams disjoint tasks; a cell records its stream and classes
    (a hand-made cell without them is taken as disjoint, its class count unchecked)."""
    classes = cell.get("n_classes")
    return [what for what, differs in (("backbone", cell.get("encoder") != row.backbone),
                                       ("task count", cell["n_tasks"] != row.tasks),
                                       ("stream", cell.get("stream", "disjoint") != "disjoint"),
                                       ("class count", None not in (classes, row.classes) and classes != row.classes))
            if differs]


def _and(things: Sequence[str]) -> str:
    """``a``, ``a and the b``, ``a, the b and the c``."""
    return ", the ".join(things[:-1]) + (" and the " if len(things) > 1 else "") + things[-1]


def references(cells: Sequence[dict[str, Any]], rows: Sequence[PublishedRow] = PUBLISHED
               ) -> tuple[list[Reference], list[str]]:
    """The published rows that match a cell's benchmark, backbone, task count, stream and class count, and one line
    per near miss (a published group on a store's benchmark where one of those differs) saying what differs."""
    matched: list[Reference] = []
    missed: dict[tuple[str, str, str, str, str, str], tuple[list[str], list[str]]] = {}
    seen = set()
    for cell in cells:
        key = (cell["store"], cell["tasks"])
        if key in seen:
            continue
        seen.add(key)
        for row in rows:
            if dataset_key(row.benchmark) != dataset_key(cell.get("dataset") or ""):
                continue
            diffs = _differences(row, cell)
            if not diffs:
                matched.append(Reference(row, cell["store"], cell["tasks"]))
                continue
            theirs, ours = f"{row.tasks} tasks, {row.backbone}", f"{cell['n_tasks']} tasks, {cell.get('encoder')}"
            if "stream" in diffs:
                theirs, ours = f"{theirs}, disjoint tasks", f"{ours}, stream {cell.get('stream')}"
            if "class count" in diffs:
                theirs, ours = f"{theirs}, {row.classes} classes", f"{ours}, {cell.get('n_classes')} classes"
            group = missed.setdefault((row.source, row.benchmark, theirs, cell["store"], ours, str(diffs)), ([], diffs))
            group[0].append(row.method)
    why = [f"{', '.join(methods)} ({source}): {benchmark}, {theirs}; {store}: {ours}; the {_and(diffs)} "
           f"differ{'s' if len(diffs) == 1 else ''}, not comparable"
           for (source, benchmark, theirs, store, ours, _), (methods, diffs) in missed.items()]
    return matched, sorted(set(why))
