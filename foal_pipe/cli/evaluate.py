"""``foal-pipe evaluate`` (plots and summary.md for one run) and ``foal-pipe summary`` (a table of runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from foal_pipe.cli._app import app, console, err_console, user_errors


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
        typer.Option(help="Directory for the plots, CSV plot data and summary.md. Default: RUN/eval."),
    ] = None,
    sweep: Annotated[
        Path | None,
        typer.Option(
            help="sweep.json (or its directory) from `foal-pipe sweep`, for the gamma plot. "
            "Default: RUN/sweep.json if it exists, else no gamma plot.",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="model.safetensors for the per-class weight-norm plot. "
            "Default: RUN/model.safetensors if it exists, else no weight-norm plot.",
        ),
    ] = None,
    plots: Annotated[
        bool,
        typer.Option(help="Draw the PNG plots (off: only CSV plot data and summary.md). Default: on."),
    ] = True,
) -> None:
    """Plot a run (accuracy matrix, A_i per step, weight norms, gamma curve) and write summary.md.

    When the dataset and settings match a column of the paper's Table 2, summary.md shows the paper's
    numbers beside ours.
    """
    with user_errors():
        from foal_pipe.evaluate import evaluate as run_evaluation

        ev = run_evaluation(run, out=out, sweep=sweep, model=model, plots=plots)
        for warning in ev.warnings:
            err_console.print(f"[bold yellow]Warning:[/] {warning}", highlight=False, soft_wrap=True)
        console.print(summary_table([ev.run.path], paper_note=True))
        console.print(f"Wrote {len(ev.files)} files to {ev.out}: " + ", ".join(f.name for f in ev.files),
                      highlight=False, soft_wrap=True)


@app.command()
def summary(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run directories, metrics.json or sweep.json files; directories are searched recursively. "
            "Default: runs.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print a table of runs (A_avg, A_last, F; the paper's numbers when comparable) and of sweeps."""
    with user_errors():
        console.print(summary_table(paths or [Path("runs")], paper_note=False))


def summary_table(paths: list[Path], paper_note: bool) -> Table:
    """A rich table with one row per learn run and per sweep found under ``paths``."""
    from foal_pipe.evaluate import describe, find_runs, pct
    from foal_pipe.paper import match_paper

    found = find_runs(paths)
    table = Table(title="F-OAL runs (accuracy and forgetting in %)", title_justify="left")
    for name, justify in [("run", "left"), ("dataset", "left"), ("encoder", "left"), ("tasks", "right"),
                          ("D", "right"), ("gamma", "right"), ("A_avg", "right"), ("A_last", "right"),
                          ("F", "right"), ("paper A_avg/A_last/F", "left"), ("s", "right")]:
        table.add_column(name, justify=justify, no_wrap=name != "paper A_avg/A_last/F")
    notes = []
    for entry in found:
        if entry.metrics is not None:
            m = entry.metrics
            match = match_paper(m)
            if match is None:
                paper = "-"
            elif match.comparable:
                paper = f"{match.row.A_avg} / {match.row.A_last} / {match.row.F}"
            else:
                paper = f"not comparable ({len(match.differences)} settings differ)"
                notes.append(f"{entry.path}: differs from the paper's {match.row.title} in "
                             + "; ".join(match.differences))
            seconds = m.get("seconds")
            table.add_row(
                str(entry.path), str(m.get("dataset", "?")), str((m.get("encoder") or {}).get("name", "?")),
                str(m.get("n_tasks", len(m["accuracy_matrix"]))), str(m.get("projection_dim", "?")),
                f"{m.get('gamma', '?'):g}" if isinstance(m.get("gamma"), (int, float)) else "?",
                pct(m["A_avg"]), pct(m["A_last"]), pct(m["F"]), paper,
                f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-",
            )
        if entry.sweep is not None:
            s = entry.sweep
            best = max(s["results"], key=lambda r: r["A_avg"])
            gammas = ", ".join(f"{r['gamma']:g}" for r in s["results"])
            seconds = s.get("seconds")
            table.add_row(
                f"{entry.path} (sweep)", str(s.get("dataset", "?")), str((s.get("encoder") or {}).get("name", "?")),
                str(len(s["tasks"])) if isinstance(s.get("tasks"), list) else "?", str(s.get("projection_dim", "?")),
                f"best {best['gamma']:g} of {gammas}", pct(best["A_avg"]), pct(best["A_last"]), pct(best["F"]), "",
                f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-",
            )
    if notes and paper_note:
        table.caption = "\n".join(notes)
    elif not notes and paper_note and len(found) == 1 and found[0].metrics is not None:
        table.caption = describe(found[0].metrics)
    return table
