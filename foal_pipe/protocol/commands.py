"""The ``learn`` and ``sweep`` commands: prepare, walk, test, record, and write the outputs as one unit."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from foal_pipe.core.engines import check_gamma
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import head_entry
from foal_pipe.io import check_output_dir, write_json
from foal_pipe.protocol.anytime import Anytime
from foal_pipe.protocol.capabilities import Settings, check_capabilities
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
from foal_pipe.protocol.evaluation import lane_accuracies, model_reports
from foal_pipe.protocol.headruns import (
    check_sweep_heads,
    resolved_options,
)
from foal_pipe.protocol.internal import known
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.learners.heads import learn_heads
from foal_pipe.protocol.learnkinds import LEARN_KINDS, shown, warn_gcv
from foal_pipe.protocol.outputs import write_learned, write_outputs
from foal_pipe.protocol.records import (
    Learned,
    Swept,
    accuracy_report,
    choose,
    fusion_entry,
    fusions_report,
    grid_edge,
    heads_report,
    leave_one_out_rows,
    run_info,
    sweep_report,
    sweep_results,
    sweep_selections,
    undetermined,
)
from foal_pipe.protocol.run import Run, prepare, reread_note
from foal_pipe.protocol.runstate import row_sample
from foal_pipe.protocol.schema import SWEEP_FILE, SweepReport
from foal_pipe.protocol.solvers import Boundary, ManyGammas
from foal_pipe.protocol.stream import dropped_warning, listed_order
from foal_pipe.protocol.sweepparts import SweepSelection
from foal_pipe.protocol.walk import SharedRows, head_train_rows, test_rows, walk
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
    """Train ``model.head`` through the stream, evaluate after each task; write ``metrics.json``,
    ``model.safetensors`` and ``timings.json`` (wall-clock seconds by step, not a pipeline output) into ``out`` as one
    unit. ``shared``: rows already read for several class orders (:func:`~foal_pipe.protocol.walk.shared_rows`). The
    head's registry entry picks its learner of the one walk and its outputs
    (:data:`~foal_pipe.protocol.learnkinds.LEARN_KINDS`: ridge's Gram lanes or rls engine, or a registry head)."""
    kind = LEARN_KINDS[head_entry(model.head).learner]
    settings = kind.settings(stream, model, evaluation, execution)
    start = time.perf_counter()
    check_output_dir(out, inputs=[features])
    run = prepare(features, stream, settings, evaluation, execution, **kind.prepare(model))
    anytime = anytime_points(run)
    warn_dropped(run, stream, log)
    with np.errstate(all="ignore"):  # overflow is caught by the finiteness checks of the solves
        metrics, save = kind.learn(run, model, stream, shared, anytime, log)
    return write_learned(out, [run], start, metrics, save, timed=True)


def anytime_points(run: Run) -> Anytime | None:
    """The evaluation points of ``--eval-every`` (None without it); refused when the stream is shorter."""
    every = run.evaluation.eval_every
    if every is None:
        return None
    check_eval_every([run], every)
    return Anytime(run, every)


def check_eval_every(runs: Sequence[Run], every: int, seeds: Sequence[int] | None = None) -> None:
    """``--eval-every`` at most every stream's training rows (``seeds``: the streams' class orders, the shortest
    named), else that stream would have no point to evaluate."""
    counts = [int(sum(r.size for r in run.stream.rows)) for run in runs]
    k = int(np.argmin(counts))
    if every > counts[k]:
        where = "the stream's" if seeds is None else f"class order seed {seeds[k]}'s"
        raise FoalPipeError(f"{param('eval_every', every)} is more than {where} {counts[k]:,} training rows, so nothing "
                            f"would be evaluated; pass at most {param('eval_every', counts[k])}")


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
    check_sweep_select(sweep)
    select = sweep.resolved_select
    fusions = [f.text for f in parse_fusions(list(sweep.fusions), param("fusions"))] if sweep.fusions else []
    if fusions and stream.stream != "disjoint":
        raise FoalPipeError(f"{param('fusions')} scores disjoint tasks; with {param('stream', stream.stream)} compare "
                            f"fusions one at a time ({param('fusion', 'X')})")
    others = check_sweep_heads(sweep, model)
    check_capabilities(others, Settings(stream, model, evaluation, execution))  # what ridge alone would take
    check_output_dir(out, inputs=[features])
    run = prepare(features, stream, replace(model, gamma=1.0, engine="gram"), evaluation, execution,
                  n_models=len(gammas), loo=sweep.loo, command="sweep", fusions=fusions, heads=others,
                  search=sweep.search_points)
    warn_dropped(run, stream, log)
    if sweep.loo and not run.keep_activations:
        log(reread_note(run))
    sample = row_sample(run) if sweep.loo else None  # learn --gamma auto's rows and bound (--loo-sample)
    solvers = {key: ManyGammas(gammas, sweep.loo, None, sweep.per_decade, sample) for key in run.lanes}
    read = others and shared is None  # the heads walk the rows ridge's walk takes, read once
    with np.errstate(all="ignore"), (head_train_rows(run) if read else nullcontext(shared.train if shared else None)) as train, \
            (test_rows(run) if read else nullcontext(shared.test if shared else None)) as test:
        lanes = walk(run, [GramLearner(run, solvers)], train)[0].lanes
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
        seen = np.cumsum([r.size for r in run.stream.rows]).tolist()
        report = replace(report, leave_one_out=leave_one_out_rows(next(iter(lanes.values())).boundaries,
                                                                  model.loo_sample, seen))
    warn_search_edges(report.selections or [], log)
    if sweep.heads:
        report = with_heads(report, report.fusion if fusions else None)
    for key, lane in lanes.items():
        lane_log = log if key is None else prefixed(log, f"{key}: ")
        warn_gcv(lane.boundaries, gammas, lane_log)
        warn_undetermined(lane.boundaries, lane_log)
    report = flag_grid_edge(report, None if shared else log)  # one of several orders: run_sweep_orders warns once
    return Swept(report, write_outputs(out, [run], start, lambda tmp: write_json(tmp / SWEEP_FILE, report.to_dict()),
                                       SWEEP_FILE))


def check_sweep_select(sweep: SweepConfig) -> None:
    """Refuse a ``--select`` that is unknown, or that needs the leave-one-out pass ``--no-loo`` turns off."""
    select = sweep.resolved_select
    if select not in CRITERIA:
        raise FoalPipeError(f"unknown {param('select')} {select!r}; choose one of {', '.join(CRITERIA)}")
    if CRITERIA[select].rows and not sweep.loo:
        raise FoalPipeError(f"{param('select', select)} needs the leave-one-out pass; drop {param('loo', False)} or use "
                            f"{param('select', 'gcv')}")


def prefixed(log: Callable[[str], None], prefix: str, said: list[str] | None = None) -> Callable[[str], None]:
    """``log`` with ``prefix`` before every line (a fusion's warnings name it); each line also kept in ``said``
    where given, unprefixed (a table's kept run says them again when resumed)."""
    def say(text: str) -> None:
        if said is not None:
            said.append(text)
        log(prefix + text)

    return say


def grid_edge_warning(report: SweepReport) -> str | None:
    """The warning when ``report``'s ``best_gamma`` is on an edge of its ``gammas`` (None: it is not)."""
    gamma, grid = known(report.best_gamma, "a sweep's best gamma"), known(report.gammas, "a sweep's gammas")
    edge = grid_edge(gamma, grid)
    if edge is None:
        return None
    best, low, high = shown(gamma, min(grid), max(grid))
    return (f"warning: the best gamma by {report.selected_by}, {best}, is the {edge} of --gammas ({low} .. {high}); a "
            "better gamma may lie beyond the grid: extend --gammas")


def flag_grid_edge(report: SweepReport, log: Callable[[str], None] | None) -> SweepReport:
    """The report, recording whether its ``best_gamma`` is on an edge of its ``gammas``; warn when it is (``log``;
    None: the caller warns, as ``--order-seeds`` does once for every order, :func:`say_once`)."""
    warning = grid_edge_warning(report)
    if warning and log:
        log(warning)
    return replace(report, best_gamma_at_grid_edge=warning is not None)


def warn_search_edges(selections: Sequence[SweepSelection], log: Callable[[str], None]) -> None:
    """``sweep``: warn when a criterion's refined choice at the last boundary is an end of the searched range."""
    for s in selections:
        if s.at_edge[-1]:
            chosen, low, high = shown(s.gammas_selected[-1], s.gammas[0], s.gammas[-1])
            log(f"warning: {CRITERIA[s.criterion].short}'s refined choice, {chosen}, is an end of the searched range "
                f"({low} .. {high}); a better gamma may lie beyond: extend --gammas")


def warn_undetermined(boundaries: Sequence[Boundary], log: Callable[[str], None]) -> None:
    """``sweep``: say which criteria chose no gamma (no value at some boundary) and are left out of ``selections``."""
    for name in undetermined(boundaries):
        log(f"warning: {CRITERIA[name].short} has no value at any gamma of some task boundary (below its rounding: "
            f"the gammas are too small for these sums), so no choice by it is recorded; use larger --gammas")


def warn_dropped(run: Run, stream: StreamConfig, log: Callable[[str], None]) -> None:
    message = dropped_warning(run.stream, len(run.store.classes), listed_order(stream.class_order))
    if message:
        log(message)


def say_once(seeds: Sequence[int], notes: Sequence[str | None], log: Callable[[str], None]) -> None:
    """The class orders' ``notes`` (None: none) said once: in the same words for every order once, else each order's
    lines prefixed with its seed."""
    if len(set(notes)) == 1:
        if notes[0]:
            log(notes[0])
        return
    for seed, note in zip(seeds, notes):
        if note:
            log("\n".join(f"order seed {seed}: {line}" for line in note.splitlines()))
