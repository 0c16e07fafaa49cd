"""Rich progress bars on stderr, so stdout stays clean for results."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_console = Console(stderr=True)


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
    with Progress(*columns, console=_console, transient=True) as progress:
        task = progress.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            progress.advance(task, n)
            speed = progress.tasks[task].speed
            progress.update(task, rate=f"{speed:,.0f} {unit}/s" if speed else "")

        yield advance
