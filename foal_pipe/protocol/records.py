"""What ``learn`` and ``sweep`` record: the :mod:`~foal_pipe.protocol.schema` records of a run, and the gamma
(and fusion) each selection criterion chooses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from foal_pipe.core.gammapath import gcv_undeterminable
from foal_pipe.core.gammasearch import best_point
from foal_pipe.core.leaveoneout import SAMPLE_DELTA
from foal_pipe.core.metrics import summarize
from foal_pipe.heads import HEADS
from foal_pipe.io.pathtext import path_text
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.config import ModelConfig, StreamConfig
from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.internal import known
from foal_pipe.protocol.metricsparts import AnytimeCurve, GammaSearch
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.schema import LearnMetrics, SweepReport
from foal_pipe.protocol.solvers import Boundary
from foal_pipe.protocol.sweepparts import FusionChoice, FusionSweep, HeadSweep, LeaveOneOutRows, SweepResult, SweepSelection


def ragged(acc: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in acc[i, : i + 1]] for i in range(acc.shape[0])]


def accuracy_report(acc: np.ndarray) -> dict[str, Any]:
    """The :class:`~foal_pipe.protocol.schema.Accuracy` fields of an accuracy matrix (NaN above the diagonal)."""
    matrix = ragged(acc)
    return {**summarize(matrix), "accuracy_matrix": matrix}


def run_info(run: Run, stream_config: StreamConfig) -> dict[str, Any]:
    """The :class:`~foal_pipe.protocol.schema.RunSettings` fields of a run (the stream's kind and ratios only for
    a Si-Blurry stream: the default's records stay as they were)."""
    blurry = {} if run.stream.kind == "disjoint" else {
        "stream": run.stream.kind, "disjoint_ratio": stream_config.disjoint_ratio,
        "blurry_ratio": stream_config.blurry_ratio, "disjoint_classes": run.stream.disjoint_classes,
        "blurred_rows": run.stream.blurred_rows,
    }
    return {**blurry,
        "tasks": run.stream.tasks,
        "n_tasks": run.stream.n_tasks,
        "dropped_classes": run.stream.dropped,
        "drop_remainder": stream_config.drop_remainder,
        "projection_dim": run.model.projection_dim,
        "projection_init": run.model.projection_init,
        "activation": run.model.resolved_activation,
        "batch_size": stream_config.batch_size,
        "drop_last": stream_config.drop_last,
        "mask_unseen": run.evaluation.mask_unseen,
        "seed": stream_config.seed,
        "order_seed": stream_config.resolved_order_seed,
        "backend": run.backend,
        "dtype": run.model.dtype,
        "n_train_seen": int(sum(rows.size for rows in run.stream.rows)),
        "n_test": int(run.test_totals.sum()),
        "feature_dim": int(run.store.dim),
        "dataset": run.store.meta.dataset,
        "encoder": run.store.meta.encoder,
        "features": path_text(run.store.path),
    }


def _finite_or_none(values: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in values]


def sweep_results(gammas: Sequence[float], boundaries: Sequence[Boundary], reports: Sequence[dict[str, Any]],
                  loo: bool) -> list[SweepResult]:
    """Every gamma's results from one walk: ``reports[m]`` (:class:`Accuracy` fields) and, per boundary, GCV and
    (with ``loo``) leave-one-out."""
    return [SweepResult(gamma=g, **reports[m],
                        gcv=_finite_or_none(np.array([known(b.gcv, "a sweep's GCV")[m] for b in boundaries])),
                        loo_accuracy=[float(known(b.loo_accuracy, "a sweep's LOO accuracy")[m]) for b in boundaries]
                        if loo else None,
                        loo_mse=_finite_or_none(np.array([known(b.loo_mse, "a sweep's LOO MSE")[m] for b in boundaries]))
                        if loo else None)
            for m, g in enumerate(gammas)]


def gamma_search(boundaries: Sequence[Boundary], criterion: str, per_decade: int, loo_sample: int = 0) -> GammaSearch:
    """The record of ``criterion``'s refined search at every boundary (with ``loo_sample``, its sample and bound
    where the criterion is leave-one-out's)."""
    searches = [known(b.searches, "a gamma path's searches")[criterion] for b in boundaries]
    sampled: dict[str, Any] = {}
    if loo_sample and boundaries and boundaries[0].loo_rows is not None and CRITERIA[criterion].rows:
        sampled = dict(loo_sample=int(loo_sample), sample_rows=[int(known(b.loo_rows, "a sample's rows")) for b in boundaries],
                       sample_eps=[float(known(b.loo_bound, "a sample's bound")) for b in boundaries], sample_delta=SAMPLE_DELTA)
    grid = searches[0].grid
    if any(s.refined is not None for s in searches):  # a zoom: each boundary's evaluated points
        sampled["evaluated"] = [np.searchsorted(grid, s.gammas).tolist() for s in searches]
    if any(b.floor is not None for b in boundaries):
        sampled["resolution_floor"] = [b.floor for b in boundaries]
    return GammaSearch(criterion=criterion, per_decade=per_decade, gammas=[float(g) for g in grid],
                       values=[_finite_or_none(s.values) for s in searches],
                       gammas_selected=[s.gamma for s in searches],
                       # the least point above the sums' resolution is an edge too, even where it was the only one
                       at_edge=[s.edge is not None or (b.floor is not None and s.index == 0)
                                for s, b in zip(searches, boundaries, strict=True)],
                       **sampled)


def sweep_selections(boundaries: Sequence[Boundary], reports: Sequence[dict[str, Any]], criteria: Sequence[str],
                     per_decade: int, loo_sample: int = 0) -> list[SweepSelection]:
    """Each criterion's refined search and the test accuracy ``reports[i]`` (:class:`Accuracy` fields) of the
    models it chose (``criteria[i]``); with ``loo_sample``, the leave-one-out criteria's sample and bound. A
    criterion with no value at some boundary (GCV below its rounding everywhere) chose nothing there: it is left out
    (:func:`undetermined`)."""
    out = []
    for i, name in enumerate(criteria):
        if name in undetermined(boundaries):
            continue
        search = gamma_search(boundaries, name, per_decade, loo_sample)
        out.append(SweepSelection(**reports[i], **{k: getattr(search, k) for k in (
            "criterion", "per_decade", "gammas", "values", "evaluated", "gammas_selected", "at_edge", "loo_sample",
            "sample_rows", "sample_eps", "sample_delta")}))
    return out


def undetermined(boundaries: Sequence[Boundary]) -> list[str]:
    """The criteria whose refined search has no finite value at some boundary: they chose no gamma there (the
    search's first point stands in its record), so no choice of theirs is reported."""
    names = {name for b in boundaries for name, s in known(b.searches, "a gamma path's searches").items()
             if not np.isfinite(s.values).any()}
    return sorted(names)


def leave_one_out_rows(boundaries: Sequence[Boundary], loo_sample: int, seen: Sequence[int]) -> LeaveOneOutRows:
    """What ``sweep``'s leave-one-out figures scored: per boundary the rows (``seen[k]`` without a sample) and
    Hoeffding's bound, exact where every boundary scored every row seen."""
    rows = [int(n) if b.loo_rows is None else int(b.loo_rows) for b, n in zip(boundaries, seen)]
    eps = [0.0 if b.loo_bound is None else float(b.loo_bound) for b in boundaries]
    return LeaveOneOutRows(loo_sample=int(loo_sample), exact=not any(eps), sample_rows=rows, sample_eps=eps,
                           sample_delta=SAMPLE_DELTA)


def fusion_entry(fusion: str, results: list[SweepResult], select: str,
                 selections: list[SweepSelection] | None = None) -> FusionSweep:
    """One fusion's sweep (an entry of ``fusions``): its results and its own choices of gamma."""
    return FusionSweep(fusion=fusion, best_gamma=selected(results, select), best_gamma_test=choose(results, "test"),
                       results=results, selections=selections)


def sweep_report(gammas: Sequence[float], results: list[SweepResult], select: str, info: dict[str, Any],
                 selections: list[SweepSelection] | None = None) -> SweepReport:
    """The ``sweep.json`` of one feature set: its results, the gamma ``select`` chooses and the test oracle's,
    the refined ``selections`` and the run's settings ``info``."""
    return SweepReport(gammas=list(gammas), best_gamma=selected(results, select), best_gamma_test=choose(results, "test"),
                       selected_by=select, results=results, selections=selections, **info)


def fusions_report(gammas: Sequence[float], entries: Sequence[FusionSweep], select: str, model: ModelConfig,
                   info: dict[str, Any]) -> SweepReport:
    """``sweep --fusions``: the single-sweep keys of the fusion chosen overall (readers of one sweep read it),
    with every fusion's entry, the choice over every fusion x gamma, and the test oracle's, labelled as such."""
    fusion, gamma = choose_fusion(entries, select)
    oracle_fusion, oracle_gamma = choose_fusion(entries, "test")
    chosen = next(e for e in entries if e.fusion == fusion)
    return replace(sweep_report(gammas, chosen.results, select, info, chosen.selections), best_gamma=gamma, fusion=fusion,
                   fusion_norm=model.fusion_norm, best=FusionChoice(fusion=fusion, gamma=gamma, selected_by=select),
                   best_test=FusionChoice(fusion=oracle_fusion, gamma=oracle_gamma, selected_by="test"),
                   fusions=list(entries))


#: How ``sweep --heads`` names its ``best_head``: a training-data criterion that only heads with an exact
#: leave-one-out accuracy have (ridge, by its gamma sweep's leave-one-out pass; ncm, balanced, cosine); the others are
#: not ranked.
HEAD_CRITERION = "loo_accuracy"


def heads_report(report: SweepReport, names: Sequence[str], fields: dict[str, dict[str, Any]], loo: dict[str, float],
                 options: dict[str, dict[str, Any]]) -> SweepReport:
    """``sweep --heads``: the report with every head's entry (ridge: its gamma chosen by ``selected_by``, and that
    gamma's leave-one-out accuracy at the last boundary; the others: ``loo``, their exact leave-one-out accuracy
    where they have one, and ``fields``, their accuracy fields), the head of best leave-one-out accuracy (None when
    no head has one; first of equals in the registry's order, :data:`~foal_pipe.heads.HEADS`, whatever order
    ``--heads`` lists them in) and the test oracle's head (best test A_avg), labelled as such."""
    ridge = next(r for r in report.results if r.gamma == report.best_gamma)
    names = [name for name in HEADS if name in names]
    entries = {}
    for name in names:
        if name == "ridge":
            ridge_loo = ridge.loo_accuracy[-1] if ridge.loo_accuracy else None
            entries[name] = HeadSweep(**{k: getattr(ridge, k) for k in ("accuracy_matrix", "A_steps", "A_avg", "A_last",
                                                                        "F", "F_published_code")},
                                      options={"gamma": ridge.gamma, "selected_by": report.selected_by},
                                      loo_accuracy=ridge_loo, rows=HEADS[name].space)
        else:
            entries[name] = HeadSweep(**fields[name], options=options[name], loo_accuracy=loo.get(name),
                                      rows=HEADS[name].space)
    best, oracle = best_heads(entries)
    return replace(report, heads=entries, best_head=best, best_head_selected_by=HEAD_CRITERION if best else None,
                   best_head_test=oracle)


def best_heads(heads: Mapping[str, HeadSweep]) -> tuple[str | None, str]:
    """The head of best :data:`HEAD_CRITERION` (None where no head has one) and the test oracle's (best test
    A_avg), each the first of equals in ``heads``' order (the registry's, as ``sweep --heads`` lists them)."""
    ranked = {name: score for name, entry in heads.items() if (score := entry.loo_accuracy) is not None}
    best = max(ranked, key=ranked.__getitem__) if ranked else None
    return best, max(heads, key=lambda name: heads[name].A_avg)


def _best_index(results: Sequence[SweepResult], criterion: str) -> int:
    """The result that ``criterion`` prefers at the last task boundary (among equals, LOO accuracy's least LOO
    MSE, then the smallest gamma, then the first in the given order: the same choice whatever order ``--gammas``
    lists them in)."""
    order = sorted(range(len(results)), key=lambda i: results[i].gamma)  # stable: equal gammas keep their order

    def scores(name: str) -> np.ndarray:
        return np.array([np.nan if (v := results[i].criterion(name)) is None else v for i in order], dtype=np.float64)

    return order[best_point(scores(criterion), CRITERIA[criterion].larger,
                            scores("loo") if criterion == "loo_accuracy" else None)]


def selected(results: Sequence[SweepResult], select: str) -> float:
    """:func:`choose` for the run's ``--select``: refused where GCV chooses and no gamma has a GCV value (the table
    may still mark each criterion's choice, null curves and all)."""
    if select == "gcv" and all(r.criterion("gcv") is None for r in results):
        raise gcv_undeterminable()
    return choose(results, select)


def choose(results: Sequence[SweepResult], criterion: str) -> float:
    """The gamma that ``criterion`` prefers at the last task boundary (of equals, the smallest)."""
    return float(results[_best_index(results, criterion)].gamma)


def choose_fusion(entries: Sequence[FusionSweep], criterion: str) -> tuple[str, float]:
    """The ``(fusion, gamma)`` that ``criterion`` prefers over every fusion's results (of equals, the smallest
    gamma, then the first fusion in the given order). LOO MSE and GCV compare across fusions: the same rows, the
    same one-hot targets, the same projection size."""
    flat = [(e.fusion, r) for e in entries for r in e.results]
    fusion, result = flat[_best_index([r for _, r in flat], criterion)]
    return fusion, float(result.gamma)


def learn_metrics(run: Run, stream: StreamConfig, report: dict[str, Any], boundaries: Sequence[Boundary],
                  anytime: Anytime | None = None, curve: Sequence[float] | None = None) -> LearnMetrics:
    """``metrics.json`` of one learned stream: the accuracy ``report`` (:class:`Accuracy` fields), the run's
    settings, with ``--gamma auto`` the gamma chosen at each boundary, and with ``anytime`` its ``curve``
    (accuracy at each point) and ``A_auc``, the curve's mean."""
    model = run.model
    metrics = LearnMetrics(**report, gamma="auto" if model.gamma == "auto" else float(model.gamma),
                           engine=model.engine, **run_info(run, stream))
    if anytime is not None:
        curve = known(curve, "the anytime curve")
        metrics = replace(metrics, A_auc=float(np.mean(curve)) if len(curve) else None, anytime=AnytimeCurve(
            eval_every=anytime.every, samples_seen=list(anytime.samples), accuracy=[float(a) for a in curve],
            gammas=[float(b.gammas[0]) for b in anytime.snapshots]))
    if model.gamma == "auto":
        search = gamma_search(boundaries, model.select, model.per_decade, model.loo_sample)
        metrics = replace(metrics, gammas_selected=search.gammas_selected, selected_by=model.select,
                          gamma_grid=[float(g) for g in model.gamma_grid], gammas_at_grid_edge=search.at_edge,
                          gamma_search=search)
    return metrics


def grid_edge(gamma: float, grid: Sequence[float]) -> str | None:
    """``"smallest"`` or ``"largest"`` when ``gamma`` is that end of ``grid`` (of two values or more), else None:
    a gamma chosen there may be bettered beyond the grid."""
    lo, hi = min(grid), max(grid)
    if lo == hi:
        return None
    return "smallest" if gamma == lo else "largest" if gamma == hi else None


@dataclass(frozen=True)
class Learned:
    """What ``learn`` wrote: the ``metrics.json`` record, and ``timings.json``'s wall seconds by step."""

    metrics: LearnMetrics
    timings: dict[str, float]


@dataclass(frozen=True)
class Swept:
    """What ``sweep`` wrote: the ``sweep.json`` record, and ``timings.json``'s wall seconds by step."""

    report: SweepReport
    timings: dict[str, float]
