"""The criteria that choose gamma (:data:`CRITERIA`), by the names that ``selected_by`` and ``--select`` give.

Apart from the records of :mod:`foal_pipe.protocol.schema`, which name them, so that the command line's choices,
the solvers and the report read them from one place. Standard library only, as the records are.
"""

from __future__ import annotations

from dataclasses import dataclass

from foal_pipe.protocol.typedjson import _Kind


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
