"""DVC stage `sweep@DATASET`: `foal-pipe sweep` over `sweep.gammas`, with learn's stream settings
(everything in `learn` but gamma and engine) -> runs/DATASET-sweep/sweep.json."""

from _params import run, stage_params, stream_args

dataset, params = stage_params()
run([
    "sweep", "--features", f"data/features/{dataset}.zarr", "--out", f"runs/{dataset}-sweep",
    "--gammas", ",".join(f"{float(g):g}" for g in params["sweep"]["gammas"]), *stream_args(params["learn"]),
])
