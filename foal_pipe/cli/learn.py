"""``foal-pipe learn``, ``sweep`` and ``predict``: the analytic learner on a feature store."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from foal_pipe.cli._app import app, console, err_console, user_errors
from foal_pipe.errors import FoalPipeError

Features = Annotated[Path, typer.Option("--features", help="Feature store (a .zarr directory written by `foal-pipe extract`).")]
Out = Annotated[Path, typer.Option("--out", help="Output directory, checked before any work and replaced as one unit at the end.")]
Tasks = Annotated[
    int,
    typer.Option(help="Number of tasks; classes are shuffled with --seed and split evenly (leftover classes dropped)."),
]
BatchSize = Annotated[int, typer.Option(help="Mini-batch size S of the online stream.")]
ProjectionDim = Annotated[int, typer.Option(help="Projection dimension D of the smooth projection.")]
Seed = Annotated[int, typer.Option(help="Seed of the class order, the within-task shuffles and the projection.")]
Engine = Annotated[
    str,
    typer.Option(
        help="gram: accumulate H^T H and H^T Y, solve at task ends (fastest, exact). "
        "rls: the paper's per-batch Woodbury recursion (exact, sequential, always single-process)."
    ),
]
Backend = Annotated[str, typer.Option(help="auto (CuPy when a GPU and cupy are present, else NumPy), numpy or cupy.")]
Dtype = Annotated[str, typer.Option(help="State dtype: float64 (exact to ~1e-12) or float32 (faster, drifts).")]
ProjectionInit = Annotated[str, typer.Option(help="uniform U(-1/sqrt(d), 1/sqrt(d)) as the authors' code, or normal (same variance).")]
ClassOrder = Annotated[
    Path | None, typer.Option(help="JSON file with an explicit task split: a list of task lists of label ids; overrides --tasks. Default: none (--tasks splits the classes).")
]
DropLast = Annotated[bool, typer.Option("--drop-last", help="Drop each task's last incomplete batch (the published code). Default: off (the batch is kept).")]
NoMask = Annotated[
    bool, typer.Option("--no-mask-unseen", help="Predict over all classes, unseen ones included (the published code). Default: off (only seen classes).")
]
Scheduler = Annotated[
    str,
    typer.Option(
        help="local: one process. dask: Gram statistics computed in parallel on a Dask cluster "
        "(--engine gram only; the per-batch RLS path is sequential by nature and stays single-process)."
    ),
]
DaskAddress = Annotated[
    str, typer.Option(help="With --scheduler dask: 'local' starts a LocalCluster, or a scheduler address tcp://host:port.")
]
Workers = Annotated[int, typer.Option(help="With --scheduler dask and --dask-address local: number of worker processes.")]


def _config(options: dict):
    """LearnConfig from a command's parameters (``locals()``): the fields it has, ``--no-mask-unseen`` inverted."""
    from foal_pipe.learn import LearnConfig

    _scheduler(options["scheduler"])
    names = {f.name for f in dataclasses.fields(LearnConfig)}
    config = {k: v for k, v in options.items() if k in names}
    return LearnConfig(**config, mask_unseen=not options["no_mask_unseen"])


def _log(message: str) -> None:
    err_console.print(f"[yellow]{message}[/]", highlight=False, soft_wrap=True)


@app.command()
def learn(
    features: Features,
    out: Out,
    tasks: Tasks = 10,
    batch_size: BatchSize = 10,
    projection_dim: ProjectionDim = 1000,
    gamma: Annotated[float, typer.Option(help="Ridge regularisation gamma (R0 = I/gamma); must be > 0.")] = 1.0,
    seed: Seed = 0,
    engine: Engine = "gram",
    backend: Backend = "auto",
    dtype: Dtype = "float64",
    projection_init: ProjectionInit = "uniform",
    class_order: ClassOrder = None,
    drop_last: DropLast = False,
    no_mask_unseen: NoMask = False,
    scheduler: Scheduler = "local",
    dask_address: DaskAddress = "local",
    workers: Workers = 2,
) -> None:
    """Train F-OAL's analytic classifier through the stream, evaluating after every task.

    Writes OUT/metrics.json (accuracy matrix, A_avg, A_last, F), OUT/model.safetensors and OUT/timings.json
    (seconds per phase) as one unit: a failed or killed run leaves the previous outputs as they were.
    """
    options = locals()
    from foal_pipe.learn import run_learn

    with user_errors():
        config = _config(options)
        start = time.perf_counter()
        m = run_learn(features, out, config, log=_log)
        console.print(
            f"A_avg {100 * m['A_avg']:.2f}  A_last {100 * m['A_last']:.2f}  F {100 * m['F']:.2f}  "
            f"({m['n_tasks']} tasks, {m['n_train_seen']} rows, {time.perf_counter() - start:.1f} s) -> {out}",
            highlight=False,
        )


def _scheduler(name: str) -> str:
    if name not in ("local", "dask"):
        raise FoalPipeError(f"unknown scheduler {name!r}; choose local or dask")
    return name


def _gammas(text: str) -> list[float]:
    try:
        return [float(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise FoalPipeError(f"--gammas {text!r} is not a comma-separated list of numbers; write e.g. 1e-3,1e-1,1,10") from None


@app.command()
def sweep(
    features: Features,
    out: Out,
    gammas: Annotated[str, typer.Option(help="Comma-separated gammas, all evaluated from one pass over the data.")] = (
        "1e-4,1e-3,1e-2,1e-1,0.3,1,3,10,30,100,300,1000,1e4"
    ),
    tasks: Tasks = 10,
    batch_size: BatchSize = 10,
    projection_dim: ProjectionDim = 1000,
    seed: Seed = 0,
    backend: Backend = "auto",
    dtype: Dtype = "float64",
    projection_init: ProjectionInit = "uniform",
    class_order: ClassOrder = None,
    drop_last: DropLast = False,
    no_mask_unseen: NoMask = False,
    scheduler: Scheduler = "local",
    dask_address: DaskAddress = "local",
    workers: Workers = 2,
) -> None:
    """Evaluate many gammas at about the cost of one `learn`: writes OUT/sweep.json and OUT/timings.json.

    Each gamma's numbers equal what `learn --gamma G` gives with the same seed, tasks and projection.
    """
    options = locals()
    from foal_pipe.learn import run_sweep

    with user_errors():
        config = _config(options)
        start = time.perf_counter()
        report = run_sweep(features, out, _gammas(gammas), config, log=_log)
        table = Table(title=f"gamma sweep: {report['dataset']} ({report['n_tasks']} tasks, D={report['projection_dim']})")
        for name in ("gamma", "A_avg %", "A_last %", "F %", ""):
            table.add_column(name, justify="right")
        for r in report["results"]:
            best = r["gamma"] == report["best_gamma"]
            table.add_row(
                f"{r['gamma']:g}", f"{100 * r['A_avg']:.2f}", f"{100 * r['A_last']:.2f}", f"{100 * r['F']:.2f}",
                "[bold green]best[/]" if best else "",
            )
        console.print(table)
        console.print(f"{len(report['gammas'])} gammas in {time.perf_counter() - start:.1f} s -> {out / 'sweep.json'}")


@app.command()
def predict(
    model: Annotated[Path, typer.Option(help="model.safetensors written by `foal-pipe learn`.")],
    features: Features,
    split: Annotated[str, typer.Option(help="Which split of the store to predict: train or test.")] = "test",
    out: Annotated[
        Path | None, typer.Option(help="Write the CSV here (atomically, checked before predicting). Default: stdout.")
    ] = None,
) -> None:
    """Predict every row of a store's split with a saved model; writes CSV.

    Columns: row, predicted_class (label id), predicted_name, score (the winning class's score),
    true_class (the label id the store holds), true_name. Accuracy goes to stderr.
    """
    from foal_pipe.io import atomic_path, check_output_file
    from foal_pipe.predict import predict_split

    with user_errors():
        if out is not None:
            check_output_file(out)
        result = predict_split(model, features, split)
        if out is None:
            result.write_csv(sys.stdout)
        else:
            with atomic_path(out) as tmp, open(tmp, "w", newline="") as fh:
                result.write_csv(fh)
        err_console.print(
            f"{result.predicted.size} rows, accuracy {100 * result.accuracy:.2f}% on {split}", highlight=False
        )
