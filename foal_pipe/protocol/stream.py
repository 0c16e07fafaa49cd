"""The online stream (docs/protocol.md section 3, docs/streams.md): class order, task split, shuffling, batches.

Everything is drawn from one ``numpy.random.default_rng(seed)``: first the class permutation, then
the within-task shuffles in task order. The store keeps rows in dataset order; only this module
decides the order in which a learner sees them.

The permutation is cut into ``T`` tasks of consecutive classes. When ``T`` does not divide the ``C`` classes,
the first ``C mod T`` tasks get one class more than the others (8 classes in 5 tasks: 2, 2, 2, 1, 1), so every
class is streamed; ``drop_remainder`` instead gives every task ``C // T`` classes and leaves the last
``C mod T`` classes of the permutation out (the published code), with a warning. Without ``T``,
:data:`DEFAULT_TASKS` tasks, or one class per task when there are fewer classes.

That is the ``disjoint`` stream. ``si-blurry`` (:func:`si_blurry`) lets classes recur across tasks and draws
the number of classes per task (Moon et al., ICCV 2023); :data:`STREAMS` names both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from foal_pipe.errors import FoalPipeError, param

#: Tasks when none are asked for (at most one per class).
DEFAULT_TASKS = 10
#: Si-Blurry's percentages when none are asked for (the published code's).
DEFAULT_RATIOS = {"disjoint_ratio": 50, "blurry_ratio": 10}


class OrderError(FoalPipeError):
    """A refusal of one class order's stream (its split or shuffles): ``--order-seeds`` names the order."""


def listed_classes(task: list[int]) -> str:
    """A task's label ids in a message: ``1, 4, 7``, the first 8 of a longer task and its count."""
    return ", ".join(map(str, task[:8])) + (f", ... ({len(task)} classes)" if len(task) > 8 else "")


@dataclass(frozen=True)
class Stream:
    """A task sequence over one split's labels.

    Attributes
    ----------
    tasks : list of lists of label ids, in stream order.
    rows : one array per task: train row indices in the order the learner sees them.
    batch_size : rows per ``partial_fit`` call.
    dropped : label ids left out: by ``drop_remainder``, not listed by an explicit class order, or among
        ``emptied`` or ``untrained``.
    emptied : label ids whose every training row ``drop_last`` dropped.
    untrained : label ids with test rows but no training row (scored, they could only be wrong).
    named : its tasks are a named class order's (``pilot``) cut into ``--tasks``, which streams every class
        (``--drop-remainder`` is refused with it).
    """

    tasks: list[list[int]]
    rows: list[np.ndarray]
    batch_size: int
    dropped: list[int]
    kind: str = "disjoint"
    disjoint_classes: list[int] | None = None  # si-blurry: the classes seen in one task only
    blurred_rows: int | None = None  # si-blurry: rows of the other classes dealt over the tasks
    emptied: list[int] = field(default_factory=list)
    untrained: list[int] = field(default_factory=list)
    named: bool = False

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    def task_of_label(self, n_classes: int) -> np.ndarray:
        """``t`` for each label id first seen in task ``t`` (its only task in a disjoint stream); -1 for labels
        outside the stream."""
        out = np.full(n_classes, -1, dtype=np.int64)
        for t in reversed(range(self.n_tasks)):
            out[self.tasks[t]] = t
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


def split_classes(n_classes: int, n_tasks: int | None, rng: np.random.Generator | None,
                  drop_remainder: bool = False, order: np.ndarray | None = None) -> tuple[list[list[int]], list[int]]:
    """Seeded class permutation (or the given ``order``) cut into ``n_tasks`` (None: :data:`DEFAULT_TASKS`, at most
    ``n_classes``); the first ``n_classes mod n_tasks`` tasks get one class more, or, with ``drop_remainder``,
    those classes are returned apart (the module's docstring)."""
    if n_tasks is None:
        n_tasks = min(DEFAULT_TASKS, n_classes)
    if n_tasks < 1:
        raise FoalPipeError(f"{param('tasks')} must be at least 1, got {n_tasks}")
    if n_tasks > n_classes:
        raise FoalPipeError(
            f"{param('tasks')} {n_tasks} is larger than the number of classes ({n_classes}); use {param('tasks', n_classes)} or "
            "fewer"
        )
    if order is None:
        order = rng.permutation(n_classes)  # type: ignore[union-attr]
    per, extra = divmod(n_classes, n_tasks)
    sizes = [per] * n_tasks if drop_remainder else [per + (t < extra) for t in range(n_tasks)]
    bounds = np.cumsum([0, *sizes])
    tasks = [sorted(int(c) for c in order[bounds[t] : bounds[t + 1]]) for t in range(n_tasks)]
    return tasks, sorted(int(c) for c in order[bounds[-1] :])


#: The named class orders of ``--class-order`` (docs/orders.md): name -> (default seed, the permutation of the
#: ``C`` label ids it draws from a seed). ``pilot`` is LAMDA-PILOT's (PyCIL's, RanPAC's): ``np.random.seed(1993)``
#: then ``np.random.permutation(C)`` (NumPy's legacy generator) over the label ids, which are the sorted class
#: folder names in both tools. ``pilot:S`` draws it from seed ``S``.
CLASS_ORDERS: dict[str, tuple[int, Callable[[int, int], np.ndarray]]] = {
    "pilot": (1993, lambda n_classes, seed: np.random.RandomState(seed).permutation(n_classes)),
}


def named_class_order(text: str) -> tuple[str, int] | None:
    """``(name, seed)`` when ``text`` is ``NAME`` or ``NAME:SEED`` of :data:`CLASS_ORDERS`, else None (a file)."""
    name, colon, seed = text.partition(":")
    if name not in CLASS_ORDERS:
        return None
    if colon and not (seed.isdigit() and seed.isascii()):
        raise FoalPipeError(f"{param('class_order', text)} is not {name} with a seed (the seed after the colon must be a "
                            f"non-negative integer); pass e.g. {param('class_order', f'{name}:{CLASS_ORDERS[name][0]}')}")
    if colon and int(seed) >= 2**32:  # NumPy's legacy generator (the published code's) takes 32-bit seeds
        raise FoalPipeError(f"{param('class_order', text)}: the seed after the colon must be below 2**32 "
                            f"({2**32:,}), the range of NumPy's legacy generator the {name} order draws from; pass e.g. "
                            f"{param('class_order', f'{name}:{CLASS_ORDERS[name][0]}')}")
    return name, int(seed) if colon else CLASS_ORDERS[name][0]


def listed_order(value: str | Path | None) -> bool:
    """Whether ``--class-order`` lists the tasks itself (a file), which may leave classes out; a named order is drawn
    over every class and split as a seeded one is (its uneven split noted as that one's)."""
    return value is not None and named_class_order(str(value)) is None


def resolve_class_order(value: str | Path, n_classes: int, n_tasks: int | None,
                        drop_remainder: bool = False) -> list[list[int]]:
    """The tasks of ``--class-order``: a named order (:data:`CLASS_ORDERS`) cut into ``n_tasks`` as the seeded split
    is, or the task lists of a JSON file (:func:`read_class_order`)."""
    named = named_class_order(str(value))
    if named is None:
        tasks = read_class_order(value, n_classes)
        if n_tasks is not None and n_tasks != len(tasks):  # the file's split is the run's: another count is ignored
            raise FoalPipeError(f"{param('tasks', n_tasks)} conflicts with {param('class_order', str(value))}, which "
                                f"lists {len(tasks)} tasks; drop {param('tasks')}")
        return tasks
    if Path(value).exists():
        raise FoalPipeError(f"{param('class_order', str(value))} names both the class order {named[0]} and the file "
                            f"{value}; rename the file")
    if drop_remainder:
        raise FoalPipeError(f"{param('class_order', str(value))} streams every class (the first classes mod tasks "
                            f"tasks one class larger); drop {param('drop_remainder', True)}")
    name, seed = named
    tasks, _ = split_classes(n_classes, n_tasks, None, order=CLASS_ORDERS[name][1](n_classes, seed))
    return tasks


def read_class_order(path: str | Path, n_classes: int) -> list[list[int]]:
    """Read an explicit task split: a JSON list of task lists of label ids (integers, not booleans).

    It may leave classes out; :func:`dropped_warning` names them once the stream is built.
    """
    path = Path(path)
    example = "write e.g. [[0,1],[2,3]]"
    if path.is_dir():
        raise FoalPipeError(f"class order file {path} is a directory; pass the path of a JSON file of task lists, e.g. "
                            "one holding [[0,1],[2,3]]")
    if path.exists() and not path.is_file():  # a pipe is read once, and every class order's run reads the file again
        raise FoalPipeError(f"class order file {path} is not a regular file (a pipe or a device); write the task lists "
                            "to a file and pass its path")
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
    except ValueError:  # Python's limit on the digits of an integer it converts (4,300 by default)
        raise FoalPipeError(f"class order file {path} holds a number too long to be a label id (the store's are 0 to "
                            f"{n_classes - 1}); {example}") from None
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
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def _tasks_range(first: int, last: int) -> str:
    return f"task {first}" if first == last else f"tasks {first}-{last}"


def dropped_warning(stream: Stream, n_classes: int, class_order: bool) -> str | None:
    """The warnings (one a line) for classes the stream leaves out: by ``--drop-remainder``, an explicit
    ``--class-order`` that does not list them, ``--drop-last`` (:attr:`Stream.emptied`) or for want of training
    rows (:attr:`Stream.untrained`); or the note on a seeded split into tasks of unequal sizes; None when none
    applies (a Si-Blurry stream draws unequal tasks by design)."""
    lines = [_split_warning(stream, n_classes, class_order) if stream.kind == "disjoint" else None]
    if stream.emptied:
        lines.append(f"warning: --drop-last drops the last partial batch of every task, and with it every training row of "
                     f"{counted(len(stream.emptied), 'class', 'classes')} (label ids {stream.emptied}): they are neither "
                     "trained on nor evaluated")
    if stream.untrained:
        lines.append(f"warning: {counted(len(stream.untrained), 'class', 'classes')} (label ids {stream.untrained}) "
                     f"{'has' if len(stream.untrained) == 1 else 'have'} test rows but no training row: left out of the "
                     "stream, neither trained on nor evaluated")
    return "\n".join(line for line in lines if line) or None


def _split_warning(stream: Stream, n_classes: int, class_order: bool) -> str | None:
    """:func:`dropped_warning`'s line on the disjoint split: the classes it leaves out, or its unequal sizes."""
    lost = set(stream.emptied) | set(stream.untrained)
    left = [c for c in stream.dropped if c not in lost]
    if not left:
        if class_order:
            return None
        per, extra = divmod(n_classes, stream.n_tasks)  # the split's sizes, before any class was emptied or untrained
        sizes = [per + (t < extra) for t in range(stream.n_tasks)]
        if len(set(sizes)) < 2:
            return None
        larger, n = extra, stream.n_tasks
        instead = "" if stream.named else (f" (--drop-remainder drops the {counted(larger, 'class', 'classes')} left "
                                           "over instead, as the published code)")  # a named order streams every class
        return (f"note: {n_classes} classes do not split evenly into {n} tasks: {_tasks_range(1, larger)} "
                f"{'has' if larger == 1 else 'have'} {counted(sizes[0], 'class', 'classes')}, "
                f"{_tasks_range(larger + 1, n)} {'has' if n - larger == 1 else 'have'} "
                f"{counted(sizes[-1], 'class', 'classes')}{instead}")
    ids = f"{counted(len(left), 'class', 'classes')} (label ids {left})"
    if class_order:
        return (f"warning: --class-order lists {n_classes - len(left)} of the store's {n_classes} "
                f"classes; dropping the other {ids}: their rows are neither trained on nor evaluated")
    return (f"warning: {n_classes} classes do not split evenly into {counted(stream.n_tasks, 'task')}; "
            f"--drop-remainder drops {ids}: their rows are neither trained on nor evaluated")


def _drop_last_empties(n_rows: int, task: int, batch_size: int) -> str:
    """The refusal when ``--drop-last`` would empty task ``task`` (1-based, as every message numbers tasks)."""
    return (f"{param('drop_last')} would drop all {n_rows} rows of task {task} (fewer than {param('batch_size')} "
            f"{batch_size}); use a smaller {param('batch_size')} or leave out {param('drop_last')}")


def build_stream(
    labels: np.ndarray,
    n_classes: int,
    n_tasks: int | None,
    batch_size: int,
    seed: int,
    class_order: list[list[int]] | None = None,
    drop_last: bool = False,
    drop_remainder: bool = False,
    test_labels: np.ndarray | None = None,
    named: bool = False,
) -> Stream:
    """The stream over ``labels`` (a split's label array): tasks (``n_tasks`` None: the default number), then
    shuffled rows per task. A class left with no training row in its task (``test_labels``: one with test rows
    and none to train on, or one ``drop_last`` empties) leaves the task and joins ``dropped``, as in :func:`si_blurry`:
    scored, it could only be wrong. ``named``: ``class_order`` is a named order's split (:attr:`Stream.named`), not
    task lists of the user's (a file), whose split ``--tasks`` cannot change."""
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
    in_tasks = {c for task in tasks for c in task}
    untrained = [] if test_labels is None else [c for c in _untrained(labels, test_labels) if c in in_tasks]
    rows, emptied, kept = [], [], []
    for t, task in enumerate(tasks):
        idx = np.flatnonzero(np.isin(labels, task))
        rng.shuffle(idx)
        if idx.size == 0:
            fix = (f"move them into a task with training rows or leave them out of {param('class_order')}"
                   if class_order is not None and not named else
                   f"use fewer {param('tasks')} (each task then holds more classes), a {param('class_order')} without them")
            raise OrderError(f"task {t + 1} (classes {listed_classes(task)}) has no training rows: none of its classes has a "
                             f"row in the training split; {fix}, or check the store's labels")
        if drop_last and idx.size < batch_size:
            raise OrderError(_drop_last_empties(idx.size, t + 1, batch_size))
        if drop_last:
            present = np.unique(labels[idx])
            idx = idx[: idx.size - idx.size % batch_size]
            emptied += [int(c) for c in np.setdiff1d(present, labels[idx])]
        rows.append(idx)
        kept.append([c for c in task if c not in emptied and c not in untrained])
    return Stream(tasks=kept, rows=rows, batch_size=batch_size, dropped=sorted(dropped + emptied + untrained),
                  emptied=sorted(emptied), untrained=untrained, named=named)


def _untrained(train_labels: np.ndarray, test_labels: np.ndarray) -> list[int]:
    """The label ids with test rows and no training row."""
    return [int(c) for c in np.setdiff1d(test_labels, train_labels)]


def check_ratio(value: object, name: str) -> int:
    """A percentage of ``--disjoint-ratio`` / ``--blurry-ratio``: an integer in [0, 100]."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= value <= 100:
        raise FoalPipeError(f"{param(name)} is a percentage, an integer from 0 to 100, got {value!r}; "
                            f"pass e.g. {param(name, DEFAULT_RATIOS[name])} (the default)")
    return int(value)


def _cut(items: np.ndarray, n_tasks: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``items`` cut into ``n_tasks`` consecutive pieces at ``n_tasks - 1`` uniform random points (pieces may be
    empty): the published code's stochastic split."""
    points = np.sort(rng.integers(0, items.size, n_tasks - 1)) if items.size else np.zeros(n_tasks - 1, np.int64)
    bounds = np.concatenate([[0], points, [items.size]])
    return [items[bounds[t] : bounds[t + 1]] for t in range(n_tasks)]


def si_blurry(labels: np.ndarray, n_classes: int, n_tasks: int | None, batch_size: int, seed: int,
              disjoint_ratio: int = DEFAULT_RATIOS["disjoint_ratio"], blurry_ratio: int = DEFAULT_RATIOS["blurry_ratio"],
              drop_last: bool = False, test_labels: np.ndarray | None = None) -> Stream:
    """The Si-Blurry stream (Moon et al., ICCV 2023, and its public code; docs/streams.md).

    From one ``numpy.random.default_rng(seed)``: a class permutation; its first ``C * disjoint_ratio // 100``
    classes are *disjoint* (their rows in one task only), the others *blurry*; each group cut into the tasks at
    uniform random points (a stochastic number of classes per task). Each class's rows go to its task, shuffled.
    Then ``blurry_ratio`` % of the blurry classes' rows (rounded down), drawn uniformly, leave their task: pooled,
    shuffled and dealt over the tasks in random quotas (cut points again; a row may land in its own task, as in
    the published code). Each task's rows are shuffled once more. Unlike the published code no class is left
    over (it rounds both counts down to multiples of the tasks); tasks that receive no row are left out. Classes
    with test rows and no training row (``test_labels``) are recorded in ``dropped``, as those ``drop_last`` empties.
    """
    if batch_size < 1:
        raise FoalPipeError(f"{param('batch_size')} must be at least 1, got {batch_size}")
    disjoint_ratio, blurry_ratio = check_ratio(disjoint_ratio, "disjoint_ratio"), check_ratio(blurry_ratio, "blurry_ratio")
    n_tasks = min(DEFAULT_TASKS, n_classes) if n_tasks is None else n_tasks
    if n_tasks < 1:
        raise FoalPipeError(f"{param('tasks')} must be at least 1, got {n_tasks}")
    if n_tasks > max(labels.size, 1):
        raise FoalPipeError(f"{param('tasks')} {n_tasks} is more than the {labels.size:,} training rows, and a task holds "
                            f"at least one; pass {param('tasks')} {min(DEFAULT_TASKS, max(labels.size, 1))} or another "
                            "count up to the rows")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_classes)
    n_disjoint = n_classes * disjoint_ratio // 100
    disjoint, blurry = _cut(order[:n_disjoint], n_tasks, rng), _cut(order[n_disjoint:], n_tasks, rng)

    def rows_of(classes: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(np.isin(labels, classes))
        rng.shuffle(idx)
        return idx

    own, spread = [rows_of(c) for c in disjoint], [rows_of(c) for c in blurry]
    everyone = np.concatenate(spread)
    moved = np.zeros(everyone.size, dtype=bool)
    moved[rng.choice(everyone.size, everyone.size * blurry_ratio // 100, replace=False)] = True
    pool = rng.permutation(everyone[moved])
    quotas = _cut(pool, n_tasks, rng)
    stays = np.split(~moved, np.cumsum([r.size for r in spread])[:-1])
    tasks: list[list[int]] = []
    rows: list[np.ndarray] = []
    dealt: list[np.ndarray] = []
    for t in range(n_tasks):
        idx = np.concatenate([own[t], spread[t][stays[t]], quotas[t]])
        rng.shuffle(idx)
        dealt.append(idx)
        if drop_last and idx.size:
            if idx.size < batch_size:
                raise OrderError(_drop_last_empties(idx.size, len(tasks) + 1, batch_size))
            idx = idx[: idx.size - idx.size % batch_size]
        if idx.size:
            tasks.append(sorted(int(c) for c in np.unique(labels[idx])))
            rows.append(idx)
    kept = {c for task in tasks for c in task}
    lost = sorted(int(c) for c in np.unique(labels[np.concatenate(dealt)]) if int(c) not in kept)  # --drop-last's tails
    untrained = [] if test_labels is None else _untrained(labels, test_labels)
    return Stream(tasks=tasks, rows=rows, batch_size=batch_size, dropped=sorted(lost + untrained), kind="si-blurry",
                  emptied=lost, untrained=untrained,
                  disjoint_classes=sorted(int(c) for c in order[:n_disjoint]), blurred_rows=int(pool.size))


def _disjoint(labels: np.ndarray, n_classes: int, n_tasks: int | None, batch_size: int, seed: int,
              class_order: list[list[int]] | None, drop_last: bool, drop_remainder: bool, disjoint_ratio: int,
              blurry_ratio: int, test_labels: np.ndarray | None, named: bool) -> Stream:
    return build_stream(labels, n_classes, n_tasks, batch_size, seed, class_order, drop_last, drop_remainder, test_labels,
                        named)


def _si_blurry(labels: np.ndarray, n_classes: int, n_tasks: int | None, batch_size: int, seed: int,
               class_order: list[list[int]] | None, drop_last: bool, drop_remainder: bool, disjoint_ratio: int,
               blurry_ratio: int, test_labels: np.ndarray | None, named: bool) -> Stream:
    check_disjoint_options("si-blurry", class_order is not None, drop_remainder)
    return si_blurry(labels, n_classes, n_tasks, batch_size, seed, disjoint_ratio, blurry_ratio, drop_last, test_labels)


#: ``--stream``: each kind of stream by name, with the same arguments (:func:`make_stream`'s).
STREAMS = {"disjoint": _disjoint, "si-blurry": _si_blurry}


def check_disjoint_options(kind: str, class_order: bool, drop_remainder: bool) -> None:
    """Refuse a class order or ``drop_remainder`` (given: true) with the stream ``kind`` unless it is disjoint: they
    split disjoint tasks, and si-blurry draws its own split."""
    for name, given in (("class_order", class_order), ("drop_remainder", drop_remainder)):
        if given and kind == "si-blurry":
            raise FoalPipeError(f"{param(name)} splits disjoint tasks; {param('stream', 'si-blurry')} draws its own "
                                f"split: leave out {param(name)} or use {param('stream', 'disjoint')}")


def make_stream(kind: str, labels: np.ndarray, n_classes: int, n_tasks: int | None, batch_size: int, seed: int,
                class_order: list[list[int]] | None = None, drop_last: bool = False, drop_remainder: bool = False,
                disjoint_ratio: int = DEFAULT_RATIOS["disjoint_ratio"], blurry_ratio: int = DEFAULT_RATIOS["blurry_ratio"],
                test_labels: np.ndarray | None = None, named: bool = False) -> Stream:
    """The stream ``kind`` (:data:`STREAMS`) over a split's labels (``test_labels``: the test split's, which name
    the classes with test rows and no training row; ``named``: :func:`build_stream`'s); its options refused where
    they do not apply."""
    if kind not in STREAMS:
        raise FoalPipeError(f"unknown {param('stream')} {kind!r}; choose {' or '.join(STREAMS)}")
    return STREAMS[kind](labels, n_classes, n_tasks, batch_size, seed, class_order, drop_last, drop_remainder,
                         disjoint_ratio, blurry_ratio, test_labels, named)
