"""The online stream (docs/protocol.md section 3): class order, task split, shuffling, batches.

Everything is drawn from one ``numpy.random.default_rng(seed)``: first the class permutation, then
the within-task shuffles in task order. The store keeps rows in dataset order; only this module
decides the order in which a learner sees them.

The permutation is cut into ``T`` tasks of consecutive classes. When ``T`` does not divide the ``C`` classes,
the first ``C mod T`` tasks get one class more than the others (8 classes in 5 tasks: 2, 2, 2, 1, 1), so every
class is streamed; ``drop_remainder`` instead gives every task ``C // T`` classes and leaves the last
``C mod T`` classes of the permutation out (the published code), with a warning. Without ``T``,
:data:`DEFAULT_TASKS` tasks, or one class per task when there are fewer classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foal_pipe.errors import FoalPipeError, param

#: Tasks when none are asked for (at most one per class).
DEFAULT_TASKS = 10


@dataclass(frozen=True)
class Stream:
    """A task sequence over one split's labels.

    Attributes
    ----------
    tasks : list of lists of label ids, in stream order.
    rows : one array per task: train row indices in the order the learner sees them.
    batch_size : rows per ``partial_fit`` call.
    dropped : label ids left out: by ``drop_remainder``, or not listed by an explicit class order.
    """

    tasks: list[list[int]]
    rows: list[np.ndarray]
    batch_size: int
    dropped: list[int]

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    def task_of_label(self, n_classes: int) -> np.ndarray:
        """``t`` for each label id in task ``t``; -1 for labels outside the stream."""
        out = np.full(n_classes, -1, dtype=np.int64)
        for t, task in enumerate(self.tasks):
            out[task] = t
        return out

    def row_tasks(self, n_rows: int) -> np.ndarray:
        """Task of each train row, -1 for rows the stream skips (dropped classes, ``drop_last``)."""
        out = np.full(n_rows, -1, dtype=np.int64)
        for t, rows in enumerate(self.rows):
            out[rows] = t
        return out

    def batches(self, task: int) -> list[np.ndarray]:
        rows = self.rows[task]
        return [rows[i : i + self.batch_size] for i in range(0, rows.size, self.batch_size)]


def split_classes(n_classes: int, n_tasks: int | None, rng: np.random.Generator,
                  drop_remainder: bool = False) -> tuple[list[list[int]], list[int]]:
    """Seeded class permutation cut into ``n_tasks`` (None: :data:`DEFAULT_TASKS`, at most ``n_classes``); the
    first ``n_classes mod n_tasks`` tasks get one class more, or, with ``drop_remainder``, those classes are
    returned apart (the module's docstring)."""
    if n_tasks is None:
        n_tasks = min(DEFAULT_TASKS, n_classes)
    if n_tasks < 1:
        raise FoalPipeError(f"{param('tasks')} must be at least 1, got {n_tasks}")
    if n_tasks > n_classes:
        raise FoalPipeError(
            f"{param('tasks')} {n_tasks} is larger than the number of classes ({n_classes}); use {param('tasks', n_classes)} or "
            "fewer"
        )
    order = rng.permutation(n_classes)
    per, extra = divmod(n_classes, n_tasks)
    sizes = [per] * n_tasks if drop_remainder else [per + (t < extra) for t in range(n_tasks)]
    bounds = np.cumsum([0, *sizes])
    tasks = [sorted(int(c) for c in order[bounds[t] : bounds[t + 1]]) for t in range(n_tasks)]
    return tasks, sorted(int(c) for c in order[bounds[-1] :])


def read_class_order(path: str | Path, n_classes: int) -> list[list[int]]:
    """Read an explicit task split: a JSON list of task lists of label ids (integers, not booleans).

    It may leave classes out; :func:`dropped_warning` names them once the stream is built.
    """
    path = Path(path)
    example = "write e.g. [[0,1],[2,3]]"
    if not path.is_file():
        raise FoalPipeError(f"class order file {path} does not exist; pass a JSON list of task lists, e.g. [[0,1],[2,3]]")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FoalPipeError(f"class order file {path} is not UTF-8 text (byte {exc.start}); {example}") from None
    except OSError as exc:
        raise FoalPipeError(f"cannot read class order file {path}: {exc.strerror or exc}; {example}") from None
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FoalPipeError(f"class order file {path} is not valid JSON ({exc.msg}); {example}") from None
    except RecursionError:  # Python's parser recurses once per level of nesting
        raise FoalPipeError(f"class order file {path} nests its lists too deeply to read (a task split is a list of "
                            f"lists, two levels); {example}") from None
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, list) and t for t in tasks):
        raise FoalPipeError(f"class order file {path} must hold a non-empty JSON list of non-empty lists of label ids")
    flat = [c for t in tasks for c in t]
    wrong = [c for c in flat if type(c) is not int]  # bool is an int subclass: true is not label 1
    if wrong:
        raise FoalPipeError(f"class order file {path} holds {json.dumps(wrong[0])}, which is not a label id; "
                            f"label ids are integers, {example}")
    bad = [c for c in flat if not 0 <= c < n_classes]
    if bad:
        raise FoalPipeError(f"class order file {path} names label {bad[0]}, outside [0, {n_classes}); use the store's label ids")
    if len(set(flat)) != len(flat):
        raise FoalPipeError(f"class order file {path} lists a class in more than one place; each class belongs to one task")
    return tasks


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 class``, ``2 classes``: ``n`` and the noun in the matching number (``nouns``: default ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def _tasks_range(first: int, last: int) -> str:
    return f"task {first}" if first == last else f"tasks {first}-{last}"


def dropped_warning(stream: Stream, n_classes: int, class_order: bool) -> str | None:
    """The warning for classes the stream leaves out (``--drop-remainder``, or an explicit ``--class-order`` that
    does not list them), or the note on a seeded split into tasks of unequal sizes; None when neither applies."""
    if not stream.dropped:
        sizes = [len(t) for t in stream.tasks]
        if class_order or len(set(sizes)) < 2:
            return None
        larger, n = sizes.count(sizes[0]), stream.n_tasks
        return (f"note: {n_classes} classes do not split evenly into {n} tasks: {_tasks_range(1, larger)} "
                f"{'has' if larger == 1 else 'have'} {counted(sizes[0], 'class', 'classes')}, "
                f"{_tasks_range(larger + 1, n)} {'has' if n - larger == 1 else 'have'} "
                f"{counted(sizes[-1], 'class', 'classes')} (--drop-remainder drops the "
                f"{counted(larger, 'class', 'classes')} left over instead, as the published code)")
    ids = f"{counted(len(stream.dropped), 'class', 'classes')} (label ids {stream.dropped})"
    if class_order:
        return (f"warning: --class-order lists {n_classes - len(stream.dropped)} of the store's {n_classes} "
                f"classes; dropping the other {ids}: their rows are neither trained on nor evaluated")
    return (f"warning: {n_classes} classes do not split evenly into {counted(stream.n_tasks, 'task')}; "
            f"--drop-remainder drops {ids}: their rows are neither trained on nor evaluated")


def build_stream(
    labels: np.ndarray,
    n_classes: int,
    n_tasks: int | None,
    batch_size: int,
    seed: int,
    class_order: list[list[int]] | None = None,
    drop_last: bool = False,
    drop_remainder: bool = False,
) -> Stream:
    """The stream over ``labels`` (a split's label array): tasks (``n_tasks`` None: the default number), then
    shuffled rows per task."""
    if batch_size < 1:
        raise FoalPipeError(f"{param('batch_size')} must be at least 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    if class_order is None:
        tasks, dropped = split_classes(n_classes, n_tasks, rng, drop_remainder)
    elif drop_remainder:
        raise FoalPipeError(f"{param('drop_remainder')} applies to the seeded split into {param('tasks')}; an explicit "
                            f"{param('class_order')} lists its tasks itself: drop {param('drop_remainder', True)}")
    else:
        tasks = class_order
        dropped = sorted(set(range(n_classes)) - {c for t in tasks for c in t})
    rows = []
    for t, task in enumerate(tasks):
        idx = np.flatnonzero(np.isin(labels, task))
        rng.shuffle(idx)
        if drop_last:
            idx = idx[: idx.size - idx.size % batch_size]
        if idx.size == 0:
            raise FoalPipeError(f"task {t} (classes {task}) has no training rows; check the store's labels or the task split")
        rows.append(idx)
    return Stream(tasks=[list(t) for t in tasks], rows=rows, batch_size=batch_size, dropped=dropped)
