"""DVC stage `table@NAME`: `foal-pipe table` on data/features/NAME.zarr -> runs/NAME-table/."""

from __future__ import annotations

from typing import Any

from _params import main


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    t, p = settings["table"], settings["learn"]
    return [
        "table", "--features", f"data/features/{name}.zarr", "--out", f"runs/{name}-table",
        "--heads", ",".join(t["heads"]), "--order-seeds", ",".join(map(str, t["order_seeds"])),
        "--tasks", ",".join(map(str, t["tasks"])), "--gamma", "auto", "--select", p["select"],
        "--batch-size", p["batch_size"], "--projection-dim", p["projection_dim"], "--activation", p["activation"],
        "--seed", p["seed"], "--backend", p["backend"],
    ]


if __name__ == "__main__":
    main(command)
