"""The records nested in ``metrics.json``: the accuracy report and its curves, a class order, the gamma search, and
what a continued model adds; the records of ``sweep.json`` (:mod:`foal_pipe.protocol.sweepparts`) build on the first.

Apart from the file's own record (:class:`foal_pipe.protocol.schema.LearnMetrics`), which holds them and is where the
documented ones are imported from; their keys are typed as the file's are (:mod:`foal_pipe.protocol.typedjson`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foal_pipe.protocol.criteria import SELECTOR
from foal_pipe.protocol.typedjson import (
    BOOLEAN,
    COUNT,
    CURVES,
    FRACTION,
    FRACTIONS,
    INTEGER,
    INTEGERS,
    MATRIX,
    NUMBER,
    NUMBERS,
    PER_BOUNDARY,
    POSITIVE,
    POSITIVE_INTEGER,
    TASK_NAMES,
    TASKS,
    TEXT,
    _Invalid,
    _Kind,
    _list_of,
    _Record,
    _record,
    _records,
    key,
    shown,
)


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
    #: With a sampled leave-one-out, where the orders' differ (a boundary that saw at most ``--loo-sample`` rows in
    #: one order scored them all): this order's rows scored and Hoeffding's eps at each boundary (``gamma_search``'s).
    sample_rows: list[int] | None = key(_list_of(COUNT))
    sample_eps: list[float] | None = key(NUMBERS)


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
    those points only; absent, every point was evaluated.

    ``resolution_floor`` (``learn --gamma auto``, where the sums could not resolve the grid's least gammas, as in
    float32): at each boundary the sums' resolution where the search left out the gammas at or below it, null
    where it left out none; ``evaluated`` then starts above it."""

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
    resolution_floor: list[float | None] | None = key(PER_BOUNDARY)

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

