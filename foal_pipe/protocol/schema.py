"""``metrics.json`` and ``sweep.json``: one frozen type each, the only code that turns them into JSON and back.

A writer builds a :class:`LearnMetrics` or a :class:`SweepReport` and writes ``to_dict()``, which names the
file's ``format`` and ``format_version`` (zarr-python's ``parse_zarr_format``: a file says what it is); a reader
calls ``from_dict()``, which refuses another format or a version this foal-pipe does not know, reads a file without
them (written before they were recorded) as version 1, checks the type of every key it knows and refuses a
malformed file in one line that names the fix. A field that is ``None`` is not recorded (its key is left out),
so the files of earlier versions, which lack later keys, read as they are; keys this version does not know are
kept in ``extra`` and written back. The files are written with sorted keys (:func:`foal_pipe.io.write_json`): the
same record gives the same bytes. The machinery of typed keys is :mod:`foal_pipe.protocol.typedjson`.

Also the selection criteria (:data:`CRITERIA`) that ``selected_by`` names. Standard library only: the report,
and the command line's choices, read this module without NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from foal_pipe.core.metrics import SUMMARIES
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import METRICS_FILE, SWEEP_FILE
from foal_pipe.protocol.typedjson import (
    BOOLEAN,
    COUNT,
    CURVES,
    FRACTION,
    FRACTIONS,
    GAMMA,
    INTEGER,
    INTEGERS,
    MAPPING,
    MATRIX,
    NUMBER,
    NUMBER_BY_NAME,
    NUMBERS,
    PER_BOUNDARY,
    POSITIVE,
    POSITIVE_INTEGER,
    TASK_NAMES,
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
    shown,
)
from foal_pipe.protocol.typedjson import is_number as is_number  # the report's number test

#: The ``format`` of each file (its ``format_version``: :attr:`_Document.VERSION`).
METRICS_FORMAT = "foal-pipe/metrics"
SWEEP_FORMAT = "foal-pipe/sweep"
#: Per-result lists of a sweep, one value per task boundary (``null`` where that criterion was skipped).
CRITERION_KEYS = ("gcv", "loo_accuracy", "loo_mse")
_SWEEP_FIX = "re-run `foal-pipe sweep --out DIR` to write it"
#: A stream the metrics know how to summarise (:data:`foal_pipe.core.metrics.SUMMARIES`).
STREAM = _Kind(" or ".join(f'"{name}"' for name in SUMMARIES), lambda v: v in SUMMARIES)


@dataclass(frozen=True)
class Criterion:
    """How a gamma is chosen: the sweep result key judged at the last task boundary, and which way is better."""

    name: str
    key: str
    larger: bool
    #: How summary.md names it.
    description: str
    #: Its name in plot legends and tables.
    short: str
    #: Whether it needs the leave-one-out pass over the rows (GCV needs only the statistics).
    rows: bool = False


#: ``selected_by`` -> criterion: LOO MSE and GCV judge the training rows seen; ``test`` is an oracle.
CRITERIA: dict[str, Criterion] = {c.name: c for c in (
    Criterion("loo", "loo_mse", False, "leave-one-out MSE on the training rows seen", "LOO MSE", rows=True),
    Criterion("gcv", "gcv", False, "GCV (generalised cross-validation, from the Gram statistics alone)", "GCV"),
    Criterion("loo_accuracy", "loo_accuracy", True, "leave-one-out accuracy on the training rows seen (among "
              "equals, the least LOO MSE)", "LOO acc", rows=True),
    Criterion("test", "A_avg", True, "test A_avg (an oracle: it peeks at the test split)", "test A_avg"),
)}
#: The criteria of ``learn --gamma auto``, which never looks at the test split.
TRAINING_CRITERIA = ("loo", "gcv", "loo_accuracy")

SELECTOR = _Kind(f"criterion ({', '.join(CRITERIA)})", lambda v: v in CRITERIA)

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


@dataclass(frozen=True, kw_only=True)
class Accuracy(_Record):
    """The accuracy report of a matrix (:func:`foal_pipe.core.metrics.summarize`): fractions."""

    #: ``a[i][j]``: accuracy on task j after training through task i (row i has i+1 entries).
    accuracy_matrix: list[list[float]] | None = key(MATRIX)
    A_steps: list[float] | None = key(FRACTIONS)
    A_avg: float = key(FRACTION, required=True)
    A_last: float = key(FRACTION, required=True)
    F: float = key(NUMBER, required=True)
    F_published_code: float | None = key(NUMBER)


@dataclass(frozen=True, kw_only=True)
class StoreScore(_Record):
    """``learn --init-model --eval-features``: the final model on another store's test split."""

    features: str = key(TEXT, required=True)
    n_test: int = key(COUNT, required=True)
    accuracy: float = key(FRACTION, required=True)
    unknown_class_rows: int = key(COUNT, required=True)


@dataclass(frozen=True, kw_only=True)
class AnytimeCurve(_Record):
    """``learn --eval-every N``: the accuracy on the test rows of the classes seen so far after every N training
    rows, and the gamma of the weights there (docs/streams.md)."""

    eval_every: int = key(POSITIVE_INTEGER, required=True)
    samples_seen: list[int] = key(INTEGERS, required=True)
    accuracy: list[float] = key(FRACTIONS, required=True)
    gammas: list[float] | None = key(NUMBERS)

    @classmethod
    def parse_dict(cls, data: Any, where: str) -> AnytimeCurve:
        """One accuracy (and gamma) per point, the points strictly increasing: the plot and ``anytime.csv`` pair them."""
        record = super().parse_dict(data, where)
        n, seen = len(record.samples_seen), record.samples_seen
        for name in ("accuracy", "gammas"):
            if (values := getattr(record, name)) is not None and len(values) != n:
                raise _Invalid(f"{where} has {len(values)} entries under {name!r} but {n} points under 'samples_seen'")
        if any(b <= a for a, b in zip(seen, seen[1:])):
            raise _Invalid(f"{where} has 'samples_seen' not strictly increasing ({shown(seen)})")
        return record


@dataclass(frozen=True, kw_only=True)
class OrderMetrics(Accuracy):
    """One class order of ``learn --order-seeds``."""

    order_seed: int | None = key(INTEGER)
    tasks: list[list[int]] | None = key(TASKS)
    accuracy_matrix: list[list[float]] = key(MATRIX, required=True)
    gammas_selected: list[float] | None = key(NUMBERS)
    A_auc: float | None = key(FRACTION)
    anytime: AnytimeCurve | None = key(_record(AnytimeCurve, "anytime curve object"))
    #: Where the orders' streams differ (``--drop-last``, Si-Blurry's draws), this order's; the top level holds
    #: the first order's.
    n_train_seen: int | None = key(INTEGER)
    n_test: int | None = key(INTEGER)
    dropped_classes: list[int] | None = key(INTEGERS)
    disjoint_classes: list[int] | None = key(INTEGERS)
    blurred_rows: int | None = key(COUNT)


@dataclass(frozen=True, kw_only=True)
class GammaSearch(_Record):
    """A criterion's refined search of gamma: ``per_decade`` log-spaced ``gammas`` per decade of the grid's
    range (the same at every task boundary), the criterion's ``values`` there at each boundary (null where
    infinite), the gamma chosen at each boundary and whether it is an end of the range (the best may lie beyond).

    With a sampled leave-one-out (``--loo-sample``): the rows requested (``loo_sample``) and scored at each
    boundary (``sample_rows``), and Hoeffding's ``sample_eps`` there (0 where every row was scored): with
    probability >= ``1 - sample_delta`` every gamma's sampled value is within eps of its all-rows leave-one-out
    accuracy, so the choice's all-rows value is within 2 eps of the best searched gamma's.

    ``evaluated`` (leave-one-out's zoom, since ``metrics.json`` version 3 and ``sweep.json`` version 2): at each
    boundary the indices into ``gammas`` of the points evaluated, ascending, and ``values[k]`` holds the values at
    those points only; absent, every point was evaluated."""

    criterion: str = key(SELECTOR, required=True)
    per_decade: int = key(INTEGER, required=True)
    gammas: list[float] = key(_list_of(POSITIVE, "list of numbers > 0"), required=True)
    values: list[list[float | None]] = key(CURVES, required=True)
    evaluated: list[list[int]] | None = key(_list_of(_list_of(COUNT), "list of lists of indices"))
    gammas_selected: list[float] = key(NUMBERS, required=True)
    at_edge: list[bool] = key(_list_of(BOOLEAN), required=True)
    loo_sample: int | None = key(POSITIVE_INTEGER)
    sample_rows: list[int] | None = key(_list_of(COUNT))
    sample_eps: list[float] | None = key(NUMBERS)
    sample_delta: float | None = key(FRACTION)

    @classmethod
    def parse_dict(cls, data: Any, where: str) -> GammaSearch:
        """``evaluated`` must index ``gammas``, ascending, one index per value at every boundary: a reader pairs them."""
        record = super().parse_dict(data, where)
        if record.evaluated is not None:
            n = len(record.gammas)
            if len(record.evaluated) != len(record.values) or any(
                    len(e) != len(v) or e != sorted(set(e)) or (e and e[-1] >= n)
                    for e, v in zip(record.evaluated, record.values)):
                raise _Invalid(f"{where}: 'evaluated' should hold, at each boundary of 'values', the ascending indices "
                               f"into 'gammas' ({n}) of its values")
        return record


@dataclass(frozen=True, kw_only=True)
class SweepSelection(Accuracy, GammaSearch):
    """``sweep``: one criterion's refined choice at every boundary and the test accuracy of the models so chosen."""

    FIX: ClassVar[str] = _SWEEP_FIX
    accuracy_matrix: list[list[float]] = key(MATRIX, required=True)


@dataclass(frozen=True, kw_only=True)
class TaskScore(_Record):
    """One part of :class:`AllClasses`: a task of this run (``T1``, ... on the run's store) or the classes
    learned before it (``earlier``, on one ``--eval-features`` store)."""

    task: str = key(TEXT, required=True)
    features: str = key(TEXT, required=True)
    n_test: int = key(COUNT, required=True)
    accuracy: float = key(FRACTION, required=True)


@dataclass(frozen=True, kw_only=True)
class AllClasses(_Record):
    """``learn --init-model --eval-features``: the final model on the test rows of every class it has seen (the
    run's store's rows of this run's classes and the eval stores' rows of the classes learned before), as A_last
    reads in the literature; ``tasks``: the same per part (their rows add up to ``n_test``)."""

    A_last: float = key(FRACTION, required=True)
    n_test: int = key(COUNT, required=True)
    tasks: list[TaskScore] = key(_records(TaskScore, "list of task scores"), required=True)


LABEL_IDS = _Kind("mapping of label ids", lambda v: isinstance(v, dict) and all(INTEGER.accepts(x) for x in v.values()))


@dataclass(frozen=True, kw_only=True)
class Continuation(_Record):
    """``learn --init-model``: the model continued, the rows it has seen in all, the store's classes by the model's
    label ids, this run's classes by name, task by task as ``tasks`` (a continued model's label ids are not the
    store's), and the final model's scores on each ``--eval-features`` store."""

    init_model: str | None = key(TEXT)
    n_samples_seen_total: int | None = key(INTEGER)
    label_ids: dict[str, int] | None = key(LABEL_IDS)
    task_names: list[list[str]] | None = key(TASK_NAMES)
    eval_features: list[StoreScore] | None = key(_records(StoreScore, "list of store scores"))
    #: Written since the record came; older files read without it.
    all_classes: AllClasses | None = key(_record(AllClasses, "all-classes object"))


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
class HeadSweep(Accuracy):
    """``sweep --heads``: one head's accuracy, its hyperparameters (ridge: the gamma chosen by the sweep's
    criterion) and its exact leave-one-out accuracy on the training rows at the last boundary, where it has one."""

    FIX: ClassVar[str] = "re-run `foal-pipe sweep --heads ... --out DIR` to write it"
    accuracy_matrix: list[list[float]] = key(MATRIX, required=True)
    options: dict[str, Any] = key(MAPPING, required=True)
    loo_accuracy: float | None = key(FRACTION)
    #: With ``--order-seeds``: the std over the orders of A_avg, A_last and F (the fields above are means).
    std: dict[str, float] | None = key(NUMBER_BY_NAME)
    #: The rows the head ran on (its registry ``space``: ``features``, the store's, whatever ``--projection-dim``
    #: says, since the projection is ridge's here; ``activations``; ``projected``). Absent in older files.
    rows: str | None = key(TEXT)


def _heads_by_name(values: dict, where: str, key: str) -> dict[str, HeadSweep]:
    return {name: HeadSweep.parse_dict(v, f"{where}: {key}[{name!r}]") for name, v in values.items()}


HEAD_SWEEPS = _Kind("mapping of head entries", lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
                    _heads_by_name)


@dataclass(frozen=True, kw_only=True)
class SweepResult(Accuracy):
    """One gamma of a sweep: its test accuracy and, per task boundary, GCV and leave-one-out (sweeps written
    before those have none of the three keys: ``gcv`` is then None and none is written)."""

    FIX: ClassVar[str] = _SWEEP_FIX
    gamma: float = key(POSITIVE, required=True)
    gcv: list[float | None] | None = key(PER_BOUNDARY)
    loo_accuracy: list[float | None] | None = key(PER_BOUNDARY)
    loo_mse: list[float | None] | None = key(PER_BOUNDARY)
    #: With ``--order-seeds``: the std over the orders of A_avg, A_last and F (the fields above are means).
    std: dict[str, float] | None = key(NUMBER_BY_NAME)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.gcv is not None:  # without the leave-one-out pass its lists are null, not absent
            out.update(loo_accuracy=self.loo_accuracy, loo_mse=self.loo_mse)
        return out

    def criterion(self, name: str) -> float | None:
        """The value criterion ``name`` judges: its key at the last task boundary (None where not computed)."""
        value = getattr(self, CRITERIA[name].key)
        value = value[-1] if isinstance(value, list) and value else value
        return None if isinstance(value, list) else value


@dataclass(frozen=True, kw_only=True)
class LeaveOneOutRows(_Record):
    """``sweep``'s leave-one-out pass: the rows requested per boundary (``loo_sample``, 0: every row), the rows
    scored at each boundary and Hoeffding's ``sample_eps`` there at ``sample_delta`` (0 where every row seen was
    scored): it bounds the sampled LOO accuracies (values in [0, 1]); the sampled LOO MSEs are unbiased estimates
    without that bound. ``exact``: every boundary scored every row seen, so every leave-one-out figure is exact."""

    FIX: ClassVar[str] = _SWEEP_FIX
    loo_sample: int = key(COUNT, required=True)
    exact: bool = key(BOOLEAN, required=True)
    sample_rows: list[int] = key(_list_of(COUNT), required=True)
    sample_eps: list[float] = key(NUMBERS, required=True)
    sample_delta: float = key(FRACTION, required=True)


@dataclass(frozen=True, kw_only=True)
class FusionChoice(_Record):
    """``sweep --fusions``: a (fusion, gamma) chosen over every fusion x gamma, and by what."""

    FIX: ClassVar[str] = _SWEEP_FIX
    fusion: str = key(TEXT, required=True)
    gamma: float = key(NUMBER, required=True)
    selected_by: str | None = key(SELECTOR)


@dataclass(frozen=True, kw_only=True)
class FusionSweep(_Record):
    """``sweep --fusions``: one fusion's results and its own choices of gamma."""

    FIX: ClassVar[str] = _SWEEP_FIX
    fusion: str = key(TEXT, required=True)
    best_gamma: float | None = key(NUMBER)
    best_gamma_test: float | None = key(NUMBER)
    results: list[SweepResult] = key(_records(SweepResult, "list of results"), required=True)
    selections: list[SweepSelection] | None = key(_records(SweepSelection, "list of selections"))
    #: ``--heads``: this fusion's entry of every head.
    heads: dict[str, HeadSweep] | None = key(HEAD_SWEEPS)


@dataclass(frozen=True, kw_only=True)
class OrderSweep(_Record):
    """``sweep --order-seeds``: one class order's results and choice."""

    FIX: ClassVar[str] = _SWEEP_FIX
    order_seed: int | None = key(INTEGER)
    tasks: list[list[int]] | None = key(TASKS)
    best_gamma: float | None = key(NUMBER)
    results: list[SweepResult] = key(_records(SweepResult, "list of results"), required=True)
    #: ``--heads``: this order's entry of every head.
    heads: dict[str, HeadSweep] | None = key(HEAD_SWEEPS)
    #: As :class:`OrderMetrics`': this order's, where the orders' streams differ.
    n_train_seen: int | None = key(INTEGER)
    n_test: int | None = key(INTEGER)
    dropped_classes: list[int] | None = key(INTEGERS)
    disjoint_classes: list[int] | None = key(INTEGERS)
    blurred_rows: int | None = key(COUNT)


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
