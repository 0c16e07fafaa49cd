"""``foal-pipe datasets``: every registered dataset, and with ``--data-dir`` whether each is there."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from foal_pipe.cli._app import app, err_console, flag, print_json, print_table, user_errors
from foal_pipe.datasets.registry import DATASETS


def dataset_rows(data_dir: Path | None) -> list[dict[str, Any]]:
    """One row per registered dataset: name, class count, source, where it is looked for, how to obtain it, and
    with ``data_dir`` where it was found (``None``: not there; ``"-"``: the user's own data, any folder)."""
    rows = []
    for name, entry in DATASETS.items():
        row: dict[str, Any] = {"name": name, "classes": entry.classes, "source": entry.source,
                               "looks_in": entry.looks_in, "obtain": entry.obtain}
        if data_dir is not None:
            row["found"] = entry.locate(data_dir) if entry.locate is not None else "-"
        rows.append(row)
    return rows


@app.command()
def datasets(
    data_dir: Annotated[Path | None, typer.Option(help="Also say whether each dataset is found there, as `extract "
                        "--data-dir DIR` would look for it (folders and file names only, no image is read). Default: "
                        "none (only the list).", show_default=False)] = None,
    as_json: Annotated[bool, flag("--json", help="Print the list as JSON instead of a table. Default: off.")] = False,
) -> None:
    """List every dataset `foal-pipe extract --dataset` reads: classes, source, where it is looked for, how to get it.

    The class count of a benchmark is checked when it is read: a folder with another count is refused.
    """
    with user_errors():
        if data_dir is not None and not data_dir.is_dir():  # every dataset "no" below: say why
            err_console.print(f"note: {data_dir} is not a folder, so no dataset is found there", highlight=False,
                              markup=False, soft_wrap=True)
        rows = dataset_rows(data_dir)
        if as_json:
            print_json(rows)
            return
        table = Table(box=None, pad_edge=False)
        for column in ("dataset", "classes", "source", "looked for in (DIR = --data-dir)", "how to obtain"):
            table.add_column(column, overflow="fold")
        if data_dir is not None:
            table.add_column(f"found in {data_dir}", overflow="fold")
        for row in rows:
            cells = [row["name"], str(row["classes"] or "any"), row["source"], escape(row["looks_in"]), row["obtain"]]
            if data_dir is not None:
                found = row["found"]
                cells.append("your own data" if found == "-" else escape(found) if found else "[yellow]no[/]")
            table.add_row(*cells)
        print_table(table)
