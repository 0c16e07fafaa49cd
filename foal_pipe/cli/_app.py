"""The typer application and the one place user errors become ``Error: ...`` and exit status 1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from foal_pipe.errors import FoalPipeError

app = typer.Typer(
    name="foal-pipe",
    help="F-OAL: frozen-ViT features to a Zarr cache, then exact online analytic learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a :class:`FoalPipeError` into one line on stderr and exit status 1.

    Set ``FOAL_PIPE_DEBUG=1`` to see the traceback instead.
    """
    try:
        yield
    except FoalPipeError as exc:
        if os.environ.get("FOAL_PIPE_DEBUG"):
            raise
        err_console.print(f"[bold red]Error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
