"""DVC stage `extract@NAME`: `foal-pipe extract` -> data/features/NAME.zarr.

The store is a `persist` output, so DVC leaves it in place when the stage reruns. DVC reruns this stage
only when its params or code changed or the store is missing or incomplete; so an incomplete store (an
interrupted run) is resumed, and a complete one is stale and replaced (`--overwrite`).
"""

from __future__ import annotations

import json
from typing import Any

from _params import main


def complete(path: str) -> bool:
    import zarr

    try:
        return zarr.open_group(path, mode="r").attrs.get("complete") is True
    except Exception:  # missing or not a store: nothing to replace
        return False


def _kwargs(values: dict[str, Any]) -> str:
    """``{img_size: 32, pretrained_strict: false}`` -> ``img_size=32,pretrained_strict=false`` (JSON scalars)."""
    return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items())


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    p = settings["extract"]
    out = f"data/features/{name}.zarr"
    args = [
        "extract", "--dataset", settings["dataset"], "--model", p["model"], "--fusion", p["fusion"],
        "--token", p["token"], "--normalize" if p["normalize"] else "--no-normalize", "--dtype", p["dtype"],
        "--chunk-rows", p["chunk_rows"], "--device", p["device"], "--precision", p["precision"], "--out", out,
    ]
    optional = {"--checkpoint": "checkpoint", "--image-size": "image_size", "--data-dir": "data_dir",
                "--batch-size": "batch_size", "--workers": "workers"}
    for option, key in optional.items():
        if p[key] is not None:
            args += [option, p[key]]
    if p["model_kwargs"]:
        args += ["--model-kwargs", _kwargs(p["model_kwargs"])]
    if p["download"]:
        args.append("--download")
    if p["keep_blocks"]:
        args.append("--keep-blocks")
    if complete(out):
        args.append("--overwrite")
    return args


if __name__ == "__main__":
    main(command)
