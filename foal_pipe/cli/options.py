"""The options of ``learn`` and ``sweep``, each defined once, and the settings they build.

An option named after a field of the settings dataclasses (:mod:`foal_pipe.protocol.config`) sets that field
(:func:`settings`; ``--no-X`` sets ``X`` false); its default is read from the dataclass and its fixed set of
values from the registry that accepts them. A new option is one settings field plus one alias here, and
:mod:`~foal_pipe.cli.flags` tells the error handler which flag sets a library parameter.

Imported by ``foal-pipe --help``: nothing here imports scikit-learn, SciPy, zarr or torch.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from foal_pipe.cli._app import choice, flag
from foal_pipe.cli.flags import NEGATED
from foal_pipe.cli.headoptions import head_options, parse_head_option
from foal_pipe.cli.optiontext import (
    class_order_text,
    fusion_text,
    fusions_text,
    gamma_text,
    head_names,
    heads_value,
    integers,
    numbers,
    read_by,
    shrinkage_value,
    size_text,
)
from foal_pipe.core.activations import ACTIVATIONS, INITS
from foal_pipe.core.backend import BACKENDS, DTYPES
from foal_pipe.core.engines import ENGINES
from foal_pipe.errors import FoalPipeError, comma_items
from foal_pipe.heads import HEADS
from foal_pipe.memory import memory_text, parse_memory
from foal_pipe.protocol.config import (
    HEAD_ROWS,
    SCHEDULERS,
    EvaluationConfig,
    ExecutionConfig,
    ModelConfig,
    StreamConfig,
    SweepConfig,
    head_option_names,
    parse_gamma,
)
from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
from foal_pipe.protocol.stream import DEFAULT_TASKS, STREAMS
from foal_pipe.store.blockfusion import FUSION_FORMS

if TYPE_CHECKING:  # mypy: the plain string a command receives (a Literal built at run time is no type to mypy)
    StreamName = str
    BackendName = str
    DtypeName = str
    InitName = str
    ActivationName = str
    SchedulerName = str
    EngineName = str
    HeadName = str
    HeadRowsName = str
    TrainingCriterion = str
    Criterion = str
else:  # typer: a Literal of the registry's names, which --help lists and typer refuses any other value of
    StreamName, BackendName, DtypeName, InitName = choice(*STREAMS), choice(*BACKENDS), choice(*DTYPES), choice(*INITS)
    ActivationName, SchedulerName, EngineName = choice(*ACTIVATIONS), choice(*SCHEDULERS), choice(*ENGINES)
    HeadName, HeadRowsName = choice(*HEADS), choice(*HEAD_ROWS)
    TrainingCriterion, Criterion = choice(*TRAINING_CRITERIA), choice(*CRITERIA)

STREAM, MODEL, EVALUATION, EXECUTION, SWEEP = StreamConfig(), ModelConfig(), EvaluationConfig(), ExecutionConfig(), SweepConfig()


def grid_text(grid: tuple[float, ...]) -> str:
    """``1e-4,1e-3,...,1e8``: powers of ten written as such, other values as ``%g``."""
    def one(g: float) -> str:
        k = round(math.log10(g))
        return f"{g:g}" if 10.0**k != g or -1 <= k <= 3 else f"1e{k}"

    return ",".join(one(g) for g in grid)


# ----------------------------------------------------------------------------------------------------------------
# Both commands: the store, the stream, the expansion, where the work runs

Features = Annotated[Path, typer.Option("--features", help="Feature store (a .zarr directory written by `foal-pipe extract`).")]
Out = Annotated[Path, typer.Option("--out", help="Output directory (missing parent folders are made), checked before any work "
                                                 "and replaced as one unit at the end.")]
Tasks = Annotated[
    int | None,
    typer.Option(help="Number of tasks, at most the number of classes: the classes, shuffled with --seed (--order-seed "
                 "when given), are cut into tasks of consecutive classes, the first (classes mod tasks) tasks one class "
                 "larger (8 classes in 5 tasks: 2, 2, 2, 1, 1); with --stream si-blurry, at most the training rows "
                 f"(docs/streams.md). Default: {DEFAULT_TASKS}, or one class per task with fewer classes.",
                 show_default=False),
]


def _drop_remainder(scope: str, recorded: str) -> Any:
    """``--drop-remainder``'s type: ``scope`` names the splits it refuses, ``recorded`` the file that keeps it."""
    return Annotated[
        bool, flag("--drop-remainder", help="Give every task (classes // tasks) classes and drop the classes left over, "
                   f"with a warning (the published code: DTD 47 -> 40 classes); {scope}; recorded as drop_remainder in "
                   f"{recorded}. Default: off (every class is streamed).")
    ]


def _stream_kind(disjoint: str, recorded: str) -> Any:
    """``--stream``'s type: ``disjoint`` names the options that shape the disjoint split, ``recorded`` where it is kept."""
    return Annotated[
        StreamName,
        typer.Option("--stream", help=f"disjoint: each class in one task ({disjoint}). si-blurry: the Si-Blurry stream "
                     "(Moon et al. 2023; docs/streams.md): classes recur across tasks and the classes per task are "
                     f"drawn with the seed (--disjoint-ratio, --blurry-ratio); {recorded}."),
    ]


DropRemainder = _drop_remainder("not with --class-order or --stream si-blurry, which split the classes themselves",
                                "metrics.json (learn) or sweep.json (sweep)")
StreamKind = _stream_kind("--tasks, --class-order", "metrics.json (learn) or sweep.json (sweep) records it with its "
                         "ratios")
#: ``table``'s: it has no --class-order and writes table.json.
TableDropRemainder = _drop_remainder("not with --stream si-blurry, which draws its own split", "table.json's settings")
TableStreamKind = _stream_kind("--tasks", "table.json's settings record it")
DisjointRatio = Annotated[
    int, typer.Option(help="With --stream si-blurry: % of the classes (rounded down) whose rows all fall in one task.")
]
BlurryRatio = Annotated[
    int, typer.Option(help="With --stream si-blurry: % of the other classes' rows (rounded down) dealt over the tasks "
                      "instead of staying in their class's task.")
]
BatchSize = Annotated[int, typer.Option(help="Mini-batch size S of the online stream.")]
ProjectionDim = Annotated[int, typer.Option(help="Projection dimension D of the smooth projection; 0: no projection.")]
Seed = Annotated[int, typer.Option(help="Seed of the projection and, without --order-seed(s), of the class order and "
                                   "the within-task shuffles.")]
OrderSeed = Annotated[int | None, typer.Option(help="Seed of the class order and the within-task shuffles. Default: --seed.")]
OrderSeeds = Annotated[
    str | None,
    typer.Option(help="Comma-separated class-order seeds (e.g. 0,1,2,3,4): every order from one pass over the store, "
                 "reported per order with mean and std; every head takes them (sweep --heads: every order of every "
                 "head). Default: one order (--order-seed).",
                 callback=read_by(lambda text: integers(text, "--order-seeds", "0,1,2,3,4")))
]
MaxMemory = Annotated[str, typer.Option(help="The most each speed-up may hold (each on its own: together they may hold a "
                                        "few times it): the decoded rows of the walk (in memory up "
                                        "to the smaller of 512 MiB and this limit, beyond it in a temporary file in "
                                        "TMPDIR), the activations kept for leave-one-out "
                                        "(rows x D values; beyond it each boundary projects the rows again) and, with "
                                        "--order-seeds, the per-class statistics (C x D^2 values; beyond it one pass "
                                        "per order).", callback=read_by(size_text))]
Backend = Annotated[BackendName, typer.Option(help="auto (CuPy if it sees a GPU, else torch on CUDA if available, "
                                              "else NumPy), numpy, cupy or torch (CUDA when available, else the CPU).")]
Dtype = Annotated[DtypeName, typer.Option(help="State dtype: float64 (exact to its rounding: a gamma at which that could move W by 1e-4 is refused) or float32 (half the memory; "
                                          "solved in float64, a gamma below its resolution is refused, and left out of --gamma auto's "
                                          "search; a head "
                                          "other than ridge: float32 rows, float64 statistics).")]
ProjectionInit = Annotated[InitName, typer.Option(help="uniform U(-1/sqrt(d), 1/sqrt(d)) as the authors' code, or "
                                                  "normal (same variance).")]
Activation = Annotated[
    ActivationName | None,
    typer.Option(help="Activation after the projection: sigmoid (the paper), relu, identity, or cos: random Fourier "
                 "features sqrt(2/D) cos(x P + b), b drawn uniform in [0, 2 pi) after P (KLDA's expansion; with a "
                 "--head on --head-rows activations or in sweep: ridge's model file holds no bias). Default: sigmoid, "
                 "or identity with --projection-dim 0 (ridge on the raw features)."),
]
ClassOrder = Annotated[
    Path | None, typer.Option(help="JSON file with an explicit task split: a list of task lists of label ids; its split is "
                              "the run's (--tasks, if given, must equal its number of tasks). Or pilot: LAMDA-PILOT's class order (numpy.random.seed(1993), then "
                              "numpy.random.permutation of the label ids; pilot:SEED another seed) cut into --tasks. "
                              "Not with --drop-remainder (a FILE lists its tasks itself; pilot streams every class). "
                              "Default: none (--tasks splits the classes in the order drawn by --order-seed).",
                              metavar="FILE|pilot", callback=read_by(class_order_text))
]
DropLast = Annotated[bool, flag("--drop-last", help="Drop each task's last incomplete batch (the published code). "
                                "Default: off (the batch is kept).")]
NoMaskUnseen = Annotated[
    bool, flag("--no-mask-unseen", help="Predict over all classes, unseen ones included (the published code). "
               "Default: off (only seen classes).")
]
Scheduler = Annotated[
    SchedulerName,
    typer.Option(
        help="local: one process. dask: Gram statistics computed in parallel on a Dask cluster (sweep always "
        "uses them; learn only with --engine gram, as the per-batch RLS path is sequential by nature and stays "
        "single-process); with a head other than ridge, the cluster reads the train split and the head takes its "
        "rows here."
    ),
]
DaskAddress = Annotated[
    str, typer.Option(help="With --scheduler dask: 'local' starts a LocalCluster, or a scheduler address tcp://host:port.")
]
Workers = Annotated[int, typer.Option(help="With --scheduler dask and --dask-address local: number of worker processes.")]
Fusion = Annotated[
    str | None,
    typer.Option(help="Fuse the store's per-block tokens at read time (stores made with `extract --keep-blocks`): "
                 f"{FUSION_FORMS}; then the stored final norm (concat: on each block's token). Default: the store's own features.",
                 callback=read_by(fusion_text)),
]
NoFusionNorm = Annotated[bool, flag("--no-fusion-norm", help="With --fusion(s): skip the stored final norm. Default: off.")]

# ----------------------------------------------------------------------------------------------------------------
# The heads (foal_pipe.heads)

Shrinkage = Annotated[
    str | None,
    typer.Option(help="slda: eps of Lambda = pinv((1 - eps) S + eps I), a number in [0, 1] (default 1e-4), or oas (the "
                 "OAS estimate); fecam: a1, the diagonal shrinkage (default 1). Not for the other heads.",
                 show_default=False, callback=read_by(shrinkage_value)),
]
ShrinkageOffdiag = Annotated[
    float | None, typer.Option(help="fecam: a2, the off-diagonal shrinkage (default 0). Not for the other heads.",
                               show_default=False)
]

Compensation = Annotated[
    float | None, typer.Option(help="dual: C, the compensation stream's weight in the scores (default 1). Not for the "
                               "other heads.", show_default=False)
]
GammaComp = Annotated[
    float | None, typer.Option(help="dual: the compensation stream's ridge regularisation, > 0 (default: dual's gamma). "
                               "Not for the other heads.", show_default=False)
]
HeadOption = Annotated[
    list[str] | None,
    typer.Option("--head-option", metavar="NAME=VALUE",
                 help="A head's own option, read as its head's Options type (repeatable: --head-option shrinkage=oas "
                 "--head-option shrinkage_offdiag=0.3); the heads' options: " + "; ".join(
                     f"{name} ({', '.join(heads)})" for name, heads in head_option_names().items())
                 + ". The flags above set the same options (one given both ways must agree). Default: none (each "
                 "head's defaults).", show_default=False, callback=read_by(lambda texts: [parse_head_option(t) for t in texts])),
]

# ----------------------------------------------------------------------------------------------------------------
# learn

Gamma = Annotated[
    str, typer.Option(help="Ridge regularisation gamma (R0 = I/gamma), > 0; or auto: chosen at every task boundary on "
                      "the training rows seen so far (see --select, --gamma-grid).", callback=read_by(gamma_text))
]
LearnSelect = Annotated[
    TrainingCriterion | None,
    typer.Option(help="With --gamma auto: how gamma is chosen on the training rows seen so far, loo (exact "
                 "leave-one-out MSE), gcv (generalised cross-validation, no extra pass) or loo_accuracy (exact "
                 "leave-one-out accuracy; among equals the least LOO MSE); never on the test split. "
                 f"Default: {MODEL.select}."),
]
GammaGrid = Annotated[
    str | None, typer.Option(help="Candidates of --gamma auto (comma-separated); a choice on an edge is warned about. "
                             f"Default: {grid_text(MODEL.gamma_grid)}.", show_default=False,
                             callback=read_by(lambda text: numbers(text, "--gamma-grid")))
]
PerDecade = Annotated[
    int, typer.Option(help="Points per decade of the refined search of gamma: the criterion is evaluated at this many "
                      "log-spaced gammas per decade across the grid's range and the best is chosen (learn --gamma auto; "
                      "sweep's selections), besides the grid's own; 0: the grid's gammas only. A model file records it and "
                      f"--init-model keeps it. Default: {MODEL.per_decade}.", show_default=False)
]
LooSample = Annotated[
    int, typer.Option(help="With learn --gamma auto and a leave-one-out criterion, and in sweep's leave-one-out pass: "
                      "score leave-one-out on this many rows drawn from --seed among those seen, at each task boundary "
                      "(each left out of all the rows; the same rows in learn and sweep), instead of on every row; the "
                      "sampled accuracy is within Hoeffding's sqrt(ln(2K/0.05)/2M) of every row's at all K gammas with "
                      "probability 0.95 (recorded in metrics.json and sweep.json). 0: every row (exact). "
                      f"Default: {MODEL.loo_sample}.", show_default=False)
]
Engine = Annotated[
    EngineName,
    typer.Option(
        help="gram: accumulate H^T H and H^T Y, solve at task ends (fastest, exact). "
        "rls: the paper's per-batch Woodbury recursion (exact, sequential, always single-process)."
    ),
]
#: The heads by the rows they take (``foal_pipe.heads`` registry order), for the help texts.
ON_FEATURES = ", ".join(name for name, entry in HEADS.items() if entry.space == "features")
ON_PROJECTION = ", ".join(name for name, entry in HEADS.items() if entry.space != "features" and name != "ridge")
#: The heads with an exact leave-one-out (``loo_hits``), which ``sweep --heads`` ranks beside ridge.
WITH_LOO = ", ".join(name for name, entry in HEADS.items() if hasattr(entry.head, "loo_hits"))
WITHOUT_LOO = ", ".join(name for name, entry in HEADS.items()
                        if name != "ridge" and not hasattr(entry.head, "loo_hits"))

Head = Annotated[
    HeadName,
    typer.Option(help="The classifier: ridge (F-OAL's analytic ridge on the projection), or a head of the family "
                 f"compared in docs/heads.md: {ON_FEATURES} work on the store's features (a projection option typed "
                 "moves them onto the projection's activations, as --head-rows activations does); "
                 f"{ON_PROJECTION} on the projection, with --gamma."),
]
HeadRows = Annotated[
    HeadRowsName | None,
    typer.Option(help="The rows of a head on the store's features (ncm, slda, fecam, cosine): features, or "
                 "activations, the projection's (--projection-dim, --projection-init, --activation; e.g. KLDA: slda "
                 "on --activation cos random Fourier features). Default: the head's own rows (features for those "
                 "heads, activations when a projection option is typed; balanced and dual take the projection "
                 "anyway).", show_default=False),
]
InitModel = Annotated[
    Path | None, typer.Option(help="Continue this model.safetensors on --features: classes matched by name (a new "
                              "name gets a new label id), gamma, projection, activation, dtype and fusion from the model; "
                              "a head's model (learn --head) continues that head with its options. "
                              "Default: none (a new model).")
]
EvalEvery = Annotated[
    int | None,
    typer.Option(help="Also score the test rows of the classes seen so far after every N training rows (exact ridge "
                 "on the rows seen; gamma: the last task end's choice, or --gamma): metrics.json gains the curve "
                 "(anytime) and A_auc, its mean (Koh et al. 2022); with --head, that head's model on the rows seen (not "
                 "dual). Not with --scheduler dask (which sums whole tasks) or --init-model. Default: none (task ends only).",
                 show_default=False),
]
EvalFeatures = Annotated[
    list[Path] | None, typer.Option(help="With --init-model: also score the final model on this store's test "
                                    "split (classes by name; repeatable), to measure forgetting. Default: none.")
]

# ----------------------------------------------------------------------------------------------------------------
# sweep

Gammas = Annotated[
    str | None, typer.Option(help="Comma-separated gammas, all evaluated from one pass over the data; a best gamma on an "
                             f"edge is warned about. Default: --gamma auto's grid, {grid_text(SWEEP.gammas)}.",
                             show_default=False, callback=read_by(lambda text: numbers(text, "--gammas")))
]
Select = Annotated[
    Criterion | None,
    typer.Option(help="How the best gamma is chosen: on the training rows seen so far, loo (exact leave-one-out MSE), "
                 "gcv (generalised cross-validation, no extra pass) or loo_accuracy (exact leave-one-out accuracy; "
                 "among equals the least LOO MSE); or test, an oracle that peeks at the test split. Default: loo, or "
                 "gcv with --no-loo."),
]
NoLoo = Annotated[bool, flag("--no-loo", help="Skip the leave-one-out pass (then --select defaults to gcv). Default: off.")]
Heads = Annotated[
    str | None,
    typer.Option(help="Comma-separated heads (e.g. ridge,ncm,slda,fecam), all from one read of the store: "
                 "sweep.json's heads holds each one's accuracy and hyperparameters, and best_head the head of best "
                 f"leave-one-out accuracy on the training rows ({WITH_LOO}: exact; ridge: on the --loo-sample rows, "
                 f"exact up to that many rows seen; {WITHOUT_LOO} have none and are not ranked). Must name ridge. "
                 "With --fusions, every head on "
                 "every fusion; with --order-seeds, every order of every head (means over the orders). "
                 "Default: none (the gamma sweep alone).", callback=read_by(head_names)),
]
Fusions = Annotated[
    str | None,
    typer.Option(help="Comma-separated fusions of a blocks store (e.g. mean-cls,last,mean:7-12), every fusion x gamma "
                 "from one read of the blocks: a table and sweep.json entries per fusion, and the best (fusion, "
                 "gamma) by --select. All of one width (concat:A-B fusions of as many blocks). Not with --fusion. Default: none (the store's features, or --fusion).",
                 callback=read_by(fusions_text)),
]

#: Defaults of the options whose text the command line parses.
GAMMA_TEXT = f"{MODEL.gamma:g}"
MAX_MEMORY_TEXT = memory_text(EXECUTION.max_memory)

#: Every option of ``learn`` and ``sweep`` but ``--select`` (whose values and default differ), each defined once: its
#: type (with its help) and its default. A command lists the names it takes (:func:`options`).
OPTIONS: dict[str, tuple[Any, Any]] = {
    "gamma": (Gamma, GAMMA_TEXT),
    "gamma_grid": (GammaGrid, None),
    "gammas": (Gammas, None),
    "no_loo": (NoLoo, not SWEEP.loo),
    "engine": (Engine, MODEL.engine),
    "fusions": (Fusions, None),
    "eval_every": (EvalEvery, None),
    "init_model": (InitModel, None),
    "eval_features": (EvalFeatures, None),
    "head": (Head, MODEL.head),
    "head_rows": (HeadRows, MODEL.head_rows),
    "heads": (Heads, None),
    "per_decade": (PerDecade, MODEL.per_decade),
    "loo_sample": (LooSample, MODEL.loo_sample),
    "tasks": (Tasks, STREAM.tasks),
    "batch_size": (BatchSize, STREAM.batch_size),
    "projection_dim": (ProjectionDim, MODEL.projection_dim),
    "seed": (Seed, STREAM.seed),
    "order_seed": (OrderSeed, STREAM.order_seed),
    "order_seeds": (OrderSeeds, None),
    "max_memory": (MaxMemory, MAX_MEMORY_TEXT),
    "backend": (Backend, EXECUTION.backend),
    "dtype": (Dtype, MODEL.dtype),
    "projection_init": (ProjectionInit, MODEL.projection_init),
    "activation": (Activation, MODEL.activation),
    "fusion": (Fusion, MODEL.fusion),
    "no_fusion_norm": (NoFusionNorm, not MODEL.fusion_norm),
    "class_order": (ClassOrder, STREAM.class_order),
    "drop_last": (DropLast, STREAM.drop_last),
    "drop_remainder": (DropRemainder, STREAM.drop_remainder),
    "stream": (StreamKind, STREAM.stream),
    "disjoint_ratio": (DisjointRatio, STREAM.disjoint_ratio),
    "blurry_ratio": (BlurryRatio, STREAM.blurry_ratio),
    "no_mask_unseen": (NoMaskUnseen, not EVALUATION.mask_unseen),
    "scheduler": (Scheduler, EXECUTION.scheduler),
    "dask_address": (DaskAddress, EXECUTION.dask_address),
    "workers": (Workers, EXECUTION.workers),
    "shrinkage": (Shrinkage, None),
    "shrinkage_offdiag": (ShrinkageOffdiag, None),
    "compensation": (Compensation, None),
    "gamma_comp": (GammaComp, None),
    "head_option": (HeadOption, None),
}


def options(*names: str, **own: tuple[Any, Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the signature typer reads: ``ctx``, ``--features``, ``--out``, then the options ``names`` in that
    order (their ``--help`` order), each the command's ``own`` ``(type, default)`` or else :data:`OPTIONS`'s. The
    command takes them as keyword arguments (``def learn(ctx, features, out, **params)``)."""
    missing = [name for name in names if name not in own and name not in OPTIONS]
    if missing or set(own) - set(names):
        raise TypeError(f"options: no definition of {missing} or unlisted own options {sorted(set(own) - set(names))}")

    def build(command: Callable[..., None]) -> Callable[..., None]:
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter("ctx", keyword, annotation=typer.Context),
                      inspect.Parameter("features", keyword, annotation=Features),
                      inspect.Parameter("out", keyword, annotation=Out)]
        for name in names:
            kind, default = own.get(name) or OPTIONS[name]
            parameters.append(inspect.Parameter(name, keyword, annotation=kind, default=default))
        command.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        return command

    return build


# ----------------------------------------------------------------------------------------------------------------
# The settings the options build


def floats(text: str, option: str) -> tuple[float, ...]:
    """``"1e-3,1,10"`` -> ``(0.001, 1.0, 10.0)``: gammas, so each a positive finite number; a value listed twice is
    refused (a sweep would evaluate it twice)."""
    items, values = comma_items(text, option), numbers(text, option)
    bad = next((i for i, v in enumerate(values) if not (math.isfinite(v) and v > 0)), None)
    if bad is not None:
        raise FoalPipeError(f"{option} lists {_as_read(items[bad], values[bad])}; a gamma is a positive number: write "
                            "e.g. 1e-3,1e-1,1,10")
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise FoalPipeError(f"{option} lists {twice:g} twice; list each gamma once")
    return values


def _as_read(item: str, value: float) -> str:
    """A listed number as typed, and as read where that differs (``1e-3000`` underflows to 0, ``1e999`` is inf)."""
    return item if f"{value:g}" == item else f"{item} (read as {value:g})"


def gamma_value(text: str) -> float | str:
    """``--gamma``: a number > 0, or ``auto``."""
    value = gamma_text(text)
    if isinstance(value, str):
        return value
    if (value == 0 and any(c in text.lower().split("e")[0] for c in "123456789")) or \
            (abs(value) == float("inf") and "inf" not in text.lower()):  # named as typed, not as the 0 or inf it reads as
        raise FoalPipeError(f"--gamma {text} reads as {value:g}, beyond float64's range; gamma must be a positive number, "
                            "e.g. --gamma 1")
    return parse_gamma(value)


#: Options whose text becomes the field's value.
PARSE: dict[str, Callable[[Any], Any]] = {
    "gamma": gamma_value,
    "gamma_grid": lambda text: floats(text, "--gamma-grid"),
    "gammas": lambda text: floats(text, "--gammas"),
    "fusions": lambda text: tuple(comma_items(text, "--fusions")) or ("",),  # no item: "names no fusion", as before
    "heads": heads_value,
    "shrinkage": shrinkage_value,
    "max_memory": parse_memory,
}


def settings(params: Mapping[str, Any], kind: type[Any]) -> Any:
    """The settings of dataclass ``kind`` that a command's options ``params`` (``ctx.params``) give: each field
    from the option of its name (parsed by :data:`PARSE`) or its ``--no-`` option; a field whose option is absent
    or None keeps its default; ``head_options`` from ``--head-option`` and the heads' own flags
    (:func:`~foal_pipe.cli.headoptions.head_options`)."""
    names, given = {f.name for f in fields(kind)}, {}
    for option, value in params.items():
        name = NEGATED.get(option, option)
        if name in names and value is not None:
            given[name] = (not value) if option in NEGATED else PARSE.get(name, lambda v: v)(value)
    if "head_options" in names:
        given["head_options"] = head_options(params, PARSE)
    return kind(**given)
