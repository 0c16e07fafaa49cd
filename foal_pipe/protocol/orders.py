"""Many class orders (``--order-seeds``) from one pass over the train split.

The ridge solution after task k depends only on the sums ``G``, ``Q`` over the rows of tasks 1..k, not on
the order of those rows. One pass therefore accumulates each class's statistics (C x D^2 values;
:mod:`~foal_pipe.protocol.classsums`), and every order's boundary k is the sum of its first k tasks' class
statistics: the same rows summed, so each order's accuracy matrix equals a separate ``learn --order-seed s``. A
sampled leave-one-out (``--gamma auto``'s default) scores the rows the separate run scores, projected again.

The one pass needs the order-free sums; where a run needs the rows in stream order (``--engine rls``), every
row again at every boundary (``--loo-sample 0``, ``sweep`` with its leave-one-out pass),
order-dependent rows (``--drop-last``), a cluster (``--scheduler dask``), or where the per-class statistics
exceed ``--max-memory``, it runs one walk per order instead and says so. Either way the store is read once: the
rows of every order's classes are decoded once and grouped by class (:func:`~foal_pipe.protocol.walk.shared_rows`),
and each walk takes its tasks from them.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from foal_pipe.core.engines import check_gamma
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import head_entry
from foal_pipe.io import atomic_dir, check_output_dir, write_json
from foal_pipe.memory import check_memory, human
from foal_pipe.model.modelfile import MODEL_FILE
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.capabilities import Settings, check_capabilities, check_points
from foal_pipe.protocol.classsums import class_statistics, class_statistics_bytes, order_boundaries
from foal_pipe.protocol.commands import (
    check_eval_every,
    check_sweep_select,
    flag_grid_edge,
    grid_edge_warning,
    run_learn,
    run_sweep,
    say_once,
    warn_search_edges,
    warn_undetermined,
)
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
from foal_pipe.protocol.evaluation import accuracy_matrices
from foal_pipe.protocol.headruns import check_sweep_heads
from foal_pipe.protocol.learnkinds import LEARN_KINDS, auto_edges_warning
from foal_pipe.protocol.memoryparts import held_bytes
from foal_pipe.protocol.orderchecks import check_orders, check_task_counts, each_order, fallback_reason
from foal_pipe.protocol.ordermeans import combine, combine_sweep
from foal_pipe.protocol.outputs import replaced_evaluation, save_model, summed_timings, write_learned, write_timings
from foal_pipe.protocol.records import (
    Learned,
    Swept,
    accuracy_report,
    learn_metrics,
    leave_one_out_rows,
    run_info,
    sweep_report,
    sweep_results,
    sweep_selections,
)
from foal_pipe.protocol.run import Run, prepare
from foal_pipe.protocol.runstate import row_sample
from foal_pipe.protocol.schema import METRICS_FILE, SWEEP_FILE, SweepReport
from foal_pipe.protocol.solvers import FixedGamma, ManyGammas
from foal_pipe.protocol.stream import dropped_warning, listed_order
from foal_pipe.protocol.walk import SharedRows, shared_rows


def _check_class_memory(command: str, runs: Sequence[Run], loo: bool, n_models: int = 1, eigen: bool = False,
                        search: int = 0) -> None:
    """The per-class statistics, on top of one order's run as its solver walks it (``n_models`` gammas' weights,
    ``eigen``: factored at every boundary, as ``sweep``'s; its cached rows included; ``loo``: and a sampled
    leave-one-out's coordinates; ``search``: ``sweep``'s refined gammas) and the other orders' prepared runs, against
    the available memory."""
    from foal_pipe.protocol.memoryparts import run_parts

    run = runs[0]
    need = class_statistics_bytes(len(run.store.classes), run.dim, run.model.dtype)
    parts = {**run_parts(run, n_models, loo, eigen=eigen, search=search), "per-class statistics": need}
    if len(runs) > 1:
        parts[f"the other {len(runs) - 1} orders' prepared runs"] = sum(held_bytes(r) for r in runs[1:])
    gammas = f"fewer {param('gammas')}, " if command == "sweep" else ""
    check_memory(f"{command} --order-seeds", parts,
                 f"set {param('max_memory')} below {human(need)} for one walk per order, lower {param('projection_dim')}, "
                 f"use {param('dtype', 'float32')}, {gammas}or free memory")


def check_walks_memory(command: str, runs: Sequence[Run]) -> None:
    """One walk per order, each preparing its run again: the largest walk's estimate (:attr:`Run.parts`) on top of every
    order's prepared run, all held until the last walk, against the available memory."""
    walk = max((run.parts for run in runs), key=lambda parts: sum(parts.values()))
    parts = {**walk, f"the {len(runs)} orders' prepared runs": sum(held_bytes(r) for r in runs)}
    check_memory(f"{command} --order-seeds", parts,
                 f"pass fewer {param('order_seeds')}, lower {param('projection_dim')}, or free memory")


def warn_dropped_once(seeds: Sequence[int], runs: Sequence[Run], stream: StreamConfig,
                      log: Callable[[str], None]) -> Callable[..., None]:
    """Each order's note on its split (:func:`~foal_pipe.protocol.stream.dropped_warning`) said once: in the same words
    for every order (an uneven split's sizes) once, else each order's prefixed with its seed (the classes
    ``--drop-remainder`` drops depend on the order). ``log`` without those notes, for the orders' own walks (with
    ``seed``, an order's own lines prefixed with it)."""
    notes = [dropped_warning(run.stream, len(run.store.classes), listed_order(stream.class_order)) for run in runs]
    say_once(seeds, notes, log)
    said = {note for note in notes if note}

    def rest(text: str, seed: int | None = None) -> None:
        if text not in said:
            log(text if seed is None else f"order seed {seed}: {text}")

    return rest


# ----------------------------------------------------------------------------------------------
# The commands


@dataclass
class _Settings:
    stream: StreamConfig
    model: ModelConfig
    evaluation: EvaluationConfig
    execution: ExecutionConfig


def run_learn_orders(
    features: str | Path,
    out: str | Path,
    seeds: Sequence[int],
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
) -> Learned:
    """``learn`` for every class order of ``seeds``: ``metrics.json`` with ``orders``, ``mean`` and ``std``;
    ``model.safetensors`` is the first order's final model; ``timings.json``."""
    start = time.perf_counter()
    check_output_dir(out, inputs=[features])
    check_orders(stream, seeds)
    kind = LEARN_KINDS[head_entry(model.head).learner]  # as run_learn picks it
    run_model = kind.settings(stream, model, evaluation, execution)
    out = Path(out)
    settings = _Settings(stream, model, evaluation, execution)
    runs = each_order(seeds, lambda s: prepare(features, replace(stream, order_seed=s), run_model, evaluation, execution,
                                               **kind.prepare(model)))
    check_task_counts(seeds, runs)
    if evaluation.eval_every is not None:  # every order's points, once: a fix that suits them all (learn_head: not again)
        check_eval_every(runs, evaluation.eval_every, seeds)
        labels = [r.store.train.labels[np.concatenate(r.stream.rows)] for r in runs]
        check_points(model.head, labels, evaluation.eval_every, seeds, names=runs[0].store.classes)
    loo = model.loo and not model.loo_sample  # a sample's rows are projected again per boundary; every row's are not
    # a head's state follows its rows' stream order: one walk per order by definition (no reason to give)
    reason = fallback_reason(stream, model, execution, loo, len(runs[0].store.classes), evaluation.eval_every is not None,
                             dim=runs[0].dim) if kind.class_sums else None
    if reason is not None or not kind.class_sums:
        check_walks_memory("learn", runs)
        with shared_rows(runs, kind.read) as shared:  # read by the cluster with --scheduler dask
            return _learn_per_order(features, out, seeds, settings, reason, start, log, shared, runs)
    _check_class_memory("learn", runs, model.loo)
    warn_dropped_once(seeds, runs, stream, log)
    with np.errstate(all="ignore"), shared_rows(runs, kind.read) as shared:
        per_class = class_statistics(runs[0], shared)
        entries, finals = [], []
        for s, run in zip(seeds, runs):
            if model.gamma == "auto":
                path = ManyGammas.auto(run)
                boundaries, running = order_boundaries(run, per_class, path, shared)
                finals.append(RidgeModel.solved(running, float(boundaries[-1].gammas[0]), model.gamma_grid,
                                                model.per_decade))
            else:
                fixed = FixedGamma(float(model.gamma))
                boundaries, _ = order_boundaries(run, per_class, fixed)
                finals.append(fixed.model)
            acc = accuracy_matrices(run, boundaries, shared.test)[0]
            metrics = learn_metrics(run, replace(stream, order_seed=s), accuracy_report(acc), boundaries)
            entries.append(metrics)
    metrics = combine(seeds, entries, one_pass=True)
    say_once(seeds, [auto_edges_warning(m) for m in entries], log)  # each order's, as its own walk says it
    return write_learned(out, runs, start, metrics, lambda path: save_model(finals[0], runs[0], path), timed=True)


def walks_text(n: int, execution: ExecutionConfig) -> str:
    """What the walks per order read: the rows once, shared; with ``--scheduler dask`` the cluster also reads the
    store's train rows again for every order's Gram sums."""
    again = "; each order's Gram sums read the train rows again on the Dask cluster" if execution.scheduler == "dask" else ""
    return f"{n} walks over rows read once{again}"


def _learn_per_order(features: str | Path, out: Path, seeds: Sequence[int], settings: _Settings, reason: str | None,
                     start: float, log: Callable[[str], None], shared: SharedRows, runs: Sequence[Run]) -> Learned:
    """One walk per order over the rows read once (``reason``: why ridge cannot sum per class; None for a head
    other than ridge, whose state follows its rows' stream order and is walked per order by definition; ``runs``:
    the orders' prepared runs, whose notes are said once)."""
    if reason is not None:
        log(f"running one walk per class order ({walks_text(len(seeds), settings.execution)}): {reason}")
    log = warn_dropped_once(seeds, runs, settings.stream, log)
    with atomic_dir(out, owned=replaced_evaluation(out)) as tmp:
        results = []
        for s in seeds:
            sub = tmp / f"order-{s}"
            results.append(run_learn(features, sub, replace(settings.stream, order_seed=s), settings.model,
                                     settings.evaluation, settings.execution, log=functools.partial(log, seed=s),
                                     shared=shared))
        shutil.move(str(tmp / f"order-{seeds[0]}" / MODEL_FILE), str(tmp / MODEL_FILE))
        for s in seeds:
            shutil.rmtree(tmp / f"order-{s}")
        metrics = combine(seeds, [r.metrics for r in results], one_pass=False)
        write_json(tmp / METRICS_FILE, metrics.to_dict())
        timings = summed_timings([*(run.timings for run in runs), *(r.timings for r in results)], start)
        write_timings(tmp, timings, METRICS_FILE)
    return Learned(metrics, timings)


def run_sweep_orders(
    features: str | Path,
    out: str | Path,
    seeds: Sequence[int],
    sweep: SweepConfig,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    log: Callable[[str], None] = print,
) -> Swept:
    """``sweep`` for every class order: ``sweep.json`` holds the first order's report with each gamma's A_avg,
    A_last and F replaced by their mean over the orders (``std`` beside them), and ``orders``: each order's
    ``order_seed``, ``tasks``, ``best_gamma`` and ``results``."""
    start = time.perf_counter()
    if sweep.fusions:
        raise FoalPipeError(f"{param('fusions')} compares fusions on one class order; leave out {param('order_seeds')}, or pass "
                            f"{param('fusion', 'X')} with {param('order_seeds')}")
    check_output_dir(out, inputs=[features])
    check_orders(stream, seeds)
    out = Path(out)
    with atomic_dir(out, owned=replaced_evaluation(out)) as tmp:
        # run_sweep validates the settings; one-pass sums apply unless leave-one-out scores every row
        others = check_sweep_heads(sweep, model)
        check_capabilities(others, Settings(stream, model, evaluation, execution))
        check_sweep_select(sweep)
        runs = _sweep_runs(features, seeds, sweep, stream, model, evaluation, execution, others)
        check_task_counts(seeds, runs)
        reason = ("--heads walks every head per class order" if others else
                  fallback_reason(stream, replace(model, engine="gram"), execution, sweep.loo and not model.loo_sample,
                                  len(runs[0].store.classes), dim=runs[0].dim))
        m = runs[0].model
        one_pass = reason is None
        if one_pass and class_statistics_bytes(len(runs[0].store.classes), runs[0].dim, m.dtype) > execution.max_memory:
            log(fallback_reason(stream, m, execution, False, len(runs[0].store.classes), dim=runs[0].dim) or "")
            one_pass = False
        if not one_pass:
            check_walks_memory("sweep", runs)
        with shared_rows(runs) as shared:
            reports, walks = [], []
            if one_pass:
                reports = _sweep_one_pass(runs, seeds, sweep, stream, log, shared)
            else:
                log(f"running one walk per class order ({walks_text(len(seeds), execution)}): "
                    f"{reason or 'the per-class statistics exceed --max-memory'}")
                rest = warn_dropped_once(seeds, runs, stream, log)
                for s in seeds:
                    walks.append(run_sweep(features, tmp / f"order-{s}", sweep, replace(stream, order_seed=s), model,
                                           evaluation, execution, log=functools.partial(rest, seed=s), shared=shared))
                    shutil.rmtree(tmp / f"order-{s}")
                reports = [w.report for w in walks]
        report = flag_grid_edge(replace(combine_sweep(seeds, reports, sweep.resolved_select), one_pass=one_pass), None)
        say_once(seeds, [grid_edge_warning(r) for r in reports], log)  # each order's best gamma, as its own sweep says it
        timings = summed_timings([*(run.timings for run in runs), *(w.timings for w in walks)], start)
        write_json(tmp / SWEEP_FILE, report.to_dict())
        write_timings(tmp, timings, SWEEP_FILE)
    return Swept(report, timings)


def _sweep_runs(features: str | Path, seeds: Sequence[int], sweep: SweepConfig, stream: StreamConfig,
                model: ModelConfig, evaluation: EvaluationConfig, execution: ExecutionConfig,
                heads: Sequence[str] = ()) -> list[Run]:
    """Every order's run of ``sweep`` (its settings validated before any work; ``heads``: the heads other than
    ridge, in its memory estimate)."""
    if not sweep.gammas:
        raise FoalPipeError(f"{param('gammas')} is empty; pass a comma-separated list such as 1e-3,1e-2,1e-1,1,10")
    gammas = [check_gamma(g) for g in sweep.gammas]
    m = replace(model, gamma=1.0, engine="gram")
    return each_order(seeds, lambda s: prepare(features, replace(stream, order_seed=s), m, evaluation, execution,
                                                n_models=len(gammas), loo=sweep.loo, command="sweep", heads=heads,
                                                search=sweep.search_points))


def _sweep_one_pass(runs: Sequence[Run], seeds: Sequence[int], sweep: SweepConfig, stream: StreamConfig,
                    log: Callable[[str], None], shared: SharedRows) -> list[SweepReport]:
    """Each order's sweep report from the per-class sums (within ``--max-memory``: the caller's test), as
    ``run_sweep`` writes it: every gamma's results, each criterion's refined selection and, with a sampled
    leave-one-out, the rows it scored."""
    gammas = [float(g) for g in sweep.gammas]
    m = runs[0].model
    _check_class_memory("sweep", runs, sweep.loo, len(gammas), eigen=True, search=sweep.search_points)
    warn_dropped_once(seeds, runs, stream, log)
    reports, notes = [], []
    with np.errstate(all="ignore"):
        per_class = class_statistics(runs[0], shared)
        for s, run in zip(seeds, runs):
            solver = ManyGammas(gammas, sweep.loo, None, sweep.per_decade, row_sample(run) if sweep.loo else None)
            boundaries, _ = order_boundaries(run, per_class, solver, shared)
            reports_m = [accuracy_report(a) for a in accuracy_matrices(run, boundaries, shared.test)]
            selections = sweep_selections(boundaries, reports_m[len(gammas):], solver.criteria, sweep.per_decade,
                                          m.loo_sample)
            report = sweep_report(gammas, sweep_results(gammas, boundaries, reports_m, sweep.loo), sweep.resolved_select,
                                  run_info(run, replace(stream, order_seed=s)), selections)
            if sweep.loo:
                seen = np.cumsum([r.size for r in run.stream.rows]).tolist()
                report = replace(report, leave_one_out=leave_one_out_rows(boundaries, m.loo_sample, seen))
            said: list[str] = []
            warn_search_edges(selections, said.append)
            warn_undetermined(boundaries, said.append)
            notes.append("\n".join(said) or None)
            reports.append(report)
    say_once(seeds, notes, log)  # as the walks per order say them
    runs[0].store.check_unchanged()
    return reports
