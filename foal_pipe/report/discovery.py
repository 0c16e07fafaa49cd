"""Finding a run's files: its sweep and model for ``evaluate``, and every run under a path for ``summary``.

A run's sweep is ``RUN/sweep.json`` or, where the pipeline writes it (``foal-pipe sweep --out RUN-sweep``),
``RUN-sweep/sweep.json``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io import TIMINGS_FILE, TIMINGS_OF
from foal_pipe.io.outpaths import is_feature_store
from foal_pipe.io.pathtext import os_path
from foal_pipe.io.temporaries import TEMPORARY
from foal_pipe.model.modelfile import MODEL_FILE, shown
from foal_pipe.protocol.schema import (
    CHECKSUM_VERSION,
    METRICS_FILE,
    SWEEP_FILE,
    LearnMetrics,
    SweepReport,
    is_number,
    same_gamma,
)
from foal_pipe.report.readers import Run, read_json, read_metrics, read_metrics_version, read_sweep, read_weight_norms

#: What a sweep shares with a run for its gamma curve to be the run's, besides the features (each where both files
#: record it): the store's rows and width (two stores of one dataset and encoder differ there), the seed (of the
#: projection, and of the class order unless one is given), the projection and activation, the stream and the
#: scoring, then the class orders (``--order-seeds``: a run's numbers are means over them) and the tasks themselves.
SWEPT_SETTINGS = ("n_train_seen", "n_test", "feature_dim", "seed", "projection_dim", "projection_init", "activation",
                  "stream", "disjoint_ratio", "blurry_ratio", "mask_unseen", "drop_last", "drop_remainder", "dtype",
                  "order_seeds", "tasks")


def sweep_candidates(run_dir: Path) -> tuple[Path, ...]:
    """Where a run's sweep may be, in the order they are tried: ``RUN/sweep.json``, ``RUN-sweep/sweep.json``. A run
    given as ``.`` or ``..`` (``a/..``) is named by the folder it resolves to, beside which its sweep is: ``../r-sweep``
    for ``.`` in ``w/r`` (``Path('.').parent`` is ``.`` itself, inside the run)."""
    if run_dir.name in ("", ".."):
        return run_dir / SWEEP_FILE, run_dir / ".." / f"{run_dir.resolve().name}-sweep" / SWEEP_FILE
    return run_dir / SWEEP_FILE, run_dir.parent / f"{run_dir.name}-sweep" / SWEEP_FILE


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
    if not (run_dir / METRICS_FILE).exists() and (run_dir / SWEEP_FILE).exists():
        raise FoalPipeError(f"{run_dir} holds a sweep ({SWEEP_FILE}), not a learn run; pass the run's directory as "
                            f"{param('run_dir')} and this one as {param('sweep')}")
    if not (run_dir / METRICS_FILE).exists():
        raise FoalPipeError(
            f"{run_dir} has no {METRICS_FILE}; run `foal-pipe learn --out {run_dir}` first (or check the path)"
        )
    metrics, version = read_metrics_version(run_dir / METRICS_FILE)
    run = Run(path=run_dir, metrics=metrics, metrics_version=version)
    if metrics.head not in (None, "ridge"):  # a gamma sweep is ridge's curve; its heads ran at the sweep's settings
        if sweep is not None:
            raise FoalPipeError(f"run {run_dir} is head {metrics.head}'s, and a sweep is ridge's gamma curve (its heads "
                                f"table, run at the sweep's own settings, is not this run's); drop {param('sweep')}")
    elif sweep is not None:
        sweep_path = Path(sweep)
        run.sweep_path = sweep_path / SWEEP_FILE if sweep_path.is_dir() else sweep_path
    else:
        candidates = sweep_candidates(run_dir)
        run.sweep_path = next((c for c in candidates if c.is_file()), None)
        run.sweep_searched = () if run.sweep_path else candidates
    if run.sweep_path is not None:
        run.sweep = read_sweep(run.sweep_path, run.sweep_warnings.append)
        found = _other_data(run.sweep.dataset, run.sweep.encoder, run.metrics, _fusions(run.sweep), run.sweep.fusion_norm)
        pairs = [(key, _setting(run.sweep, key), _setting(run.metrics, key)) for key in SWEPT_SETTINGS]
        differ = [(key, theirs, ours) for key, theirs, ours in pairs if None not in (theirs, ours) and theirs != ours]
        kind = "features" if found or not differ else "settings"
        found += differ + _other_store(run.sweep, run.metrics)  # the path last: the data and settings say more
        if found:
            what, theirs, ours = found[0]
            problem = (f"{run.sweep_path} swept other {kind} than run {run_dir}: its {what} is {shown(theirs)} but "
                       f"the run's metrics.json has {shown(ours)}")
            if sweep is not None:
                raise FoalPipeError(f"{param('sweep')} {problem}; pass a sweep of the run's store and settings")
            run.sweep, run.sweep_path, run.sweep_mismatch = None, None, problem
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
    (``model_checksum``): the weight norms, per-class accuracy and confusion matrix would be another model's. A
    metrics.json of a version that always records it (:data:`CHECKSUM_VERSION`) but does not was damaged or edited:
    it cannot say which model is the run's."""
    from foal_pipe.model.modelfile import stored_header

    recorded = run.metrics.model_checksum if run.metrics is not None else None
    if recorded is None and run.metrics_version >= CHECKSUM_VERSION:
        raise FoalPipeError(f"{run.path / METRICS_FILE} is damaged or edited: it is format_version {run.metrics_version}, "
                            f"which records the checksum of the run's model file (model_checksum), but has none, so "
                            f"{path} cannot be checked as the run's model; run `foal-pipe learn --out {run.path}` again")
    meta = stored_header(path)[0]
    if recorded is None and run.metrics is not None:
        check_recorded_settings(run, path)  # an older run records no checksum: its settings must fit the file
    if recorded is None or not meta or meta.get("checksum") == recorded:
        return  # an unreadable file is refused by its reader, with the reason
    found = meta.get("checksum")  # none (a version-1 file) cannot be the run's either: it wrote this checksum
    theirs = f"its checksum {found[:23]}... differs from" if isinstance(found, str) else "it carries no checksum, unlike"
    fix = ("pass the run's own model (or leave out --model)" if given
           else f"the file was replaced after the run: run `foal-pipe learn --out {run.path}` again")
    raise FoalPipeError(f"{path} is not the model run {run.path} wrote: {theirs} the {recorded[:23]}... its "
                        f"metrics.json records; {fix}")


def check_recorded_settings(run: Run, path: Path) -> None:
    """For a run whose metrics.json predates ``model_checksum``: refuse a model file whose own record contradicts the
    run's (:func:`_other_model`: head, gamma, rows learned, classes) or whose projection -- drawn again from the run's
    seed, init and shape, bit for bit -- is not the run's: another seed's or gamma's model would otherwise be reported
    as the run's; so is a file whose projection is not the run's D wide (``projection_dim`` 0: the identity, as wide
    as the rows, ``feature_dim``). A continued model (``init_model``) started from another file's projection, so its
    projection is not compared bit for bit."""
    from foal_pipe.core.expansion import Expansion
    from foal_pipe.model.modelfile import read_model, stored_header

    m = run.metrics
    meta, shapes = stored_header(path)
    why = f"(the run predates model_checksum, so its settings were compared); pass the run's own model, or run " \
          f"`foal-pipe learn --out {run.path}` again"
    width = shapes["projection"][-1] if "projection" in shapes else None
    wide = m.projection_dim or m.feature_dim  # without a projection the file keeps the identity, the rows' width
    if None not in (width, wide) and width != wide:
        ours = f"{wide}" if m.projection_dim else f"{wide} (projection_dim 0: the identity on its {wide} features)"
        raise FoalPipeError(f"{path} is not the model run {run.path} wrote: projection width D {width} in the file, "
                            f"{ours} in the run's metrics.json {why}")
    if not meta:
        return  # an unreadable file is refused by its reader, with the reason
    found = _other_model(m, meta, path)
    if found:
        what, theirs, ours = found
        raise FoalPipeError(f"{path} is not the model run {run.path} wrote: {what} {theirs} in the file, {ours} in the "
                            f"run's metrics.json {why}")
    D, d = m.projection_dim, m.feature_dim
    if m.continuation is not None or not (D and d and m.seed is not None and shapes.get("projection") == (d, D)):
        return
    stored = read_model(path, names=("projection",))[0]["projection"]
    drawn = Expansion.draw(d, D, m.projection_init or "uniform", "identity", m.seed, "float64").components_
    if not np.array_equal(stored, drawn.astype(m.dtype or "float64").astype(stored.dtype)):  # as the run kept it
        raise FoalPipeError(f"{path} is not the model run {run.path} wrote: its projection is not the one the run's "
                            f"seed {m.seed} draws {why}")


def _other_model(m: LearnMetrics, meta: dict[str, Any], path: Path) -> tuple[str, str, str] | None:
    """``(what, the file's, the run's)``, as text, for the first of the head, its options, ridge's final gamma (with
    ``--gamma auto`` the last one chosen), the rows learned (a continued model's total) and the classes learned where
    the model file's record contradicts the run's metrics.json (each where both record it); else None."""
    from foal_pipe.model.modelfile import read_model

    if meta.get("head") != m.head:
        return "head", meta.get("head") or "ridge", m.head or "ridge"
    if m.head is not None and m.head_options is not None and meta.get("head_options") is not None:
        # dual's batch size is recorded beside the options in metrics.json: compared as one of them
        ours = {**m.head_options, **({"batch_size": m.batch_size} if m.head == "dual" and m.batch_size else {})}
        if {k: v for k, v in meta["head_options"].items() if k in ours} != {k: v for k, v in ours.items()
                                                                             if k in meta["head_options"]}:
            return "head options", shown(meta["head_options"]), shown(m.head_options)
    gamma = m.gammas_selected[-1] if m.gamma == "auto" and m.gammas_selected else m.gamma
    if m.head is None and is_number(meta.get("gamma")) and is_number(gamma) and not same_gamma(meta["gamma"], gamma):
        return "gamma", f"{meta['gamma']:g}", f"{gamma:g}" + (" (the last one --gamma auto chose)" if m.gamma == "auto" else "")
    rows = m.continuation.n_samples_seen_total if m.continuation is not None else m.n_train_seen
    if None not in (rows, meta.get("n_samples_seen")) and meta["n_samples_seen"] != rows:
        return "rows learned", f"{meta['n_samples_seen']:,}", f"{rows:,}"
    if m.continuation is not None:
        names = meta.get("class_names") or []
        learned = [n for t in m.continuation.task_names or [] for n in t]
        return None if set(learned) <= set(names) else ("classes", shown(names), shown(learned))
    known = read_model(path, names=("classes",))[0].get("classes")
    label_ids = sorted({c for t in m.tasks or [] for c in t} - set(m.dropped_classes or ()))
    if known is None or set(label_ids) <= set(known.tolist()):
        return None
    return "class label ids", shown(known.tolist()), shown(label_ids)


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
        raise FoalPipeError(f"{param('model')} {path} is not the model of run {run.path}: its {what} is {shown(theirs)} "
                            f"but the run's metrics.json has {shown(ours)}; pass the run's own model (or leave out "
                            f"{param('model')})")


#: The encoder settings a fusion chosen when reading sets (:func:`foal_pipe.store.blockfusion.fused_encoder`).
FUSION_KEYS = ("fusion", "blocks_dtype", "final_norm")


def _fusions(sweep: SweepReport) -> list[str] | None:
    """The fusions a ``sweep --fusions`` compared (its encoder records the store's own), else None."""
    return None if sweep.fusions is None else [entry.fusion for entry in sweep.fusions]


def _other_data(dataset: Any, encoder: Any, metrics: LearnMetrics, fusions: list[str] | None = None,
                fusion_norm: bool | None = None) -> list[tuple[str, Any, Any]]:
    """``(what, theirs, the run's)`` where a file's dataset or encoder differ from the run's (both recorded): the
    dataset, then each encoder setting that differs, by name. ``fusions``: the file compared these (a
    ``sweep --fusions``, ``fusion_norm``: whether it applied the final norm), so the run's fusion must be one of them
    instead of its encoder's, fused with the norm as they were (a --no-fusion-norm run's features are not a normed
    sweep's, though the fusions share a name)."""
    found: list[tuple[str, Any, Any]] = []
    if None not in (dataset, metrics.dataset) and dataset != metrics.dataset:
        found.append(("dataset", dataset, metrics.dataset))
    if isinstance(encoder, dict) and isinstance(metrics.encoder, dict):
        skip = FUSION_KEYS if fusions is not None else ()
        found += [(f"encoder's {key}", encoder.get(key), metrics.encoder.get(key))
                  for key in sorted(set(encoder) | set(metrics.encoder))
                  if key not in skip and encoder.get(key) != metrics.encoder.get(key)]
        if fusions is not None and metrics.encoder.get("fusion") not in fusions:
            found.append(("fusions", fusions, metrics.encoder.get("fusion")))
        ours = metrics.encoder.get("final_norm")
        if fusions is not None and fusion_norm is not None and "blocks_dtype" in metrics.encoder \
                and str(ours).startswith("applied") != fusion_norm:
            found.append(("fusions' final norm", "applied" if fusion_norm else "not applied (--no-fusion-norm)", ours))
    elif None not in (encoder, metrics.encoder) and encoder != metrics.encoder:
        found.append(("encoder", encoder, metrics.encoder))
    return found


def _other_store(sweep: SweepReport, metrics: LearnMetrics) -> list[tuple[str, Any, Any]]:
    """The store path, where the two files name different stores: a sweep of another store of the same dataset,
    encoder and sizes would otherwise pass as the run's. The paths were recorded as typed, each from the directory
    its command ran in, so they are compared where both name a store from here (the same directory, or not); where
    one does not, the dataset, sizes and settings compared before decide (``s.zarr`` and ``../s.zarr`` typed from
    two directories are one store)."""
    theirs, ours = Path(os_path(str(sweep.features))), Path(os_path(str(metrics.features)))
    if None in (sweep.features, metrics.features) or theirs == ours or not (theirs.exists() and ours.exists()):
        return []
    return [] if theirs.resolve() == ours.resolve() else [("features (store path)", sweep.features, metrics.features)]


def _setting(record: Any, key: str) -> Any:
    """A recorded setting of a run or sweep; the stream is recorded only when it is not the default disjoint one, and
    the class orders (``order_seeds``) as a list, one seed for a single order, and the activation of a file from
    before ``--activation`` as it was read (:attr:`~foal_pipe.protocol.config.ModelConfig.resolved_activation`)."""
    if key == "order_seeds":
        seeds = record.order_seeds
        return seeds if seeds is not None or record.order_seed is None else [record.order_seed]
    value = getattr(record, key)
    if key == "activation" and value is None:  # written before --activation: the sigmoid, the identity at D = 0
        return "identity" if record.projection_dim == 0 else "sigmoid"
    return "disjoint" if key == "stream" and value is None else value


@dataclass
class RunSummary:
    """One row of ``foal-pipe summary``: a learn run (``metrics``) or a sweep (``sweep``)."""

    path: Path
    metrics: LearnMetrics | None = None
    sweep: SweepReport | None = None
    #: The sweep's numbers that its accuracy matrices contradict, shown recomputed (:func:`read_sweep`).
    sweep_warnings: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        """The run's wall time: ``total`` in ``timings.json``, or ``seconds`` in a metrics.json or sweep.json
        from before wall times moved out of them; ``None`` when neither is there, or when the folder holds both a
        learn run and a sweep: ``learn`` and ``sweep`` each write ``timings.json``, so it is the last one's and
        cannot be told apart (a sweep into a run's folder replaces the run's). A time no run takes (negative, NaN,
        infinite, over :data:`MAX_SECONDS`: edited) is not shown either."""
        for record in (self.metrics, self.sweep):
            if record is not None and record.seconds is not None:
                return _wall_time(record.seconds)
        if self.metrics is not None and self.sweep is not None or self.timings_of_another:
            return None
        return _wall_time(self._timings.get("total"))

    @functools.cached_property
    def _timings(self) -> dict[str, Any]:
        """``timings.json``'s record ({} where it is missing or unreadable: the time is simply not shown)."""
        try:
            timings = read_json(self.path / TIMINGS_FILE, "wall times", "")
        except FoalPipeError:
            return {}
        return timings if isinstance(timings, dict) else {}

    @functools.cached_property
    def timings_of_another(self) -> bool:
        """Whether ``timings.json`` names, by its SHA-256, another ``metrics.json`` or ``sweep.json`` than the one
        beside it: a ``dvc checkout`` or a copy restored the record and not its times, which are then another run's.
        One that names none (written before the name was recorded) is read as before."""
        of = self._timings.get(TIMINGS_OF)
        if not isinstance(of, dict) or of.get("file") not in (METRICS_FILE, SWEEP_FILE):
            return False
        try:
            return hashlib.sha256((self.path / of["file"]).read_bytes()).hexdigest() != of.get("sha256")
        except OSError:
            return True


#: More wall seconds than a run takes (over 30 years): a time recorded so was edited, and is not shown.
MAX_SECONDS = 1e9


def _wall_time(value: Any) -> float | None:
    """``value`` as a run's wall seconds, None where it is not a number of them (0 to :data:`MAX_SECONDS`)."""
    return float(value) if is_number(value) and 0 <= value <= MAX_SECONDS else None


def find_tables(paths: Iterable[str | Path]) -> list[Path]:
    """The ``table.json`` files of ``foal-pipe table`` under each path (a file, or a directory searched recursively,
    temporaries left out as :func:`find_runs` leaves them): a table holds its runs itself, not as run directories."""
    return [t for p in map(Path, paths) for t in ([p] if p.is_file() else _run_files(p, ("table.json",)))
            if t.name == "table.json"]


def _run_files(root: Path, wanted: tuple[str, ...] = (METRICS_FILE, SWEEP_FILE)) -> list[Path]:
    """The files named ``wanted`` (a run's ``metrics.json`` and ``sweep.json``) under ``root``, sorted, linked folders
    followed (a run kept elsewhere and linked in is a run here too); a folder reached again (a link to one above it, or
    to one already searched) is searched once, and temporaries (:data:`~foal_pipe.io.temporaries.TEMPORARY`) not at
    all."""
    seen: set[str] = set()
    files = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not TEMPORARY.fullmatch(d))
        files += [Path(folder) / n for n in names if n in wanted]
    return sorted(files)


def find_runs(
    paths: Iterable[str | Path], on_error: Callable[[Path, str], None] | None = None
) -> list[RunSummary]:
    """Runs and sweeps under each path: a ``metrics.json``/``sweep.json`` file, or a directory searched
    recursively (:func:`_run_files`), a run found twice (through a link, or under two paths) listed once. Sorted by
    path. A file that cannot be read raises :class:`FoalPipeError`, or, with ``on_error``, is passed to it with the
    reason (which may raise) and skipped."""
    found: dict[str, RunSummary] = {}
    skipped = 0
    for p in map(Path, paths):
        if not p.exists():
            raise FoalPipeError(f"{p} does not exist; give run directories or metrics.json/sweep.json files")
        for f in [p] if p.is_file() else _run_files(p):
            if f.name not in (METRICS_FILE, SWEEP_FILE):
                raise FoalPipeError(f"{f} is neither a {METRICS_FILE} nor a {SWEEP_FILE}")
            warnings: list[str] = []
            try:
                data = read_metrics(f) if f.name == METRICS_FILE else read_sweep(f, warnings.append)
            except FoalPipeError as exc:
                if on_error is None:
                    raise
                on_error(f, str(exc))
                skipped += 1
                continue
            entry = found.setdefault(os.path.realpath(f.parent), RunSummary(f.parent))
            if isinstance(data, LearnMetrics):  # read_metrics read it: f is a metrics.json
                entry.metrics = data
            else:
                entry.sweep, entry.sweep_warnings = data, warnings
    if not found:
        names = ", ".join(map(str, paths))
        tables = find_tables(paths)
        if tables:  # `foal-pipe table` writes its runs into table.json, not as run directories
            raise FoalPipeError(f"{tables[0].parent} holds a results table (table.json), which `summary` does not read: "
                                f"open {tables[0].parent / 'table.md'}, or give `summary` run directories of `foal-pipe learn`")
        if skipped:
            raise FoalPipeError(f"no {METRICS_FILE} or {SWEEP_FILE} under {names} that can be read: {skipped} skipped "
                                "(above, each with its fix)")
        raise FoalPipeError(
            f"no {METRICS_FILE} or {SWEEP_FILE} under {names}; run `dvc repro` or `foal-pipe learn` first"
        )
    return sorted(found.values(), key=lambda entry: entry.path)
