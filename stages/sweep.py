"""DVC stage `sweep@NAME`: `foal-pipe sweep` over `sweep.gammas` (null: the default grid) and `sweep.fusions`
(when set), chosen by `sweep.select`, with learn's stream settings (everything in `learn` but gamma, select and
engine) -> runs/NAME-sweep/sweep.json."""

from __future__ import annotations

from typing import Any

from _params import main, number_text, stream_args


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    s = settings["sweep"]
    fusions = ["--fusions", ",".join(map(str, s["fusions"]))] if s["fusions"] else []
    gammas = [] if s["gammas"] is None else ["--gammas", ",".join(number_text(g) for g in s["gammas"])]
    return [
        "sweep", "--features", f"data/features/{name}.zarr", "--out", f"runs/{name}-sweep", *gammas,
        "--select", s["select"], *fusions, *stream_args(settings["learn"]),
    ]


if __name__ == "__main__":
    main(command, "sweep")
