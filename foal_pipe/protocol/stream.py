"""The online stream (docs/protocol.md section 3): class order, task split, shuffling, batches.

Everything is drawn from one ``numpy.random.default_rng(seed)``: first the class permutation, then
the within-task shuffles in task order. The store keeps rows in dataset order; only this module
decides the order in which a learner sees them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foal_pipe.errors import FoalPipeError


@dataclass(frozen=True)
class Stream:
    """A task sequence over one split's labels.

    Attributes
    ----------
    tasks : list of lists of label ids, in stream order.
    rows : one array per task: train row indices in the order the learner sees them.
    batch_size : rows per ``partial_fit`` call.
    dropped : label ids left out because they do not split evenly into the tasks.
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


def split_classes(n_classes: int, n_tasks: int, rng: np.random.Generator) -> tuple[list[list[int]], list[int]]:
    """Seeded class permutation split evenly into ``n_tasks``; the leftover classes are returned apart."""
    if n_tasks < 1:
        raise FoalPipeError(f"--tasks must be at least 1, got {n_tasks}")
    if n_tasks > n_classes:
        raise FoalPipeError(
            f"--tasks {n_tasks} is larger than the number of classes ({n_classes}); use --tasks {n_classes} or fewer"
        )
    order = rng.permutation(n_classes)
    per = n_classes // n_tasks
    tasks = [sorted(int(c) for c in order[t * per : (t + 1) * per]) for t in range(n_tasks)]
    return tasks, sorted(int(c) for c in order[n_tasks * per :])


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


def dropped_warning(stream: Stream, n_classes: int, class_order: bool) -> str | None:
    """The warning for classes the stream leaves out (None when it has them all): those that do not split
    evenly into the tasks, or those an explicit ``--class-order`` does not list."""
    if not stream.dropped:
        return None
    ids = f"{len(stream.dropped)} classes (label ids {stream.dropped})"
    if class_order:
        return (f"warning: --class-order lists {n_classes - len(stream.dropped)} of the store's {n_classes} "
                f"classes; dropping the other {ids}: their rows are neither trained on nor evaluated")
    return (f"warning: {n_classes} classes do not split evenly into {stream.n_tasks} tasks; dropping {ids}")


def build_stream(
    labels: np.ndarray,
    n_classes: int,
    n_tasks: int | None,
    batch_size: int,
    seed: int,
    class_order: list[list[int]] | None = None,
    drop_last: bool = False,
) -> Stream:
    """The stream over ``labels`` (a split's label array): tasks, then shuffled rows per task."""
    if batch_size < 1:
        raise FoalPipeError(f"--batch-size must be at least 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    if class_order is None:
        tasks, dropped = split_classes(n_classes, int(n_tasks or 0), rng)
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
