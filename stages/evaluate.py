"""DVC stage `evaluate@DATASET`: plots, plot data and summary.md for runs/DATASET and its sweep
-> runs/DATASET/eval/."""

from _params import run, stage_params

dataset, _ = stage_params()
run([
    "evaluate", "--run", f"runs/{dataset}", "--sweep", f"runs/{dataset}-sweep/sweep.json",
    "--out", f"runs/{dataset}/eval",
])
