"""``foal-pipe table``: every store x head x task count x class order, each run the separate ``learn --head H
--order-seed S --tasks T`` would give (ncm, slda, fecam and cosine on the store's features whatever
``--projection-dim``, as ``sweep --heads``), from one read of each store.

Every run of every store is prepared (checked) before the first starts, so a store's refusal comes before any work.
Per store, the train and test rows of every run are read once and grouped by class
(:func:`~foal_pipe.protocol.walk.shared_rows`); each (task count, order) then takes ridge's walk
(:func:`~foal_pipe.protocol.commands.run_learn` on the shared rows) and one walk of the other heads
(:func:`~foal_pipe.protocol.learners.heads.learn_heads`) from them. Each finished run is kept beside the output
(``.OUT.table-runs/``, :mod:`~foal_pipe.protocol.tablekept`) under a fingerprint of its store and settings, so a
killed table resumes its finished runs; the table's files are written as one unit and the kept runs removed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.activations import BIASED
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import HEADS, head_entry
from foal_pipe.io import atomic_dir, check_output_dir, write_json
from foal_pipe.io.pathtext import path_text
from foal_pipe.memory import check_memory, human
from foal_pipe.protocol.capabilities import Settings
from foal_pipe.protocol.config import ModelConfig, StreamConfig, check_seed, config_record
from foal_pipe.protocol.headruns import (
    PROJECTION_FIELDS,
    RIDGE_FIELDS,
    check_head_options,
    check_learn_head,
    resolved_options,
)
from foal_pipe.protocol.memoryparts import held_bytes, run_parts
from foal_pipe.protocol.ordermeans import mean_std
from foal_pipe.protocol.run import ClassRowsError, Run, check_settings, prepare
from foal_pipe.protocol.stream import DEFAULT_TASKS, counted
from foal_pipe.protocol.tablekept import KeptRuns as _Kept
from foal_pipe.protocol.tablekept import asdict_shallow, fingerprint, recorded_settings, run_record, store_content

#: The format of ``table.json``; a reader refuses another.
TABLE_FORMAT = "foal-pipe/table"
TABLE_VERSION = 1
#: The metrics of a cell, each as mean, std and the values over the orders.
CELL_KEYS = ("A_avg", "A_last", "F")
#: The std of a cell: population (ddof 0), as ``learn --order-seeds`` reports over orders.
DDOF = 0
#: Heads that take ridge's gamma: with ``--gamma auto`` they run at ridge's last-boundary choice on the same order.
GAMMA_HEADS = ("balanced", "dual")


@dataclass(frozen=True)
class TableConfig:
    """What the table crosses: the heads (keys of :data:`foal_pipe.heads.HEADS`), class orders and task counts
    (None: ``learn``'s default, :data:`~foal_pipe.protocol.stream.DEFAULT_TASKS` or the fewest classes of a store)."""

    heads: tuple[str, ...] = ("ridge",)
    order_seeds: tuple[int, ...] = (0,)
    tasks: tuple[int, ...] | None = None


def check_table(config: TableConfig, features: Sequence[Path], settings: Settings,
                explicit: Sequence[str] | None = None) -> None:
    """Refuse, before any work, a table some run of which ``learn`` would refuse, or an option no run would use
    (``explicit``: the options the user gave, ``seed`` and the model's, as
    :func:`~foal_pipe.protocol.headruns.check_head_options` takes them; None: those that differ from the defaults)."""
    if not features:
        raise FoalPipeError(f"no feature store given; pass {param('features', 'A.zarr')} (repeatable)")
    resolved = [Path(f).resolve() for f in features]
    if len(set(resolved)) < len(resolved):
        raise FoalPipeError(f"{param('features')} names a store twice; name each once")
    for name in config.heads:
        head_entry(name, "heads")
    lists = {"heads": config.heads, "order_seeds": config.order_seeds}
    for option, values in {**lists, **({} if config.tasks is None else {"tasks": config.tasks})}.items():
        if not values:
            raise FoalPipeError(f"{param(option)} is empty; give at least one")
        if len(set(values)) < len(values):
            raise FoalPipeError(f"{param(option)} lists a value twice; list each once")
    for seed in config.order_seeds:
        check_seed(seed, "order_seeds")
    for t in config.tasks or ():
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise FoalPipeError(f"{param('tasks')} takes task counts of at least 1, got {t!r}; write e.g. 10,20")
    if settings.stream.class_order is not None and len(config.order_seeds) > 1:
        raise FoalPipeError(f"{param('class_order')} fixes the class order, so {param('order_seeds')} has nothing to vary; "
                            "pass one seed")
    model = settings.model
    check_settings(_ridge_model(model), settings.execution)
    _check_projection_used(config.heads, model, explicit)
    check_head_options(list(config.heads), model, explicit)
    if "ridge" in config.heads and model.resolved_activation in BIASED:  # learn --head ridge's refusal
        raise FoalPipeError(f"{param('activation', model.resolved_activation)} draws a projection bias that ridge's "
                            f"model file does not hold, so ridge's separate `learn` refuses it; drop ridge from "
                            f"{param('heads')} or pass {param('activation', 'relu')}")
    others = [h for h in config.heads if h != "ridge"]
    for name in others:
        check_learn_head(head_model(name, model, 1.0), settings.evaluation, settings.execution)
    auto_heads = [h for h in others if h in GAMMA_HEADS and "gamma" in HEADS[h].options]
    if model.gamma == "auto" and auto_heads and "ridge" not in config.heads:
        raise FoalPipeError(f"with {param('gamma', 'auto')}, {', '.join(auto_heads)} run{'s' * (len(auto_heads) == 1)} at "
                            f"the gamma ridge chooses on the training rows; add ridge to {param('heads')} or pass a "
                            f"number, e.g. {param('gamma', 1)}")


def _check_projection_used(heads: Sequence[str], model: ModelConfig, explicit: Sequence[str] | None) -> None:
    """A projection option, or ``seed``, that no head of the table would use refused: the heads on the store's
    features run there (as ``learn --head``), and the seed draws only the projection and ridge's leave-one-out
    sample."""
    if explicit is None:
        explicit = [f for f in PROJECTION_FIELDS if getattr(model, f) != getattr(ModelConfig(), f)]
    on_features = [h for h in heads if HEADS[h].space == "features"]
    names = ", ".join(heads)
    for option in (f for f in PROJECTION_FIELDS if f not in RIDGE_FIELDS):  # ridge's own: check_head_options names them
        users = [h for h, e in HEADS.items() if e.space == "activations" or (e.space != "features" and option != "activation")]
        if option in explicit and not set(heads) & set(users):
            if len(on_features) == len(heads):
                why = f"work{'s' * (len(heads) == 1)} on the store's features, without a projection or gamma"
            elif on_features:  # and dual, which applies its own activations to the projected rows
                why = "work on the store's features or apply their own activations to the projected rows"
            else:
                why = f"appl{'ies its' if len(heads) == 1 else 'y their'} own activations to the projected rows"
            raise FoalPipeError(f"{names} {why}, so {param(option)} would be ignored; drop {param(option)} or add a head "
                                f"that uses it ({', '.join(users)}) to {param('heads')}")
    sampled = "ridge" in heads and model.loo and model.loo_sample > 0
    if "seed" in explicit and not (sampled or (len(on_features) < len(heads) and model.projection_dim > 0)):
        raise FoalPipeError(f"{param('seed')} draws only the projection and ridge's leave-one-out sample, and no run of "
                            f"{names} here has either; drop {param('seed')} (the class orders come from "
                            f"{param('order_seeds')})")


def head_model(name: str, model: ModelConfig, gamma: float) -> ModelConfig:
    """The settings head ``name``'s separate ``learn --head`` runs with: its own head, ``gamma`` a number (ridge's
    choice with ``--gamma auto``; the heads on the store's features ignore it)."""
    return replace(model, head=name, gamma=gamma)


def run_table(features: Sequence[Path], out: Path, config: TableConfig, settings: Settings,
              explicit: Sequence[str] | None = None, log: Callable[[str], None] = print,
              write: Callable[[Path, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every run of the table, its cells, and its files written by ``write(tmp, table)`` into ``out`` as one unit
    (``table.json`` always); the table as written."""
    start = time.perf_counter()
    out = Path(out)
    check_table(config, features, settings, explicit)
    settings = recorded_settings(settings, config.heads)  # a default typed or not: the same record and kept runs
    check_output_dir(out, inputs=features)
    config = check_stores(config, [Path(p) for p in features], settings)
    kept = _Kept(out)
    runs, resumed = [], 0
    for path in features:
        store_runs, n = _store_runs(Path(path), config, settings, kept, log)
        runs += store_runs
        resumed += n
    if kept.damaged:
        log(f"ignored {counted(kept.damaged, 'kept run')} in {kept.path} that {'is' if kept.damaged == 1 else 'are'} "
            "not a whole run record (edited or cut): run again")
    if resumed:
        log(f"resumed {resumed} finished run{'s' if resumed != 1 else ''} of an interrupted table")
    table = {
        "format": TABLE_FORMAT, "format_version": TABLE_VERSION,
        "features": [path_text(p) for p in features], "heads": list(config.heads),
        "order_seeds": list(config.order_seeds), "tasks": list(config.tasks or ()),
        "settings": {k: _jsonable(config_record(v)) for k, v in asdict_shallow(settings).items()},
        "std_ddof": DDOF, "runs": runs, "cells": cells(runs),
    }
    with atomic_dir(out) as tmp:
        write_json(tmp / "table.json", table)
        if write is not None:
            write(tmp, table)
    kept.clear()
    log(f"{counted(len(runs), 'run')} in {time.perf_counter() - start:.1f} s")
    return table


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def check_stores(config: TableConfig, features: Sequence[Path], settings: Settings) -> TableConfig:
    """Every run of every store prepared (its stream, projection and memory checked) before the first run starts,
    so that a store's refusal, named, comes before any work; ``config`` with the task counts it runs:
    ``learn``'s default when None (:data:`~foal_pipe.protocol.stream.DEFAULT_TASKS`, or the fewest classes of a
    store, one count for the whole table)."""
    from foal_pipe.store import open_store

    if config.tasks is None:
        fewest = min(len(open_store(path).classes) for path in features)
        config = replace(config, tasks=(min(DEFAULT_TASKS, fewest),))
    for path in features:
        try:
            streamed: dict[int, dict[int, int]] = {}
            first: Run | None = None
            held, walks = [], []  # each run's held bytes and walk estimate, not the runs: one is held at a time here
            for (t, seed), stream in _streams(config, settings.stream).items():
                run = prepare(path, stream, _ridge_model(settings.model), settings.evaluation, settings.execution,
                              command="table")
                streamed.setdefault(t, {})[seed] = run.stream.n_tasks
                first = first or run
                held.append(held_bytes(run))
                if "ridge" in config.heads:
                    walks.append(run_parts(run, 1, run.model.loo))
                for group in _groups(config.heads):
                    try:
                        head_run = _head_run(path, stream, group, settings, 1.0)[0]
                    except ClassRowsError as exc:
                        raise FoalPipeError(f"{exc.template} ({param('tasks', t)}, order {seed}); or drop {exc.head} "
                                            f"from {param('heads')}") from None
                    walks.append(run_parts(head_run, heads=group, ridge=False))
            for t, counts in streamed.items():
                _check_same_task_counts(t, counts)
            if first is not None:
                _check_store_memory(config, settings, first, held, walks)
        except FoalPipeError as exc:
            if _names(exc.template, path):
                raise
            raise FoalPipeError(f"{path}: {exc.template}") from None
    return config


def _names(message: str, path: Path) -> bool:
    """Whether ``message`` names the store ``path`` as a whole word, not only holds its text: a store named ``s``
    is in every message's letters (``classes``), and a refusal that does not name it must say which store it is of."""
    return re.search(rf"(?<![\w./-]){re.escape(str(path))}(?![\w/-])", message) is not None


def _check_store_memory(config: TableConfig, settings: Settings, run: Run, held: Sequence[int],
                        walks: Sequence[dict[str, int]]) -> None:
    """What a store's runs hold together, refused before the first: the largest walk (ridge's or a head's, its own
    estimate), every other (task count, order)'s prepared run, and with ridge's one pass its per-class statistics
    (C x D^2, held through the heads' walks) and, with ``--gamma auto``, the boundaries each order's task counts
    share; each walk alone was checked when prepared, this is what they add up to."""
    from foal_pipe.protocol.classsums import class_statistics_bytes
    from foal_pipe.protocol.orderchecks import fallback_reason

    parts: dict[str, int] = {}
    for walk in walks:  # the largest walk: they run one after another
        if sum(walk.values()) > sum(parts.values()):
            parts = dict(walk)
    if len(held) > 1:  # _store_runs holds every (task count, order)'s run through the store's walks
        parts[f"the other {len(held) - 1} prepared runs"] = sum(held[1:])
    ways = [f"lower {param('projection_dim')}", f"fewer {param('order_seeds')} or {param('tasks')}"]
    model, n_classes = run.model, len(run.store.classes)
    every_row = model.loo and not model.loo_sample
    if "ridge" in config.heads and fallback_reason(settings.stream, model, settings.execution, every_row, n_classes,
                                                   dim=run.dim) is None:
        need = class_statistics_bytes(n_classes, run.dim, model.dtype)
        parts[f"ridge's per-class statistics ({n_classes} classes, D={run.dim})"] = need
        if model.gamma == "auto":  # memos of _ridge_from_classes: one boundary's weights per task of every count
            parts["the boundaries the task counts share"] = (
                len(config.order_seeds) * sum(config.tasks or ()) * run.dim * n_classes * 8)
        ways.append(f"set {param('max_memory')} below {human(need)} for one ridge walk per run")
    check_memory("table", parts, ", ".join(ways) + ", or free memory")


def _check_same_task_counts(tasks: int, counts: dict[int, int]) -> None:
    """Refuse class orders of one cell that stream different numbers of tasks (Si-Blurry leaves out a task that
    receives no row): the cell would stand for runs of different lengths under one task count."""
    if len(set(counts.values())) > 1:
        each = ", ".join(f"{seed}: {n}" for seed, n in counts.items())
        raise FoalPipeError(f"at {param('tasks', tasks)} the class orders stream different numbers of tasks ({each}; "
                            f"{param('stream', 'si-blurry')} leaves out a task that receives no row), so a cell would "
                            f"average runs of different lengths; pass {param('order_seeds')} that stream as many tasks "
                            "each, or another task count")


def _streams(config: TableConfig, stream: StreamConfig) -> dict[tuple[int, int], StreamConfig]:
    """The stream of every (task count, order)."""
    return {(t, seed): replace(stream, tasks=t, order_seed=seed) for t in config.tasks or () for seed in config.order_seeds}


def _ridge_model(model: ModelConfig) -> ModelConfig:
    """ridge's settings: the heads' options go to the heads that take them."""
    return replace(model, head="ridge", head_options={})


def _groups(names: Sequence[str]) -> list[list[str]]:
    """The heads other than ridge by the space they walk (the store's features; the projection), one walk each."""
    others = [n for n in names if n != "ridge"]
    groups = [[n for n in others if (HEADS[n].space == "features") == on_features] for on_features in (True, False)]
    return [group for group in groups if group]


def _head_run(path: Path, stream: StreamConfig, group: Sequence[str], settings: Settings,
              gamma: float) -> tuple[Run, ModelConfig]:
    """The prepared walk of ``group`` (one space) and the settings it runs with: those of a head on the activations
    where the group has one (dual's own drop the activation, which its projected rows never see, and the projection
    is drawn alike), so each head's rows are those of its separate ``learn --head``."""
    lead = next((name for name in group if HEADS[name].space == "activations"), group[0])
    model = head_model(lead, settings.model, gamma)
    run_model = check_learn_head(model, settings.evaluation, settings.execution)
    run = prepare(path, stream, run_model, settings.evaluation, settings.execution, heads=group, ridge=False,
                  command="table")
    return run, model


def _store_runs(path: Path, config: TableConfig, settings: Settings, kept: _Kept,
                log: Callable[[str], None]) -> tuple[list[dict[str, Any]], int]:
    """The runs of one store, in the order heads x tasks x orders; the store read once for all that are not kept."""
    from foal_pipe.protocol.classsums import class_statistics
    from foal_pipe.protocol.commands import prefixed, run_learn
    from foal_pipe.protocol.orderchecks import fallback_reason
    from foal_pipe.protocol.orders import walks_text
    from foal_pipe.protocol.walk import shared_rows

    s = settings
    ridge_model = _ridge_model(s.model)
    streams = _streams(config, s.stream)
    runs = {key: prepare(path, stream, ridge_model, s.evaluation, s.execution, command="table")
            for key, stream in streams.items()}
    store = next(iter(runs.values())).store
    content = None if store.meta.generation is not None else store_content(Path(store.path))
    keys = {(h, t, seed): fingerprint(store, h, t, seed, settings, content) for h in config.heads
            for (t, seed) in streams}
    # a kept run resumed under the store as now spelled (its key is the resolved path): cells group by the spelling
    auto = s.model.gamma == "auto"
    resumed = {k: got for k, key in keys.items() if key is not None and (got := kept.get(key, *k, auto)) is not None}
    done = {k: {**rec, "store": path_text(path)} for k, (rec, _) in resumed.items()}
    for (_, t, seed), (_, lines) in resumed.items():
        for line in lines:  # a resumed run's warnings, as it said them when it ran
            log(_run_prefix(path, t, seed) + line)
    n_resumed = len(done)
    # ridge's boundaries of every order and task count from per-class sums (a sampled leave-one-out projects its rows)
    every_row = ridge_model.loo and not ridge_model.loo_sample
    first = next(iter(runs.values()))
    reason = fallback_reason(s.stream, ridge_model, s.execution, every_row, len(store.classes), dim=first.dim)
    one_pass = reason is None
    ridge_todo = sum(("ridge", t, seed) not in done for t, seed in streams) if "ridge" in config.heads else 0
    if reason is not None and ridge_todo > 1:  # said as `learn --order-seeds` says it
        log(f"{path}: running one ridge walk per run ({walks_text(ridge_todo, s.execution)}): {reason}")
    per_class = None
    tasks = config.tasks or ()
    finest = max(tasks)  # each order's classes summed over its finest split: nested splits share boundaries
    splits = {seed: runs[(finest, seed)].stream.tasks for seed in config.order_seeds}
    memos: dict[int, dict[tuple[int, ...], Any]] = {seed: {} for seed in config.order_seeds}
    if len(done) < len(keys):
        with np.errstate(all="ignore"), shared_rows(list(runs.values())) as shared:
            for (t, seed), stream in streams.items():
                gamma = None if auto else float(s.model.gamma)
                said: list[str] = []
                run_log = prefixed(log, _run_prefix(path, t, seed), said)
                if "ridge" in config.heads:
                    rec = done.get(("ridge", t, seed))
                    if rec is None:
                        if one_pass:
                            per_class = per_class or class_statistics(runs[(t, seed)], shared)
                            m = _ridge_from_classes(runs[(t, seed)], stream, per_class, shared, splits[seed],
                                                    memos[seed], run_log)
                        else:
                            with kept.scratch() as tmp:
                                m = run_learn(path, Path(tmp) / "run", stream, ridge_model, s.evaluation,
                                              s.execution, log=run_log, shared=shared).metrics
                        options = {"gamma": m.gamma, "selected_by": m.selected_by,
                                   "gammas_selected": m.gammas_selected}
                        rec = run_record(path, store, "ridge", t, seed, m, options)
                        kept.put(keys[("ridge", t, seed)], rec, said)
                        done[("ridge", t, seed)] = rec
                    if gamma is None:
                        gamma = float(rec["options"]["gammas_selected"][-1])
                todo = [h for h in config.heads if h != "ridge" and (h, t, seed) not in done]
                for rec_key, rec in _head_runs(path, store, todo, t, seed, stream, settings, gamma, shared).items():
                    kept.put(keys[rec_key], rec)
                    done[rec_key] = rec
    return [done[(h, t, seed)] for h in config.heads for t in tasks for seed in config.order_seeds], n_resumed


def _run_prefix(path: Path, tasks: int, seed: int) -> str:
    """What a run's lines start with in the table's log: which store, task count and order they are of."""
    return f"{path} (--tasks {tasks}, order {seed}): "


def _ridge_from_classes(run: Any, stream: StreamConfig, per_class: Any, shared: Any, split: Sequence[Sequence[int]],
                        memo: dict[tuple[int, ...], Any], log: Callable[[str], None]) -> Any:
    """ridge's metrics on one order from the per-class sums (:func:`~foal_pipe.protocol.classsums.order_boundaries`):
    the same rows summed, and a sampled leave-one-out's same rows scored, as its separate ``learn``, so the same
    accuracy matrix (``learn --order-seeds``' one pass), and its warnings ``log``ged as that ``learn`` says them. With
    ``--gamma auto`` the classes are summed over ``split`` (the order's finest split) and a boundary another task
    count of the order reached with the same sums is taken from ``memo``, not solved again."""
    from foal_pipe.protocol.classsums import order_boundaries
    from foal_pipe.protocol.evaluation import accuracy_matrices
    from foal_pipe.protocol.learnkinds import warn_ridge
    from foal_pipe.protocol.records import accuracy_report, learn_metrics
    from foal_pipe.protocol.solvers import FixedGamma, ManyGammas

    model = run.model
    if model.gamma == "auto":
        path = ManyGammas.auto(run)
        boundaries, _ = order_boundaries(run, per_class, path, shared, split, memo)
    else:
        boundaries, _ = order_boundaries(run, per_class, FixedGamma(float(model.gamma)))
    acc = accuracy_matrices(run, boundaries, shared.test)[0]
    metrics = learn_metrics(run, stream, accuracy_report(acc), boundaries)
    warn_ridge(model, boundaries, metrics, log)
    return metrics


def _head_runs(path: Path, store: Any, names: Sequence[str], tasks: int, seed: int, stream: StreamConfig,
               settings: Settings, gamma: float | None, shared: Any) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The heads other than ridge on one (task count, order): one walk of the heads of each space (the store's
    features; the projection) over the shared rows, each as its separate ``learn --head`` would run."""
    from foal_pipe.protocol.learners.heads import learn_heads
    from foal_pipe.protocol.records import run_info
    from foal_pipe.protocol.schema import LearnMetrics

    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    g = 1.0 if gamma is None else gamma
    for group in _groups(names):
        run, model = _head_run(path, stream, group, settings, g)
        options = model.head_arguments()
        reports, _ = learn_heads(run, group, options, shared.train, shared.test)
        for name in group:
            resolved = resolved_options(name, head_model(name, settings.model, g))
            metrics = LearnMetrics(**reports[name], head=name, head_options=resolved, **run_info(run, stream))
            out[(name, tasks, seed)] = run_record(path, store, name, tasks, seed, metrics, resolved)
    return out


def cells(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per store x head x task count: ``A_avg``, ``A_last``, ``F`` (and ``A_auc`` where every run has one)
    as ``{"mean", "std", "values"}`` over its runs' orders, std with ddof :data:`DDOF` (:func:`mean_std`: identical
    values give that value and 0 exactly)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["store"], r["head"], r["tasks"]), []).append(r)
    out = []
    for (store, head, tasks), members in groups.items():
        keys = [*CELL_KEYS, *(["A_auc"] if all(m["A_auc"] is not None for m in members) else [])]
        first = members[0]
        cell: dict[str, Any] = {
            "store": store, "dataset": first["dataset"], "encoder": first["encoder"], "head": head, "tasks": tasks,
            "n_tasks": first["n_tasks"], **{k: first[k] for k in ("stream", "n_classes") if k in first},  # run_record's
            "order_seeds": [m["order_seed"] for m in members]}
        for key in keys:
            values = [float(m[key]) for m in members]
            mean, std = mean_std(values)
            cell[key] = {"mean": mean, "std": std, "values": values}
        out.append(cell)
    return out
