"""Finding a run's files: its sweep and model for ``evaluate``, and every run under a path for ``summary``.

A run's sweep is ``RUN/sweep.json`` or, where the pipeline writes it (``foal-pipe sweep --out RUN-sweep``),
``RUN-sweep/sweep.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io import is_feature_store
from foal_pipe.model.modelfile import MODEL_FILE
from foal_pipe.protocol.schema import METRICS_FILE, SWEEP_FILE, LearnMetrics, SweepReport, is_number
from foal_pipe.report.readers import Run, read_json, read_metrics, read_sweep, read_weight_norms

#: Wall times of a run, beside its metrics.json (not a DVC output: they change every run).
TIMINGS_FILE = "timings.json"


def sweep_candidates(run_dir: Path) -> tuple[Path, ...]:
    """Where a run's sweep may be, in the order they are tried: ``RUN/sweep.json``, ``RUN-sweep/sweep.json``."""
    name = run_dir.name or run_dir.resolve().name
    return run_dir / SWEEP_FILE, run_dir.parent / f"{name}-sweep" / SWEEP_FILE


def load_run(
    run_dir: str | Path,
    sweep: str | Path | None = None,
    model: str | Path | None = None,
) -> Run:
    """Read a run directory: ``metrics.json`` is required; the sweep and model are read when present.

    ``sweep`` and ``model`` name other files (or, for the sweep, a directory) explicitly; then they must
    exist. By default the first of :func:`sweep_candidates` that exists and ``DIR/model.safetensors`` are
    used; when no sweep is found, :attr:`Run.sweep_searched` lists where it was looked for.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FoalPipeError(f"run directory {run_dir} does not exist; run `foal-pipe learn --out {run_dir}` first")
    if not run_dir.is_dir():
        raise FoalPipeError(f"{run_dir} is not a directory; {param('run_dir')} takes the directory `foal-pipe learn --out` "
                            "wrote")
    if is_feature_store(run_dir):  # the advice below would be to write a run into the store
        raise FoalPipeError(f"{run_dir} is a feature store, not a run directory; pass the directory that "
                            f"`foal-pipe learn --features {run_dir} --out DIR` wrote")
    if not (run_dir / METRICS_FILE).exists():
        raise FoalPipeError(
            f"{run_dir} has no {METRICS_FILE}; run `foal-pipe learn --out {run_dir}` first (or check the path)"
        )
    run = Run(path=run_dir, metrics=read_metrics(run_dir / METRICS_FILE))
    if sweep is not None:
        sweep_path = Path(sweep)
        run.sweep_path = sweep_path / SWEEP_FILE if sweep_path.is_dir() else sweep_path
    else:
        candidates = sweep_candidates(run_dir)
        run.sweep_path = next((c for c in candidates if c.is_file()), None)
        run.sweep_searched = () if run.sweep_path else candidates
    if run.sweep_path is not None:
        run.sweep = read_sweep(run.sweep_path)
        found = _other_data(run.sweep.dataset, run.sweep.encoder, run.metrics) if sweep is not None else []
        if found:
            what, theirs, ours = found[0]
            raise FoalPipeError(f"{param('sweep')} {run.sweep_path} swept other features than run {run_dir}: its "
                                f"{what} is {theirs!r:.80} but the run's metrics.json has {ours!r:.80}; pass a sweep "
                                "of the run's store")
    model_path = Path(model) if model is not None else run_dir / MODEL_FILE
    if model is not None:
        check_run_model(run, model_path)
    if model_path.exists():
        check_model_checksum(run, model_path, given=model is not None)
    if model is not None or model_path.exists():
        run.weight_norms = read_weight_norms(model_path)
        run.model_path = model_path
    return run


def check_model_checksum(run: Run, path: Path, given: bool) -> None:
    """Refuse a model file other than the one the run wrote, where its ``metrics.json`` records that file's checksum
    (``model_checksum``): the weight norms, per-class accuracy and confusion matrix would be another model's."""
    from foal_pipe.model.modelfile import stored_checksum

    recorded = run.metrics.model_checksum if run.metrics is not None else None
    found = stored_checksum(path)
    if recorded is None and run.metrics is not None:
        check_recorded_settings(run, path)  # an older run records no checksum: its settings must fit the file
    if recorded is None or found is None or found == recorded:
        return  # an unreadable file is refused by its reader, with the reason
    fix = ("pass the run's own model (or leave out --model)" if given
           else f"the file was replaced after the run: run `foal-pipe learn --out {run.path}` again")
    raise FoalPipeError(f"{path} is not the model run {run.path} wrote: its checksum {found[:23]}... differs from "
                        f"the {recorded[:23]}... its metrics.json records; {fix}")


def check_recorded_settings(run: Run, path: Path) -> None:
    """For a run whose metrics.json predates ``model_checksum``: refuse a model file whose projection -- drawn
    again from the run's seed, init and shape, bit for bit -- is not the run's (another seed's model would
    otherwise be reported as the run's). A continued model (``init_model``) started from another
    file's projection and rows, so only a fresh run is compared."""
    from foal_pipe.core.expansion import Expansion
    from foal_pipe.model.modelfile import read_model, stored_header

    m = run.metrics
    meta, shapes = stored_header(path)
    if m.continuation is not None or not meta:
        return
    D, d = m.projection_dim, m.feature_dim
    if not (D and d and m.seed is not None and shapes.get("projection") == (d, D)):
        return
    stored = read_model(path, names=("projection",))[0]["projection"]
    drawn = Expansion.draw(d, D, m.projection_init or "uniform", "identity", m.seed, "float64").components_
    if not np.array_equal(stored, drawn.astype(m.dtype or "float64").astype(stored.dtype)):  # as the run kept it
        raise FoalPipeError(f"{path} is not the model run {run.path} wrote: its projection is not the one the run's "
                            f"seed {m.seed} draws (the run predates model_checksum, so its settings were compared); "
                            f"pass the run's own model, or run `foal-pipe learn --out {run.path}` again")


def check_run_model(run: Run, path: Path) -> None:
    """Refuse a ``--model`` that this run cannot have written: trained on another dataset or encoder, or (ridge)
    at another projection dimension; its weight norms, per-class accuracy and confusion matrix would be reported
    as the run's."""
    from foal_pipe.model.modelfile import stored_header

    meta, shapes = stored_header(path)  # from the header alone: read_weight_norms then validates the whole file
    m = run.metrics
    found = _other_data(meta.get("dataset"), meta.get("encoder"), m)
    if not found and not isinstance(meta.get("head"), str) and m.projection_dim:
        rows = shapes["projection"][1] if "projection" in shapes else None
        if rows is not None and rows != m.projection_dim:
            found.append(("projection dimension D", rows, m.projection_dim))
    if found:
        what, theirs, ours = found[0]
        raise FoalPipeError(f"{param('model')} {path} is not the model of run {run.path}: its {what} is {theirs!r:.80} "
                            f"but the run's metrics.json has {ours!r:.80}; pass the run's own model (or leave out "
                            f"{param('model')})")


def _other_data(dataset: Any, encoder: Any, metrics: LearnMetrics) -> list[tuple[str, Any, Any]]:
    """``(what, theirs, the run's)`` where a file's dataset or encoder differ from the run's (both recorded)."""
    pairs = (("dataset", dataset, metrics.dataset), ("encoder", encoder, metrics.encoder))
    return [(what, theirs, ours) for what, theirs, ours in pairs if None not in (theirs, ours) and theirs != ours]


@dataclass
class RunSummary:
    """One row of ``foal-pipe summary``: a learn run (``metrics``) or a sweep (``sweep``)."""

    path: Path
    metrics: LearnMetrics | None = None
    sweep: SweepReport | None = None

    @property
    def seconds(self) -> float | None:
        """The run's wall time: ``total`` in ``timings.json``, or ``seconds`` in a metrics.json or sweep.json
        from before wall times moved out of them; ``None`` when neither is there."""
        for record in (self.metrics, self.sweep):
            if record is not None and record.seconds is not None:
                return float(record.seconds)
        try:
            total = read_json(self.path / TIMINGS_FILE, "wall times", "").get("total")
        except FoalPipeError:  # missing or unreadable: the time is simply not shown
            return None
        return float(total) if is_number(total) else None


def find_runs(
    paths: Iterable[str | Path], on_error: Callable[[str], None] | None = None
) -> list[RunSummary]:
    """Runs and sweeps under each path: a ``metrics.json``/``sweep.json`` file, or a directory searched
    recursively. Sorted by path. A file that cannot be read raises :class:`FoalPipeError`, or, with
    ``on_error``, is reported to it and skipped."""
    found: dict[Path, RunSummary] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise FoalPipeError(f"{p} does not exist; give run directories or metrics.json/sweep.json files")
        files = [p] if p.is_file() else sorted([*p.rglob(METRICS_FILE), *p.rglob(SWEEP_FILE)])
        for f in files:
            if f.name not in (METRICS_FILE, SWEEP_FILE):
                raise FoalPipeError(f"{f} is neither a {METRICS_FILE} nor a {SWEEP_FILE}")
            try:
                data = read_metrics(f) if f.name == METRICS_FILE else read_sweep(f)
            except FoalPipeError as exc:
                if on_error is None:
                    raise
                on_error(str(exc))
                continue
            entry = found.setdefault(f.parent, RunSummary(f.parent))
            if f.name == METRICS_FILE:
                entry.metrics = data
            else:
                entry.sweep = data
    if not found:
        names = ", ".join(map(str, paths))
        raise FoalPipeError(
            f"no {METRICS_FILE} or {SWEEP_FILE} under {names}; run `dvc repro` or `foal-pipe learn` first"
        )
    return [found[k] for k in sorted(found)]
