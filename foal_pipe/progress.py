"""Progress on stderr, so stdout stays clean for results.

On a terminal, rich bars. Elsewhere (a log file, a pipe, a CI capture, a terminal with ``TERM=dumb``, where rich
never redraws) a live display would print blank lines (transient bars) or stray bar glyphs, so the bars are off and
plain lines take their place: one per task at every further 10% of its total, or after 30 s without one, once the
task has run for 2 s (a quick command prints none). For example
``train: 6,144/50,000 images (12%), 512 images/s, 0:00:12 elapsed, 0:01:25 left``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

_console = Console(stderr=True, emoji=False)

#: Plain progress lines (output not a terminal): a line at every further LINE_STEP of the total, or after
#: LINE_SECONDS without one, once a task has run QUIET_SECONDS.
LINE_STEP = 0.10
LINE_SECONDS = 30.0
QUIET_SECONDS = 2.0


def _clock(seconds: float | None) -> str:
    return str(timedelta(seconds=int(seconds))) if seconds is not None else "?"


class _Progress(Progress):
    """A :class:`rich.progress.Progress` that prints plain lines (``unit`` counted) while its display is off."""

    def __init__(self, *columns: str | ProgressColumn, unit: str, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.unit = unit
        self._printed: dict[TaskID, tuple[int, float]] = {}  # task -> (last step printed, when)

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._printed[task_id] = (self._step(task_id), self.get_time())
        return task_id

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._line(task_id)

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._line(task_id)

    def _step(self, task_id: TaskID) -> int:
        task = self._tasks[task_id]
        return int(task.completed / task.total / LINE_STEP) if task.total else 0

    def _line(self, task_id: TaskID) -> None:
        if not self.disable or task_id not in self._printed:
            return
        task, now = self._tasks[task_id], self.get_time()
        step, (last_step, last_time) = self._step(task_id), self._printed[task_id]
        if (task.elapsed or 0.0) < QUIET_SECONDS or (step <= last_step and now - last_time < LINE_SECONDS):
            return
        self._printed[task_id] = (step, now)
        total = f"/{task.total:,.0f}" if task.total else ""
        share = f" ({task.percentage:.0f}%)" if task.total else ""
        speed = f", {task.speed:,.0f} {self.unit}/s" if task.speed else ""
        left = "" if task.finished else f", {_clock(task.time_remaining)} left"
        self.console.print(f"{task.description}: {task.completed:,.0f}{total} {self.unit}{share}{speed}, "
                           f"{_clock(task.elapsed)} elapsed{left}", highlight=False, markup=False, soft_wrap=True)


class _Description(TextColumn):
    """The task's description on one line, cut short with "…" where the line is too narrow: it gives way first, so
    that the counts and times beside it (``no_wrap``) are never cut (``38392…``, ``0:00:…`` at 80 columns)."""

    def __init__(self, text_format: str) -> None:
        super().__init__(text_format, table_column=Column())  # rich's own is no_wrap: it would not give way

    def render(self, task: Task) -> Text:
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


def new_progress(*columns: str | ProgressColumn, console: Console | None = None, transient: bool = False,
                 unit: str = "rows") -> Progress:
    """A :class:`rich.progress.Progress` on ``console`` (default stderr) that draws only on an interactive terminal
    (not ``TERM=dumb``, on which rich never redraws the bar), and prints plain lines of ``unit`` counts elsewhere (see
    the module).

    Tasks, counts and speeds are tracked either way, so callers need no second code path.
    """
    console = console or _console
    return _Progress(*columns, unit=unit, console=console, transient=transient, disable=not console.is_interactive)


@contextmanager
def progress_bar(description: str, total: int, unit: str = "rows", shown: int | None = None) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; the bar shows count, rate and ETA and disappears when done.

    ``shown``: the count the bar displays for ``total`` units of work, where the work passes over the same rows
    more than once (read, then learn, then leave-one-out): the bar counts the split's rows, not 2-3x as many."""
    columns = (
        _Description("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[rate]}", table_column=Column(no_wrap=True)),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
    )
    bar_total = total if shown is None else shown
    scale = bar_total != total
    with new_progress(*columns, transient=True, unit=unit) as progress:
        task = progress.add_task(description, total=bar_total, rate="")
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            if scale:
                done += n
                progress.advance(task, done * bar_total // max(total, 1) - progress.tasks[task].completed)
            else:
                progress.advance(task, n)
            speed = progress.tasks[task].speed
            progress.update(task, rate=f"{speed:,.0f} {unit}/s" if speed else "")

        yield advance
