"""DVC stage `learn@NAME`: `foal-pipe learn` on data/features/NAME.zarr -> runs/NAME/."""

from __future__ import annotations

from typing import Any

from _params import main, stream_args


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    p = settings["learn"]
    args = [
        "learn", "--features", f"data/features/{name}.zarr", "--out", f"runs/{name}",
        *stream_args(p), "--gamma", p["gamma"], "--engine", p["engine"],
    ]
    if p["gamma"] == "auto":
        args += ["--select", p["select"]]
    return args


if __name__ == "__main__":
    main(command, "learn")
