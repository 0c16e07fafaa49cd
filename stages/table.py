"""DVC stage `table@NAME`: `foal-pipe table` on data/features/NAME.zarr -> runs/NAME-table/.

It passes learn's settings that the table takes (:data:`_params.TABLE_FROM_LEARN`) and ridge's gamma auto, each only
where `table.heads` uses it (:func:`_params.table_options`): heads on the store's features alone take no projection."""

from __future__ import annotations

from typing import Any

from _params import main, table_options


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    t, options = settings["table"], table_options(settings)
    args = [
        "table", "--features", f"data/features/{name}.zarr", "--out", f"runs/{name}-table",
        "--heads", ",".join(t["heads"]), "--order-seeds", ",".join(map(str, t["order_seeds"])),
        "--tasks", ",".join(map(str, t["tasks"])),
    ]
    for option in ("gamma", "select", "batch_size", "projection_dim", "activation", "seed", "backend"):
        if option in options:
            args += ["--" + option.replace("_", "-"), options[option]]
    return [*args, *(["--drop-remainder"] if options["drop_remainder"] else [])]


if __name__ == "__main__":
    main(command)
