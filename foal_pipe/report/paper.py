"""The paper's published F-OAL numbers as data, and the rule that says when a run is comparable.

Source: Zhuang et al., "F-OAL: Forward-only Online Analytic Learning", NeurIPS 2024
(``shared/paper/f-oal-neurips2024.tex``): Table 2 (``tab:performance``, the F-OAL row, mean of 3 runs)
and the appendix's gamma table (``tab:gamma``, A_avg for gamma = 1e2 .. 1e-3).

A run is *comparable* to a Table 2 column when its dataset is that column's dataset, it used the paper's
settings (:data:`PAPER_SETTINGS`, plus the column's number of tasks) and it saw the same data: as many
train and test rows as the paper's appendix states for that dataset, of the same feature dimension. Where
the appendix gives only per-class averages (CORe50, FGVCAircraft, Country211) the row counts cannot be
checked, so no match is claimed. :func:`match_paper` returns the row with the settings that differ, so a
summary can say why a run is not compared.
Choices where foal-pipe's defaults depart from the published code (input normalisation, last batch,
masking unseen classes, projection init) do not prevent a comparison; :func:`recipe_notes` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from foal_pipe.protocol.schema import LearnMetrics, RunSettings

PAPER = "F-OAL (NeurIPS 2024), Table 2"
PAPER_BACKBONE = "vit_base_patch16_224.augreg2_in21k_ft_in1k"

#: Where the paper's fusion puts the final norm, as an ``encoder``'s ``final_norm`` records it.
PAPER_NORM = "applied once to the block average"
#: The ``encoder.weights.source`` of the published weights of :data:`PAPER_BACKBONE` (a checkpoint or random
#: weights under that architecture are other weights).
PAPER_WEIGHTS = ("hf-hub", "url")
#: Settings every Table 2 run used (the number of tasks is per dataset: :attr:`PaperRow.n_tasks`).
PAPER_SETTINGS: dict[str, Any] = {
    "encoder": PAPER_BACKBONE,
    "fusion": "mean",
    "image_size": 224,
    "feature_dim": 768,
    "projection_dim": 1000,
    "activation": "sigmoid",
    "gamma": 1.0,
    "batch_size": 10,
}

#: What the published code does where foal-pipe's default differs (``metrics.json`` key -> value).
PUBLISHED_RECIPE: dict[str, Any] = {
    "normalize": False,
    "drop_last": True,
    "mask_unseen": False,
    "projection_init": "uniform",
}

GAMMAS = (1e2, 1e1, 1.0, 1e-1, 1e-2, 1e-3)


@dataclass(frozen=True)
class PaperRow:
    """One dataset's F-OAL results in the paper, in percent."""

    dataset: str
    title: str
    n_tasks: int
    A_avg: float
    A_last: float
    F: float
    #: The appendix's A_avg (percent) for each gamma in :data:`GAMMAS`; at gamma 1 it can differ from
    #: Table 2's A_avg (CORe50, FGVCAircraft, DTD): both are the paper's numbers.
    gamma_A_avg: tuple[float, ...] = field(default=())
    #: Train and test rows over the classes streamed, where the appendix states them exactly; ``None``
    #: where it gives only averages (then no run is claimed to match).
    n_train: int | None = None
    n_test: int | None = None
    #: Classes per task where the paper's split is not ``n_tasks`` equal tasks (CORe50: 10, then 8 x 5).
    task_sizes: tuple[int, ...] | None = None

    def metrics(self) -> dict[str, float]:
        """Table 2's numbers as fractions, keyed like ``metrics.json``."""
        return {"A_avg": self.A_avg / 100, "A_last": self.A_last / 100, "F": self.F / 100}


#: Row counts from the appendix's dataset descriptions: CIFAR-100 "5,000 images for training and 1,000 for
#: testing" per task of 10; DTD 40 classes of "40 training images and 40 testing images"; Tiny-ImageNet 200
#: classes of 500 with a 10,000-image test set. CORe50 ("2,398 training images and 900 testing images on
#: average"), FGVCAircraft ("33 ... on average") and Country211 ("150 train and test images per class") are
#: not exact, so they are ``None``.
TABLE2: tuple[PaperRow, ...] = (
    PaperRow("cifar100", "CIFAR-100", 10, 91.1, 86.5, 5.5, (91.1, 91.1, 91.1, 90.8, 90.3, 87.2), 50_000, 10_000),
    PaperRow("core50", "CORe50", 9, 96.3, 92.5, 3.9, (95.3, 95.3, 95.3, 95.2, 93.6, 89.9), task_sizes=(10, *[5] * 8)),
    PaperRow("fgvcaircraft", "FGVCAircraft", 10, 62.2, 54.0, 10.0, (55.1, 59.5, 61.1, 47.1, 34.9, 22.4)),
    PaperRow("dtd", "DTD", 10, 82.8, 75.9, 10.1, (70.3, 75.2, 81.6, 81.5, 79.1, 70.8), 1_600, 1_600),
    PaperRow("tinyimagenet", "Tiny-ImageNet", 10, 91.2, 87.3, 5.0, (91.2, 91.2, 91.2, 90.9, 90.3, 89.8), 100_000,
             10_000),
    PaperRow("country211", "Country211", 10, 24.4, 17.5, 6.9, (23.2, 23.3, 24.4, 22.6, 21.3, 17.4)),
)


def dataset_key(name: str) -> str:
    """Normalise a dataset name for matching: ``"FGVC-Aircraft"``, ``"fgvc_aircraft"`` -> ``"fgvcaircraft"``."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def paper_row(dataset: str) -> PaperRow | None:
    """The Table 2 column for ``dataset`` (any spelling), or ``None`` if the paper has none."""
    key = dataset_key(dataset)
    return next((row for row in TABLE2 if row.dataset == key), None)


@dataclass(frozen=True)
class PaperMatch:
    """The paper's row for a run's dataset and the settings in which the run differs from it."""

    row: PaperRow
    differences: tuple[str, ...]

    @property
    def comparable(self) -> bool:
        return not self.differences


#: A run as :func:`match_paper` reads it: a ``metrics.json`` or ``sweep.json`` record, or such a dict.
RunLike = RunSettings | Mapping[str, Any]


def _record(run: RunLike) -> tuple[RunSettings, Any]:
    """The run's settings and its gamma (a sweep has none: it varies gamma); a dict is read as a record."""
    if isinstance(run, RunSettings):
        return run, run.gamma if isinstance(run, LearnMetrics) else None
    return RunSettings.from_dict(dict(run), "the run's settings"), run.get("gamma")


def run_settings(run: RunLike) -> dict[str, Any]:
    """The settings :func:`match_paper` compares.

    Rows: ``n_train_seen`` (the training rows streamed) and ``n_test`` (the test rows of the classes
    streamed); the feature dimension: ``feature_dim``, else the store's ``encoder.dim``.
    """
    settings, gamma = _record(run)
    encoder = settings.encoder or {}
    n_tasks = settings.n_tasks
    if n_tasks is None and settings.tasks is not None:
        n_tasks = len(settings.tasks)
    return {
        "encoder": encoder.get("name"),
        "fusion": encoder.get("fusion"),
        "token": encoder.get("token", "cls"),
        "image_size": encoder.get("image_size"),
        "feature_dim": encoder.get("dim") if settings.feature_dim is None else settings.feature_dim,
        "projection_dim": settings.projection_dim,
        "activation": settings.activation or "sigmoid",  # files from before --activation: the sigmoid
        "gamma": gamma,
        "batch_size": settings.batch_size,
        "n_tasks": n_tasks,
        "n_train": settings.n_train_seen,
        "n_test": settings.n_test,
    }


_LABELS = {
    "encoder": "encoder",
    "fusion": "fusion",
    "token": "token",
    "image_size": "image size",
    "feature_dim": "feature dimension",
    "projection_dim": "projection dim D",
    "activation": "activation",
    "gamma": "gamma",
    "batch_size": "batch size",
    "n_tasks": "tasks",
    "n_train": "train rows",
    "n_test": "test rows",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(key: str, ours: Any, paper: Any) -> bool:
    if ours is None:
        return False
    if key == "gamma":
        return _number(ours) and abs(float(ours) - float(paper)) <= 1e-12 * max(1.0, abs(float(paper)))
    if key == "fusion":
        return dataset_key(ours) in {"mean", "meancls", "blockmean"}
    if key == "token":
        return dataset_key(ours) == "cls"
    return ours == paper


def _show(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1000:
        return f"{value:,}"
    return str(value)


def match_paper(metrics: RunLike, *, ignore: tuple[str, ...] = ()) -> PaperMatch | None:
    """Compare a run with the paper's Table 2.

    Parameters
    ----------
    metrics : LearnMetrics, SweepReport or mapping
        A ``metrics.json`` (or ``sweep.json``) record or dict: ``dataset``, ``encoder``, ``projection_dim``,
        ``gamma``, ``batch_size``, ``n_tasks`` (or ``tasks``), ``n_train_seen``, ``n_test`` and
        ``feature_dim`` (or ``encoder.dim``) are read.
    ignore : tuple of str
        Settings not to compare (a sweep varies ``"gamma"``).

    Returns
    -------
    PaperMatch or None
        ``None`` when the paper has no column for the dataset; otherwise the row and a tuple of
        human-readable differences such as ``"gamma 0.1 (paper 1)"``, empty when comparable.
    """
    settings, _ = _record(metrics)
    row = paper_row(settings.dataset or "")
    if row is None:
        return None
    ours = run_settings(metrics)
    wanted = dict(PAPER_SETTINGS, token="cls", n_tasks=row.n_tasks)
    differences = [
        f"{_LABELS[key]} {_show(ours[key])} (paper {_show(value)})"
        for key, value in wanted.items()
        if key not in ignore and not _same(key, ours[key], value)
    ]
    encoder = settings.encoder or {}
    norm = encoder.get("final_norm")
    if "fusion" not in ignore and norm is not None and norm != PAPER_NORM:  # older records: the norm always applied
        differences.append(f"final norm {norm} (paper: {PAPER_NORM})")
    source = (encoder.get("weights") or {}).get("source")
    if "encoder" not in ignore and source is not None and source not in PAPER_WEIGHTS:
        differences.append(f"weights from {source} (paper: {PAPER_BACKBONE}'s published weights)")
    head = getattr(settings, "head", None)
    if head is not None:  # learn --head: the paper's numbers are F-OAL's ridge
        differences.insert(0, f"head {head} (paper: F-OAL's ridge)")
    continued = _init_model(metrics)
    if continued is not None:  # learn --init-model: the model had learned other rows first
        differences.append(f"a continued model (learn --init-model {continued}; paper: trained from scratch on this "
                           "stream)")
    if settings.stream not in (None, "disjoint"):
        differences.append(f"stream {settings.stream} (paper: disjoint tasks)")
    sizes = [len(t) for t in settings.tasks or []]
    uneven = len(set(sizes)) > 1
    kept = "; the published code drops the classes left over by an even split: --drop-remainder" if uneven else ""
    hinted = False  # the row counts' differences already name the uneven split
    for key in ("n_train", "n_test"):
        paper = getattr(row, key)
        if paper is None:
            differences.append(f"{_LABELS[key]} {_show(ours[key])} (the paper gives no exact count for {row.title})")
        elif not _same(key, ours[key], paper):
            differences.append(f"{_LABELS[key]} {_show(ours[key])} (paper {_show(paper)}{kept})")
            hinted = bool(kept)
    if settings.stream in (None, "disjoint") and len(sizes) == row.n_tasks and not hinted and (
            sizes != list(row.task_sizes) if row.task_sizes else uneven):  # the task count alone does not fix the split
        paper_sizes = _sizes(list(row.task_sizes)) if row.task_sizes else f"{row.n_tasks} equal tasks"
        differences.append(f"classes per task {_sizes(sizes)} (paper {paper_sizes})")
    return PaperMatch(row, tuple(differences))


def _sizes(sizes: list[int]) -> str:
    """Classes per task, runs of equal tasks shortened: ``55, 9 x 5``."""
    runs = [(size, len(list(group))) for size, group in groupby(sizes)]
    return ", ".join(str(size) if n == 1 else f"{n} x {size}" for size, n in runs)


def _init_model(run: RunLike) -> str | None:
    """The model a ``learn --init-model`` run continued (``?`` where not recorded), None for a fresh run; a dict as
    ``metrics.json`` holds it (version 1: ``init_model`` at the top level)."""
    if isinstance(run, RunSettings):
        continued = getattr(run, "continuation", None)
        return None if continued is None else continued.init_model or "?"
    record = run.get("continuation")
    if isinstance(record, Mapping):
        return str(record.get("init_model") or "?")
    return None if run.get("init_model") is None else str(run["init_model"])


def recipe_notes(metrics: RunLike) -> list[str]:
    """Where a run departs from the published code in ways that do not block a comparison."""
    settings, _ = _record(metrics)
    encoder = settings.encoder or {}
    seen = {"normalize": encoder.get("normalize"),
            **{k: getattr(settings, k) for k in PUBLISHED_RECIPE if k != "normalize"}}
    return [
        f"{key.replace('_', ' ')} {seen[key]} (published code: {value})"
        for key, value in PUBLISHED_RECIPE.items()
        if seen[key] is not None and seen[key] != value
    ]
