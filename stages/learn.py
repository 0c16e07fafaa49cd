"""DVC stage `learn@DATASET`: `foal-pipe learn` on data/features/DATASET.zarr -> runs/DATASET/."""

from _params import run, stage_params, stream_args

dataset, params = stage_params()
p = params["learn"]
run([
    "learn", "--features", f"data/features/{dataset}.zarr", "--out", f"runs/{dataset}",
    *stream_args(p), "--gamma", p["gamma"], "--engine", p["engine"],
])
