"""DVC stage `extract@DATASET`: `foal-pipe extract` -> data/features/DATASET.zarr.

The store is a `persist` output, so DVC leaves it in place when the stage reruns. DVC reruns this stage
only when its params or code changed or the store is missing or incomplete; so an incomplete store (an
interrupted run) is resumed, and a complete one is stale and replaced (`--overwrite`).
"""

from _params import run, stage_params

dataset, params = stage_params()
p = params["extract"]
out = f"data/features/{dataset}.zarr"
args = [
    "extract", "--dataset", dataset, "--model", p["model"], "--fusion", p["fusion"], "--token", p["token"],
    "--normalize" if p["normalize"] else "--no-normalize", "--dtype", p["dtype"], "--out", out,
]
if p["image_size"] is not None:
    args += ["--image-size", p["image_size"]]
if p["data_dir"] is not None:
    args += ["--data-dir", p["data_dir"]]
if p["download"]:
    args.append("--download")


def complete(path: str) -> bool:
    import zarr

    try:
        return zarr.open_group(path, mode="r").attrs.get("complete") is True
    except Exception:  # missing or not a store: nothing to replace
        return False


if complete(out):
    args.append("--overwrite")
run(args)
