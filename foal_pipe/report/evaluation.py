"""One evaluation: read a run, write its plots, plot data, scores and summary into one directory, atomically."""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from foal_pipe.io import atomic_dir, check_output_dir, replacement_held_off, settle_enclosing, write_json
from foal_pipe.io.csvrows import ENCODING, ERRORS
from foal_pipe.io.outpaths import follow_link
from foal_pipe.io.pathtext import path_text
from foal_pipe.protocol.outputs import EVAL_DIR, EVAL_FILES, SCORES_FILE, SUMMARY_FILE
from foal_pipe.protocol.schema import METRICS_FILE
from foal_pipe.report.classes import class_results
from foal_pipe.report.discovery import load_run
from foal_pipe.report.markdown import summary_markdown
from foal_pipe.report.paper import PaperMatch, match_paper
from foal_pipe.report.plots import (
    plot_accuracy_matrix,
    plot_anytime,
    plot_confusion,
    plot_fusions,
    plot_gamma,
    plot_heads,
    plot_steps,
    plot_weight_norms,
)
from foal_pipe.report.readers import Run, as_recomputed, consistency_warnings
from foal_pipe.report.tables import anytime_rows, plot_data, scores, write_confusion, write_csv

#: Every file an evaluation may write (:data:`~foal_pipe.protocol.outputs.EVAL_FILES`); those a later evaluation does
#: not write (no sweep, no model, no plots) are not carried into its directory (:func:`atomic_dir`'s ``owned``), so a
#: stale plot never sits beside a new summary, even for a moment or after a kill.
OUTPUTS = EVAL_FILES
DEFAULT_OUT = EVAL_DIR


@dataclass
class Evaluation:
    """What :func:`evaluate` produced: the files written, the paper match, warnings and notes."""

    run: Run
    out: Path
    files: list[Path] = field(default_factory=list)
    paper: PaperMatch | None = None
    #: The run's stored numbers disagree with its accuracy matrix.
    warnings: list[str] = field(default_factory=list)
    #: Things worth knowing that are not wrong, such as no sweep found.
    notes: list[str] = field(default_factory=list)


def _plots(run: Run, out: Path) -> list[Path]:
    files = [plot_accuracy_matrix(run, out / "accuracy_matrix.png"), plot_steps(run, out / "steps.png")]
    if run.weight_norms is not None:
        files.append(plot_weight_norms(run, out / "weight_norms.png"))
    if anytime_rows(run):  # a curve with points (a hand-edited one may have none: no plot, as no anytime.csv)
        files.append(plot_anytime(run, out / "anytime.png"))
    if run.sweep is not None:
        sweep_paper = match_paper(run.sweep, ignore=("gamma",)) if run.sweep.dataset else None
        files.append(plot_gamma(run, out / "gamma.png", sweep_paper))
        if run.sweep.fusions is not None:
            files.append(plot_fusions(run, out / "fusions.png"))
        if run.sweep.heads:
            files.append(plot_heads(run, out / "heads.png"))
    return files


def _writes_inside(out: Path, run: Path) -> bool:
    """Whether ``out``'s swap, which locks its parent, is in ``run``: then the lock on ``run``'s parent stays held over it
    (parent before child); one elsewhere is left to it, so no two evaluations wait on each other's locks."""
    return Path(os.path.realpath(follow_link(out))).parent.is_relative_to(os.path.realpath(run))


def evaluate(
    run_dir: str | Path,
    out: str | Path | None = None,
    sweep: str | Path | None = None,
    model: str | Path | None = None,
    plots: bool = True,
) -> Evaluation:
    """Read a run and write its plots, plot data, ``scores.json`` and ``summary.md`` into ``out`` (default
    ``RUN/eval``).

    The directory is replaced in one step (:func:`foal_pipe.io.atomic_dir`): a failure leaves the previous
    evaluation as it was. The same inputs give byte-identical files, PNGs included.
    """
    settle_enclosing(Path(run_dir) / DEFAULT_OUT)  # a killed learn's pending swap of RUN, before RUN is read
    with ExitStack() as held:  # from reading RUN to renaming RUN/eval in, a learn or sweep replacing RUN waits
        held.enter_context(replacement_held_off(run_dir))
        run = load_run(run_dir, sweep=sweep, model=model)
        out = Path(out) if out is not None else run.path / DEFAULT_OUT
        inputs = [run.path / METRICS_FILE, run.sweep_path, run.model_path]
        check_output_dir(out, inputs=inputs, inside=DEFAULT_OUT)
        warnings = consistency_warnings(run.metrics) + (run.sweep_warnings if run.sweep is not None else [])
        ev = Evaluation(run=run, out=out, paper=match_paper(run.metrics), warnings=warnings)
        run.metrics = as_recomputed(run.metrics)  # the warnings name what metrics.json records; the files show the matrix's
        if run.sweep_mismatch is not None:
            ev.notes.append(f"No gamma plot: {run.sweep_mismatch}; pass `--sweep` of a sweep with the run's settings.")
        elif run.sweep_searched:
            looked = " or ".join(path_text(p) for p in run.sweep_searched)
            ev.notes.append(f"No gamma sweep found (looked for {looked}), so no gamma plot: run "
                            f"`foal-pipe sweep --out {path_text(run.sweep_searched[-1].parent)}` or pass `--sweep`.")
        classes = class_results(run)
        if isinstance(classes, str):
            ev.notes.append(classes)
            classes = None
        if not _writes_inside(out, run.path):  # all read: a replacement of RUN now changes nothing of this one
            held.close()
        with atomic_dir(out, owned=OUTPUTS) as tmp:
            written = [write_csv(tmp / name, rows) for name, rows in plot_data(run).items() if rows]
            written.append(write_json(tmp / SCORES_FILE, scores(run)))
            if classes is not None:
                written += [write_csv(tmp / "class_accuracy.csv", classes.rows()),
                            write_confusion(tmp / "confusion_matrix.csv", classes)]
            if plots:
                written += _plots(run, tmp)
                if classes is not None:
                    written.append(plot_confusion(run, classes, tmp / "confusion_matrix.png"))
            text = summary_markdown(run, paper=ev.paper, warnings=ev.warnings, notes=ev.notes,
                                    plots=[f.name for f in written if f.suffix == ".png"], classes=classes)
            (tmp / SUMMARY_FILE).write_text(text, encoding=ENCODING, errors=ERRORS)  # class names in any script
            written.append(tmp / SUMMARY_FILE)
    ev.files = [out / f.name for f in written]
    return ev
