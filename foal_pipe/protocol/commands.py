"""The ``learn`` and ``sweep`` commands: prepare, walk, test, record, and write the outputs as one unit."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.engines import GCV_DOF_WARNING, check_gamma
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import DEFAULT_HEAD, Head, Scorer, head_entry
from foal_pipe.heads.state import export_head, takes_batch_size
from foal_pipe.io import atomic_dir, check_output_dir, write_json
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.modelfile import MODEL_FILE, stored_checksum
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.capabilities import Settings, check_capabilities, check_points
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
from foal_pipe.protocol.evaluation import lane_accuracies, model_reports
from foal_pipe.protocol.headruns import (
    check_head_options,
    check_learn_head,
    check_ridge_model_file,
    check_sweep_heads,
    head_space,
    resolved_options,
)
from foal_pipe.protocol.headwalk import build_heads, head_boundaries, head_reports, head_train_rows, learn_heads
from foal_pipe.protocol.records import (
    Learned,
    Swept,
    accuracy_report,
    choose,
    fusion_entry,
    fusions_report,
    grid_edge,
    heads_report,
    learn_metrics,
    leave_one_out_rows,
    run_info,
    sweep_report,
    sweep_results,
    sweep_selections,
)
from foal_pipe.protocol.run import Run, prepare, reread_note, row_sample
from foal_pipe.protocol.schema import (
    CRITERIA,
    METRICS_FILE,
    SWEEP_FILE,
    TRAINING_CRITERIA,
    AnytimeCurve,
    LearnMetrics,
    SweepReport,
    SweepSelection,
)
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas
from foal_pipe.protocol.stream import dropped_warning
from foal_pipe.protocol.walk import SharedRows, gram_boundaries, gram_walk, rls_boundaries, test_rows
from foal_pipe.store.blockfusion import parse_fusions


def run_learn(
    features: str | Path,
    out: str | Path,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
    shared: SharedRows | None = None,
) -> Learned:
    """Train through the stream, evaluate after each task; write ``metrics.json``, ``model.safetensors``
    and ``timings.json`` (wall-clock seconds by step, not a pipeline output) into ``out`` as one unit.
    ``shared``: rows already read for several class orders (:func:`~foal_pipe.protocol.walk.shared_rows`). The head's
    registry entry picks the walk: ridge's Gram lanes (its gamma path, RLS engine, fusion lanes) here, every other
    head :func:`run_learn_head`."""
    if not head_entry(model.head).gram_lanes:
        return run_learn_head(features, out, stream, model, evaluation, execution, log, shared)
    check_head_options([DEFAULT_HEAD], model)
    check_ridge_model_file(model)
    start = time.perf_counter()
    check_output_dir(out)
    auto = model.gamma == "auto"
    loo = model.loo
    run = prepare(features, stream, model, evaluation, execution, n_models=1, loo=loo)
    anytime = anytime_points(run)
    warn_dropped(run, stream, log)
    if loo and not run.keep_activations:
        log(reread_note(run))
    with np.errstate(all="ignore"):  # overflow is caught by the finiteness checks of the solves
        if model.engine == "rls":
            boundaries, final = rls_boundaries(run, shared and shared.train, anytime)
        else:
            if auto:
                solver = ManyGammas(model.gamma_grid, loo, model.select, model.per_decade, row_sample(run))
                boundaries, statistics = gram_boundaries(run, solver, rows=shared and shared.train, anytime=anytime)
                final = RidgeModel.solved(statistics, float(boundaries[-1].gammas[0]))
            else:
                solver = FixedGamma(float(model.gamma))
                boundaries, _ = gram_boundaries(run, solver, rows=shared and shared.train, anytime=anytime)
                final = solver.model
        reports, curve = model_reports(run, boundaries, shared and shared.test, anytime)
    metrics = learn_metrics(run, stream, reports[0], boundaries, anytime, curve)
    if auto and model.select == "gcv":
        _warn_gcv(boundaries, model.gamma_grid, log)
    warn_auto_edges(metrics, log)
    return write_learned(out, [run], start, metrics, lambda path: save_model(final, run, path), timed=True)


def head_settings(stream: StreamConfig, model: ModelConfig, evaluation: EvaluationConfig,
                  execution: ExecutionConfig) -> ModelConfig:
    """``learn --head NAME`` (not ridge): its settings checked before any work; the model settings it runs with."""
    check_head_options([model.head], model)
    return check_learn_head(model, evaluation, execution, stream)


def run_learn_head(features: str | Path, out: str | Path, stream: StreamConfig, model: ModelConfig,
                   evaluation: EvaluationConfig, execution: ExecutionConfig, log: Callable[[str], None],
                   shared: SharedRows | None = None) -> Learned:
    """``learn --head NAME`` (not ridge): the head through the one-read walk, scored after every task; writes
    ``metrics.json`` (with ``head`` and ``head_options``), ``model.safetensors`` (the head after the last task) and
    ``timings.json`` as one unit. ``shared`` as in :func:`run_learn`."""
    start = time.perf_counter()
    check_output_dir(out)
    settings = head_settings(stream, model, evaluation, execution)
    run = prepare(features, stream, settings, evaluation, execution, heads=[model.head], ridge=False)
    warn_dropped(run, stream, log)
    options = resolved_options(model.head, model)
    anytime = anytime_points(run)
    points = None if anytime is None else {model.head: []}
    if anytime is not None:
        check_points(model.head, run.store.train.labels[np.concatenate(run.stream.rows)], anytime.every)
    spaces = {model.head: head_space(model.head, model)}
    with np.errstate(all="ignore"):
        heads = build_heads(run, [model.head], options, spaces)
        boundaries, _ = head_boundaries(run, heads, shared and shared.train, points=points, spaces=spaces)
        reports = head_reports(run, boundaries, spaces, shared and shared.test, points)
    report = reports[model.head]
    curve = report.pop("curve", None)
    metrics = LearnMetrics(**report, head=model.head, head_options=options, head_rows=model.head_rows,
                           **run_info(run, stream))
    if anytime is not None:
        metrics = replace(metrics, A_auc=float(np.mean(curve)), anytime=AnytimeCurve(
            eval_every=anytime.every, samples_seen=list(anytime.points), accuracy=[float(a) for a in curve]))
    return write_learned(out, [run], start, metrics, lambda path: save_head_model(
        heads[model.head], boundaries[model.head][-1], run, path), timed=True)


def save_head_model(head: Head, scorer: Scorer, run: Run, path: Path) -> None:
    """The model file of a head's run: its tensors after the last task (:mod:`foal_pipe.heads.state`), its options
    (dual's with the stream's batch size), the run's projection, provenance and class names."""
    name = type(head).name
    options = resolved_options(name, run.model)
    if takes_batch_size(name):
        options["batch_size"] = run.stream.batch_size
    model = HeadClassifier(name, options, export_head(name, head, scorer), sum(int(r.size) for r in run.stream.rows),
                           space=head_space(name, run.model), dtype=run.model.dtype)
    model.save(path, projection=run.projection, **provenance(run),
               class_names=[run.store.classes[c] for c in model.classes_], activation=run.model.resolved_activation)


def anytime_points(run: Run) -> Anytime | None:
    """The evaluation points of ``--eval-every`` (None without it); refused when the stream is shorter."""
    every = run.evaluation.eval_every
    if every is None:
        return None
    anytime = Anytime(run, every)
    if not anytime.points:
        n = int(sum(r.size for r in run.stream.rows))
        raise FoalPipeError(f"{param('eval_every', every)} is more than the stream's {n} training rows, so nothing would "
                            f"be evaluated; pass at most {param('eval_every', n)}")
    return anytime


def run_sweep(
    features: str | Path,
    out: str | Path,
    sweep: SweepConfig,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
    shared: SharedRows | None = None,
) -> Swept:
    """Score every gamma from one walk over the train split and one pass over the test split; write
    ``sweep.json`` (and ``timings.json``). ``model.gamma`` and ``model.engine`` are not used.

    With ``sweep.fusions``, every fusion x gamma from that one walk (each blocks chunk decoded once per task):
    ``sweep.json`` keeps the single-sweep keys for the fusion chosen overall, and adds ``fusions`` (each
    fusion's ``results``, ``best_gamma``, ``best_gamma_test``), ``best`` and the oracle ``best_test``
    (``{"fusion", "gamma"}`` over every fusion x gamma). ``shared`` as in :func:`run_learn`.
    """
    start = time.perf_counter()
    if not sweep.gammas:
        raise FoalPipeError(f"{param('gammas')} is empty; pass a comma-separated list such as 1e-3,1e-2,1e-1,1,10")
    gammas = [check_gamma(g) for g in sweep.gammas]
    select = sweep.resolved_select
    if select not in CRITERIA:
        raise FoalPipeError(f"unknown {param('select')} {select!r}; choose one of {', '.join(CRITERIA)}")
    if CRITERIA[select].rows and not sweep.loo:
        raise FoalPipeError(f"{param('select', select)} needs the leave-one-out pass; drop {param('loo', False)} or use "
                            f"{param('select', 'gcv')}")
    fusions = [f.text for f in parse_fusions(list(sweep.fusions), param("fusions"))] if sweep.fusions else []
    if fusions and stream.stream != "disjoint":
        raise FoalPipeError(f"{param('fusions')} scores disjoint tasks; with {param('stream', stream.stream)} compare "
                            f"fusions one at a time ({param('fusion', 'X')})")
    others = check_sweep_heads(sweep, model)
    check_capabilities(others, Settings(stream, model, evaluation, execution))  # what ridge alone would take
    check_output_dir(out)
    run = prepare(features, stream, replace(model, gamma=1.0, engine="gram"), evaluation, execution,
                  n_models=len(gammas), loo=sweep.loo, command="sweep", fusions=fusions, heads=others)
    warn_dropped(run, stream, log)
    if sweep.loo and not run.keep_activations:
        log(reread_note(run))
    sample = row_sample(run) if sweep.loo else None  # learn --gamma auto's rows and bound (--loo-sample)
    solvers = {key: ManyGammas(gammas, sweep.loo, None, sweep.per_decade, sample) for key in run.lanes}
    read = others and shared is None  # the heads walk the rows ridge's walk takes, read once
    with np.errstate(all="ignore"), (head_train_rows(run) if read else nullcontext(shared and shared.train)) as train, \
            (test_rows(run) if read else nullcontext(shared and shared.test)) as test:
        lanes = gram_walk(run, solvers, rows=train)
        if run.stream.kind == "disjoint":
            accs = lane_accuracies(run, {key: lane.boundaries for key, lane in lanes.items()}, test)
            reports = {key: [accuracy_report(a) for a in acc] for key, acc in accs.items()}
        else:
            reports = {None: model_reports(run, lanes[None].boundaries, test)[0]}
        results = {key: sweep_results(gammas, lane.boundaries, reports[key], sweep.loo) for key, lane in lanes.items()}
        selections = {key: sweep_selections(lane.boundaries, reports[key][len(gammas):], solvers[key].criteria,
                                            sweep.per_decade, model.loo_sample) for key, lane in lanes.items()}
        # heads that take gamma run at ridge's choice on their feature set by a training criterion (never the oracle)
        criterion = select if select in TRAINING_CRITERIA else ("loo" if sweep.loo else "gcv")
        models = {key: replace(model, gamma=choose(results[key], criterion)) for key in lanes} if others else {}
        heads = {key: learn_heads(run, others, m.head_arguments(), train, test, sweep.loo, key) for key, m in models.items()}
    info = run_info(run, stream)

    def with_heads(report: SweepReport, key: str | None) -> SweepReport:
        return heads_report(report, sweep.heads, *heads.get(key, ({}, {})),
                            {name: resolved_options(name, models[key]) for name in others})

    if fusions:
        entries = [fusion_entry(key, results[key], select, selections[key]) for key in fusions]
        if sweep.heads:  # every fusion's heads, as a sweep of that fusion alone with --heads writes them
            entries = [replace(e, heads=with_heads(sweep_report(gammas, results[e.fusion], select, info), e.fusion).heads)
                       for e in entries]
        report = fusions_report(gammas, entries, select, model, info)
    else:
        report = sweep_report(gammas, results[None], select, info, selections[None])
    if sweep.loo:
        seen = np.cumsum([r.size for r in run.stream.rows])
        report = replace(report, leave_one_out=leave_one_out_rows(next(iter(lanes.values())).boundaries,
                                                                  model.loo_sample, seen))
    warn_search_edges(report.selections or [], log)
    if sweep.heads:
        report = with_heads(report, report.fusion if fusions else None)
    for key, lane in lanes.items():
        _warn_gcv(lane.boundaries[-1:], gammas, log if key is None else lambda text, key=key: log(f"{key}: {text}"))
    report = flag_grid_edge(report, log)
    return Swept(report, write_outputs(out, [run], start, lambda tmp: write_json(tmp / SWEEP_FILE, report.to_dict())))


def flag_grid_edge(report: SweepReport, log: Callable[[str], None]) -> SweepReport:
    """The report, recording whether its ``best_gamma`` is on an edge of its ``gammas``; warn when it is."""
    gamma, grid = report.best_gamma, report.gammas
    edge = grid_edge(gamma, grid)
    if edge is not None:
        log(f"warning: the best gamma by {report.selected_by}, {gamma:g}, is the {edge} of --gammas "
            f"({min(grid):g} .. {max(grid):g}); a better gamma may lie beyond the grid: extend --gammas")
    return replace(report, best_gamma_at_grid_edge=edge is not None)


def warn_auto_edges(metrics: LearnMetrics, log: Callable[[str], None]) -> None:
    """``learn --gamma auto``: warn when a boundary chose a gamma on an edge of the grid."""
    edges = [k for k, flagged in enumerate(metrics.gammas_at_grid_edge or []) if flagged]
    if edges:
        grid, last = metrics.gamma_grid, metrics.gammas_selected[edges[-1]]
        log(f"warning: --gamma auto chose {last:g}, the {grid_edge(last, grid)} of --gamma-grid ({min(grid):g} .. "
            f"{max(grid):g}), at {len(edges)} of {len(metrics.gammas_selected)} task boundaries; a better gamma "
            "may lie beyond the grid: extend --gamma-grid")


def warn_search_edges(selections: Sequence[SweepSelection], log: Callable[[str], None]) -> None:
    """``sweep``: warn when a criterion's refined choice at the last boundary is an end of the searched range."""
    for s in selections:
        if s.at_edge[-1]:
            log(f"warning: {CRITERIA[s.criterion].short}'s refined choice, {s.gammas_selected[-1]:g}, is an end of the "
                f"searched range ({s.gammas[0]:g} .. {s.gammas[-1]:g}); a better gamma may lie beyond: extend --gammas")


def write_learned(out: str | Path, runs: Sequence[Run], start: float, metrics: LearnMetrics,
                  save: Callable[[Path], object], timed: bool = False) -> Learned:
    """Write a run's model file (``save``), then its ``metrics.json`` recording that file's checksum (which
    ``evaluate`` checks a model against), with ``timings.json``, as one unit (:func:`write_outputs`); ``timed``: the
    writing is the first run's ``write`` step. The metrics as written."""
    written = metrics

    def write(tmp: Path) -> None:
        nonlocal written
        with runs[0].timed("write") if timed else nullcontext():
            save(tmp / MODEL_FILE)
            written = replace(metrics, model_checksum=stored_checksum(tmp / MODEL_FILE))
            write_json(tmp / METRICS_FILE, written.to_dict())

    timings = write_outputs(out, runs, start, write)
    return Learned(written, timings)


def provenance(run: Run, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A model file's record of the data it learned: the store's dataset and encoder, ``learned_from`` (the
    generation ids of the stores whose training rows it holds, this one last) and ``learned_data`` (their data
    identities, which survive re-extraction with other chunks or dtype) where the store has them; ``previous``:
    the continued model's metadata, whose lists are extended."""
    record = {"dataset": run.store.meta.dataset, "encoder": run.store.meta.encoder}
    for key, this in (("learned_from", run.store.meta.generation), ("learned_data", run.store.data_identity())):
        values = [*(previous or {}).get(key, []), *([this] if this else [])]
        if values:
            record[key] = values
    return record


def save_model(final: RidgeModel, run: Run, path: Path) -> None:
    """The model file of a run: the ridge model with the run's projection, provenance and class names."""
    final.save(path, run.projection.components_, **provenance(run),
               class_names=[run.store.classes[c] for c in final.classes], activation=run.model.resolved_activation)


def write_outputs(out: str | Path, runs: Sequence[Run], start: float, write: Callable[[Path], None]) -> dict[str, float]:
    """Write a run's files (``write`` fills the directory it is given) and ``timings.json`` (each step's seconds
    summed over ``runs``) as one unit, after checking that no store changed while it was read; the timings."""
    for run in runs:
        run.store.check_unchanged()
    with atomic_dir(out) as tmp:
        write(tmp)
        timings = summed_timings([run.timings for run in runs], start)
        write_json(tmp / "timings.json", timings)
    return timings


def summed_timings(parts: Sequence[dict[str, float]], start: float) -> dict[str, float]:
    """Each step's seconds summed over ``parts``, and the ``total`` since ``start``, rounded to milliseconds."""
    timings: dict[str, float] = {}
    for part in parts:
        for step, seconds in part.items():
            timings[step] = timings.get(step, 0.0) + seconds
    timings["total"] = time.perf_counter() - start
    return {step: round(seconds, 3) for step, seconds in sorted(timings.items())}


def _warn_gcv(boundaries: Sequence[Boundary], grid: Sequence[float], log: Callable[[str], None]) -> None:
    flagged = [k for k, b in enumerate(boundaries) if b.gcv_dof_ratio is not None and b.gcv_dof_ratio > GCV_DOF_WARNING]
    if flagged:
        b = boundaries[flagged[-1]]
        log(
            f"warning: GCV's choice has effective degrees of freedom {100 * b.gcv_dof_ratio:.0f}% of the rows "
            f"(above {100 * GCV_DOF_WARNING:.0f}%) at {len(flagged)} task boundar{'y' if len(flagged) == 1 else 'ies'}; "
            "GCV is unreliable as D nears n: prefer --select loo"
        )


def warn_dropped(run: Run, stream: StreamConfig, log: Callable[[str], None]) -> None:
    message = dropped_warning(run.stream, len(run.store.classes), stream.class_order is not None)
    if message:
        log(message)
