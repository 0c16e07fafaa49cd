"""The run's classes as the model knows them: which task each column of W belongs to, and the final model's
per-class accuracy and confusion matrix on the test split of the run's store.

``metrics.json`` lists each task's classes by the store's label ids (``tasks``); a model continued with
``learn --init-model`` numbers its classes its own way, so such a run also names them (``task_names``) and
the model's columns are matched to tasks by class name (a file written before ``task_names``: the names its store
gives ``tasks``, :func:`continued_names`). Otherwise the label ids are the model's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.io.pathtext import os_path
from foal_pipe.memory import MemoryRefusal
from foal_pipe.report.readers import Run


def continued_names(run: Run) -> list[list[str]] | None:
    """A continued run's classes by name, task by task: its ``task_names``, or for a file written before them
    (foal-pipe before 2026-11-26) its ``tasks``, label ids of the run's store, named by that store where its classes
    are those ``label_ids`` names; None for a run not continued, or where the store is gone or names others."""
    m = run.metrics
    if m.continuation is None or m.continuation.task_names is not None:
        return None if m.continuation is None else m.continuation.task_names
    classes = _store_classes(run)
    tasks = m.tasks or []
    if classes is None or set(classes) != set(m.continuation.label_ids or {}) or \
            any(c >= len(classes) for t in tasks for c in t):
        return None
    return [[classes[c] for c in t] for t in tasks]


def _store_classes(run: Run) -> list[str] | None:
    """The class names of the run's store, found as :func:`class_results` finds it; None where it cannot be read or
    is not the store the model learned last (another generation id)."""
    from foal_pipe.model.modelfile import read_model
    from foal_pipe.store import read_meta

    if run.metrics.features is None:
        return None
    try:
        learned = (read_model(run.model_path, names=())[1].get("learned_from") if run.model_path else None) or [None]
        meta = read_meta(located(run, run.metrics.features, learned[-1]))[1]
    except FoalPipeError:
        return None
    return list(meta.classes) if None in (meta.generation, learned[-1]) or meta.generation == learned[-1] else None


def stream_positions(run: Run, model: tuple[Sequence[int], Sequence[str]] | None = None) -> dict[int, tuple[int, int]]:
    """``{model label id: (task, position in the stream)}`` for each class of this run's stream (0-based), where it
    first appears. A continued run's classes are matched by name to ``model``'s (label ids and class names; by
    default the weight norms'); none where nothing names them."""
    m = run.metrics
    source: Sequence[Sequence[int | None]] = m.tasks or []
    if m.continuation is not None:  # its label ids are the store's, not the model's
        norms = run.weight_norms
        ids, names = model or ((norms[0].tolist(), norms[2] or []) if norms is not None else ([], []))
        by_name = dict(zip(names, ids))
        source = [[by_name.get(name) for name in t] for t in continued_names(run) or []]
    stream = [(t, c) for t, classes in enumerate(source) for c in classes]
    positions: dict[int, tuple[int, int]] = {}
    for k, (t, c) in enumerate(stream):
        if c is not None:
            positions.setdefault(c, (t, k))  # a class a Si-Blurry stream brings again: its first task
    return positions


def stream_order(positions: dict[int, tuple[int, int]], labels: Sequence[int], earlier_first: bool = False) -> list[int]:
    """Indices of ``labels`` (model label ids) in stream order, then those not in the stream by label id;
    ``earlier_first`` (a continued model: those were learned before this stream) puts them first instead."""
    outside = (-1, 0) if earlier_first else (len(positions), 0)
    return sorted(range(len(labels)), key=lambda k: (positions.get(labels[k], outside), labels[k]))


def task_classes(run: Run) -> list[list[str]]:
    """Each task's classes, in stream order: by name when the run, its model or its store names them (a head without
    weights, ncm say, has no weight norms to name them), else label ids (none for a continued run whose classes nothing
    names: its label ids are not the model's)."""
    m = run.metrics
    if m.continuation is not None:
        return continued_names(run) or []
    names: dict[int, str] = {}
    if run.weight_norms is not None and run.weight_norms[2]:
        names = dict(zip(run.weight_norms[0].tolist(), run.weight_norms[2]))
    elif m.tasks and (store := _store_classes(run)) is not None:
        names = dict(enumerate(store))
    return [[names.get(c, str(c)) for c in t] for t in m.tasks or []]


@dataclass(frozen=True)
class Confusion:
    """Confusion counts kept sparse: ``count[k]`` test rows of class ``true[k]`` predicted as class ``predicted[k]``
    (row and column of the ``size`` x ``size`` matrix), each pair once, row by row. A test row adds one pair at most,
    so they grow with the rows, where the matrix grows with the square of the classes (10,000 classes: 800 MB of
    mostly zeros)."""

    size: int
    true: np.ndarray
    predicted: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, size: int, true: np.ndarray, predicted: np.ndarray) -> Confusion:
        """The counts of the pairs ``(true[r], predicted[r])``, one per test row."""
        pairs, count = np.unique(np.asarray(true, np.int64) * size + np.asarray(predicted, np.int64), return_counts=True)
        return cls(size, pairs // size, pairs % size, count.astype(np.int64))

    def totals(self) -> np.ndarray:
        """Each true class's test rows."""
        out = np.zeros(self.size, np.int64)
        np.add.at(out, self.true, self.count)
        return out

    def diagonal(self) -> np.ndarray:
        """Each true class's rows predicted as itself."""
        out, hit = np.zeros(self.size, np.int64), self.true == self.predicted
        out[self.true[hit]] = self.count[hit]
        return out


@dataclass
class ClassResults:
    """The final model on the run's store's test split, one entry per class of the model (stream order, then
    the model's other classes by label id): ``confusion`` counts the rows of each class predicted as each class."""

    features: str
    labels: list[int]
    names: list[str]
    #: Each class's task in this run's stream (1-based); ``None`` for a class the model learned before it.
    tasks: list[int | None]
    confusion: Confusion
    #: Test rows of classes the model does not know (not in the matrix).
    unknown_rows: int
    #: A continued run's ``--eval-features`` stores whose test rows fill the classes learned before it.
    earlier_from: tuple[str, ...] = ()

    def rows(self) -> list[dict[str, Any]]:
        """``class_accuracy.csv``: label id, name, task, test rows, correct, accuracy (%, empty without rows)."""
        totals, hits = self.confusion.totals(), self.confusion.diagonal()
        return [{"class": label, "name": name, "task": "" if task is None else task, "test_rows": int(n),
                 "correct": int(k), "accuracy": 100 * float(k) / n if n else None}
                for label, name, task, n, k in zip(self.labels, self.names, self.tasks, totals, hits)]


def class_results(run: Run) -> ClassResults | str | None:
    """The per-class results of the run's model on its store; ``None`` without a model or without a store named
    in metrics.json (every ``learn`` names it); or why there are none (one sentence): a store that cannot be read,
    or that no longer holds the test rows the run was scored on."""
    from foal_pipe.model.deploy import load_model

    features = run.metrics.features
    if run.model_path is None or features is None:
        return None
    skipped = "so no per-class accuracy or confusion matrix"
    model = load_model(run.model_path, estimators=False)
    learned = model.metadata.get("learned_from") or []
    try:
        where = located(run, features, learned[-1] if learned else None)
    except FoalPipeError as exc:
        return f"{exc}, {skipped}; run `foal-pipe evaluate` from the folder `foal-pipe learn` ran in."
    try:
        changed = _other_generation(model.metadata, where, features)
        true, predicted = model.store_predictions(where, command="evaluate")
    except MemoryRefusal:  # the machine's limit, not the store's fault: evaluate is refused
        raise
    except FoalPipeError as exc:
        return f"The run's feature store could not be read or scored, {skipped} ({exc})."
    if changed is not None:
        return f"{changed}, {skipped}; re-run learn on it."
    ids = model.classifier.classes_.tolist()
    positions = stream_positions(run, (ids, model.class_names))
    order = stream_order(positions, ids)
    column = np.zeros(max(ids) + 1, dtype=np.int64)  # model label id -> row and column of the matrix
    column[[ids[k] for k in order]] = np.arange(len(order))
    streamed = int(np.isin(true, list(positions)).sum())
    n_test = run.metrics.n_test
    if n_test is not None and streamed != n_test and streamed + _untrained_rows(run, where, model.class_names) != n_test:
        return (f"{features} now holds {streamed:,} test rows of the run's classes but the run was tested "
                f"on {n_test:,}: the store changed since `foal-pipe learn`, {skipped}; re-run learn.")
    known = true >= 0
    earlier = _earlier_rows(run, where, model, positions)
    if isinstance(earlier, str):
        return f"{earlier}, {skipped}."
    pairs = [(true[known], predicted[known]), *earlier.values()]
    confusion = Confusion.of(len(order), np.concatenate([column[t] for t, _ in pairs]),
                             np.concatenate([column[p] for _, p in pairs]))
    tasks = [positions[ids[k]][0] + 1 if ids[k] in positions else None for k in order]
    return ClassResults(features, [ids[k] for k in order], [model.class_names[k] for k in order], tasks, confusion,
                        int((~known).sum()), tuple(earlier))


def located(run: Run, recorded: str, generation: str | None = None) -> str:
    """Where to read a store that metrics.json names as ``learn`` was given it: as recorded (an absolute path, or a
    relative one that exists from here), or below a directory above the run (a relative path typed in the project's
    root, say, read by `evaluate` run from elsewhere). Where several different stores answer to the name, the one of
    ``generation`` (the model's last ``learned_from``) is taken, so the working directory cannot pick an unrelated
    store; reports keep naming it as recorded, so their bytes do not depend on where they run. Raises
    :class:`FoalPipeError` when several different stores answer and no generation id tells which one is the run's."""
    found = _candidates(run, os_path(recorded))
    if len(found) <= 1:
        return found[0] if found else os_path(recorded)
    ours = [where for where in found if generation is not None and _generation(where) == generation]
    if ours:
        return ours[0]
    named = [os.path.abspath(where) for where in found]
    listing = f"{', '.join(named[:-1])} and {named[-1]}"
    raise FoalPipeError(f"{recorded} names {len(found)} different stores, {listing}, and no generation id tells which "
                        "one is the run's")


def _candidates(run: Run, recorded: str) -> list[str]:
    """Every existing store ``recorded`` may name, each once (a path that reaches one already listed, through a
    symlink or as the same folder, is left out): as recorded from here, then below each directory above the run."""
    path = Path(recorded)
    if path.is_absolute():
        return [recorded]
    found: list[str] = [recorded] if path.exists() else []
    for base in run.path.resolve().parents:
        where = base / path
        if where.exists() and not any(os.path.samefile(where, other) for other in found):
            found.append(str(where))
    return found


def _generation(where: str) -> str | None:
    """The generation id of the store at ``where``; None without one, or where it cannot be read as a store."""
    from foal_pipe.store import read_meta

    try:
        return read_meta(where)[1].generation
    except FoalPipeError:
        return None


def _other_generation(metadata: dict[str, Any], where: str, features: str) -> str | None:
    """Why ``features`` is not the store the model learned last (its generation id, a digest of its metadata and
    chunk records, differs from the model's ``learned_from``), or None: a store re-extracted with another test
    split, or replaced, would score the model on rows the run never saw. Stores without a generation are not told."""
    from foal_pipe.store import read_meta

    learned = metadata.get("learned_from") or []
    generation = read_meta(where)[1].generation  # the attributes only: the store itself is opened, checked, once after
    if not learned or generation is None or generation == learned[-1]:
        return None
    return (f"{features} is not the store the run learned from (generation {generation[:12]}, the model's "
            f"{learned[-1][:12]}): it was re-extracted or replaced since `foal-pipe learn`")


def _untrained_rows(run: Run, where: str, known: list[str]) -> int:
    """Test rows of the stream's classes that the model has no class for (a class with test rows but no training
    row): the run scored them (always wrong), and the model's predictions count them as of unknown classes.
    ``where``: the run's store, as :func:`located` found it."""
    from foal_pipe.store import open_store

    m = run.metrics
    store = open_store(where)
    stream = ({name for t in m.continuation.task_names for name in t} if m.continuation and m.continuation.task_names
              else {store.classes[c] for t in m.tasks or [] for c in t if c < len(store.classes)})
    missing = [k for k, name in enumerate(store.classes) if name in stream - set(known)]
    return int(np.isin(np.asarray(store.test.labels), missing).sum()) if missing else 0


def _earlier_rows(run: Run, own: str, model: Any, positions: dict[int, tuple[int, int]]
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]] | str:
    """A continued run's ``--eval-features`` stores: each one's ``(true, predicted)`` on its test rows of the
    classes learned before the run (the run's own store, ``own`` as :func:`located` found it, is left out: its rows
    are counted already); or why a store cannot be read."""
    from foal_pipe.protocol.continuation import same_store

    continuation = run.metrics.continuation
    stores = [e.features for e in (continuation.eval_features or [])] if continuation is not None else []
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        for features in stores:
            if same_store(located(run, features), own):
                continue
            true, predicted = model.store_predictions(located(run, features), command="evaluate")
            before = (true >= 0) & ~np.isin(true, list(positions))
            rows[features] = (true[before], predicted[before])
    except MemoryRefusal:
        raise
    except FoalPipeError as exc:
        return f"The run's --eval-features store could not be read or scored ({exc})"
    return rows
