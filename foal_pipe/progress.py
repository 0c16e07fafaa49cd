"""Rich progress bars on stderr, so stdout stays clean for results.

A bar is drawn only on a terminal: in a log file or a CI capture a live display prints blank lines (transient
bars) or stray bar glyphs, so there it is switched off and only the commands' own result lines remain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

_console = Console(stderr=True)


def new_progress(*columns: str | ProgressColumn, console: Console | None = None, transient: bool = False) -> Progress:
    """A :class:`rich.progress.Progress` on ``console`` (default stderr) that draws only when it is a terminal.

    Tasks, counts and speeds are still tracked when the display is off, so callers need no second code path.
    """
    console = console or _console
    return Progress(*columns, console=console, transient=transient, disable=not console.is_terminal)


@contextmanager
def progress_bar(description: str, total: int, unit: str = "rows") -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; the bar shows count, rate and ETA and disappears when done."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with new_progress(*columns, transient=True) as progress:
        task = progress.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            progress.advance(task, n)
            speed = progress.tasks[task].speed
            progress.update(task, rate=f"{speed:,.0f} {unit}/s" if speed else "")

        yield advance
