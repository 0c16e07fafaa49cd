"""``foal-pipe evaluate`` (plots and summary.md for one run) and ``foal-pipe summary`` (a table of runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from foal_pipe.cli._app import app, console, err_console, flag, one_line, print_table, user_errors
from foal_pipe.cli.optiontext import group_text, read_by


@app.command()
def evaluate(
    run: Annotated[
        Path,
        typer.Option(
            "--run",
            help="Run directory written by `foal-pipe learn --out` (must hold metrics.json). Required.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for the plots, CSV plot data and summary.md (missing parent folders are made). "
                          "Default: RUN/eval."),
    ] = None,
    sweep: Annotated[
        Path | None,
        typer.Option(
            help="sweep.json (or its directory) from `foal-pipe sweep`, for the gamma plot. "
            "Default: RUN/sweep.json, else RUN-sweep/sweep.json (where the pipeline writes it), else no gamma plot.",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="model.safetensors for the per-class weight norms, and with the store metrics.json names, the "
            "per-class accuracy and the confusion matrix. Default: RUN/model.safetensors if it exists, else none "
            "of them.",
        ),
    ] = None,
    plots: Annotated[
        bool, flag("--plots/--no-plots", help="Draw the PNG plots (--no-plots: only CSV plot data and summary.md). "
                   "Default: --plots."),
    ] = True,
) -> None:
    """Plot a run (accuracy matrix, A_i per step, weight norms, gamma curve, confusion matrix) and write
    summary.md (with the accuracy of every class).

    When the dataset and settings match a column of the paper's Table 2, summary.md shows its numbers too.
    """
    with user_errors():
        from foal_pipe.report import evaluate as run_evaluation
        from foal_pipe.report import pct

        ev = run_evaluation(run, out=out, sweep=sweep, model=model, plots=plots)
        for warning in ev.warnings:
            err_console.print(f"[bold yellow]Warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
        for note in ev.notes:
            err_console.print(f"Note: {note}", highlight=False, soft_wrap=True, markup=False)
        m = ev.run.metrics
        line = f"{one_line(str(ev.run.dataset))}: A_avg {pct(m.A_avg)}  A_last {pct(m.A_last)}  F {pct(m.F)} (%)"
        if ev.paper is not None and ev.paper.comparable:
            r = ev.paper.row
            line += f"; paper ({r.title}): A_avg {r.A_avg}  A_last {r.A_last}  F {r.F}"
        elif ev.paper is not None:
            line += f"; not comparable with the paper's {ev.paper.row.title}: " + "; ".join(ev.paper.differences)
        console.print(line, highlight=False, soft_wrap=True, markup=False)
        console.print(f"Wrote {len(ev.files)} files to {ev.out}: " + ", ".join(f.name for f in ev.files),
                      highlight=False, soft_wrap=True, markup=False)


@app.command()
def summary(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run directories, metrics.json or sweep.json files; directories are searched recursively. "
            "Default: runs.",
            show_default=False,
            metavar="PATHS",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="Group the learn runs into table cells by these keys (comma-separated: head, tasks, dataset, "
                     "encoder, stream, D, gamma, fusion, activation, init, seed, select, options, ratios, mask, dtype, "
                     "store, init_model, dim, classes, rows, drop, batch, encoder_settings, grid, per_decade, loo_sample), each cell the mean +- std (ddof 0) of its runs' A_avg, A_last and F; e.g. head,tasks over "
                     "runs of several class orders; a cell whose runs differ in a setting not grouped by is named in "
                     "a warning. Default: one row per run.",
                     show_default=False, callback=read_by(group_text)),
    ] = None,
) -> None:
    """Print a table of runs (A_avg, A_last, F, A_auc; the paper's numbers when comparable) and of sweeps, a
    `sweep --heads`' heads each on a row of its own; with --group, the runs grouped into cells."""
    with user_errors():
        if group is not None:
            print_table(grouped_table(paths or [Path("runs")], group))
        else:
            print_table(summary_table(paths or [Path("runs")]))


def grouped_table(paths: list[Path], group: str) -> Table:
    """``summary --group``: a row per cell of :func:`~foal_pipe.report.grouping.group_cells`."""
    from foal_pipe.errors import FoalPipeError, param
    from foal_pipe.protocol.schema import METRICS_FILE
    from foal_pipe.report import consistency_warnings, find_runs, pct
    from foal_pipe.report.grouping import METRICS, exact_text, group_cells, mixed_warning, parse_group, repeated_warning
    from foal_pipe.report.readers import as_recomputed

    keys = parse_group(group)

    def unreadable(path: Path, message: str) -> None:
        """A metrics.json left out would drop a run from its cell's mean unseen: refused; a sweep (not grouped) skipped."""
        if path.name == METRICS_FILE:
            raise FoalPipeError(f"{message} (or move its folder out of {', '.join(map(str, paths))}: {param('group')} "
                                "leaves no run out of a cell's mean)")
        skipped(path, message)

    found = find_runs(paths, on_error=unreadable)
    for entry in found:  # as the plain table: the cells use the matrix's numbers
        for problem in consistency_warnings(entry.metrics) if entry.metrics is not None else ():
            err_console.print("[bold yellow]Warning:[/] " + escape(f"{entry.path}: {problem}"), highlight=False,
                              soft_wrap=True)
    runs = [as_recomputed(e.metrics) for e in found if e.metrics is not None]
    if not runs:
        raise FoalPipeError(f"no learn run (metrics.json) under {', '.join(map(str, paths))}, only sweeps: {param('group')} "
                            "groups learn runs; leave it out to list the sweeps")
    cells = group_cells(runs, keys)
    for warning in filter(None, (w for c in cells for w in (repeated_warning(c), mixed_warning(c, keys)))):
        err_console.print(f"[bold yellow]Warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    table = Table(title=f"F-OAL runs by {', '.join(keys)} (mean +- std over the runs of a cell, ddof 0; in %)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for k in (*keys, "runs", *METRICS):
        table.add_column(k, justify="left" if k in keys else "right", no_wrap=True)
    for c in cells:
        table.add_row(*("-" if v is None else escape(one_line(exact_text(v) if isinstance(v, float) else str(v)))  # one row
                        for v in c["key"].values()), str(c["n"]),  # "-": not recorded
                      *(pct(c[m]["mean"]) + (f" +- {100 * c[m]['std']:.2f}" if c["n"] > 1 else "")
                        for m in METRICS))
    table.caption, table.caption_justify = "\n".join(tables_note(paths)) or None, "left"
    return table


def skipped(path: Path, message: str) -> None:
    """``summary``'s warning for a file it cannot read, listed without it (one row per run: the warning names the row
    missing, unlike a ``--group`` cell's mean)."""
    err_console.print(f"[bold yellow]Warning:[/] skipped: {escape(message)}", highlight=False, soft_wrap=True)


def tables_note(paths: list[Path]) -> list[str]:
    """A line per results table of ``foal-pipe table`` under ``paths``: it holds its runs itself, so the summary's
    rows leave them out, and says so rather than passing over them."""
    from foal_pipe.report.discovery import find_tables

    return [escape(f"{t.parent}: a results table, not rows here; open {t.parent / 'table.md'}") for t in find_tables(paths)]


def summary_table(paths: list[Path]) -> Table:
    """A rich table with one row per learn run and per sweep found under ``paths``.

    The paper column appears when a run's dataset is in the paper's Table 2; runs that are not
    comparable say how many settings differ (``foal-pipe evaluate`` writes which ones to summary.md).
    """
    from foal_pipe.heads import HEADS
    from foal_pipe.report import consistency_warnings, find_runs, gamma_text, pct, result_at, select
    from foal_pipe.report.grouping import fusion_of, sweep_fusion
    from foal_pipe.report.paper import match_paper
    from foal_pipe.report.readers import as_recomputed

    found = find_runs(paths, on_error=skipped)
    matches = {e.path: match_paper(e.metrics) for e in found if e.metrics is not None}
    with_paper = any(m is not None for m in matches.values())
    table = Table(title="F-OAL runs (accuracy and forgetting in %)", title_justify="left", box=box.SIMPLE_HEAD,
                  caption_justify="left")
    table.add_column("run (dataset · encoder)", overflow="fold", min_width=16)
    for name in ("tasks", "stream", "D", "gamma", "A_avg", "A_last", "F", "A_auc"):
        table.add_column(name, justify="right", no_wrap=True)
    if with_paper:
        table.add_column("paper A_avg / A_last / F")
    table.add_column("s", justify="right", no_wrap=True)

    def number(value, fmt: str) -> str:
        return "?" if value is None else format(value, fmt)

    def label(path: Path, run, fusion: str | None) -> str:
        dataset = "?" if run.dataset is None else one_line(str(run.dataset))
        head = f" · head {run.head}" if getattr(run, "head", None) else ""
        head += f" · {len(run.orders)} class orders" if len(getattr(run, "orders", None) or ()) > 1 else ""
        encoder = one_line(str((run.encoder or {}).get("name", "?"))) + ("" if fusion is None else f" · {fusion}")
        return escape(one_line(str(path))) + "\n[dim]" + escape(f"{dataset} · {encoder}{head}") + "[/]"

    def head_width(name: str, head, s) -> str:
        """D of a sweep's head: 0 on the store's features (as `learn --head ncm` records), else the projection's."""
        rows = head.rows or (HEADS[name].space if name in HEADS else None)  # older files: the registry's space
        return "0" if rows == "features" else number(s.projection_dim, "d")

    def head_gamma(options: dict, seeds: list[int] | None) -> str:
        """A sweep head's gamma; with ``--order-seeds`` the options of ridge and of the heads at its gamma hold one per
        order (``gammas``): that one where they agree. Files before balanced's and dual's held their first order's."""
        gammas = options.get("gammas") or ([] if options.get("gamma") is None else [options["gamma"]])
        first = f" (order {seeds[0]}'s)" if seeds and len(seeds) > 1 and "gammas" not in options and gammas else ""
        return "-" if not gammas else format(gammas[0], "g") + first if len(set(gammas)) == 1 else "per order"

    def spread(m, key: str, orders: list | None) -> str:
        """A learn or sweep --order-seeds record's mean over its ``orders``, with their std (ddof 0)."""
        std = (m.std or {}).get(key)
        return pct(getattr(m, key)) + ("" if std is None or len(orders or ()) < 2 else f" ± {pct(std)}")

    def gamma_cell(m) -> str:
        """ridge's gamma; a head's own gamma (balanced, dual), or - for a head without one."""
        if m.head is None:
            return gamma_text(m)
        return format((m.head_options or {})["gamma"], "g") if "gamma" in (m.head_options or {}) else "-"

    sweeps = []
    for entry in found:
        if entry.metrics is not None:
            m, match = as_recomputed(entry.metrics), matches[entry.path]
            tasks: int | str = len(m.accuracy_matrix) if m.n_tasks is None else m.n_tasks
            row = [label(entry.path, m, fusion_of(m.encoder)), str(tasks), m.stream or "disjoint",
                   number(m.projection_dim, "d"), gamma_cell(m), spread(m, "A_avg", m.orders),
                   spread(m, "A_last", m.orders), spread(m, "F", m.orders),
                   "-" if m.A_auc is None else spread(m, "A_auc", m.orders)]
            if with_paper:
                row.append(
                    "-" if match is None
                    else f"{match.row.A_avg} / {match.row.A_last} / {match.row.F}" if match.comparable
                    else f"not comparable: {len(match.differences)} settings differ"
                )
            table.add_row(*row, number(entry.seconds, ".1f"))
            for problem in consistency_warnings(entry.metrics):  # as evaluate does: the row shows the matrix's numbers
                err_console.print("[bold yellow]Warning:[/] " + escape(f"{entry.path}: {problem}"), highlight=False,
                                  soft_wrap=True)
        if entry.sweep is not None:
            s = entry.sweep
            choice = select(s)
            rows = "" if choice.sampled_rows is None else f" of {choice.sampled_rows:,} rows"
            sweeps.append(f"{len(s.results)} by {choice.short}{rows}")
            best = result_at(s, choice.gamma)
            tasks = s.n_tasks if s.n_tasks is not None else "?" if s.tasks is None else len(s.tasks)
            stream = s.stream or "disjoint"
            fusion = sweep_fusion(s)
            chosen = fusion if fusion is None or not s.fusions else f"{fusion} (chosen of {len(s.fusions)} fusions)"
            row = [label(entry.path, s, chosen), str(tasks), stream, number(s.projection_dim, "d"), f"{best.gamma:g}*",
                   *(spread(best, key, s.orders) for key in ("A_avg", "A_last", "F")), "-"]
            table.add_row(*row, *([""] if with_paper else []), number(entry.seconds, ".1f"))
            for problem in entry.sweep_warnings:  # the row shows the numbers its matrices give
                err_console.print("[bold yellow]Warning:[/] " + escape(problem), highlight=False, soft_wrap=True)
            for name, head in (s.heads or {}).items():  # sweep --heads: every head, ridge at the sweep's choice
                on = "" if fusion is None else f" · {fusion}"  # --fusions: the chosen fusion's heads
                table.add_row(escape(str(entry.path)) + f"\n[dim]· head {escape(name + on)}[/]", str(tasks), stream,
                              head_width(name, head, s), head_gamma(head.options, s.order_seeds),
                              *(spread(head, key, s.orders) for key in ("A_avg", "A_last", "F")), "-",
                              *([""] if with_paper else []), "")
    notes = [f"*: a sweep's selected gamma (of {', '.join(dict.fromkeys(sweeps))}) and its test numbers"] if sweeps else []
    if any(e.metrics is not None and e.sweep is not None and e.seconds is None for e in found):
        notes.append("s ?: a folder holding a run and a sweep keeps one timings.json, the last command's")
    if any(e.timings_of_another for e in found):
        notes.append("s ?: timings.json is of another record than the one beside it (a dvc checkout or a copy restored "
                     "the record, not its times)")
    notes += tables_note(paths)
    if notes:
        table.caption = "\n".join(notes)
    return table
