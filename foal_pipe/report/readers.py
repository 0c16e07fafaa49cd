"""Reading a run's files: ``metrics.json``, ``sweep.json`` and the class weight norms of the model.

Each reader validates what it returns and raises a one-line :class:`FoalPipeError` that names the fix, so the
tables, plots and summary can trust the values. Metrics are fractions, as the learner writes them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.metrics import summarize
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model

METRICS_FILE = "metrics.json"
SWEEP_FILE = "sweep.json"
MODEL_FILE = "model.safetensors"
#: Largest disagreement tolerated between a stored metric and its recomputation from the matrix.
TOLERANCE = 1e-6
HEADLINE = ("A_avg", "A_last", "F", "F_published_code")
#: How ``foal-pipe sweep`` may have chosen its ``best_gamma`` (``selected_by``).
SELECTORS = ("loo", "gcv", "test")
#: Per-result lists in a sweep, one value per task boundary (``null`` when that criterion was skipped).
CRITERION_KEYS = ("gcv", "loo_accuracy", "loo_mse")

_LEARN_FIX = "re-run `foal-pipe learn --out DIR` (or `dvc repro`) to write it"
_SWEEP_FIX = "re-run `foal-pipe sweep --out DIR` to write it"


@dataclass
class Run:
    """A run read from disk: its metrics, and the sweep and class weight norms when present."""

    path: Path
    metrics: dict[str, Any]
    sweep: dict[str, Any] | None = None
    sweep_path: Path | None = None
    #: ``(labels, norms, names)``: each class's label id, the L2 norm of its column of W, and the
    #: store's class names (indexed by label id) when the model records them.
    weight_norms: tuple[np.ndarray, np.ndarray, list[str] | None] | None = None
    model_path: Path | None = None
    #: Where a sweep was looked for, when none was given and none was found.
    sweep_searched: tuple[Path, ...] = ()

    @property
    def matrix(self) -> list[list[float]]:
        return self.metrics["accuracy_matrix"]

    @property
    def dataset(self) -> str:
        return str(self.metrics.get("dataset", "?"))

    @property
    def label(self) -> str:
        """The run's name (its directory, the pipeline's run name), with its dataset when that differs."""
        name = self.path.resolve().name
        return name if name == self.dataset else f"{name} ({self.dataset})"


def is_number(value: Any) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    if not isinstance(data, dict):
        raise FoalPipeError(f"{path} should hold a JSON object ({what}), got {type(data).__name__}; {fix}")
    return data


def check_matrix(matrix: Any, where: str) -> list[list[float]]:
    """Validate a lower-triangular accuracy matrix: row i has i+1 fractions in [0, 1]."""
    if not isinstance(matrix, list) or not matrix:
        raise FoalPipeError(f"{where}: 'accuracy_matrix' must be a non-empty list of rows; re-run `foal-pipe learn`")
    rows = []
    for i, row in enumerate(matrix):
        if not isinstance(row, list) or len(row) != i + 1:
            raise FoalPipeError(
                f"{where}: row {i} of 'accuracy_matrix' should have {i + 1} entries "
                f"(a[i][j] for tasks j <= i), got {row!r:.60}; re-run `foal-pipe learn`"
            )
        try:
            values = [float(v) for v in row]
        except (TypeError, ValueError):
            raise FoalPipeError(f"{where}: row {i} of 'accuracy_matrix' is not all numbers") from None
        if not all(0.0 <= v <= 1.0 for v in values):
            raise FoalPipeError(
                f"{where}: row {i} of 'accuracy_matrix' has values outside [0, 1]; accuracies must be fractions"
            )
        rows.append(values)
    return rows


def consistency_warnings(metrics: dict[str, Any]) -> list[str]:
    """Stored headline metrics that disagree with their recomputation from the accuracy matrix.

    With ``orders`` (``learn --order-seeds``) each order is checked against its own matrix, and the top-level
    headline numbers against the mean over the orders (F is not linear in the matrix: the mean matrix's F differs).
    """
    if isinstance(metrics.get("orders"), list):
        return _orders_warnings(metrics)
    recomputed = summarize(metrics["accuracy_matrix"])
    out = []
    for key in HEADLINE:
        stored = metrics.get(key)
        if is_number(stored) and abs(stored - recomputed[key]) > TOLERANCE:
            out.append(
                f"{key} in metrics.json is {stored:.6f} but the accuracy matrix gives {recomputed[key]:.6f}"
            )
    stored_steps = metrics.get("A_steps")
    if isinstance(stored_steps, list) and (
        len(stored_steps) != len(recomputed["A_steps"])
        or any(abs(float(s) - r) > TOLERANCE for s, r in zip(stored_steps, recomputed["A_steps"]))
    ):
        out.append("A_steps in metrics.json disagrees with the row means of the accuracy matrix")
    return out


def _orders_warnings(metrics: dict[str, Any]) -> list[str]:
    out = []
    for entry in metrics["orders"]:
        where = f"order {entry.get('order_seed', '?')}"
        recomputed = summarize(check_matrix(entry.get("accuracy_matrix"), where))
        out += [f"{key} of {where} in metrics.json is {entry[key]:.6f} but its accuracy matrix gives {recomputed[key]:.6f}"
                for key in HEADLINE if is_number(entry.get(key)) and abs(entry[key] - recomputed[key]) > TOLERANCE]
    for key in HEADLINE:
        values = [e.get(key) for e in metrics["orders"]]
        stored = metrics.get(key)
        if is_number(stored) and all(is_number(v) for v in values) and abs(stored - sum(values) / len(values)) > TOLERANCE:
            out.append(f"{key} in metrics.json is {stored:.6f} but the mean over its orders is {sum(values) / len(values):.6f}")
    return out


def _check_gamma(metrics: dict[str, Any], path: Path) -> None:
    """``gamma`` is a positive number, or ``"auto"`` with one chosen gamma per task boundary."""
    gamma = metrics.get("gamma")
    if gamma is None or (is_number(gamma) and gamma > 0):
        return
    if gamma != "auto":
        raise FoalPipeError(f"{path}: 'gamma' is {gamma!r}; expected a number > 0 or \"auto\"; {_LEARN_FIX}")
    chosen = metrics.get("gammas_selected")
    n_tasks = len(metrics["accuracy_matrix"])
    if not isinstance(chosen, list) or len(chosen) != n_tasks or not all(is_number(g) and g > 0 for g in chosen):
        raise FoalPipeError(
            f"{path}: gamma is \"auto\" but 'gammas_selected' is not a list of {n_tasks} positive numbers "
            f"(one per task boundary); {_LEARN_FIX}"
        )


def read_metrics(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``metrics.json`` (a file, or the run directory holding one).

    Wall times are not required (``seconds`` moved to ``timings.json``); ``gamma`` may be ``"auto"``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    metrics = read_json(path, "a run's metrics", _LEARN_FIX)
    if "accuracy_matrix" not in metrics:
        raise FoalPipeError(f"{path} has no 'accuracy_matrix'; it is not a foal-pipe metrics.json; {_LEARN_FIX}")
    metrics["accuracy_matrix"] = check_matrix(metrics["accuracy_matrix"], str(path))
    for key in ("A_avg", "A_last", "F"):
        if not is_number(metrics.get(key)):
            raise FoalPipeError(f"{path} has no number under {key!r}; {_LEARN_FIX}")
    _check_gamma(metrics, path)
    _check_classes(metrics, path)
    return metrics


def _check_classes(metrics: dict[str, Any], path: Path) -> None:
    """``tasks`` (label ids), ``task_names`` (a continued model's class names, task by task, as ``tasks``) and
    ``eval_features`` (the continued model on other stores), when present, are what ``learn`` writes."""
    tasks, names = metrics.get("tasks"), metrics.get("task_names")
    if tasks is not None and not (isinstance(tasks, list) and all(
            isinstance(t, list) and all(type(c) is int and c >= 0 for c in t) for t in tasks)):
        raise FoalPipeError(f"{path}: 'tasks' should be a list of lists of label ids; {_LEARN_FIX}")
    if names is not None and not (isinstance(names, list) and isinstance(tasks, list) and len(names) == len(tasks)
                                  and all(isinstance(n, list) and len(n) == len(t) and all(isinstance(x, str) for x in n)
                                          for n, t in zip(names, tasks))):
        raise FoalPipeError(f"{path}: 'task_names' should name the classes of 'tasks', task by task; {_LEARN_FIX}")
    entries = metrics.get("eval_features")
    if entries is not None and not (isinstance(entries, list) and all(
            isinstance(e, dict) and isinstance(e.get("features"), str) and is_number(e.get("accuracy"))
            and 0 <= e["accuracy"] <= 1 and all(type(e.get(k)) is int and e[k] >= 0
                                                for k in ("n_test", "unknown_class_rows")) for e in entries)):
        raise FoalPipeError(f"{path}: 'eval_features' should be a list of {{features, n_test, accuracy, "
                            f"unknown_class_rows}} entries; {_LEARN_FIX}")


def _check_criteria(res: dict[str, Any], where: str) -> None:
    for key in CRITERION_KEYS:
        values = res.get(key)
        if values is not None and not (
            isinstance(values, list) and values and all(v is None or is_number(v) for v in values)
        ):
            raise FoalPipeError(
                f"{where}: {key!r} should be a list of numbers (one per task boundary) or null; {_SWEEP_FIX}"
            )


def read_sweep(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``sweep.json`` (a file, or the directory holding one); results sorted by gamma.

    Sweeps written before GCV and leave-one-out (no ``selected_by``, no per-result ``gcv``/``loo_*``)
    are read too: their ``best_gamma`` was picked by test A_avg.
    """
    path = Path(path)
    if path.is_dir():
        path = path / SWEEP_FILE
    sweep = read_json(path, "a gamma sweep", _SWEEP_FIX)
    _check_results(sweep, str(path))
    selected_by = sweep.get("selected_by")
    if selected_by is not None and selected_by not in SELECTORS:
        raise FoalPipeError(
            f"{path}: 'selected_by' is {selected_by!r}; expected one of {', '.join(SELECTORS)}; {_SWEEP_FIX}"
        )
    if "fusions" in sweep:
        _check_fusions(sweep, path)
    return sweep


def _check_results(entry: dict[str, Any], where: str) -> None:
    """A sweep's (or one fusion's) ``results``, sorted by gamma in place, and its choices among them."""
    results = entry.get("results")
    if not isinstance(results, list) or not results:
        raise FoalPipeError(f"{where} has no 'results' list; it is not a foal-pipe sweep.json; {_SWEEP_FIX}")
    for i, res in enumerate(results):
        if not isinstance(res, dict) or not all(is_number(res.get(k)) for k in ("gamma", "A_avg", "A_last", "F")):
            raise FoalPipeError(f"{where}: results[{i}] needs numbers 'gamma', 'A_avg', 'A_last' and 'F'; {_SWEEP_FIX}")
        if res["gamma"] <= 0:
            raise FoalPipeError(f"{where}: results[{i}] has gamma {res['gamma']}; gammas must be > 0")
        _check_criteria(res, f"{where}: results[{i}]")
    entry["results"] = sorted(results, key=lambda r: r["gamma"])
    for key in ("best_gamma", "best_gamma_test"):
        if key in entry and not any(
            is_number(entry[key]) and math.isclose(entry[key], r["gamma"], rel_tol=1e-9) for r in results
        ):
            raise FoalPipeError(f"{where}: {key!r} {entry[key]!r} is not one of the gammas in 'results'; {_SWEEP_FIX}")


def _check_fusions(sweep: dict[str, Any], path: Path) -> None:
    """``sweep --fusions``: every fusion's entry, and the overall choices naming one of them and its gamma."""
    fusions = sweep["fusions"]
    if not isinstance(fusions, list) or not fusions or not all(isinstance(e, dict) and isinstance(e.get("fusion"), str)
                                                              for e in fusions):
        raise FoalPipeError(f"{path}: 'fusions' should be a list of entries, each with a 'fusion' spec; {_SWEEP_FIX}")
    for i, entry in enumerate(fusions):
        _check_results(entry, f"{path}: fusions[{i}]")
    by_name = {e["fusion"]: e for e in fusions}
    for key in ("best", "best_test"):
        choice = sweep.get(key)
        entry = by_name.get(choice.get("fusion")) if isinstance(choice, dict) else None
        if entry is None or not any(is_number(choice.get("gamma")) and math.isclose(choice["gamma"], r["gamma"], rel_tol=1e-9)
                                    for r in entry["results"]):
            raise FoalPipeError(f"{path}: {key!r} should name a fusion of 'fusions' and one of its gammas; {_SWEEP_FIX}")


def read_weight_norms(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Per-class L2 norms of W's columns from a ``model.safetensors``: ``(labels, norms, class names)``.

    The file is validated by :func:`foal_pipe.model.modelfile.read_model`, but only ``W`` and ``classes`` are read
    (not the learner state); names come from the ``class_names`` metadata, one per column of ``W``.
    """
    tensors, meta = read_model(path, names=("W", "classes"))
    W, classes = tensors["W"], tensors["classes"].reshape(-1)
    names = meta.get("class_names")
    return classes.astype(np.int64), np.linalg.norm(W.astype(np.float64), axis=0), names
