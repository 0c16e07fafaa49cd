"""A run's outputs: its files written as one unit after checking its stores did not change (:func:`write_outputs`,
:func:`write_learned`), and its model file, ridge's (:func:`save_model`) or a registry head's (:func:`save_head_model`),
with the provenance of the rows it learned."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from foal_pipe.heads import Head, Scorer
from foal_pipe.heads.state import export_head, takes_batch_size
from foal_pipe.io import TIMINGS_FILE, TIMINGS_OF, atomic_dir, write_json
from foal_pipe.io.temporaries import TEMPORARY
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.modelfile import MODEL_FILE, stored_checksum
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.protocol.headruns import head_space, resolved_options
from foal_pipe.protocol.records import Learned
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.schema import METRICS_FILE, LearnMetrics
from foal_pipe.store.manifest import data_identities

#: The folder ``evaluate`` writes into a run by default, and every file an evaluation may write
#: (:mod:`foal_pipe.report.evaluation`, above this layer, takes them from here): derived from the run's files, an
#: evaluation in ``eval/`` is not carried into the run that replaces them (:func:`write_outputs`).
EVAL_DIR = "eval"
SUMMARY_FILE = "summary.md"
SCORES_FILE = "scores.json"
EVAL_FILES = frozenset(
    {SUMMARY_FILE, SCORES_FILE}
    | {f"{stem}.{ext}" for stem in ("accuracy_matrix", "steps", "weight_norms", "gamma", "confusion_matrix", "anytime")
       for ext in ("png", "csv")}
    | {"fusions.png", "heads.png", "class_accuracy.csv"}
)


def write_learned(out: str | Path, runs: Sequence[Run], start: float, metrics: LearnMetrics,
                  save: Callable[[Path], object], timed: bool = False) -> Learned:
    """Write a run's model file (``save``), then its ``metrics.json`` recording that file's checksum (which
    ``evaluate`` checks a model against), with ``timings.json``, as one unit (:func:`write_outputs`); ``timed``: the
    writing is the first run's ``write`` step. The metrics as written."""
    written = metrics

    def write(tmp: Path) -> None:
        nonlocal written
        with runs[0].timed("write") if timed else nullcontext():
            save(tmp / MODEL_FILE)
            written = replace(metrics, model_checksum=stored_checksum(tmp / MODEL_FILE))
            write_json(tmp / METRICS_FILE, written.to_dict())

    timings = write_outputs(out, runs, start, write, METRICS_FILE)
    return Learned(written, timings)

def write_outputs(out: str | Path, runs: Sequence[Run], start: float, write: Callable[[Path], object],
                  record: str) -> dict[str, float]:
    """Write a run's files (``write`` fills the directory it is given, ``record`` the name of the record among them)
    and ``timings.json`` (each step's seconds summed over ``runs``) as one unit, after checking that no store changed
    while it was read; the timings. An evaluation of the outputs replaced (:func:`replaced_evaluation`, found at the
    swap) goes with them."""
    for run in runs:
        run.store.check_unchanged()
    with atomic_dir(out, owned=replaced_evaluation(out)) as tmp:
        write(tmp)
        timings = summed_timings([run.timings for run in runs], start)
        write_timings(tmp, timings, record)
    return timings


def write_timings(folder: Path, timings: Mapping[str, float], record: str) -> None:
    """``timings.json`` in ``folder``, naming the record written with it (``metrics.json`` or ``sweep.json``) by its
    SHA-256: a ``timings.json`` left beside another record (a ``dvc checkout`` restores the record, not the times; a
    copy) is then known not to be that run's (:attr:`~foal_pipe.report.discovery.RunSummary.seconds`)."""
    digest = hashlib.sha256((folder / record).read_bytes()).hexdigest()
    write_json(folder / TIMINGS_FILE, {**timings, TIMINGS_OF: {"file": record, "sha256": digest}})

def replaced_evaluation(out: str | Path) -> Iterable[str]:
    """The files ``evaluate`` writes, in ``out``'s ``eval/`` where an evaluation of ``out``'s outputs is (it always
    writes ``scores.json``), as ``eval/NAME``, and its temporaries in ``out`` (``.eval.tmp-*``):
    :func:`~foal_pipe.io.atomic_dir` leaves them out of what it carries (``eval/`` goes too once nothing else is in
    it), so a summary of the replaced run never sits beside the new one's files; the user's other files there are
    kept. Looked up when atomic_dir swaps, under the lock that ``evaluate --run OUT`` holds from reading the run to
    writing ``eval/``: an evaluation written while this run ran is of the replaced run too. An ``eval/`` that is a
    symlink is carried as it is (nothing is deleted through a link): a note on stderr says that its folder holds an
    evaluation of the replaced run."""
    return _AtSwap(Path(out))


class _AtSwap:
    """``out``'s evaluation, looked up when iterated: :func:`~foal_pipe.io.atomic_dir` iterates ``owned`` under its lock,
    at the swap."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __iter__(self) -> Iterator[str]:
        return iter(_evaluation_files(self.out))


def _evaluation_files(out: Path) -> list[str]:
    temporaries = sorted(p.name for p in out.glob(f".{EVAL_DIR}.tmp-*") if TEMPORARY.fullmatch(p.name))
    folder = out / EVAL_DIR
    if not (folder / SCORES_FILE).is_file():
        return temporaries
    if folder.is_symlink():
        sys.stderr.write(f"note: {folder} is a symlink, which this run keeps as it is: the folder it links to "
                         f"({os.path.realpath(folder)}) holds an evaluation of the run being replaced, left there (nothing "
                         "is deleted through a link); run `evaluate` again\n")
    return temporaries + [f"{EVAL_DIR}/{name}" for name in sorted(EVAL_FILES)]

def summed_timings(parts: Sequence[dict[str, float]], start: float) -> dict[str, float]:
    """Each step's seconds summed over ``parts``, and the ``total`` since ``start``, rounded to milliseconds."""
    timings: dict[str, float] = {}
    for part in parts:
        for step, seconds in part.items():
            timings[step] = timings.get(step, 0.0) + seconds
    timings["total"] = time.perf_counter() - start
    return {step: round(seconds, 3) for step, seconds in sorted(timings.items())}

def provenance(run: Run, previous: Mapping[str, Any] | None = None, identities: list[str] | None = None) -> dict[str, Any]:
    """A model file's record of the data it learned: the store's dataset and encoder, ``learned_from`` (the
    generation ids of the stores whose training rows it holds, this one last) and ``learned_data`` (their data
    identities, which survive re-extraction with other chunks or dtype, and the same images from
    another path: :func:`~foal_pipe.store.manifest.data_identities`) where the store has them; ``previous``:
    the continued model's metadata, whose lists are extended; ``identities``: the store's, where already read."""
    record = {"dataset": run.store.meta.dataset, "encoder": run.store.meta.encoder}
    identities = data_identities(run.store) if identities is None else identities
    for key, these in (("learned_from", [run.store.meta.generation]), ("learned_data", identities)):
        values = [*(previous or {}).get(key, []), *(this for this in these if this)]
        if values:
            record[key] = values
    return record

def save_model(final: RidgeModel, run: Run, path: Path) -> None:
    """The model file of a run: the ridge model with the run's projection, provenance and class names."""
    final.save(path, run.projection.components_, **provenance(run),
               class_names=[run.store.classes[c] for c in final.classes], activation=run.model.resolved_activation)


def save_head_model(head: Head, scorer: Scorer, run: Run, path: Path) -> None:
    """The model file of a head's run: its tensors after the last task (:mod:`foal_pipe.heads.state`), its options
    (dual's with the stream's batch size), the run's projection, provenance and class names."""
    name = type(head).name
    options = resolved_options(name, run.model)
    if takes_batch_size(name):
        options["batch_size"] = run.stream.batch_size
    model = HeadClassifier(name, options, export_head(name, head, scorer), sum(int(r.size) for r in run.stream.rows),
                           space=head_space(name, run.model), dtype=run.model.dtype)
    model.save(path, projection=run.projection, **provenance(run),
               class_names=[run.store.classes[c] for c in model.classes_], activation=run.model.resolved_activation)
