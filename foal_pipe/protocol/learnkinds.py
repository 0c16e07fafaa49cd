"""How ``learn`` runs a head, by the walk its registry entry names (:attr:`~foal_pipe.heads.HeadEntry.learner`):
one :class:`LearnKind` per learner of the one walk, in one table (:data:`LEARN_KINDS`), so
:func:`~foal_pipe.protocol.commands.run_learn` is one function for every head. A kind checks the settings before any
work, names what :func:`~foal_pipe.protocol.run.prepare` takes, then walks, scores and hands back the metrics and the
model file's writer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.engines import GCV_DOF_WARNING
from foal_pipe.heads import DEFAULT_HEAD, Scorer
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.capabilities import check_points
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.evaluation import model_reports
from foal_pipe.protocol.headruns import (
    check_head_options,
    check_learn_head,
    check_ridge_model_file,
    head_space,
    resolved_options,
)
from foal_pipe.protocol.headscores import build_heads, head_reports
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.learners.heads import HeadsLearner
from foal_pipe.protocol.learners.rls import RLSLearner
from foal_pipe.protocol.metricsparts import AnytimeCurve
from foal_pipe.protocol.outputs import save_head_model, save_model
from foal_pipe.protocol.records import grid_edge, learn_metrics, run_info
from foal_pipe.protocol.rowcache import GroupedRows
from foal_pipe.protocol.run import Run, reread_note
from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas
from foal_pipe.protocol.walk import SharedRows, head_train_rows, train_rows, walk

Log = Callable[[str], None]
#: What a kind's walk gives back: the run's metrics and the writer of its model file.
Learnt = tuple[LearnMetrics, Callable[[Path], None]]


@dataclass(frozen=True)
class LearnKind:
    """``settings(stream, model, evaluation, execution)``: the options checked before any work, and the model settings
    the run is prepared with; ``prepare(model)``: :func:`~foal_pipe.protocol.run.prepare`'s keywords;
    ``learn(run, model, stream, shared, anytime, log)``: the walk, its scores and what
    :func:`~foal_pipe.protocol.outputs.write_learned` writes; ``read``: the reader of the train rows several class
    orders share (:func:`~foal_pipe.protocol.walk.shared_rows`); ``class_sums``: whether its state is a sum over rows
    in any order, so that many class orders come from per-class sums in one pass (:mod:`foal_pipe.protocol.orders`),
    not one walk per order."""

    settings: Callable[[StreamConfig, ModelConfig, EvaluationConfig, ExecutionConfig], ModelConfig]
    prepare: Callable[[ModelConfig], dict[str, Any]]
    learn: Callable[[Run, ModelConfig, StreamConfig, SharedRows | None, Anytime | None, Log], Learnt]
    read: Callable[..., GroupedRows]
    class_sums: bool


def ridge_settings(stream: StreamConfig, model: ModelConfig, evaluation: EvaluationConfig,
                   execution: ExecutionConfig) -> ModelConfig:
    """Ridge's options checked; it runs with them as given."""
    check_head_options([DEFAULT_HEAD], model)
    check_ridge_model_file(model)
    return model


def learn_ridge(run: Run, model: ModelConfig, stream: StreamConfig, shared: SharedRows | None, anytime: Anytime | None,
                log: Log) -> Learnt:
    """Ridge's Gram lanes (one gamma, or the gamma path with ``--gamma auto``) or the rls engine, scored after every
    task (and at ``--eval-every``'s points)."""
    auto = model.gamma == "auto"
    if model.loo and not run.keep_activations:
        log(reread_note(run))
    rows = shared.train if shared else None
    final: RidgeModel
    if model.engine == "rls":
        rls = walk(run, [RLSLearner(run, anytime)], rows)[0]
        boundaries, final = rls.boundaries, rls.final
    elif auto:
        path = ManyGammas.auto(run)
        gram = walk(run, [GramLearner(run, {None: path}, anytime=anytime)], rows)[0]
        boundaries = gram.boundaries
        final = RidgeModel.solved(gram.running, float(boundaries[-1].gammas[0]), model.gamma_grid, model.per_decade)
    else:
        fixed = FixedGamma(float(model.gamma))
        boundaries = walk(run, [GramLearner(run, {None: fixed}, anytime=anytime)], rows)[0].boundaries
        final = fixed.model
    reports, curve = model_reports(run, boundaries, shared.test if shared else None, anytime)
    metrics = learn_metrics(run, stream, reports[0], boundaries, anytime, curve)
    warn_ridge(model, boundaries, metrics, log)
    return metrics, lambda path: save_model(final, run, path)


def head_settings(stream: StreamConfig, model: ModelConfig, evaluation: EvaluationConfig,
                  execution: ExecutionConfig) -> ModelConfig:
    """``learn --head NAME`` (not ridge): its settings checked before any work; the model settings it runs with."""
    check_head_options([model.head], model)
    return check_learn_head(model, evaluation, execution, stream)


def learn_head(run: Run, model: ModelConfig, stream: StreamConfig, shared: SharedRows | None, anytime: Anytime | None,
               log: Log) -> Learnt:
    """A registry head through the walk, scored after every task (and at ``--eval-every``'s points); its metrics carry
    ``head`` and ``head_options``, its model file the head after the last task. Its points are checked here for one
    order; rows ``shared`` by several orders come from ``run_learn_orders``, which checked every order's at once."""
    options = resolved_options(model.head, model)
    points: dict[str, list[Scorer]] | None = None if anytime is None else {model.head: []}
    if anytime is not None and shared is None:
        check_points(model.head, [run.store.train.labels[np.concatenate(run.stream.rows)]], anytime.every,
                     names=run.store.classes)
    spaces = {model.head: head_space(model.head, model)}
    heads = build_heads(run, [model.head], options, spaces)
    learner = walk(run, [HeadsLearner(run, heads, points=points, spaces=spaces)], shared.train if shared else None)[0]
    report = head_reports(run, learner.boundaries, spaces, shared.test if shared else None, points)[model.head]
    curve = report.pop("curve", None)
    rows = None if model.head_rows == "features" else model.head_rows  # the head's own rows, typed or not: one record
    metrics = LearnMetrics(**report, head=model.head, head_options=options, head_rows=rows,
                           **run_info(run, stream))
    if anytime is not None:
        metrics = replace(metrics, A_auc=float(np.mean(curve)), anytime=AnytimeCurve(
            eval_every=anytime.every, samples_seen=list(anytime.points), accuracy=[float(a) for a in curve]))
    last = learner.boundaries[model.head][-1]
    return metrics, lambda path: save_head_model(heads[model.head], last, run, path)


def warn_gcv(boundaries: Sequence[Boundary], grid: Sequence[float], log: Callable[[str], None]) -> None:
    """Warn when GCV's choice has effective degrees of freedom near the rows' count, where GCV is unreliable, and
    when it is the least gamma at which GCV has a value: below it the residual lies below its rounding (no value),
    so its minimum may lie there, though the choice is not on the grid's edge."""
    bounded = [k + 1 for k, b in enumerate(boundaries) if (s := (b.searches or {}).get("gcv")) is not None
               and 0 < s.index == int(np.argmax(np.isfinite(s.values)))]
    if bounded:
        at = ", ".join(map(str, bounded))
        log(f"warning: GCV chose the least gamma at which it has a value at task boundar{'y' if len(bounded) == 1 else 'ies'} "
            f"{at}: below it the fit all but interpolates the rows and its residual is below float64's rounding, so its "
            "minimum may lie lower; prefer --select loo")
    flagged = [ratio for b in boundaries if (ratio := b.gcv_dof_ratio) is not None and ratio > GCV_DOF_WARNING]
    if flagged:
        share = f"{100 * max(flagged):.0f}%" if len(flagged) == 1 else f"up to {100 * max(flagged):.0f}%"
        log(
            f"warning: GCV's choice has effective degrees of freedom {share} of the rows "
            f"(above {100 * GCV_DOF_WARNING:.0f}%) at {len(flagged)} task boundar{'y' if len(flagged) == 1 else 'ies'}; "
            "GCV is unreliable as D nears n: prefer --select loo"
        )


def shown(*gammas: float) -> list[str]:
    """Gammas as ``%g``, or as Python writes them where ``%g`` shows two different ones alike (a range "1 .. 1")."""
    short = [f"{g:g}" for g in gammas]
    return short if len(set(short)) == len(set(map(float, gammas))) else [repr(float(g)) for g in gammas]


def auto_edges_warning(metrics: LearnMetrics) -> str | None:
    """``learn --gamma auto``'s warning when a boundary chose a gamma on an edge of the grid, or the least gamma
    above the sums' resolution where that left out the grid's least (None: none did): a line per edge chosen."""
    edges = [k for k, flagged in enumerate(metrics.gammas_at_grid_edge or []) if flagged]
    grid, selected, search = metrics.gamma_grid, metrics.gammas_selected, metrics.gamma_search
    if not edges or grid is None or selected is None:  # edges come with --gamma auto's grid and choices
        return None
    floors = (search.resolution_floor if search else None) or [None] * len(selected)

    def edge(k: int) -> str | None:
        floor = floors[k]
        if floor is not None and search is not None and selected[k] == min(g for g in search.gammas if g > floor):
            return "floor"
        return grid_edge(selected[k], grid)

    kinds: dict[str | None, list[int]] = {}
    for k in edges:
        kinds.setdefault(edge(k), []).append(k)
    lines = []
    for kind, at in kinds.items():
        last, count = selected[at[-1]], f"at {len(at)} of {len(selected)} task boundaries"
        if kind == "floor":  # each boundary its own floor: the last named
            dtype = metrics.dtype or "float64"
            chosen, floor = shown(last, float(floors[at[-1]] or 0.0))
            lines.append(f"warning: --gamma auto chose the least gamma its {dtype} Gram sums resolve {count} (the last "
                         f"{chosen}, above {floor}); the smaller gammas of --gamma-grid were left out, their solutions "
                         "being noise" + ("; --dtype float64 resolves them" if dtype == "float32" else ""))
        else:
            chosen, low, high = shown(last, min(grid), max(grid))
            lines.append(f"warning: --gamma auto chose {chosen}, the {kind} of --gamma-grid ({low} .. {high}), {count}; a "
                         "better gamma may lie beyond the grid: extend --gamma-grid")
    return "\n".join(lines)


def warn_auto_edges(metrics: LearnMetrics, log: Callable[[str], None]) -> None:
    """``learn --gamma auto``: warn when a boundary chose a gamma on an edge of the grid."""
    warning = auto_edges_warning(metrics)
    if warning:
        log(warning)


def warn_ridge(model: ModelConfig, boundaries: Sequence[Boundary], metrics: LearnMetrics, log: Callable[[str], None]) -> None:
    """What ``learn`` says of ridge's choices: GCV near the rows' count (``--select gcv``), a gamma on the grid's edge."""
    if model.gamma == "auto" and model.select == "gcv":
        warn_gcv(boundaries, model.gamma_grid, log)
    warn_auto_edges(metrics, log)


#: Each learner of the walk's ``learn``, by :attr:`~foal_pipe.heads.HeadEntry.learner`.
LEARN_KINDS: dict[str, LearnKind] = {
    "gram": LearnKind(ridge_settings, lambda model: {"n_models": 1, "loo": model.loo}, learn_ridge, train_rows, True),
    "heads": LearnKind(head_settings, lambda model: {"heads": [model.head], "ridge": False}, learn_head,
                       head_train_rows, False),
}
