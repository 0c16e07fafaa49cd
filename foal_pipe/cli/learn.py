"""``foal-pipe learn``, ``sweep`` and ``predict``: the analytic learner on a feature store."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from foal_pipe.cli import options as o
from foal_pipe.cli._app import app, console, err_console, flag, one_line, print_table, user_errors
from foal_pipe.cli.optiontext import numbers
from foal_pipe.cluster import is_local
from foal_pipe.core.metrics import capped, pct
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
from foal_pipe.protocol.stream import counted

if TYPE_CHECKING:
    from foal_pipe.model.predict import Predictions


def _log(message: str) -> None:
    err_console.print(f"[yellow]{escape(message)}[/]", highlight=False, soft_wrap=True)


def _order_seeds(order_seed: int | None, order_seeds: str | None) -> tuple[int, ...] | None:
    """The seeds of ``--order-seeds`` (None: one order, the plain command)."""
    if order_seeds is None:
        return None
    if order_seed is not None:
        raise FoalPipeError("pass --order-seed (one order) or --order-seeds (many), not both")
    from foal_pipe.protocol.orderchecks import parse_order_seeds

    return parse_order_seeds(order_seeds)


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was typed (not defaulted): ``learn --init-model`` refuses or checks those."""
    source = ctx.get_parameter_source(name)  # compared by name: typer vendors its own click
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


#: Options that act only with another setting (named), by whether it is set: typed without it they would be
#: ignored, so they are refused (``learn``'s gamma options act with ``--gamma auto`` only).
ONLY_WITH: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "disjoint_ratio": ("--stream si-blurry", lambda p: p["stream"] == "si-blurry"),
    "blurry_ratio": ("--stream si-blurry and a --disjoint-ratio below 100 (at 100 no class is blurry)",
                     lambda p: p["stream"] == "si-blurry" and p["disjoint_ratio"] < 100),
    "dask_address": ("--scheduler dask", lambda p: p["scheduler"] == "dask"),
    "workers": ("--scheduler dask and --dask-address local",  # another cluster has its own workers
                lambda p: p["scheduler"] == "dask" and is_local(p["dask_address"])),
}
#: ``--select`` values that read the training rows (leave-one-out), so take ``--loo-sample``.
LOO_SELECTS = tuple(name for name in TRAINING_CRITERIA if CRITERIA[name].rows)


def _one_gamma(text: str | None) -> bool:
    """A typed grid of one gamma, which leaves the refined search (``--per-decade``) no range to cover (a grid's
    values are distinct: :func:`numbers` refuses one listed twice)."""
    return text is not None and len(numbers(text, "")) == 1


#: ``--projection-init`` draws the projection's weights: none at ``--projection-dim 0``.
PROJECTED = {"projection_init": ("a projection (--projection-dim above 0)", lambda p: p["projection_dim"] != 0)}
SWEEP_ONLY_WITH = {**ONLY_WITH, **PROJECTED, "no_fusion_norm": ("--fusion or --fusions",
                                                                lambda p: bool(p["fusion"] or p["fusions"])),
                   "loo_sample": ("the leave-one-out pass (no --no-loo)", lambda p: not p["no_loo"]),
                   "per_decade": ("--gammas of two gammas or more", lambda p: not _one_gamma(p["gammas"]))}
LEARN_ONLY_WITH = {**ONLY_WITH, **PROJECTED, "no_fusion_norm": ("--fusion", lambda p: bool(p["fusion"])),
                   **{name: ("--gamma auto", lambda p: p["gamma"] == "auto") for name in ("select", "gamma_grid")},
                   "per_decade": ("--gamma auto over two gammas or more (the default --gamma-grid)",
                                  lambda p: p["gamma"] == "auto" and not _one_gamma(p["gamma_grid"])),
                   "loo_sample": ("a leave-one-out --select (" + ", ".join(LOO_SELECTS) + ") with --gamma auto",
                                  lambda p: p["gamma"] == "auto" and (p["select"] or o.MODEL.select) in LOO_SELECTS)}


def _check_applies(ctx: typer.Context, only_with: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]],
                   can_add: bool = True) -> None:
    """Refuse a typed option that this command line would ignore (:data:`ONLY_WITH`); ``can_add``: the fix may be
    to add the setting it needs (not where that setting excludes the one given, as predict's two inputs do)."""
    for name, (needs, applies) in only_with.items():
        if _typed(ctx, name) and not applies(ctx.params):
            flag = "--" + name.replace("_", "-")
            fix = f"drop {flag}" + (f" or add {needs}" if can_add else "")
            raise FoalPipeError(f"{flag} acts only with {needs} and would be ignored here; {fix}")


#: The options that ask for projected rows: typed with a head on the store's features (ncm, slda, fecam, cosine)
#: and no ``--head-rows``, they give it the activations, as ``--head-rows activations`` does (KLDA's recipe reads
#: ``learn --head slda --projection-dim 5000 --activation relu``).
PROJECTION_OPTIONS = ("projection_dim", "projection_init", "activation")


def _check_head(ctx: typer.Context, head: str) -> None:
    """``learn --head``: the options the head cannot take, typed ones included, refused (with ``--init-model`` the
    model names its head and fixes its options: checked against it, protocol/continuation.py)."""
    from foal_pipe.protocol.config import ModelConfig
    from foal_pipe.protocol.headruns import PROJECTION_FIELDS, check_head_options

    typed = [name for name in (*PROJECTION_FIELDS, "head_rows") if _typed(ctx, name)]
    check_head_options([head], o.settings(ctx.params, ModelConfig), typed)


def _timings(timings: dict[str, float]) -> str:
    parts = [f"{step} {seconds:.1f}" for step, seconds in timings.items() if step != "total"]
    return f"{timings['total']:.1f} s: " + ", ".join(parts)


@app.command()
@o.options("tasks", "batch_size", "projection_dim", "gamma", "select", "gamma_grid", "per_decade", "loo_sample", "seed",
           "order_seed", "order_seeds", "max_memory", "engine", "backend", "dtype", "projection_init", "activation",
           "fusion", "no_fusion_norm", "class_order", "drop_last", "drop_remainder", "stream", "disjoint_ratio",
           "blurry_ratio", "eval_every", "no_mask_unseen", "scheduler", "dask_address", "workers", "init_model",
           "eval_features", "head", "head_rows", "shrinkage", "shrinkage_offdiag", "compensation", "gamma_comp",
           "head_option", select=(o.LearnSelect, None))
def learn(ctx: typer.Context, features: Path, out: Path, **params: Any) -> None:
    """Train F-OAL's analytic classifier through the stream, evaluating after every task.

    Writes OUT/metrics.json (accuracy matrix, A_avg, A_last, F), OUT/model.safetensors and OUT/timings.json
    (seconds per phase) as one unit: a failed or killed run leaves the previous outputs as they were.
    """
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.continuation import FIXED_BY_MODEL, SEARCH_SETTINGS
    from foal_pipe.protocol.entry import LearnSettings
    from foal_pipe.protocol.entry import learn as learn_entry

    with user_errors():
        init_model, head = params["init_model"], params["head"]
        seeds = _order_seeds(params["order_seed"], params["order_seeds"])
        if init_model is None and params["head_rows"] is None and any(_typed(ctx, name) for name in PROJECTION_OPTIONS):
            from foal_pipe.heads import head_entry

            if head_entry(head).space == "features":  # a projection asked for a head on the store's features
                ctx.params["head_rows"] = "activations"
        settings = LearnSettings(
            o.settings(ctx.params, StreamConfig), o.settings(ctx.params, ModelConfig),
            o.settings(ctx.params, EvaluationConfig), o.settings(ctx.params, ExecutionConfig), seeds, init_model,
            tuple(params["eval_features"] or ()),
            tuple(name for name in ("seed", "projection_init", *FIXED_BY_MODEL, "head", "head_rows", "engine", *SEARCH_SETTINGS,
                                    "batch_size") if _typed(ctx, name)))
        if init_model is None:
            _check_head(ctx, head)
            _check_applies(ctx, LEARN_ONLY_WITH)
        else:  # a continued model's head and gamma search are checked against the model's
            _check_applies(ctx, ONLY_WITH)
        done = learn_entry(features, out, settings, log=_log)
        if seeds is not None:
            std = done.metrics.std
            assert std is not None  # --order-seeds: the std over the orders
            console.print(f"{len(seeds)} class order{'s' if len(seeds) != 1 else ''}: A_avg +- {100 * std['A_avg']:.2f}  A_last +- "
                          f"{100 * std['A_last']:.2f}  F +- {100 * std['F']:.2f} (std over orders; means below)",
                          highlight=False, markup=False, soft_wrap=True)
        m, chosen = done.metrics, ""
        assert m.n_tasks is not None and m.n_train_seen is not None  # a run records its tasks and rows
        if m.head is not None:
            assert m.head_options is not None  # a head's run records its options, defaults included
            chosen = f"  head {m.head}" + "".join(f", {k} {v:g}" if isinstance(v, float) else f", {k} {v}"
                                                  for k, v in m.head_options.items())
        if m.gamma == "auto":
            assert m.gammas_selected is not None  # --gamma auto: a gamma chosen at every boundary
            where = f"{len(m.gammas_selected)} boundaries: metrics.json's gammas_selected"
            chosen = f"  gamma by {m.selected_by}: {capped([f'{g:g}' for g in m.gammas_selected], where)}"
        if m.A_auc is not None:
            chosen = f"  A_auc {100 * m.A_auc:.2f}{chosen}"
        console.print(
            f"A_avg {100 * m.A_avg:.2f}  A_last {100 * m.A_last:.2f}  F {pct(m.F)}{chosen}  "
            f"({counted(m.n_tasks, 'task')}, {counted(m.n_train_seen, 'row')}, {_timings(done.timings)}) -> {out}",
            highlight=False, markup=False, soft_wrap=True
        )
        everything = m.continuation.all_classes if m.continuation is not None else None
        if everything is not None:
            parts = ", ".join(f"{p.task} {100 * p.accuracy:.2f}" for p in everything.tasks)
            console.print(f"every class seen: A_last {100 * everything.A_last:.2f} over "
                          f"{counted(everything.n_test, 'test row')} ({parts})", highlight=False, markup=False, soft_wrap=True)


def _cell(value: float | None, scale: float = 1.0, fmt: str = ".2f") -> str:
    return "-" if value is None else f"{scale * value:{fmt}}"


@app.command()
@o.options("gammas", "select", "no_loo", "per_decade", "loo_sample", "tasks", "batch_size", "projection_dim", "seed",
           "order_seed", "order_seeds", "max_memory", "backend", "dtype", "projection_init", "activation", "fusion",
           "fusions", "no_fusion_norm", "class_order", "drop_last", "drop_remainder", "stream", "disjoint_ratio",
           "blurry_ratio", "no_mask_unseen", "scheduler", "dask_address", "workers", "heads", "shrinkage",
           "shrinkage_offdiag", "compensation", "gamma_comp", "head_option", select=(o.Select, o.SWEEP.select))
def sweep(ctx: typer.Context, features: Path, out: Path, **params: Any) -> None:
    """Evaluate many gammas at about the cost of one `learn`: writes OUT/sweep.json (and OUT/timings.json).

    Each gamma's test numbers equal what `learn --gamma G` gives with the same seed, tasks and projection;
    GCV and leave-one-out scores, computed on the training rows only (leave-one-out on --loo-sample rows a
    boundary, with its bound in sweep.json; 0: every row, exact), name the best gamma.
    With --fusions, the same for every fusion of a blocks store, and the best (fusion, gamma).
    """
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
    from foal_pipe.protocol.entry import SweepSettings
    from foal_pipe.protocol.entry import sweep as sweep_entry

    with user_errors():
        settings = SweepSettings(
            o.settings(ctx.params, SweepConfig),
            o.settings(ctx.params, StreamConfig),
            o.settings({k: v for k, v in ctx.params.items() if k != "select"}, ModelConfig),  # select: the sweep's
            o.settings(ctx.params, EvaluationConfig), o.settings(ctx.params, ExecutionConfig),
            _order_seeds(params["order_seed"], params["order_seeds"]))
        _check_applies(ctx, SWEEP_ONLY_WITH)
        done = sweep_entry(features, out, settings, log=_log)
        report = done.report
        assert report.n_tasks is not None and report.gammas is not None  # a sweep records them
        title = f"gamma sweep: {escape(one_line(str(report.dataset)))} ({counted(report.n_tasks, 'task')}, D={report.projection_dim})"
        for fusion, entry in [(e.fusion, e) for e in report.fusions] if report.fusions else [(None, report)]:
            print_table(_sweep_table(entry.results, entry.best_gamma_test, report.selected_by, params["no_loo"],
                                     title + (f", fusion {fusion}" if fusion else "")))
            if fusion:
                console.print(f"fusion {fusion}: best gamma {entry.best_gamma:g} by {report.selected_by} (test oracle "
                              f"{entry.best_gamma_test:g})", highlight=False, markup=False, soft_wrap=True)
        if report.best is not None:
            best, oracle = report.best, report.best_test
            assert oracle is not None  # --fusions: the test oracle's (fusion, gamma) beside the chosen one
            console.print(
                f"best: fusion {best.fusion}, gamma {best.gamma:g} by {report.selected_by} (GCV, LOO: training "
                f"rows only; the test oracle's fusion {oracle.fusion}, gamma {oracle.gamma:g} peeks at the test "
                "split)", highlight=False, markup=False, soft_wrap=True
            )
        else:
            console.print(
                f"best gamma {report.best_gamma:g} by {report.selected_by} (GCV, LOO: training rows only; "
                f"test {report.best_gamma_test:g} is an oracle that peeks at the test split)", highlight=False, markup=False, soft_wrap=True
            )
        if report.selections:
            from foal_pipe.protocol.criteria import CRITERIA

            seeds = report.order_seeds or []
            first = f"order seed {seeds[0]}'s " if len(seeds) > 1 else ""  # sweep.json's selections: the first order's
            console.print(f"refined search ({first}last boundary's gamma, test A_last of the chosen models): " + ", ".join(
                f"{CRITERIA[s.criterion].short} {s.gammas_selected[-1]:.3g} ({100 * s.A_last:.2f})"
                for s in report.selections), highlight=False, markup=False, soft_wrap=True)
        if report.heads:
            print_table(_heads_table(report))
            chosen = (f"best head {report.best_head} by {report.best_head_selected_by} (training rows only; ranked: the "
                      "heads with an exact leave-one-out)" if report.best_head else "no head has a training criterion")
            console.print(f"{chosen}; test oracle {report.best_head_test} (peeks at the test split)", highlight=False, markup=False, soft_wrap=True)
        runs = f"{len(report.fusions)} fusions x " if report.fusions else ""
        console.print(f"{runs}{counted(len(report.gammas), 'gamma')} in {_timings(done.timings)} -> "
                      f"{out / 'sweep.json'}",
                      highlight=False, markup=False, soft_wrap=True)


def _sweep_table(results: list, oracle: float | None, selected_by: str | None, no_loo: bool, title: str) -> Table:
    """One feature set's gammas (of a sweep, or of one of its ``fusions``), its choices marked."""
    from foal_pipe.protocol.records import choose

    table = Table(title=title)
    for name in ("gamma", "A_avg %", "A_last %", "F %", "GCV", "LOO acc %", "LOO MSE", ""):
        table.add_column(name, justify="right")
    choices = {"test": oracle}
    if any(r.gcv[-1] is not None for r in results):  # GCV null at every gamma (below its rounding): no choice to mark
        choices["gcv"] = choose(results, "gcv")
    if not no_loo:
        choices["loo"] = choose(results, "loo")
        choices["loo_accuracy"] = choose(results, "loo_accuracy")
    for r in results:
        marks = [name for name, g in choices.items() if g == r.gamma]
        label = ", ".join(f"[bold green]{m}[/]" if m == selected_by else m for m in marks)
        table.add_row(
            f"{r.gamma:g}", f"{100 * r.A_avg:.2f}", f"{100 * r.A_last:.2f}", f"{pct(r.F)}",
            _cell(r.gcv[-1], fmt=".4g"), _cell(r.loo_accuracy[-1] if r.loo_accuracy else None, 100),
            _cell(r.loo_mse[-1] if r.loo_mse else None, fmt=".4g"), label,
        )
    return table


def _option_cell(key: str, value: Any) -> str:
    """A head's option as run; with ``--order-seeds`` one per order (``gammas``: each order's gamma, chosen on its own
    rows): their common value, else each order's, "per order"."""
    def shown(v: Any) -> str:
        return format(v, "g") if isinstance(v, float) else str(v)

    if isinstance(value, list) and value and key.endswith("s"):
        values = [shown(v) for v in value]
        return f"{key[:-1]} {values[0]}" if len(set(values)) == 1 else f"{key[:-1]} per order ({' '.join(values)})"
    return f"{key} {shown(value)}"


def _heads_table(report) -> Table:
    """``sweep --heads``: every head's accuracy, options and leave-one-out accuracy."""
    table = Table(title=f"heads: {escape(str(report.dataset))} ({counted(report.n_tasks, 'task')})")
    for name in ("head", "A_avg %", "A_last %", "F %", "LOO acc %", "options"):
        table.add_column(name, justify="right")
    for name, entry in report.heads.items():
        options = ", ".join(_option_cell(k, v) for k, v in entry.options.items())
        table.add_row(name, f"{100 * entry.A_avg:.2f}", f"{100 * entry.A_last:.2f}", f"{pct(entry.F)}",
                      _cell(entry.loo_accuracy, 100), options)
    return table


#: ``predict``'s options that act on one kind of input only (named): typed with the other, they are refused.
PREDICT_ONLY_WITH = {**dict.fromkeys(("checkpoint", "top_k", "skip_bad", "batch_size", "device"),
                                     ("--images", lambda p: bool(p["images"] or p["more_images"]))),
                     "split": ("--features", lambda p: p["features"] is not None)}


@app.command()
def predict(
    ctx: typer.Context,
    model: Annotated[Path, typer.Option(help="model.safetensors written by `foal-pipe learn`.")],
    features: Annotated[
        Path | None, typer.Option(help="Predict a feature store's split (a .zarr written by `foal-pipe extract`). "
                                  "Default: none (pass this or --images).", show_default=False)
    ] = None,
    images: Annotated[
        list[str] | None, typer.Option(help="Predict unlabelled image files, folders (recursive) or glob patterns, "
                                       "encoded as the model's store was; takes several paths (--images a.png b.png, "
                                       "or a shell's --images dir/*.png) and repeats (--images a.png --images b.png). Default: none (pass this "
                                       "or --features).", show_default=False)
    ] = None,
    more_images: Annotated[
        list[str] | None, typer.Argument(help="More image paths for --images (the shell expands --images dir/*.png "
                                         "into --images dir/a.png dir/b.png ...); alone, the images to predict. "
                                         "Default: none.", show_default=False,
                                         metavar="IMAGES")
    ] = None,
    split: Annotated[Literal["train", "test"], typer.Option(help="With --features: which split to predict, train or test.")] = "test",
    checkpoint: Annotated[
        Path | None, typer.Option(help="With --images: the checkpoint of a model whose encoder came from --checkpoint "
                                  "(its sha256 must equal the recorded one). Default: none (the encoder as the model records it).", show_default=False)
    ] = None,
    top_k: Annotated[int, typer.Option(help="With --images: add the 2nd to K-th best class names and scores as "
                                       "top2_name, top2_score, ... (K > 1; the best is predicted_name, score).")] = 1,
    skip_bad: Annotated[
        bool, flag("--skip-bad", help="With --images: skip unreadable files (listed on stderr). Default: off.")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="With --images: images encoded at once.")] = 64,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="With --images: where the encoder runs: auto (CUDA when "
                                                                   "available), cpu or cuda.")] = "cpu",
    out: Annotated[
        Path | None, typer.Option(help="Write the CSV here (missing parent folders are made; atomically, checked before "
                                       "predicting). Default: stdout.")
    ] = None,
) -> None:
    """Predict with a saved model; writes CSV.

    --features: columns row, predicted_class (label id), predicted_name, score (the winning class's score),
    true_class (the label id the store holds), true_name; accuracy goes to stderr. --images: columns path,
    predicted_class, predicted_name, score (and top{i}_name, top{i}_score for i = 2..K with --top-k K). The score
    is the model's head's: act(x P) W[:, k] for ridge, minus the squared distance for ncm and fecam, the LDA
    discriminant for slda, the cosine for cosine (docs/cli.md lists each).
    """
    import io

    from foal_pipe.io import atomic_path, check_output_file
    from foal_pipe.io.csvrows import ENCODING, ERRORS
    from foal_pipe.io.outpaths import check_not_an_input
    from foal_pipe.model.predict import ImagePredictions, predict_image_files, predict_split

    images = [*(images or []), *(more_images or [])]
    with user_errors():
        if (features is None) == (not images):
            raise FoalPipeError("pass exactly one of --features STORE or --images PATH...")
        _check_applies(ctx, PREDICT_ONLY_WITH, can_add=False)
        if out is not None:
            check_output_file(out)
            inputs = [model, checkpoint]
            if images:
                from foal_pipe.extract.encoding import find_images

                inputs += find_images(images)
            check_not_an_input(out, inputs)
        result: Predictions | ImagePredictions
        if images:
            result = predict_image_files(model, images, checkpoint, top_k, skip_bad, batch_size, device)
        else:
            assert features is not None  # exactly one of --features and --images, checked above
            result = predict_split(model, features, split)
        if out is None:
            if isinstance(sys.stdout, io.TextIOWrapper):  # the file's bytes, whatever the locale
                sys.stdout.reconfigure(encoding=ENCODING, errors=ERRORS)
            result.write_csv(sys.stdout)
        else:
            with atomic_path(out) as tmp, open(tmp, "w", newline="", encoding=ENCODING, errors=ERRORS) as fh:
                result.write_csv(fh)
        if isinstance(result, ImagePredictions):  # --images
            for skipped in result.skipped:
                err_console.print(f"[yellow]skipped {escape(skipped)}[/]", highlight=False, soft_wrap=True)
            err_console.print(f"{counted(len(result.paths), 'image')} predicted, {len(result.skipped)} skipped", highlight=False,
                              markup=False)
        else:
            err_console.print(result.summary(split), highlight=False, markup=False, soft_wrap=True)
