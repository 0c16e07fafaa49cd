"""DVC stage `table@NAME`: `foal-pipe table` on data/features/NAME.zarr -> runs/NAME-table/, with learn's settings
that the table takes, each where `table.heads` uses it (`_params.table_command`)."""

from __future__ import annotations

from typing import Any

from _params import main, table_command


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    return table_command(name, settings)


if __name__ == "__main__":
    main(command, "table")
