"""``foal-pipe learn``, ``sweep`` and ``predict``: the analytic learner on a feature store."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from foal_pipe.cli._app import app, choice, console, err_console, flag, print_table, user_errors
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError
from foal_pipe.memory import parse_memory
from foal_pipe.protocol.stream import counted


def _grid_text(grid: tuple[float, ...]) -> str:
    """``1e-4,1e-3,...,1e8``: powers of ten written as such, other values as ``%g``."""
    def one(g: float) -> str:
        k = round(math.log10(g))
        return f"{g:g}" if 10.0**k != g or -1 <= k <= 3 else f"1e{k}"

    return ",".join(one(g) for g in grid)


GRID_TEXT = _grid_text(DEFAULT_GAMMA_GRID)

Features = Annotated[Path, typer.Option("--features", help="Feature store (a .zarr directory written by `foal-pipe extract`).")]
Out = Annotated[Path, typer.Option("--out", help="Output directory, checked before any work and replaced as one unit at the end.")]
Tasks = Annotated[
    int | None,
    typer.Option(help="Number of tasks, at most the number of classes: the classes, shuffled with --seed, are cut into "
                 "tasks of consecutive classes, the first (classes mod tasks) tasks one class larger (8 classes in 5 "
                 "tasks: 2, 2, 2, 1, 1). Default: 10, or one class per task with fewer classes.", show_default=False),
]
DropRemainder = Annotated[
    bool, flag("--drop-remainder", help="Give every task (classes // tasks) classes and drop the classes left over, "
               "with a warning (the published code: DTD 47 -> 40 classes); recorded in metrics.json. Default: off "
               "(every class is streamed).")
]
BatchSize = Annotated[int, typer.Option(help="Mini-batch size S of the online stream.")]
ProjectionDim = Annotated[int, typer.Option(help="Projection dimension D of the smooth projection; 0: no projection.")]
Seed = Annotated[int, typer.Option(help="Seed of the projection and, without --order-seed(s), of the class order and the within-task shuffles.")]
OrderSeed = Annotated[int | None, typer.Option(help="Seed of the class order and the within-task shuffles. Default: --seed.")]
OrderSeeds = Annotated[
    str | None,
    typer.Option(help="Comma-separated class-order seeds (e.g. 0,1,2,3,4): every order from one pass over the store, "
                 "reported per order with mean and std. Default: one order (--order-seed).")
]
MaxMemory = Annotated[str, typer.Option(help="The most a speed-up may hold: the activations kept for leave-one-out "
                                        "(rows x D values; beyond it each boundary projects the rows again) and, with "
                                        "--order-seeds, the per-class statistics (C x D^2 values; beyond it one pass "
                                        "per order).")]
Engine = Annotated[
    choice("gram", "rls"),
    typer.Option(
        help="gram: accumulate H^T H and H^T Y, solve at task ends (fastest, exact). "
        "rls: the paper's per-batch Woodbury recursion (exact, sequential, always single-process)."
    ),
]
Backend = Annotated[choice("auto", "numpy", "cupy", "torch"), typer.Option(help="auto (CuPy if it sees a GPU, else torch on CUDA if available, else NumPy), "
                                           "numpy, cupy or torch (CUDA when available, else the CPU).")]
Dtype = Annotated[choice("float64", "float32"), typer.Option(help="State dtype: float64 (exact to ~1e-12) or float32 (half the memory; "
                                       "solved in float64, a gamma below its resolution is refused).")]
ProjectionInit = Annotated[choice("uniform", "normal"), typer.Option(help="uniform U(-1/sqrt(d), 1/sqrt(d)) as the authors' code, or normal (same variance).")]
ClassOrder = Annotated[
    Path | None, typer.Option(help="JSON file with an explicit task split: a list of task lists of label ids; overrides --tasks. Default: none (--tasks splits the classes).")
]
DropLast = Annotated[bool, flag("--drop-last", help="Drop each task's last incomplete batch (the published code). Default: off (the batch is kept).")]
NoMask = Annotated[
    bool, flag("--no-mask-unseen", help="Predict over all classes, unseen ones included (the published code). Default: off (only seen classes).")
]
Scheduler = Annotated[
    choice("local", "dask"),
    typer.Option(
        help="local: one process. dask: Gram statistics computed in parallel on a Dask cluster "
        "(--engine gram only; the per-batch RLS path is sequential by nature and stays single-process)."
    ),
]
DaskAddress = Annotated[
    str, typer.Option(help="With --scheduler dask: 'local' starts a LocalCluster, or a scheduler address tcp://host:port.")
]
Workers = Annotated[int, typer.Option(help="With --scheduler dask and --dask-address local: number of worker processes.")]


Activation = Annotated[
    choice("sigmoid", "relu", "identity") | None,
    typer.Option(help="Activation after the projection: sigmoid (the paper), relu or identity. Default: sigmoid, "
                 "or identity with --projection-dim 0 (ridge on the raw features)."),
]
LearnSelect = Annotated[
    choice("loo", "gcv") | None,
    typer.Option(help="With --gamma auto: how gamma is chosen on the training rows seen so far, loo (exact "
                 "leave-one-out MSE) or gcv (generalised cross-validation, no extra pass); never on the test split. "
                 "Default: loo."),
]
Select = Annotated[
    choice("loo", "gcv", "test") | None,
    typer.Option(help="How the best gamma is chosen: on the training rows seen so far, loo (exact leave-one-out MSE) "
                 "or gcv (generalised cross-validation, no extra pass); or test, an oracle that peeks at the test "
                 "split. Default: loo, or gcv with --no-loo."),
]


Fusion = Annotated[
    str | None,
    typer.Option(help="Fuse the store's per-block tokens at read time (stores made with `extract --keep-blocks`): "
                 "mean-cls (every block, the paper), last, mean:A-B (blocks A..B, 1-based), block:K; then the stored "
                 "final norm. Default: the store's own features."),
]
NoFusionNorm = Annotated[bool, flag("--no-fusion-norm", help="With --fusion(s): skip the stored final norm. Default: off.")]
Fusions = Annotated[
    str | None,
    typer.Option(help="Comma-separated fusions of a blocks store (e.g. mean-cls,last,mean:7-12), every fusion x gamma "
                 "from one read of the blocks: a table and sweep.json entries per fusion, and the best (fusion, "
                 "gamma) by --select. Not with --fusion. Default: none (the store's features, or --fusion)."),
]


def _log(message: str) -> None:
    err_console.print(f"[yellow]{message}[/]", highlight=False, soft_wrap=True)


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(g) for g in text.split(",") if g.strip())
    except ValueError:
        raise FoalPipeError(f"{option} {text!r} is not a comma-separated list of numbers; write e.g. 1e-3,1e-1,1,10") from None


def _gamma(text: str) -> float | str:
    from foal_pipe.protocol.config import parse_gamma

    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise FoalPipeError(f"--gamma {text!r} is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto") from None
    return parse_gamma(value)


def _order_seeds(order_seed: int | None, order_seeds: str | None) -> tuple[int, ...] | None:
    """The seeds of ``--order-seeds`` (None: one order, the plain command)."""
    if order_seeds is None:
        return None
    if order_seed is not None:
        raise FoalPipeError("pass --order-seed (one order) or --order-seeds (many), not both")
    from foal_pipe.protocol.orders import parse_order_seeds

    return parse_order_seeds(order_seeds)


def _timings(timings: dict[str, float]) -> str:
    parts = [f"{step} {seconds:.1f}" for step, seconds in timings.items() if step != "total"]
    return f"{timings['total']:.1f} s: " + ", ".join(parts)


@app.command()
def learn(
    ctx: typer.Context,
    features: Features,
    out: Out,
    tasks: Tasks = None,
    batch_size: BatchSize = 10,
    projection_dim: ProjectionDim = 1000,
    gamma: Annotated[
        str, typer.Option(help="Ridge regularisation gamma (R0 = I/gamma), > 0; or auto: chosen at every task boundary "
                          "on the training rows seen so far (see --select, --gamma-grid).")
    ] = "1",
    select: LearnSelect = None,
    gamma_grid: Annotated[str | None, typer.Option(help="Candidates of --gamma auto (comma-separated); a choice on "
                                                   f"an edge is warned about. Default: {GRID_TEXT}.",
                                                   show_default=False)] = None,
    seed: Seed = 0,
    order_seed: OrderSeed = None,
    order_seeds: OrderSeeds = None,
    max_memory: MaxMemory = "8GiB",
    engine: Engine = "gram",
    backend: Backend = "auto",
    dtype: Dtype = "float64",
    projection_init: ProjectionInit = "uniform",
    activation: Activation = None,
    fusion: Fusion = None,
    no_fusion_norm: NoFusionNorm = False,
    class_order: ClassOrder = None,
    drop_last: DropLast = False,
    drop_remainder: DropRemainder = False,
    no_mask_unseen: NoMask = False,
    scheduler: Scheduler = "local",
    dask_address: DaskAddress = "local",
    workers: Workers = 2,
    init_model: Annotated[
        Path | None, typer.Option(help="Continue this model.safetensors on --features: classes matched by name (a new "
                                  "name gets a new label id), gamma, projection, activation and dtype from the model.")
    ] = None,
    eval_features: Annotated[
        list[Path] | None, typer.Option(help="With --init-model: also score the final model on this store's test "
                                        "split (classes by name; repeatable), to measure forgetting.")
    ] = None,
) -> None:
    """Train F-OAL's analytic classifier through the stream, evaluating after every task.

    Writes OUT/metrics.json (accuracy matrix, A_avg, A_last, F), OUT/model.safetensors and OUT/timings.json
    (seconds per phase) as one unit: a failed or killed run leaves the previous outputs as they were.
    """
    from foal_pipe.protocol.commands import run_learn
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    with user_errors():
        model = ModelConfig(
            projection_dim=projection_dim, projection_init=projection_init, activation=activation,
            gamma=_gamma(gamma), select=select or "loo",
            gamma_grid=DEFAULT_GAMMA_GRID if gamma_grid is None else _floats(gamma_grid, "--gamma-grid"),
            engine=engine, dtype=dtype, fusion=fusion, fusion_norm=not no_fusion_norm,
        )
        stream = StreamConfig(tasks=tasks, batch_size=batch_size, seed=seed, class_order=class_order, drop_last=drop_last,
                              order_seed=order_seed, drop_remainder=drop_remainder)
        evaluation = EvaluationConfig(mask_unseen=not no_mask_unseen)
        execution = ExecutionConfig(backend=backend, scheduler=scheduler, dask_address=dask_address, workers=workers,
                                    max_memory=parse_memory(max_memory))
        seeds = _order_seeds(order_seed, order_seeds)
        if eval_features and init_model is None:
            raise FoalPipeError("--eval-features scores a continued model; use it with --init-model")
        if init_model is not None and seeds is not None:
            raise FoalPipeError("--init-model continues one stream; leave out --order-seed/--order-seeds")
        if init_model is not None:
            from foal_pipe.protocol.continuation import continue_from_cli

            done = continue_from_cli(ctx, init_model, features, out, stream, model, evaluation, execution,
                                     eval_features or [], log=_log)
        elif seeds is None:
            done = run_learn(features, out, stream, model, evaluation, execution, log=_log)
        else:
            from foal_pipe.protocol.orders import run_learn_orders

            done = run_learn_orders(features, out, seeds, stream, model, evaluation, execution, log=_log)
            std = done.metrics.std
            console.print(f"{len(seeds)} class orders: A_avg +- {100 * std['A_avg']:.2f}  A_last +- "
                          f"{100 * std['A_last']:.2f}  F +- {100 * std['F']:.2f} (std over orders; means below)",
                          highlight=False)
        m, chosen = done.metrics, ""
        if m.gamma == "auto":
            chosen = f"  gamma by {m.selected_by}: {', '.join(f'{g:g}' for g in m.gammas_selected)}"
        console.print(
            f"A_avg {100 * m.A_avg:.2f}  A_last {100 * m.A_last:.2f}  F {100 * m.F:.2f}{chosen}  "
            f"({counted(m.n_tasks, 'task')}, {counted(m.n_train_seen, 'row')}, {_timings(done.timings)}) -> {out}",
            highlight=False,
        )


def _cell(value: float | None, scale: float = 1.0, fmt: str = ".2f") -> str:
    return "-" if value is None else f"{scale * value:{fmt}}"


@app.command()
def sweep(
    features: Features,
    out: Out,
    gammas: Annotated[str | None, typer.Option(help="Comma-separated gammas, all evaluated from one pass over the "
                                               "data; a best gamma on an edge is warned about. Default: --gamma auto's "
                                               f"grid, {GRID_TEXT}.", show_default=False)] = None,
    select: Select = None,
    no_loo: Annotated[
        bool, flag("--no-loo", help="Skip the leave-one-out pass (then --select defaults to gcv). Default: off.")
    ] = False,
    tasks: Tasks = None,
    batch_size: BatchSize = 10,
    projection_dim: ProjectionDim = 1000,
    seed: Seed = 0,
    order_seed: OrderSeed = None,
    order_seeds: OrderSeeds = None,
    max_memory: MaxMemory = "8GiB",
    backend: Backend = "auto",
    dtype: Dtype = "float64",
    projection_init: ProjectionInit = "uniform",
    activation: Activation = None,
    fusion: Fusion = None,
    fusions: Fusions = None,
    no_fusion_norm: NoFusionNorm = False,
    class_order: ClassOrder = None,
    drop_last: DropLast = False,
    drop_remainder: DropRemainder = False,
    no_mask_unseen: NoMask = False,
    scheduler: Scheduler = "local",
    dask_address: DaskAddress = "local",
    workers: Workers = 2,
) -> None:
    """Evaluate many gammas at about the cost of one `learn`: writes OUT/sweep.json (and OUT/timings.json).

    Each gamma's test numbers equal what `learn --gamma G` gives with the same seed, tasks and projection;
    GCV and exact leave-one-out scores, computed on the training rows only, name the best gamma.
    With --fusions, the same for every fusion of a blocks store, and the best (fusion, gamma).
    """
    from foal_pipe.protocol.commands import run_sweep
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig

    with user_errors():
        config = SweepConfig(gammas=DEFAULT_GAMMA_GRID if gammas is None else _floats(gammas, "--gammas"),
                             select=select, loo=not no_loo,
                             fusions=tuple(fusions.split(",")) if fusions is not None else ())
        model = ModelConfig(projection_dim=projection_dim, projection_init=projection_init, activation=activation,
                            dtype=dtype, fusion=fusion, fusion_norm=not no_fusion_norm)
        stream = StreamConfig(tasks=tasks, batch_size=batch_size, seed=seed, class_order=class_order, drop_last=drop_last,
                              order_seed=order_seed, drop_remainder=drop_remainder)
        evaluation = EvaluationConfig(mask_unseen=not no_mask_unseen)
        execution = ExecutionConfig(backend=backend, scheduler=scheduler, dask_address=dask_address, workers=workers,
                                    max_memory=parse_memory(max_memory))
        seeds = _order_seeds(order_seed, order_seeds)
        if seeds is not None and fusions is not None:
            raise FoalPipeError("--fusions compares fusions on one class order; leave out --order-seeds, or pass "
                                "--fusion X with --order-seeds")
        if seeds is None:
            done = run_sweep(features, out, config, stream, model, evaluation, execution, log=_log)
        else:
            from foal_pipe.protocol.orders import run_sweep_orders

            done = run_sweep_orders(features, out, seeds, config, stream, model, evaluation, execution, log=_log)
        report = done.report
        title = f"gamma sweep: {report.dataset} ({counted(report.n_tasks, 'task')}, D={report.projection_dim})"
        for fusion, entry in [(e.fusion, e) for e in report.fusions] if report.fusions else [(None, report)]:
            print_table(_sweep_table(entry.results, entry.best_gamma_test, report.selected_by, no_loo,
                                     title + (f", fusion {fusion}" if fusion else "")))
            if fusion:
                console.print(f"fusion {fusion}: best gamma {entry.best_gamma:g} by {report.selected_by} (test oracle "
                              f"{entry.best_gamma_test:g})", highlight=False)
        if report.best is not None:
            best, oracle = report.best, report.best_test
            console.print(
                f"best: fusion {best.fusion}, gamma {best.gamma:g} by {report.selected_by} (GCV, LOO: training "
                f"rows only; the test oracle's fusion {oracle.fusion}, gamma {oracle.gamma:g} peeks at the test "
                "split)", highlight=False,
            )
        else:
            console.print(
                f"best gamma {report.best_gamma:g} by {report.selected_by} (GCV, LOO: training rows only; "
                f"test {report.best_gamma_test:g} is an oracle that peeks at the test split)", highlight=False,
            )
        runs = f"{len(report.fusions)} fusions x " if report.fusions else ""
        console.print(f"{runs}{counted(len(report.gammas), 'gamma')} in {_timings(done.timings)} -> "
                      f"{out / 'sweep.json'}",
                      highlight=False)


def _sweep_table(results: list, oracle: float, selected_by: str, no_loo: bool, title: str) -> Table:
    """One feature set's gammas (of a sweep, or of one of its ``fusions``), its choices marked."""
    from foal_pipe.protocol.records import choose

    table = Table(title=title)
    for name in ("gamma", "A_avg %", "A_last %", "F %", "GCV", "LOO acc %", "LOO MSE", ""):
        table.add_column(name, justify="right")
    choices = {"gcv": choose(results, "gcv"), "test": oracle}
    if not no_loo:
        choices["loo"] = choose(results, "loo")
    for r in results:
        marks = [name for name, g in choices.items() if g == r.gamma]
        label = ", ".join(f"[bold green]{m}[/]" if m == selected_by else m for m in marks)
        table.add_row(
            f"{r.gamma:g}", f"{100 * r.A_avg:.2f}", f"{100 * r.A_last:.2f}", f"{100 * r.F:.2f}",
            _cell(r.gcv[-1], fmt=".4g"), _cell(r.loo_accuracy[-1] if r.loo_accuracy else None, 100),
            _cell(r.loo_mse[-1] if r.loo_mse else None, fmt=".4g"), label,
        )
    return table


@app.command()
def predict(
    model: Annotated[Path, typer.Option(help="model.safetensors written by `foal-pipe learn`.")],
    features: Annotated[
        Path | None, typer.Option(help="Predict a feature store's split (a .zarr written by `foal-pipe extract`).")
    ] = None,
    images: Annotated[
        list[str] | None, typer.Option(help="Predict unlabelled image files, folders (recursive) or glob patterns, "
                                       "encoded as the model's store was; takes several paths (--images a.png b.png, "
                                       "or a shell's --images dir/*.png) and repeats (--images a.png --images b.png).")
    ] = None,
    more_images: Annotated[
        list[str] | None, typer.Argument(help="More image paths for --images (the shell expands --images dir/*.png "
                                         "into --images dir/a.png dir/b.png ...).", show_default=False,
                                         metavar="IMAGES")
    ] = None,
    split: Annotated[choice("train", "test"), typer.Option(help="With --features: which split to predict, train or test.")] = "test",
    checkpoint: Annotated[
        Path | None, typer.Option(help="With --images: the checkpoint of a model whose encoder came from --checkpoint "
                                  "(its sha256 must equal the recorded one).")
    ] = None,
    top_k: Annotated[int, typer.Option(help="With --images: add the K best class names and scores (K > 1).")] = 1,
    skip_bad: Annotated[
        bool, flag("--skip-bad", help="With --images: skip unreadable files (listed on stderr). Default: off.")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="With --images: images encoded at once.")] = 64,
    device: Annotated[str, typer.Option(help="With --images: where the encoder runs (cpu, cuda, ...).")] = "cpu",
    out: Annotated[
        Path | None, typer.Option(help="Write the CSV here (atomically, checked before predicting). Default: stdout.")
    ] = None,
) -> None:
    """Predict with a saved model; writes CSV.

    --features: columns row, predicted_class (label id), predicted_name, score (the winning class's score),
    true_class (the label id the store holds), true_name; accuracy goes to stderr. --images: columns path,
    predicted_class, predicted_name, score (and top{i}_name, top{i}_score with --top-k).
    """
    from foal_pipe.io import atomic_path, check_output_file
    from foal_pipe.model.predict import predict_image_files, predict_split

    images = [*(images or []), *(more_images or [])]
    with user_errors():
        if (features is None) == (not images):
            raise FoalPipeError("pass exactly one of --features STORE or --images PATH...")
        if out is not None:
            check_output_file(out)
        if images:
            result = predict_image_files(model, images, checkpoint, top_k, skip_bad, batch_size, device)
        else:
            result = predict_split(model, features, split)
        if out is None:
            result.write_csv(sys.stdout)
        else:
            with atomic_path(out) as tmp, open(tmp, "w", newline="") as fh:
                result.write_csv(fh)
        if images:
            for skipped in result.skipped:
                err_console.print(f"[yellow]skipped {skipped}[/]", highlight=False, soft_wrap=True)
            err_console.print(f"{len(result.paths)} images predicted, {len(result.skipped)} skipped", highlight=False)
        else:
            accuracy = "unlabelled" if result.accuracy != result.accuracy else f"accuracy {100 * result.accuracy:.2f}%"
            err_console.print(f"{result.predicted.size} rows, {accuracy} on {split}", highlight=False)
