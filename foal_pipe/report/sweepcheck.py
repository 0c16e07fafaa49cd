"""What a ``sweep.json``'s record types cannot check: its fields agreeing with each other.

``sweep`` writes every list per task boundary with one value per row of the accuracy matrix, every headline number
as its matrix gives it (with ``--order-seeds``: as the mean over the orders), and every choice (``best_gamma``,
``best_head``, ``best``, ...) as its criterion's rule picks it from the recorded values (:mod:`foal_pipe.protocol.records`),
each refined search over its grid, the leave-one-out rows and bounds as ``--loo-sample`` gives them and, with
``--order-seeds``, a head's per-order options as each order records them.
A hand-edited file that contradicts itself is refused in one line naming the field and the fix where the
contradiction is structural or a choice; a headline number that disagrees with its matrix is shown recomputed, with
a warning (as :func:`~foal_pipe.report.readers.as_recomputed` does for ``metrics.json``). Where the recorded values
cannot determine a choice (no criterion values, a tie its record cannot break), only membership is checked.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.metricsparts import Accuracy
from foal_pipe.protocol.schema import SweepReport, same_gamma
from foal_pipe.protocol.sweepparts import (
    CRITERION_KEYS,
    FusionSweep,
    HeadSweep,
    LeaveOneOutRows,
    OrderSweep,
    SweepResult,
    SweepSelection,
)
from foal_pipe.protocol.typedjson import is_number, shown
from foal_pipe.report.metricscheck import differs, headline_numbers

#: The headline numbers of one result, head or selection, checked against its accuracy matrix.
NUMBERS = ("A_avg", "A_last", "F", "F_published_code")
_FIX = SweepReport.FIX
A = TypeVar("A", bound=Accuracy)


class _Check:
    """One file's checks: its path (for the messages), its stream (how a matrix is summarised), the warnings."""

    def __init__(self, sweep: SweepReport, path: Path) -> None:
        self.path, self.stream = path, sweep.stream
        self.warnings: list[str] = []
        self.rows = _rows(sweep, path)

    def refuse(self, text: str) -> FoalPipeError:
        return FoalPipeError(f"{self.path}: {text}; {_FIX}")

    def counts(self, where: str, matrix: list[list[float]] | None, lists: dict[str, Any]) -> None:
        """``matrix`` has one row per task and each list of ``lists`` one entry per row (task boundary)."""
        if self.rows is None:
            return
        if matrix is not None and len(matrix) != self.rows:
            raise self.refuse(f"{where}'accuracy_matrix' has {len(matrix)} rows but the sweep has {self.rows} tasks")
        for name, values in lists.items():
            if isinstance(values, list) and len(values) != self.rows:
                raise self.refuse(f"{where}{name!r} has {len(values)} entries but the sweep has {self.rows} task "
                                  "boundaries (one per row of 'accuracy_matrix')")

    def recomputed(self, record: A, where: str) -> A:
        """``record`` with each headline number (and ``A_steps``) that disagrees with its matrix replaced by the
        matrix's (a warning names each)."""
        if record.accuracy_matrix is None:
            return record
        fresh = headline_numbers(record.accuracy_matrix, self.stream, None)
        changes: dict[str, Any] = {}
        for key in NUMBERS:
            stored = getattr(record, key)
            if stored is not None and key in fresh and differs(stored, fresh[key]):
                self.warnings.append(f"{where}{key} is {stored:.6f} but its accuracy matrix gives {fresh[key]:.6f} (shown)")
                changes[key] = fresh[key]
        steps = record.A_steps
        if steps is not None and (len(steps) != len(fresh["A_steps"])
                                  or any(differs(s, r) for s, r in zip(steps, fresh["A_steps"]))):
            self.warnings.append(f"{where}A_steps disagrees with its accuracy matrix (the matrix's shown)")
            changes["A_steps"] = fresh["A_steps"]
        return replace(record, **changes) if changes else record


def checked_sweep(sweep: SweepReport, path: Path) -> tuple[SweepReport, list[str]]:
    """``sweep`` (results sorted by gamma, as :func:`~foal_pipe.report.readers.read_sweep` gives it) checked: a
    contradiction refused, a headline number its matrix contradicts shown recomputed, and the warnings that name
    each. A choice stands where the values the file records, or those shown, give it."""
    check = _Check(sweep, path)
    _structure(check, sweep)
    fixed = _numbers(check, sweep)
    try:  # over the recorded values, as sweep chose; else over those shown (a number its matrix contradicts, warned)
        _choices(check, sweep)
    except FoalPipeError:
        _choices(check, fixed)
    return fixed, check.warnings


def _rows(sweep: SweepReport, path: Path) -> int | None:
    """The sweep's number of tasks: ``n_tasks``, ``tasks`` and the first result's matrix agree on it (None: a file
    too old to record any of them)."""
    first = sweep.results[0].accuracy_matrix
    rows = len(first) if first is not None else sweep.n_tasks if sweep.n_tasks is not None else \
        None if sweep.tasks is None else len(sweep.tasks)
    for name, n in (("'n_tasks' is", sweep.n_tasks), ("'tasks' has", None if sweep.tasks is None else len(sweep.tasks))):
        if n is not None and n != rows:
            said = f"{name} {n}" + (" entries" if name.startswith("'tasks'") else "")
            raise FoalPipeError(f"{path}: {said} but 'accuracy_matrix' of results[0] has {rows} rows (one per task); "
                                f"{_FIX}")
    return rows


# ----------------------------------------------------------------------------------------------
# Structure: counts, gammas, names


def _structure(check: _Check, sweep: SweepReport) -> None:
    gammas = _results(check, sweep.results, "")
    if sweep.gammas is not None and sorted(sweep.gammas) != gammas and not (
            len(sweep.gammas) == len(gammas) and all(same_gamma(a, b) for a, b in zip(sorted(sweep.gammas), gammas))):
        raise check.refuse(f"'gammas' ({_listed(sweep.gammas)}) should list the gammas of 'results' ({_listed(gammas)})")
    _selections(check, sweep, sweep.selections, "")
    _leave_one_out(check, sweep)
    _samples(check, sweep.leave_one_out, sweep.selections, "")
    _heads(check, sweep.heads, "")
    for i, entry in enumerate(sweep.fusions or ()):
        _same_gammas(check, _results(check, entry.results, f"fusions[{i}]: "), gammas, f"fusions[{i}]")
        _selections(check, sweep, entry.selections, f"fusions[{i}]: ")
        _samples(check, sweep.leave_one_out, entry.selections, f"fusions[{i}]: ")
        _heads(check, entry.heads, f"fusions[{i}]: ")
    if sweep.orders is not None:
        _orders(check, sweep, gammas)


def _results(check: _Check, results: list[SweepResult], where: str) -> list[float]:
    """Each result's counts; its gammas (ascending), each once."""
    for r in results:
        check.counts(f"{where}results[gamma {r.gamma:g}]: ", r.accuracy_matrix,
                     {"A_steps": None, **{k: getattr(r, k) for k in CRITERION_KEYS}})
    gammas = [r.gamma for r in results]
    for a, b in zip(gammas, gammas[1:]):
        if a == b:  # exactly: sweep --gammas 1,1.0000000000000002 sweeps two
            raise check.refuse(f"{where}'results' holds gamma {a:g} twice; each gamma has one result")
    return gammas


def _same_gammas(check: _Check, theirs: list[float], ours: list[float], where: str) -> None:
    if len(theirs) != len(ours) or not all(same_gamma(a, b) for a, b in zip(theirs, ours)):
        raise check.refuse(f"{where} has results for gammas {_listed(theirs)} but 'results' for {_listed(ours)}")


def _selections(check: _Check, sweep: SweepReport, selections: list[SweepSelection] | None, where: str) -> None:
    """Each criterion once, its lists one per boundary and its points the refined grid of the sweep's ``gammas``
    (:func:`~foal_pipe.core.gammasearch.search_grid`, as :func:`~foal_pipe.protocol.records.gamma_search` records it)."""
    from foal_pipe.core.gammasearch import search_grid

    criteria = [s.criterion for s in selections or ()]
    for i, s in enumerate(selections or ()):
        if criteria.count(s.criterion) > 1:
            raise check.refuse(f"{where}'selections' holds criterion {s.criterion!r} twice; each criterion has one entry")
        check.counts(f"{where}selections[{i}]: ", s.accuracy_matrix,
                     {k: getattr(s, k) for k in ("values", "gammas_selected", "at_edge", "sample_rows", "sample_eps")})
        at = f"{where}selections[{s.criterion!r}]: "
        if sweep.gammas:
            try:
                grid = search_grid(sweep.gammas, s.per_decade).tolist()
            except FoalPipeError:
                raise check.refuse(f"{at}'per_decade' {s.per_decade} gives no refined search of 'gammas'") from None
            if len(grid) != len(s.gammas) or not all(same_gamma(a, b) for a, b in zip(grid, s.gammas)):
                raise check.refuse(f"{at}'gammas' ({len(s.gammas)} points) should be the {len(grid)} points of 'per_decade' "
                                   f"{s.per_decade} over 'gammas' ({min(sweep.gammas):g} .. {max(sweep.gammas):g})")


def _samples(check: _Check, loo: LeaveOneOutRows | None, selections: list[SweepSelection] | None, where: str) -> None:
    """A leave-one-out criterion's sample is ``leave_one_out``'s (none where it scored every row); other criteria
    have none."""
    if loo is None:
        return
    for s in selections or ():
        sampled = CRITERIA[s.criterion].rows and loo.loo_sample > 0
        for key in ("loo_sample", "sample_rows", "sample_eps", "sample_delta"):
            own, rows = getattr(s, key), getattr(loo, key) if sampled else None
            if (own is None) != (rows is None) or (rows is not None and not _same(own, rows)):
                said = "none" if rows is None else f"{shown(rows)}, as 'leave_one_out' has"
                raise check.refuse(f"{where}selections[{s.criterion!r}]: {key!r} is {shown(own)} but should be {said} (the "
                                   "rows its leave-one-out scored)")


def _same(a: Any, b: Any) -> bool:
    """Two recorded numbers, or lists of them, equal (NaN never is)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return is_number(a) and is_number(b) and not differs(a, b)


def _leave_one_out(check: _Check, sweep: SweepReport) -> None:
    """``leave_one_out`` as :func:`~foal_pipe.protocol.records.leave_one_out_rows` writes it: per boundary the rows
    seen (``loo_sample`` 0) or at most ``loo_sample`` of them, a bound of 0 where every row seen was scored (the last
    boundary's are ``n_train_seen``) else Hoeffding's over the refined search's points, and ``exact`` where no bound."""
    from foal_pipe.core.leaveoneout import sample_bound

    loo = sweep.leave_one_out
    if loo is None:
        return
    check.counts("leave_one_out: ", None, {"sample_rows": loo.sample_rows, "sample_eps": loo.sample_eps})
    if loo.exact != all(e == 0 for e in loo.sample_eps):
        raise check.refuse(f"leave_one_out: 'exact' is {str(loo.exact).lower()} but 'sample_eps' ({_listed(loo.sample_eps)}) "
                           f"{'holds' if loo.exact else 'holds no'} a bound above 0 (exact: every row seen scored)")
    m, seen, points = loo.loo_sample, sweep.n_train_seen, len(sweep.selections[0].gammas) if sweep.selections else None
    last = len(loo.sample_rows) - 1
    for k, (rows, eps) in enumerate(zip(loo.sample_rows, loo.sample_eps)):
        want = None if k < last or seen is None else min(m, seen) if m else seen
        if m and rows > m or want is not None and rows != want:
            scores = f"at most {m}" if want is None else f"{want} of the {seen} rows seen ('n_train_seen')"
            raise check.refuse(f"leave_one_out: 'sample_rows' at boundary {k + 1} is {rows} but 'loo_sample' {m} (0: every "
                               f"row seen) scores {scores}")
        every = [True] if not m or rows < m else [rows == seen] if want is not None else [True, False]
        bounds = [0.0 if all_rows else None if points is None else
                  sample_bound(rows, points, loo.sample_delta) if loo.sample_delta > 0 else math.inf for all_rows in every]
        if not any(b is None or not differs(eps, b) for b in bounds):
            raise check.refuse(f"leave_one_out: 'sample_eps' at boundary {k + 1} is {eps:g} but {rows} rows of "
                               f"{'a sample' if m else 'every row seen'} give {' or '.join(f'{b:g}' for b in bounds)} "
                               f"(Hoeffding's bound at 'sample_delta' over {points} points, 0 where every row was scored)")


def _heads(check: _Check, heads: dict[str, HeadSweep] | None, where: str) -> None:
    for name, head in (heads or {}).items():
        check.counts(f"{where}heads[{name!r}]: ", head.accuracy_matrix, {})


def _orders(check: _Check, sweep: SweepReport, gammas: list[float]) -> None:
    orders, seeds = sweep.orders or [], sweep.order_seeds
    if seeds is not None:
        if len(orders) != len(seeds):
            raise check.refuse(f"'orders' has {len(orders)} entries but 'order_seeds' lists {len(seeds)} seeds (one "
                               "entry per class order)")
        recorded = [o.order_seed for o in orders]
        if None not in recorded and recorded != seeds:
            raise check.refuse(f"the seeds of 'orders' ({_listed(recorded)}) should be 'order_seeds' ({_listed(seeds)}), "
                               "in order")
    for i, order in enumerate(orders):
        where = f"orders[{i}]: "
        if order.tasks is not None and check.rows is not None and len(order.tasks) != check.rows:
            raise check.refuse(f"{where}'tasks' has {len(order.tasks)} entries but the sweep has {check.rows} tasks")
        _same_gammas(check, _results(check, order.results, where), gammas, f"orders[{i}]")
        _heads(check, order.heads, where)
    _order_options(check, sweep)


def _order_options(check: _Check, sweep: SweepReport) -> None:
    """A head's options set from each order's gamma (:data:`~foal_pipe.protocol.ordermeans.PER_ORDER_OPTIONS`) list one
    value per order, each the one ``orders[i]`` records for that head, as ``sweep --order-seeds`` combines them."""
    from foal_pipe.protocol.ordermeans import PER_ORDER_OPTIONS

    orders = sweep.orders or []
    for name, head in (sweep.heads or {}).items():
        for own, key in PER_ORDER_OPTIONS.items():
            if key not in head.options:
                continue
            values = head.options[key]
            if not isinstance(values, list) or len(values) != len(orders):
                raise check.refuse(f"heads[{name!r}]: option {key!r} is {shown(values)} but should list one {own} per class "
                                   f"order ({len(orders)}, those of 'orders')")
            for i, (value, order) in enumerate(zip(values, orders)):
                theirs = (order.heads or {}).get(name)
                recorded = None if theirs is None else theirs.options.get(own)
                if not (is_number(value) and is_number(recorded) and same_gamma(value, recorded)):
                    raise check.refuse(f"heads[{name!r}]: option {key!r}[{i}] is {shown(value)} but orders[{i}].heads[{name!r}] "
                                       f"has {own} {shown(recorded)} (one entry per order, in order)")


def _listed(values: list[Any]) -> str:
    return ", ".join(format(v, "g") if isinstance(v, float) else str(v) for v in values)


# ----------------------------------------------------------------------------------------------
# Headline numbers: recomputed from the matrices, and the means over the orders


def _numbers(check: _Check, sweep: SweepReport) -> SweepReport:
    """The sweep with every headline number its matrix (or its orders) contradicts replaced."""
    changes: dict[str, Any] = {}
    orders = [_order_numbers(check, o, f"orders[{i}]: ") for i, o in enumerate(sweep.orders or ())]
    if sweep.orders:
        changes["orders"] = orders
        changes["results"] = [_means(check, r, [o.results[k] for o in orders], f"results[gamma {r.gamma:g}]: ")
                              for k, r in enumerate(sweep.results)]
        if sweep.heads is not None and all(o.heads is not None and set(o.heads) == set(sweep.heads) for o in orders):
            changes["heads"] = {name: _means(check, h, [(o.heads or {})[name] for o in orders], f"heads[{name!r}]: ")
                                for name, h in sweep.heads.items()}
    else:
        changes["results"] = [check.recomputed(r, f"results[gamma {r.gamma:g}]: ") for r in sweep.results]
        if sweep.heads is not None:
            changes["heads"] = {n: check.recomputed(h, f"heads[{n!r}]: ") for n, h in sweep.heads.items()}
    if sweep.selections is not None:
        changes["selections"] = [check.recomputed(s, f"selections[{s.criterion!r}]: ") for s in sweep.selections]
    if sweep.fusions is not None:
        changes["fusions"] = [_fusion_numbers(check, f, f"fusions[{f.fusion!r}]: ") for f in sweep.fusions]
    return replace(sweep, **changes)


def _fusion_numbers(check: _Check, entry: FusionSweep, where: str) -> FusionSweep:
    return replace(entry, results=[check.recomputed(r, f"{where}results[gamma {r.gamma:g}]: ") for r in entry.results],
                   selections=None if entry.selections is None else
                   [check.recomputed(s, f"{where}selections[{s.criterion!r}]: ") for s in entry.selections],
                   heads=None if entry.heads is None else
                   {n: check.recomputed(h, f"{where}heads[{n!r}]: ") for n, h in entry.heads.items()})


def _order_numbers(check: _Check, order: OrderSweep, where: str) -> OrderSweep:
    return replace(order, results=[check.recomputed(r, f"{where}results[gamma {r.gamma:g}]: ") for r in order.results],
                   heads=None if order.heads is None else
                   {n: check.recomputed(h, f"{where}heads[{n!r}]: ") for n, h in order.heads.items()})


def _means(check: _Check, record: A, entries: list[A], where: str) -> A:
    """``record`` (a mean over the orders) with each number, ``std`` and ``A_steps`` that disagrees with the mean
    over ``entries`` (the orders' own, recomputed) replaced by it, as ``sweep --order-seeds`` computes them."""
    from foal_pipe.protocol.ordermeans import order_means

    if any(e.A_steps is None or e.accuracy_matrix is None for e in entries):
        return record
    means = order_means(entries)
    changes: dict[str, Any] = {}
    for key in NUMBERS:
        stored = getattr(record, key)
        if stored is not None and means.get(key) is not None and differs(stored, means[key]):
            check.warnings.append(f"{where}{key} is {stored:.6f} but the mean over its orders is {means[key]:.6f} (shown)")
            changes[key] = means[key]
    std = dict(getattr(record, "std", None) or {})
    for key, value in std.items():
        if key in means["std"] and differs(value, means["std"][key]):
            check.warnings.append(f"{where}std of {key} is {value:.6f} but over its orders it is {means['std'][key]:.6f} "
                                  "(shown)")
            changes["std"] = {**std, **changes.get("std", {}), key: means["std"][key]}
    matrix = means["accuracy_matrix"]
    if record.accuracy_matrix is not None and (len(record.accuracy_matrix) != len(matrix) or any(
            len(a) != len(b) or any(differs(x, y) for x, y in zip(a, b))
            for a, b in zip(record.accuracy_matrix, matrix))):
        check.warnings.append(f"{where}accuracy_matrix disagrees with the mean over its orders (the mean shown)")
        changes["accuracy_matrix"] = matrix
    if record.A_steps is not None and (len(record.A_steps) != len(means["A_steps"]) or any(
            differs(s, m) for s, m in zip(record.A_steps, means["A_steps"]))):
        check.warnings.append(f"{where}A_steps disagrees with the mean over its orders (the mean shown)")
        changes["A_steps"] = means["A_steps"]
    return replace(record, **changes) if changes else record


# ----------------------------------------------------------------------------------------------
# Choices: each as its criterion's rule picks it from the recorded values


def _choices(check: _Check, sweep: SweepReport) -> None:
    from foal_pipe.protocol.records import choose_fusion, grid_edge

    select = sweep.selected_by
    if sweep.fusions:
        entries = sweep.fusions
        for i, entry in enumerate(entries):
            _gamma_choice(check, entry.results, select, entry.best_gamma, f"fusions[{i}].best_gamma")
            _gamma_choice(check, entry.results, "test", entry.best_gamma_test, f"fusions[{i}].best_gamma_test")
            _selection_choices(check, entry.selections, f"fusions[{i}]: ")
        for key, rule in (("best", select), ("best_test", "test")):
            choice = getattr(sweep, key)
            if choice is not None and choice.selected_by is not None and rule is not None and choice.selected_by != rule:
                raise check.refuse(f"{key!r} says it was selected by {choice.selected_by!r} but the sweep's rule is {rule!r}")
            if choice is None or rule is None or not _determined([r for e in entries for r in e.results], rule):
                continue
            fusion, gamma = choose_fusion(entries, rule)
            if choice.fusion != fusion or not same_gamma(choice.gamma, gamma):
                raise check.refuse(f"{key!r} is ({choice.fusion}, gamma {choice.gamma:g}) but {rule} over every fusion's "
                                   f"results chooses ({fusion}, gamma {gamma:g})")
            if key == "best" and sweep.best_gamma is not None and not same_gamma(sweep.best_gamma, gamma):
                raise check.refuse(f"'best_gamma' is {sweep.best_gamma:g} but 'best' chose gamma {gamma:g}")
        chosen = next((e for e in entries if sweep.best is not None and e.fusion == sweep.best.fusion), None)
        if chosen is not None and [r.to_dict() for r in sweep.results] != [r.to_dict() for r in chosen.results]:
            raise check.refuse(f"'results' should be those of the chosen fusion {chosen.fusion!r} "
                               f"(fusions[{entries.index(chosen)}])")
        if sweep.fusion is not None and sweep.best is not None and sweep.fusion != sweep.best.fusion:
            raise check.refuse(f"'fusion' is {sweep.fusion!r} but 'best' chose fusion {sweep.best.fusion!r}")
    else:
        _gamma_choice(check, sweep.results, select, sweep.best_gamma, "best_gamma")
    _gamma_choice(check, sweep.results, "test", sweep.best_gamma_test, "best_gamma_test")
    for i, order in enumerate(sweep.orders or ()):
        _gamma_choice(check, order.results, select, order.best_gamma, f"orders[{i}].best_gamma")
        _ridge_head(check, order.heads, order.results, order.best_gamma, f"orders[{i}].")
    _selection_choices(check, sweep.selections, "")
    if sweep.best_gamma_at_grid_edge is not None and sweep.best_gamma is not None and sweep.gammas:
        edge = grid_edge(sweep.best_gamma, sweep.gammas) is not None
        if edge != sweep.best_gamma_at_grid_edge:
            raise check.refuse(f"'best_gamma_at_grid_edge' is {str(sweep.best_gamma_at_grid_edge).lower()} but best_gamma "
                               f"{sweep.best_gamma:g} is {'' if edge else 'not '}an end of 'gammas'")
    for i, entry in enumerate(sweep.fusions or ()):
        _ridge_head(check, entry.heads, entry.results, entry.best_gamma, f"fusions[{i}].")
    if not sweep.orders:
        _ridge_head(check, sweep.heads, sweep.results, sweep.best_gamma, "")
    if sweep.heads is not None:
        _head_choices(check, sweep)


def _determined(results: list[SweepResult], rule: str) -> bool:
    """Whether the recorded values decide ``rule``'s choice: some result has its value at the last boundary."""
    return rule in CRITERIA and any(r.criterion(rule) is not None for r in results)


def _gamma_choice(check: _Check, results: list[SweepResult], rule: str | None, chosen: float | None, field: str) -> None:
    """``chosen`` is the gamma ``rule`` picks from ``results`` (ties: the smallest gamma), where the values decide it
    (sweeps before ``selected_by`` chose by test A_avg: their ``best_gamma`` is only checked to be a result's)."""
    from foal_pipe.protocol.records import choose

    if chosen is None or rule is None or not _determined(results, rule):
        return
    gamma = choose(results, rule)
    if not same_gamma(chosen, gamma):
        at = "" if rule == "test" else " at the last task boundary"
        raise check.refuse(f"{field!r} is {chosen:g} but {CRITERIA[rule].short}{at} chooses {gamma:g}")


def _selection_choices(check: _Check, selections: list[SweepSelection] | None, where: str) -> None:
    """Each refined choice is the best of its boundary's recorded values (LOO accuracy: one of its best, its ties
    broken by the LOO MSE the record does not hold; where no value decides, one of its points), and ``at_edge`` says
    whether it is an end of the points."""
    import numpy as np

    from foal_pipe.core.gammasearch import best_point, tied

    for s in selections or ():
        larger = CRITERIA[s.criterion].larger
        for k, (values, chosen) in enumerate(zip(s.values, s.gammas_selected)):
            points = s.gammas if s.evaluated is None else [s.gammas[i] for i in s.evaluated[k]]
            if len(points) != len(values):
                raise check.refuse(f"{where}selections[{s.criterion!r}] has {len(values)} values but {len(points)} gammas "
                                   f"at boundary {k + 1}")
            v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
            if not np.isfinite(v).any():  # no value decides: the search's first point stands, one of its points
                if not any(same_gamma(chosen, g) for g in points):
                    raise check.refuse(f"{where}selections[{s.criterion!r}] chose gamma {chosen:g} at boundary {k + 1}, not "
                                       "one of its points ('gammas', where evaluated)")
                continue
            best = [points[i] for i in (tied(v, larger) if s.criterion == "loo_accuracy" else [best_point(v, larger)])]
            if not any(same_gamma(chosen, g) for g in best):
                raise check.refuse(f"{where}selections[{s.criterion!r}] chose gamma {chosen:g} at boundary {k + 1} but "
                                   f"its recorded values choose {_listed(best[:3])}")
            index = next(i for i, g in enumerate(points) if same_gamma(chosen, g))
            if s.at_edge[k] != (len(points) > 1 and index in (0, len(points) - 1)):
                raise check.refuse(f"{where}selections[{s.criterion!r}]: 'at_edge' at boundary {k + 1} is "
                                   f"{str(s.at_edge[k]).lower()} but gamma {chosen:g} is "
                                   f"{'' if index in (0, len(points) - 1) else 'not '}an end of its points")


def _head_choices(check: _Check, sweep: SweepReport) -> None:
    """``best_head`` is :data:`~foal_pipe.protocol.records.HEAD_CRITERION`'s pick and ``best_head_test`` the best test
    A_avg, of equals the first in the registry's order (:data:`~foal_pipe.heads.HEADS`), as ``sweep --heads`` picks
    them (:func:`~foal_pipe.protocol.records.best_heads`); under another criterion, only that the head is one."""
    from foal_pipe.heads import HEADS
    from foal_pipe.protocol.records import HEAD_CRITERION, best_heads

    heads = sweep.heads or {}
    names = [n for n in HEADS if n in heads] + [n for n in heads if n not in HEADS]
    rule = sweep.best_head_selected_by
    for key, name in (("best_head", sweep.best_head), ("best_head_test", sweep.best_head_test)):
        if name is not None and name not in heads:
            raise check.refuse(f"{key!r} {name!r} is not one of 'heads' ({', '.join(names)})")
    if rule is not None and rule not in CRITERIA:
        raise check.refuse(f"'best_head_selected_by' {rule!r} is not a criterion ({', '.join(CRITERIA)})")
    if not heads:
        return
    best, oracle = best_heads({n: heads[n] for n in names})
    for key, name, by, pick in (("best_head", sweep.best_head, rule, best),
                                ("best_head_test", sweep.best_head_test, "test", oracle)):
        if name is not None and pick is not None and by in (HEAD_CRITERION, "test") and name != pick:
            raise check.refuse(f"{key!r} is {name!r} but {CRITERIA[by].short} over the heads chooses {pick!r}")


def _ridge_head(check: _Check, heads: dict[str, HeadSweep] | None, results: list[SweepResult], gamma: float | None,
                where: str) -> None:
    """The ridge head is the result at the sweep's chosen gamma: its options name that gamma, its matrix is its."""
    ridge = (heads or {}).get("ridge")
    if ridge is None or gamma is None:
        return
    own = ridge.options.get("gamma")
    if isinstance(own, float | int) and not same_gamma(float(own), gamma):
        raise check.refuse(f"{where}heads['ridge'] has gamma {own:g} but {where}best_gamma is {gamma:g} (ridge runs at the "
                           "chosen gamma)")
    result = next((r for r in results if same_gamma(r.gamma, gamma)), None)
    if result is not None and ridge.accuracy_matrix != result.accuracy_matrix:
        raise check.refuse(f"{where}heads['ridge'] should hold the accuracy matrix of the result at gamma {gamma:g}")
