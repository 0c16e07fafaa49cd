"""The records nested in ``sweep.json``: each gamma's results, a criterion's choice, a head's, a fusion's and a class
order's entries, and the rows the leave-one-out figures scored.

Apart from the file's own record (:class:`foal_pipe.protocol.schema.SweepReport`), which holds them and is where the
documented ones are imported from; they build on the accuracy records of :mod:`foal_pipe.protocol.metricsparts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from foal_pipe.protocol.criteria import CRITERIA, SELECTOR
from foal_pipe.protocol.metricsparts import Accuracy, GammaSearch
from foal_pipe.protocol.typedjson import (
    BOOLEAN,
    COUNT,
    FRACTION,
    INTEGER,
    INTEGERS,
    MAPPING,
    MATRIX,
    NUMBER,
    NUMBER_BY_NAME,
    NUMBERS,
    PER_BOUNDARY,
    POSITIVE,
    TASKS,
    TEXT,
    _Kind,
    _list_of,
    _Record,
    _record,
    _records,
    key,
)

#: Per-result lists of a sweep, one value per task boundary (``null`` where that criterion was skipped).
CRITERION_KEYS = ("gcv", "loo_accuracy", "loo_mse")
_SWEEP_FIX = "re-run `foal-pipe sweep --out DIR` to write it"


@dataclass(frozen=True, kw_only=True)
class SweepSelection(Accuracy, GammaSearch):
    """``sweep``: one criterion's refined choice at every boundary and the test accuracy of the models so chosen."""

    FIX: ClassVar[str] = _SWEEP_FIX
    accuracy_matrix: list[list[float]] = key(MATRIX, required=True)


@dataclass(frozen=True, kw_only=True)
class HeadSweep(Accuracy):
    """``sweep --heads``: one head's accuracy, its hyperparameters (ridge: the gamma chosen by the sweep's
    criterion) and its leave-one-out accuracy on the training rows at the last boundary, where it has one (exact;
    ridge's on the ``--loo-sample`` rows, as ``leave_one_out`` records)."""

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
    #: This order's leave-one-out rows and bound, where the orders' differ (a boundary that saw fewer rows than
    #: ``--loo-sample`` in one order scored them all, exactly); the top level holds the first order's. Absent in
    #: older files.
    leave_one_out: LeaveOneOutRows | None = key(_record(LeaveOneOutRows, "leave-one-out rows object"))


