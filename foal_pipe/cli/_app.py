"""The typer application and the one place user errors become ``Error: ...`` and exit status 1."""

from __future__ import annotations

import errno
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
    """Turn a :class:`FoalPipeError`, and any I/O error the library did not name itself, into one line on
    stderr and exit status 1.

    Set ``FOAL_PIPE_DEBUG=1`` to see the traceback instead.
    """
    try:
        yield
    except (FoalPipeError, OSError) as exc:
        if os.environ.get("FOAL_PIPE_DEBUG"):
            raise
        message = str(exc) if isinstance(exc, FoalPipeError) else os_error_message(exc)
        err_console.print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def os_error_message(exc: OSError) -> str:
    """One line for an I/O error: the path(s), the system's reason and its errno name."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    reason = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())
    code = errno.errorcode.get(exc.errno or 0)
    return (
        f"{paths + ': ' if paths else ''}{reason}{f' ({code})' if code else ''}; "
        "check the path, its permissions and the free space"
    )
