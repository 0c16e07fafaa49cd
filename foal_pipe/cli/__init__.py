"""``foal-pipe`` command line: one module per command, all registered on one typer app."""

from foal_pipe.cli import extract as _extract  # noqa: F401, I001
from foal_pipe.cli import datasets as _datasets  # noqa: F401, I001
from foal_pipe.cli import learn as _learn  # noqa: F401  (registers commands)
from foal_pipe.cli import evaluate as _evaluate  # noqa: F401, I001  (after learn: --help lists commands in import order)
from foal_pipe.cli import table as _table  # noqa: F401, I001  (after evaluate)
from foal_pipe.cli._app import app


def main() -> None:
    app()
