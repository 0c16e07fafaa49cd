"""Reading a run's files: ``metrics.json``, ``sweep.json`` and the class weight norms of the model.

The files are read into their :mod:`~foal_pipe.protocol.schema` records (every key's type checked); each
reader then checks what the types cannot (a gamma chosen per task boundary, a best gamma among the results)
and raises a one-line :class:`FoalPipeError` that names the fix, so the tables, plots and summary can trust
the values. Metrics are fractions, as the learner writes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.io.pathtext import path_text
from foal_pipe.model.modelfile import read_model, stored_head
from foal_pipe.protocol.metricsparts import OrderMetrics
from foal_pipe.protocol.schema import METRICS_FILE, SWEEP_FILE, LearnMetrics, SweepReport, same_gamma
from foal_pipe.protocol.sweepparts import FusionSweep
from foal_pipe.report.metricscheck import TOLERANCE as TOLERANCE  # the report's tolerance, used beside it
from foal_pipe.report.metricscheck import all_classes_recomputed, check_metrics, differs, headline_numbers, std_warnings
from foal_pipe.report.sweepcheck import checked_sweep

#: The numbers checked against their recomputation (and written to ``scores.json``); A_auc from the anytime curve.
HEADLINE = ("A_avg", "A_last", "F", "F_published_code", "A_auc")
#: What each headline number is recomputed from, where not the accuracy matrix.
_SOURCE = {"A_auc": "anytime curve"}
E = TypeVar("E", SweepReport, FusionSweep)


@dataclass
class Run:
    """A run read from disk: its metrics, and the sweep and class weight norms when present."""

    path: Path
    metrics: LearnMetrics
    sweep: SweepReport | None = None
    sweep_path: Path | None = None
    #: ``(labels, norms, names)``: each class's label id, the L2 norm of its column of W, and the
    #: store's class names (indexed by label id) when the model records them.
    weight_norms: tuple[np.ndarray, np.ndarray, list[str] | None] | None = None
    model_path: Path | None = None
    #: Where a sweep was looked for, when none was given and none was found.
    sweep_searched: tuple[Path, ...] = ()
    #: Why the sweep found beside the run was not used (it swept other features or settings).
    sweep_mismatch: str | None = None
    #: The sweep's numbers that its accuracy matrices contradict, shown recomputed (:func:`read_sweep`).
    sweep_warnings: list[str] = field(default_factory=list)
    #: The ``format_version`` of its ``metrics.json`` (1: written before files named it), which tells the keys a
    #: run of that version always records (``model_checksum``: :data:`~foal_pipe.protocol.schema.CHECKSUM_VERSION`).
    metrics_version: int = 1

    @property
    def matrix(self) -> list[list[float]]:
        return self.metrics.accuracy_matrix

    @property
    def dataset(self) -> str:
        return "?" if self.metrics.dataset is None else self.metrics.dataset

    @property
    def label(self) -> str:
        """The run's name (its directory, the pipeline's run name), with its dataset when that differs."""
        name = path_text(self.path.resolve().name)
        return name if name == self.dataset else f"{name} ({self.dataset})"


def read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    """A JSON object from ``path``; every failure is one line naming ``fix``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FoalPipeError(f"{path} does not exist; {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FoalPipeError(f"cannot read {path} ({exc.__class__.__name__}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise FoalPipeError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); {fix}") from None
    except RecursionError:  # arrays or objects nested too deep for the parser: no file foal-pipe writes
        raise FoalPipeError(f"{path} is nested too deep to read ({what}); {fix}") from None
    if not isinstance(data, dict):
        raise FoalPipeError(f"{path} should hold a JSON object ({what}), got {type(data).__name__}; {fix}")
    return data


def consistency_warnings(metrics: LearnMetrics) -> list[str]:
    """Stored headline metrics that disagree with their recomputation from the accuracy matrix (A_auc: from the
    anytime curve).

    With ``orders`` (``learn --order-seeds``) each order is checked against its own matrix and curve, and the
    top-level headline numbers and accuracy matrix against the mean over the orders (F is not linear in the matrix:
    the mean matrix's F differs).
    """
    out = all_classes_recomputed(metrics)[1]
    if metrics.orders is not None:
        return _orders_warnings(metrics, metrics.orders) + out
    recomputed = headline_numbers(metrics.accuracy_matrix, metrics.stream, metrics.anytime)
    if _missing_auc(metrics, recomputed):
        out.append(f"A_auc is missing from metrics.json; the anytime curve gives {recomputed['A_auc']:.6f} (shown)")
    for key in HEADLINE:
        stored = getattr(metrics, key)
        if stored is not None and key in recomputed and differs(stored, recomputed[key]):
            out.append(f"{key} in metrics.json is {stored:.6f} but the {_SOURCE.get(key, 'accuracy matrix')} gives "
                       f"{recomputed[key]:.6f} (shown)")
    stored_steps = metrics.A_steps
    if stored_steps is not None and (
        len(stored_steps) != len(recomputed["A_steps"])
        or any(differs(float(s), r) for s, r in zip(stored_steps, recomputed["A_steps"]))
    ):
        out.append("A_steps in metrics.json disagrees with its recomputation from the accuracy matrix")
    return out


def _orders_warnings(metrics: LearnMetrics, orders: list[OrderMetrics]) -> list[str]:
    out = []
    for entry in orders:
        where = f"order {'?' if entry.order_seed is None else entry.order_seed}"
        recomputed = headline_numbers(entry.accuracy_matrix, metrics.stream, entry.anytime)
        if _missing_auc(entry, recomputed):
            out.append(f"A_auc of {where} is missing from metrics.json; its anytime curve gives {recomputed['A_auc']:.6f} "
                       "(shown)")
        out += [f"{key} of {where} in metrics.json is {stored:.6f} but its {_SOURCE.get(key, 'accuracy matrix')} gives "
                f"{recomputed[key]:.6f} (shown)"
                for key in HEADLINE if (stored := getattr(entry, key)) is not None and key in recomputed
                and differs(stored, recomputed[key])]
    fixed = _headline_recomputed(metrics).orders or []  # each order's numbers as its matrix (and curve) gives them
    for key in HEADLINE:
        values = [getattr(e, key) for e in fixed]
        stored = getattr(metrics, key)
        if key == "A_auc" and stored is None and fixed and all(v is not None for v in values):
            out.append(f"A_auc is missing from metrics.json; the mean over its orders is {sum(values) / len(values):.6f} (shown)")
        elif stored is not None and all(v is not None for v in values) and differs(stored, sum(values) / len(values)):
            out.append(f"{key} in metrics.json is {stored:.6f} but the mean over its orders is {sum(values) / len(values):.6f} "
                       "(shown)")
    return out + std_warnings(metrics, fixed, HEADLINE) + _matrix_warning(metrics, orders)


def _mean_matrix(orders: list[OrderMetrics]) -> list[list[float]] | None:
    """The orders' position-wise mean accuracy matrix, as ``learn --order-seeds`` records it (``order_means``; every
    order has the top level's rows: :func:`check_metrics` has refused any other); None without orders."""
    from foal_pipe.protocol.ordermeans import position_means

    if not orders:
        return None
    rows = [len(row) for row in orders[0].accuracy_matrix]
    flat = position_means([np.concatenate(o.accuracy_matrix) for o in orders])
    return [[float(v) for v in row] for row in np.split(flat, np.cumsum(rows)[:-1])]


def _matrix_off(metrics: LearnMetrics, mean: list[list[float]] | None) -> list[tuple[int, int, float, float]]:
    """``(row, column, stored, mean)`` of each entry of the top-level accuracy matrix that the orders' mean contradicts."""
    return [] if mean is None else [(i, j, stored, mean[i][j]) for i, row in enumerate(metrics.accuracy_matrix)
            for j, stored in enumerate(row) if differs(stored, mean[i][j])]


def _matrix_warning(metrics: LearnMetrics, orders: list[OrderMetrics]) -> list[str]:
    """The top-level accuracy matrix where the mean over the orders contradicts it: its first such entry, and how many
    there are (the heatmap, accuracy_matrix.csv and steps.csv show the mean, :func:`as_recomputed`)."""
    off = _matrix_off(metrics, _mean_matrix(orders))
    if not off:
        return []
    i, j, stored, mean = off[0]
    more = "" if len(off) == 1 else f"; {len(off)} entries differ"
    return [f"accuracy_matrix[{i}][{j}] in metrics.json is {stored:.6f} but the mean over its orders is {mean:.6f} "
            f"(the mean matrix shown{more})"]


def _missing_auc(record: LearnMetrics | OrderMetrics, recomputed: dict[str, Any]) -> bool:
    """A_auc left out beside an anytime curve with points (learn records it with every such curve): shown recomputed."""
    return record.A_auc is None and "A_auc" in recomputed


def _replaced(key: str, stored: float | None, recomputed: dict[str, Any]) -> bool:
    """Whether the recomputation of ``key`` shows instead of ``stored``: they disagree, or A_auc is missing."""
    if key not in recomputed:
        return False
    return key == "A_auc" if stored is None else differs(stored, recomputed[key])


def as_recomputed(metrics: LearnMetrics) -> LearnMetrics:
    """``metrics`` with each headline number that disagrees with its recomputation from the accuracy matrix or the
    anytime curve (:func:`consistency_warnings` names them) replaced by the recomputation, so no table shows a number
    its matrix contradicts. With ``orders``: each order's from its own matrix and curve, then the means and stds over
    the orders, and the accuracy matrix their position-wise mean where the stored one differs. ``--eval-features``'
    ``all_classes``: as its sources give it (:func:`all_classes_recomputed`)."""
    fixed = _headline_recomputed(metrics)
    everything = all_classes_recomputed(metrics)[0]
    if everything is None or fixed.continuation is None:
        return fixed
    return replace(fixed, continuation=replace(fixed.continuation, all_classes=everything))


def _headline_recomputed(metrics: LearnMetrics) -> LearnMetrics:
    """:func:`as_recomputed`'s headline numbers (and stds and mean matrix over the orders)."""
    if metrics.orders is None:
        recomputed = headline_numbers(metrics.accuracy_matrix, metrics.stream, metrics.anytime)
        return replace(metrics, **{key: recomputed[key] for key in HEADLINE if _replaced(key, getattr(metrics, key), recomputed)})
    from foal_pipe.protocol.ordermeans import mean_std

    as_runs = [_headline_recomputed(replace(metrics, **{f.name: getattr(entry, f.name) for f in fields(entry)
                                                 if f.name in HEADLINE or f.name in ("accuracy_matrix", "anytime")},
                                         orders=None))
               for entry in metrics.orders]
    orders = [replace(entry, **{key: getattr(fixed, key) for key in HEADLINE})
              for entry, fixed in zip(metrics.orders, as_runs, strict=True)]
    matrix = _mean_matrix(metrics.orders)  # the heatmap's, as the docs promise: not a stored one they contradict
    changes: dict[str, Any] = {"accuracy_matrix": matrix} if _matrix_off(metrics, matrix) else {}
    std = dict(metrics.std or {})
    for key in HEADLINE:
        values = [getattr(e, key) for e in orders]
        stored = getattr(metrics, key)
        if not values or None in values or (stored is None and key != "A_auc"):  # A_auc missing: the orders' mean
            continue
        mean, spread = mean_std(values)
        if stored is None or differs(stored, mean) or values != [getattr(e, key) for e in metrics.orders]:
            changes[key] = mean
            if key in std or stored is None:
                std[key] = spread
        elif key in std and differs(std[key], spread):  # the mean as stored, its std not (a warning names it)
            std[key] = spread
    if not changes and std == (metrics.std or {}):
        return metrics
    return replace(metrics, **changes, orders=orders, std=std if metrics.std is not None else None)


def _check_gamma(metrics: LearnMetrics, path: Path) -> None:
    """With ``gamma`` "auto", one chosen gamma per task boundary."""
    chosen, n_tasks = metrics.gammas_selected, len(metrics.accuracy_matrix)
    if metrics.gamma == "auto" and (chosen is None or len(chosen) != n_tasks or not all(g > 0 for g in chosen)):
        raise FoalPipeError(
            f"{path}: gamma is \"auto\" but 'gammas_selected' is not a list of {n_tasks} positive numbers "
            f"(one per task boundary); {LearnMetrics.FIX}"
        )


def read_metrics(path: str | Path) -> LearnMetrics:
    """Read and validate a ``metrics.json`` (a file, or the run directory holding one).

    Wall times are not required (``seconds`` moved to ``timings.json``); ``gamma`` may be ``"auto"``.
    """
    return read_metrics_version(path)[0]


def read_metrics_version(path: str | Path) -> tuple[LearnMetrics, int]:
    """:func:`read_metrics`, and the file's ``format_version`` (1 where it names none: written before files did),
    which the record does not keep: the keys a file of that version must hold."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    data = read_json(path, "a run's metrics", LearnMetrics.FIX)
    metrics = LearnMetrics.from_dict(data, str(path))  # has refused a version outside 1..VERSION
    _check_gamma(metrics, path)
    check_metrics(metrics, path)
    _check_classes(metrics, path)
    return metrics, int(data.get("format_version", 1))


def _check_classes(metrics: LearnMetrics, path: Path) -> None:
    """``task_names`` (a continued model's class names), when present, names the classes of ``tasks``, task by
    task (the record has checked each key's type, ``eval_features`` included)."""
    tasks, names = metrics.tasks, metrics.continuation.task_names if metrics.continuation else None
    if names is not None and not (tasks is not None and len(names) == len(tasks)
                                  and all(len(n) == len(t) for n, t in zip(names, tasks))):
        raise FoalPipeError(f"{path}: 'task_names' should name the classes of 'tasks', task by task; "
                            f"{LearnMetrics.FIX}")


def read_sweep(path: str | Path, warn: Callable[[str], None] | None = None) -> SweepReport:
    """Read and validate a ``sweep.json`` (a file, or the directory holding one); results sorted by gamma. Fields
    that contradict each other are refused; a headline number its accuracy matrix contradicts is given recomputed,
    and ``warn`` is told of each such number (:func:`~foal_pipe.report.sweepcheck.checked_sweep`).

    Sweeps written before GCV and leave-one-out (no ``selected_by``, no per-result ``gcv``/``loo_*``)
    are read too: their ``best_gamma`` was picked by test A_avg.
    """
    path = Path(path)
    if path.is_dir():
        path = path / SWEEP_FILE
    sweep = _sorted(SweepReport.from_dict(read_json(path, "a gamma sweep", SweepReport.FIX), str(path)), str(path))
    if sweep.fusions is not None:
        sweep = _check_fusions(sweep, path)
    sweep, warnings = checked_sweep(sweep, path)
    if warn is not None:
        for text in warnings:
            warn(f"{path}: {text}")
    return sweep


def _sorted(entry: E, where: str) -> E:
    """A sweep's (or one fusion's) ``results``, sorted by gamma, with its choices among them checked."""
    if not entry.results:
        raise FoalPipeError(f"{where} has no 'results' list; it is not a foal-pipe sweep.json; {SweepReport.FIX}")
    entry = replace(entry, results=sorted(entry.results, key=lambda r: r.gamma))
    for key in ("best_gamma", "best_gamma_test"):
        chosen = getattr(entry, key)
        if chosen is not None and not any(same_gamma(chosen, r.gamma) for r in entry.results):
            raise FoalPipeError(f"{where}: {key!r} {chosen!r} is not one of the gammas in 'results'; {SweepReport.FIX}")
    return entry


def _check_fusions(sweep: SweepReport, path: Path) -> SweepReport:
    """``sweep --fusions``: every fusion's entry, and the overall choices naming one of them and its gamma."""
    if not sweep.fusions:
        raise FoalPipeError(f"{path}: 'fusions' should be a list of entries, each with a 'fusion' spec; {SweepReport.FIX}")
    fusions = [_sorted(entry, f"{path}: fusions[{i}]") for i, entry in enumerate(sweep.fusions)]
    for i, own in enumerate(fusions):  # sweep --fusions records each fusion's own choices
        for key in ("best_gamma", "best_gamma_test"):
            gamma = getattr(own, key)
            if gamma is None or not any(same_gamma(gamma, r.gamma) for r in own.results):
                raise FoalPipeError(f"{path}: fusions[{i}] should record {key!r}, one of its gammas; {SweepReport.FIX}")
    names = [e.fusion for e in fusions]
    if len(set(names)) != len(names):  # before the choices are looked up by name: one of two entries would be lost
        twice = next(n for n in names if names.count(n) > 1)
        raise FoalPipeError(f"{path}: 'fusions' lists fusion {twice!r} twice; each fusion has one entry; {SweepReport.FIX}")
    by_name = dict(zip(names, fusions))
    for key in ("best", "best_test"):
        choice = getattr(sweep, key)
        entry = by_name.get(choice.fusion) if choice is not None else None
        if entry is None or not any(same_gamma(choice.gamma, r.gamma) for r in entry.results):
            raise FoalPipeError(f"{path}: {key!r} should name a fusion of 'fusions' and one of its gammas; {SweepReport.FIX}")
    return replace(sweep, fusions=fusions)


def read_weight_norms(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str] | None] | None:
    """Per-class L2 norms of W's columns from a ``model.safetensors``: ``(labels, norms, class names)``.

    The file is validated by :func:`foal_pipe.model.modelfile.read_model`, but only ``W`` and ``classes`` are read
    (not the learner state); names come from the ``class_names`` metadata, one per column of ``W``. A head other
    than ridge: its linear weights (slda's and balanced's ``W``, dual's ``W_main``); None for ncm and fecam, which
    score distances.
    """
    from foal_pipe.heads.state import file_heads, head_file

    head = stored_head(path)
    key = "W" if head not in file_heads() else head_file(head).weights
    if key is None:
        read_model(path, names=("classes",))  # validated all the same
        return None
    tensors, meta = read_model(path, names=(key, "classes"))
    W, classes = tensors[key], tensors["classes"].reshape(-1)
    names = meta.get("class_names")
    return classes.astype(np.int64), np.linalg.norm(W.astype(np.float64), axis=0), names
