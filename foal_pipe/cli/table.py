"""``foal-pipe table``: the field's results table (stores x heads x task counts x class orders) in one command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from foal_pipe.cli import options as o
from foal_pipe.cli._app import app, console, err_console, print_table, user_errors
from foal_pipe.cli.optiontext import gamma_text, head_names, integers, read_by
from foal_pipe.heads import HEADS
from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
from foal_pipe.protocol.stream import DEFAULT_TASKS

#: How the help names the rows each space of :data:`foal_pipe.heads.SPACES` gives a head.
SPACE_WORDS = {"activations": "on the projection's activations", "projected": "on the projected rows",
               "features": "on the store's features"}
#: The heads by the space they run on, in the registry's order.
BY_SPACE = {space: [n for n, e in HEADS.items() if e.space == space] for space in dict.fromkeys(e.space for e in HEADS.values())}
PROJECTED = ", ".join(n for n, e in HEADS.items() if e.space != "features")
LOO_SELECTS = ", ".join(name for name in TRAINING_CRITERIA if CRITERIA[name].rows)

TableFeatures = Annotated[
    list[Path], typer.Option("--features", help="A feature store (a .zarr written by `foal-pipe extract`); repeat "
                             "for several (--features A.zarr --features B.zarr): each is read once for all its runs.",
                             metavar="PATH")
]
TableSeed = Annotated[int, typer.Option(help=f"Seed of the projection ({PROJECTED}) and of ridge's leave-one-out "
                                        "sample; refused when no run uses either. The class orders come from "
                                        f"--order-seeds. Default: {o.STREAM.seed}.", show_default=False)]
TableHeads = Annotated[
    str, typer.Option(help="Comma-separated heads of `foal-pipe learn --head`: " + "; ".join(
        f"{', '.join(names)} {SPACE_WORDS.get(space, space)}" for space, names in BY_SPACE.items()) + ".",
        callback=read_by(head_names))
]
TableOrderSeeds = Annotated[
    str, typer.Option(help="Comma-separated class-order seeds; each cell is the mean and std over these orders.",
                      callback=read_by(lambda text: integers(text, "--order-seeds", "0,1,2")))
]
TableTasks = Annotated[
    str | None, typer.Option(help=f"Comma-separated task counts, e.g. 5,10: a table per count. Default: {DEFAULT_TASKS}, "
                             "or the fewest classes of any store when one has fewer (as learn).", show_default=False,
                             callback=read_by(lambda text: integers(text, "--tasks", "5,10")))
]
TableGamma = Annotated[
    str, typer.Option(help="ridge's gamma: auto (chosen at every task boundary on the training rows seen so far, "
                      "by --select) or a number > 0. balanced and dual run at ridge's last-boundary choice on the same "
                      "class order with auto (ridge must be among --heads), or at this number.",
                      callback=read_by(gamma_text))
]
TableLooSample = Annotated[
    int, typer.Option(help=f"With --gamma auto and a leave-one-out --select ({LOO_SELECTS}): ridge scores "
                      "leave-one-out on this many rows drawn from --seed among those seen at each task boundary, as "
                      "`learn --loo-sample`, instead of on every row; 0: every row (ridge then walks each task count "
                      f"and order apart). Default: {o.MODEL.loo_sample}.", show_default=False)
]
TableActivation = Annotated[
    o.ActivationName | None,
    typer.Option(help=f"Activation after the projection, for the heads on its activations ({', '.join(BY_SPACE['activations'])}"
                 f"; {', '.join(BY_SPACE['projected'])} on the projected rows ignore{'s' * (len(BY_SPACE['projected']) == 1)} "
                 "it): sigmoid (the paper), relu, identity, or cos (random Fourier features, whose bias "
                 "ridge's model file does not hold: not with ridge). Default: sigmoid, or identity with "
                 "--projection-dim 0."),
]
#: The options a user typed that the checks take (defaults are not "asked for"; the head options given are asked for
#: by being given): the model's, as headruns.check_head_options takes them, and --seed.
TYPED_OPTIONS = ("projection_dim", "activation", "gamma", "select", "gamma_grid", "loo_sample", "seed")


@app.command()
def table(
    ctx: typer.Context,
    features: TableFeatures,
    out: o.Out,
    heads: TableHeads = "ridge",
    order_seeds: TableOrderSeeds = "0,1,2",
    tasks: TableTasks = None,
    gamma: TableGamma = "auto",
    select: o.LearnSelect = None,
    gamma_grid: o.GammaGrid = None,
    loo_sample: TableLooSample = o.MODEL.loo_sample,
    projection_dim: o.ProjectionDim = o.MODEL.projection_dim,
    activation: TableActivation = o.MODEL.activation,
    seed: TableSeed = o.STREAM.seed,
    batch_size: o.BatchSize = o.STREAM.batch_size,
    drop_remainder: o.TableDropRemainder = o.STREAM.drop_remainder,
    stream: o.TableStreamKind = o.STREAM.stream,
    disjoint_ratio: o.DisjointRatio = o.STREAM.disjoint_ratio,
    blurry_ratio: o.BlurryRatio = o.STREAM.blurry_ratio,
    shrinkage: o.Shrinkage = None,
    shrinkage_offdiag: o.ShrinkageOffdiag = None,
    compensation: o.Compensation = None,
    gamma_comp: o.GammaComp = None,
    head_option: o.HeadOption = None,
    max_memory: o.MaxMemory = o.MAX_MEMORY_TEXT,
    backend: o.Backend = o.EXECUTION.backend,
) -> None:
    """Run every store x head x task count x class order and write the table as one unit: OUT/table.json (each run
    and each cell's mean, std and values over the orders), table.md, table.csv, table.tex (booktabs) and table.png.

    Each run equals the separate `learn --head H --order-seed S --tasks T` with the same options, except that ncm,
    slda, fecam and cosine stay on the store's features whatever --projection-dim (as `sweep --heads`); each store
    is read once for all its runs. A killed table keeps its finished runs beside OUT and the same command resumes them.
    """
    from foal_pipe.cli.learn import LEARN_ONLY_WITH, _check_applies, _typed
    from foal_pipe.protocol.capabilities import Settings
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.stream import counted
    from foal_pipe.protocol.table import TableConfig, run_table
    from foal_pipe.report.resultstable import mean_text, store_labels, tasks_title, write_files

    with user_errors():
        params = {k: v for k, v in ctx.params.items() if k not in ("heads", "tasks", "order_seeds")}
        model = o.settings(params, ModelConfig)
        settings = Settings(o.settings(params, StreamConfig), model, o.settings(params, EvaluationConfig),
                            o.settings(params, ExecutionConfig))
        _check_applies(ctx, {k: LEARN_ONLY_WITH[k] for k in ("disjoint_ratio", "blurry_ratio", "select", "gamma_grid",
                                                           "loo_sample")})
        config = TableConfig(o.heads_value(heads), integers(order_seeds, "--order-seeds", "0,1,2"),
                             None if tasks is None else integers(tasks, "--tasks", "5,10"))
        explicit = [name for name in TYPED_OPTIONS if _typed(ctx, name)]
        done = run_table(features, out, config, settings, explicit,
                         log=lambda m: err_console.print(f"[yellow]{escape(m)}[/]", highlight=False, soft_wrap=True),
                         write=write_files)
        labels = store_labels(done["features"])
        for t in done["tasks"]:
            n = len(done["order_seeds"])
            spread = f"mean +- std over {n} orders" if n > 1 else f"one order (seed {done['order_seeds'][0]}), no std"
            view = Table(title=f"{tasks_title(done, t)}: A_last / A_avg %, {spread}")
            view.add_column("head")
            for store in done["features"]:
                view.add_column(escape(labels[store]), justify="right")
            for head in done["heads"]:
                row = [head]
                for store in done["features"]:
                    c = next(c for c in done["cells"] if (c["store"], c["head"], c["tasks"]) == (store, head, t))
                    row.append(f"{mean_text(c, 'A_last', '+-', '')} / {mean_text(c, 'A_avg', '+-', '')}")
                view.add_row(*row)
            print_table(view)
        console.print(f"{counted(len(done['runs']), 'run')} -> {Path(out) / 'table.md'}", highlight=False, markup=False)
