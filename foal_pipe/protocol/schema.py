"""``metrics.json`` and ``sweep.json``: one frozen type each, the only code that turns them into JSON and back.

A writer builds a :class:`LearnMetrics` or a :class:`SweepReport` and writes ``to_dict()``, which names the
file's ``format`` and ``format_version`` (zarr-python's ``parse_zarr_format``: a file says what it is); a reader
calls ``from_dict()``, which refuses another format or a version this foal-pipe does not know, reads a file without
them (written before they were recorded) as version 1, checks the type of every key it knows and refuses a
malformed file in one line that names the fix. A field that is ``None`` is not recorded (its key is left out),
so the files of earlier versions, which lack later keys, read as they are; keys this version does not know are
kept in ``extra`` and written back. The files are written with sorted keys (:func:`foal_pipe.io.write_json`): the
same record gives the same bytes. The machinery of typed keys is :mod:`foal_pipe.protocol.typedjson`.

The records nested in them are in :mod:`foal_pipe.protocol.metricsparts` and :mod:`foal_pipe.protocol.sweepparts`,
the selection criteria (:data:`CRITERIA`) that ``selected_by`` names in :mod:`foal_pipe.protocol.criteria`; the
documented ones are imported from here. Standard library only: the report, and the command line's choices, read
these modules without NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from foal_pipe.core.metrics import SUMMARIES
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import METRICS_FILE, SWEEP_FILE
from foal_pipe.protocol.criteria import CRITERIA as CRITERIA  # documented here: docs/python-api.md
from foal_pipe.protocol.criteria import SELECTOR
from foal_pipe.protocol.metricsparts import Accuracy, AnytimeCurve, Continuation, GammaSearch, OrderMetrics
from foal_pipe.protocol.metricsparts import StoreScore as StoreScore  # documented here: docs/python-api.md
from foal_pipe.protocol.sweepparts import (
    _SWEEP_FIX,
    HEAD_SWEEPS,
    FusionChoice,
    FusionSweep,
    LeaveOneOutRows,
    OrderSweep,
    SweepResult,
    SweepSelection,
)
from foal_pipe.protocol.sweepparts import HeadSweep as HeadSweep  # documented here: docs/api.md
from foal_pipe.protocol.typedjson import (
    BOOLEAN,
    COUNT,
    FRACTION,
    GAMMA,
    INTEGER,
    INTEGERS,
    MAPPING,
    MATRIX,
    NUMBER,
    NUMBER_BY_NAME,
    NUMBERS,
    POSITIVE,
    TASKS,
    TEXT,
    _Document,
    _Invalid,
    _Kind,
    _list_of,
    _Record,
    _record,
    _records,
    key,
)
from foal_pipe.protocol.typedjson import is_number as is_number  # the report's number test

#: The ``format`` of each file (its ``format_version``: :attr:`_Document.VERSION`).
METRICS_FORMAT = "foal-pipe/metrics"
SWEEP_FORMAT = "foal-pipe/sweep"
#: A stream the metrics know how to summarise (:data:`foal_pipe.core.metrics.SUMMARIES`).
STREAM = _Kind(" or ".join(f'"{name}"' for name in SUMMARIES), lambda v: v in SUMMARIES)


@dataclass(frozen=True, kw_only=True)
class RunSettings(_Record):
    """What both files record of a run: the stream, the model's settings, and the store it read."""

    tasks: list[list[int]] | None = key(TASKS)
    n_tasks: int | None = key(INTEGER)
    dropped_classes: list[int] | None = key(INTEGERS)
    drop_remainder: bool | None = key(BOOLEAN)
    projection_dim: int | None = key(INTEGER)
    projection_init: str | None = key(TEXT)
    activation: str | None = key(TEXT)
    batch_size: int | None = key(INTEGER)
    drop_last: bool | None = key(BOOLEAN)
    mask_unseen: bool | None = key(BOOLEAN)
    seed: int | None = key(INTEGER)
    order_seed: int | None = key(INTEGER)
    backend: str | None = key(TEXT)
    dtype: str | None = key(TEXT)
    n_train_seen: int | None = key(INTEGER)
    n_test: int | None = key(INTEGER)
    feature_dim: int | None = key(INTEGER)
    dataset: str | None = key(TEXT)
    #: The store's encoder provenance (:attr:`foal_pipe.store.meta.StoreMeta.encoder`).
    encoder: dict[str, Any] | None = key(MAPPING)
    features: str | None = key(TEXT)
    #: Wall seconds, in files written before they moved to ``timings.json``.
    seconds: float | None = key(NUMBER)
    #: ``--stream si-blurry`` (docs/streams.md): its ratios (%), the classes seen in one task only, and the rows
    #: of the other classes dealt over the tasks. Not recorded for the default disjoint stream.
    stream: str | None = key(STREAM)
    disjoint_ratio: int | None = key(COUNT)
    blurry_ratio: int | None = key(COUNT)
    disjoint_classes: list[int] | None = key(INTEGERS)
    blurred_rows: int | None = key(COUNT)


#: The first ``metrics.json`` version whose every run records ``model_checksum`` beside its model file (the key came
#: during version 2): a file of this version or later with a model file but without it was damaged or edited.
CHECKSUM_VERSION = 3

#: The keys version 1 of ``metrics.json`` kept at the top level and version 2 keeps in ``continuation``.
CONTINUATION_KEYS = tuple(f.name for f in fields(Continuation) if f.name != "extra")


@dataclass(frozen=True, kw_only=True)
class LearnMetrics(Accuracy, RunSettings, _Document):
    """``metrics.json``: the accuracy after every task, the settings, and what ``--gamma auto``,
    ``--init-model`` (:attr:`continuation`) and ``--order-seeds`` add (with many orders the headline numbers are
    means over them).

    Version 2 keeps a continuation's keys in ``continuation``; a version 1 file (or one without a version) has them
    at the top level and reads into the same record. Version 3: ``gamma_search`` may hold only the points its zoom
    evaluated (:attr:`GammaSearch.evaluated`)."""

    NAME: ClassVar[str] = METRICS_FILE
    FORMAT: ClassVar[str] = METRICS_FORMAT
    VERSION: ClassVar[int] = 3

    accuracy_matrix: list[list[float]] = key(MATRIX, required=True)
    gamma: float | str | None = key(GAMMA)
    engine: str | None = key(TEXT)
    gammas_selected: list[float] | None = key(NUMBERS)
    selected_by: str | None = key(SELECTOR)
    gamma_grid: list[float] | None = key(NUMBERS)
    gammas_at_grid_edge: list[bool] | None = key(_list_of(BOOLEAN))
    #: ``--gamma auto``: the criterion's refined search (``gammas_selected`` are its choices).
    gamma_search: GammaSearch | None = key(_record(GammaSearch, "gamma search object"))
    continuation: Continuation | None = key(_record(Continuation, "continuation object"))
    #: The ``checksum`` of the model file the run wrote: ``evaluate`` refuses another model as the run's.
    model_checksum: str | None = key(TEXT)
    order_seeds: list[int] | None = key(INTEGERS)
    orders: list[OrderMetrics] | None = key(_records(OrderMetrics, "list of class orders"))
    mean: dict[str, float] | None = key(NUMBER_BY_NAME)
    std: dict[str, float] | None = key(NUMBER_BY_NAME)
    one_pass: bool | None = key(BOOLEAN)
    #: ``--eval-every``: the mean of ``anytime``'s accuracies (Koh et al. 2022); with ``--order-seeds`` the
    #: mean over the orders (each order's curve and A_auc in ``orders``).
    A_auc: float | None = key(FRACTION)
    anytime: AnytimeCurve | None = key(_record(AnytimeCurve, "anytime curve object"))
    #: ``learn --head``: the head other than ridge (absent for ridge) and its options, defaults included.
    head: str | None = key(TEXT)
    head_options: dict[str, Any] | None = key(MAPPING)
    #: ``--head-rows``: the rows the head took, where the run chose other rows than the head's own.
    head_rows: str | None = key(TEXT)

    @classmethod
    def parse_dict(cls, data: Any, where: str) -> LearnMetrics:
        """Version 1's top-level continuation keys read into :attr:`continuation`."""
        if isinstance(data, dict) and data.get("format_version", 1) == 1 and "continuation" not in data:
            moved = {k: data[k] for k in CONTINUATION_KEYS if k in data}
            if moved:
                data = {**{k: v for k, v in data.items() if k not in moved}, "continuation": moved}
        return super().parse_dict(data, where)


@dataclass(frozen=True, kw_only=True)
class SweepReport(RunSettings, _Document):
    """``sweep.json``: every gamma's results, the gamma chosen by ``selected_by`` and the test oracle's, the
    settings; with ``--fusions`` the single-sweep keys are the chosen fusion's, with ``--order-seeds`` means.
    Version 2: a selection may hold only the points its zoom evaluated (:attr:`GammaSearch.evaluated`)."""

    FIX: ClassVar[str] = _SWEEP_FIX
    NAME: ClassVar[str] = SWEEP_FILE
    FORMAT: ClassVar[str] = SWEEP_FORMAT
    VERSION: ClassVar[int] = 2
    gammas: list[float] | None = key(_list_of(POSITIVE, "list of numbers > 0"))
    best_gamma: float | None = key(NUMBER)
    best_gamma_test: float | None = key(NUMBER)
    selected_by: str | None = key(SELECTOR)
    results: list[SweepResult] = key(_records(SweepResult, "list of results"), required=True)
    best_gamma_at_grid_edge: bool | None = key(BOOLEAN)
    #: Every criterion's refined search and the test accuracy of its choices (``best_gamma`` stays the grid's).
    selections: list[SweepSelection] | None = key(_records(SweepSelection, "list of selections"))
    #: The rows the leave-one-out figures scored (``--loo-sample``) and their bound; absent with ``--no-loo``.
    leave_one_out: LeaveOneOutRows | None = key(_record(LeaveOneOutRows, "leave-one-out rows object"))
    fusion: str | None = key(TEXT)
    fusion_norm: bool | None = key(BOOLEAN)
    best: FusionChoice | None = key(_record(FusionChoice, "(fusion, gamma) object"))
    best_test: FusionChoice | None = key(_record(FusionChoice, "(fusion, gamma) object"))
    fusions: list[FusionSweep] | None = key(_records(FusionSweep, "list of fusion entries"))
    orders: list[OrderSweep] | None = key(_records(OrderSweep, "list of class orders"))
    order_seeds: list[int] | None = key(INTEGERS)
    one_pass: bool | None = key(BOOLEAN)
    #: ``--heads``: every head's entry, the head of best leave-one-out accuracy (null when no head has one), how
    #: it was chosen, and the test oracle's head, labelled as such.
    heads: dict[str, HeadSweep] | None = key(HEAD_SWEEPS)
    best_head: str | None = key(TEXT)
    best_head_selected_by: str | None = key(TEXT)
    best_head_test: str | None = key(TEXT)


def check_matrix(matrix: Any, where: str) -> list[list[float]]:
    """A lower-triangular accuracy matrix, validated: row i has i+1 fractions in [0, 1]."""
    try:
        return MATRIX.parse(matrix, where, "accuracy_matrix")
    except _Invalid as exc:
        raise FoalPipeError(f"{exc}; re-run `foal-pipe learn`") from None


def same_gamma(a: float, b: float) -> bool:
    """Two gammas of one grid, read back from JSON."""
    return math.isclose(a, b, rel_tol=1e-9)
