"""Evaluate a finished run: plots (PNG), plot data for DVC (CSV), and a ``summary.md``.

A run directory is what ``foal-pipe learn --out DIR`` writes: ``metrics.json`` (required) and
``model.safetensors`` (optional here). A sweep (``sweep.json`` from ``foal-pipe sweep``) is read from the
run directory or from a path given separately. :func:`evaluate` writes, into one output directory:

=======================  ============================================================================
``accuracy_matrix.png``  heatmap of a[i][j], accuracy on task j after training through task i
``steps.png``            A_i, the newest task's and the first task's accuracy after each step
``weight_norms.png``     L2 norm of each class's column of W, coloured by task (the recency-bias figure)
``gamma.png``            A_avg and A_last against gamma, from a sweep (with the paper's curve if comparable)
``*.csv``                the same data for ``dvc plots``: ``steps``, ``accuracy_matrix``,
                         ``weight_norms``, ``gamma``
``summary.md``           the headline metrics (beside the paper's Table 2 when comparable), the matrix
``scores.json``          A_avg, A_last, F, F_published_code and the sweep's best gamma, for ``dvc metrics``
=======================  ============================================================================

Metrics are fractions in the JSON files and percent in plots and summaries. Every headline number is
recomputed from the accuracy matrix (paper Eq. 17-18) and a disagreement is reported, not hidden.
matplotlib is imported only when plotting, with the non-interactive Agg backend.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_path, write_json
from foal_pipe.metrics import summarize
from foal_pipe.paper import GAMMAS, PAPER, PaperMatch, match_paper, recipe_notes

METRICS_FILE = "metrics.json"
SWEEP_FILE = "sweep.json"
MODEL_FILE = "model.safetensors"
SUMMARY_FILE = "summary.md"
SCORES_FILE = "scores.json"
DEFAULT_OUT = "eval"
#: Largest disagreement tolerated between a stored metric and its recomputation from the matrix.
TOLERANCE = 1e-6
_HEADLINE = ("A_avg", "A_last", "F", "F_published_code")
_OUTPUTS = frozenset(
    f"{stem}.{ext}" for stem in ("accuracy_matrix", "steps", "weight_norms", "gamma") for ext in ("png", "csv")
)


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

    @property
    def matrix(self) -> list[list[float]]:
        return self.metrics["accuracy_matrix"]

    @property
    def dataset(self) -> str:
        return str(self.metrics.get("dataset", "?"))


@dataclass
class Evaluation:
    """What :func:`evaluate` produced."""

    run: Run
    out: Path
    files: list[Path] = field(default_factory=list)
    paper: PaperMatch | None = None
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Metrics from an accuracy matrix (paper Eq. 17-18), used to cross-check metrics.json


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
    """Stored headline metrics that disagree with their recomputation from the accuracy matrix."""
    recomputed = summarize(metrics["accuracy_matrix"])
    out = []
    for key in _HEADLINE:
        stored = metrics.get(key)
        if isinstance(stored, (int, float)) and abs(stored - recomputed[key]) > TOLERANCE:
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


# --------------------------------------------------------------------------------------------------
# Reading runs


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
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


def read_metrics(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``metrics.json`` (a file, or the run directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    fix = "re-run `foal-pipe learn --out DIR` (or `dvc repro`) to write it"
    metrics = _read_json(path, "a run's metrics", fix)
    if "accuracy_matrix" not in metrics:
        raise FoalPipeError(f"{path} has no 'accuracy_matrix'; it is not a foal-pipe metrics.json; {fix}")
    metrics["accuracy_matrix"] = check_matrix(metrics["accuracy_matrix"], str(path))
    for key in ("A_avg", "A_last", "F"):
        if not isinstance(metrics.get(key), (int, float)) or isinstance(metrics.get(key), bool):
            raise FoalPipeError(f"{path} has no number under {key!r}; {fix}")
    return metrics


def read_sweep(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``sweep.json`` (a file, or the directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / SWEEP_FILE
    fix = "re-run `foal-pipe sweep --out DIR` to write it"
    sweep = _read_json(path, "a gamma sweep", fix)
    results = sweep.get("results")
    if not isinstance(results, list) or not results:
        raise FoalPipeError(f"{path} has no 'results' list; it is not a foal-pipe sweep.json; {fix}")
    for i, res in enumerate(results):
        if not isinstance(res, dict) or not all(
            isinstance(res.get(k), (int, float)) for k in ("gamma", "A_avg", "A_last", "F")
        ):
            raise FoalPipeError(f"{path}: results[{i}] needs numbers 'gamma', 'A_avg', 'A_last' and 'F'; {fix}")
        if res["gamma"] <= 0:
            raise FoalPipeError(f"{path}: results[{i}] has gamma {res['gamma']}; gammas must be > 0")
    sweep["results"] = sorted(results, key=lambda r: r["gamma"])
    return sweep


def read_weight_norms(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Per-class L2 norms of W's columns from a ``model.safetensors``: ``(labels, norms, class names)``.

    Only ``W`` and ``classes`` are read (not the learner state); names come from the ``classes_names``
    metadata when ``learn`` stored it.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FoalPipeError(f"model file {path} does not exist; re-run `foal-pipe learn` or leave out --model")
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys, meta = set(f.keys()), f.metadata() or {}
            if not {"W", "classes"} <= keys:
                raise FoalPipeError(f"{path} lacks the tensor 'W' or 'classes'; pass the model.safetensors learn wrote")
            W, classes = np.asarray(f.get_tensor("W")), np.asarray(f.get_tensor("classes")).reshape(-1)
    except FoalPipeError:
        raise
    except Exception:  # safetensors raises several types for a damaged or foreign file
        raise FoalPipeError(f"{path} is not a readable safetensors model; re-run `foal-pipe learn`") from None
    if W.ndim != 2 or W.shape[1] != classes.size:
        raise FoalPipeError(
            f"{path}: W has shape {W.shape} but there are {classes.size} class ids; expected W of shape (D, C)"
        )
    try:
        names = json.loads(meta["classes_names"]) if "classes_names" in meta else None
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list):
        names = None
    return classes.astype(np.int64), np.linalg.norm(W.astype(np.float64), axis=0), names


def load_run(
    run_dir: str | Path,
    sweep: str | Path | None = None,
    model: str | Path | None = None,
) -> Run:
    """Read a run directory: ``metrics.json`` is required; the sweep and model are read when present.

    ``sweep`` and ``model`` name other files (or, for the sweep, a directory) explicitly; then they must
    exist. By default ``DIR/sweep.json`` and ``DIR/model.safetensors`` are used if they exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FoalPipeError(f"run directory {run_dir} does not exist; run `foal-pipe learn --out {run_dir}` first")
    if not run_dir.is_dir():
        raise FoalPipeError(f"{run_dir} is not a directory; --run takes the directory `foal-pipe learn --out` wrote")
    if not (run_dir / METRICS_FILE).exists():
        raise FoalPipeError(
            f"{run_dir} has no {METRICS_FILE}; run `foal-pipe learn --out {run_dir}` first (or check the path)"
        )
    run = Run(path=run_dir, metrics=read_metrics(run_dir / METRICS_FILE))
    sweep_path = Path(sweep) if sweep is not None else run_dir / SWEEP_FILE
    if sweep is not None or sweep_path.exists():
        run.sweep = read_sweep(sweep_path)
        run.sweep_path = sweep_path / SWEEP_FILE if sweep_path.is_dir() else sweep_path
    model_path = Path(model) if model is not None else run_dir / MODEL_FILE
    if model is not None or model_path.exists():
        run.weight_norms = read_weight_norms(model_path)
        run.model_path = model_path
    return run


# --------------------------------------------------------------------------------------------------
# Plot data


def _task_of(tasks: Any) -> dict[int, int]:
    """Label id -> task index, from the stream's ``tasks`` (list of lists of label ids)."""
    if not isinstance(tasks, list):
        return {}
    return {int(label): t for t, labels in enumerate(tasks) for label in labels}


def weight_norm_rows(run: Run) -> list[dict[str, Any]]:
    """One row per class in stream order (then unseen classes by label): position, label, task, norm."""
    if run.weight_norms is None:
        return []
    labels, norms, names = run.weight_norms
    task_of = _task_of(run.metrics.get("tasks"))
    stream = [int(lab) for t in run.metrics.get("tasks") or [] for lab in t]
    order = {label: i for i, label in enumerate(stream)}
    idx = sorted(range(labels.size), key=lambda k: (order.get(int(labels[k]), len(order)), int(labels[k])))
    return [
        {
            "position": pos,
            "label": int(labels[k]),
            "name": names[int(labels[k])] if names and 0 <= int(labels[k]) < len(names) else "",
            "task": task_of[int(labels[k])] + 1 if int(labels[k]) in task_of else "",
            "norm": float(norms[k]),
        }
        for pos, k in enumerate(idx)
    ]


def step_rows(run: Run) -> list[dict[str, Any]]:
    """After each task i: A_i, the newest task's accuracy a[i][i] and the first task's a[i][0] (percent)."""
    a = run.matrix
    steps = summarize(a)["A_steps"]
    return [
        {"step": i + 1, "A_i": 100 * steps[i], "newest_task": 100 * row[i], "first_task": 100 * row[0]}
        for i, row in enumerate(a)
    ]


def matrix_rows(run: Run) -> list[dict[str, Any]]:
    return [
        {"after_task": i + 1, "task": j + 1, "accuracy": 100 * v}
        for i, row in enumerate(run.matrix)
        for j, v in enumerate(row)
    ]


def gamma_rows(run: Run) -> list[dict[str, Any]]:
    if run.sweep is None:
        return []
    return [
        {"gamma": r["gamma"], "A_avg": 100 * r["A_avg"], "A_last": 100 * r["A_last"], "F": 100 * r["F"]}
        for r in run.sweep["results"]
    ]


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
    return path


def scores(run: Run) -> dict[str, float]:
    """The headline numbers (fractions) for ``dvc metrics``: the run's, and the sweep's best gamma."""
    out = {key: float(run.metrics[key]) for key in _HEADLINE if isinstance(run.metrics.get(key), (int, float))}
    if run.sweep is not None:
        best = max(run.sweep["results"], key=lambda r: r["A_avg"])
        out.update(sweep_best_gamma=float(best["gamma"]), sweep_best_A_avg=float(best["A_avg"]))
    return out


def write_plot_data(run: Run, out: Path) -> list[Path]:
    """The CSV files ``dvc plots`` reads; those without data (no model, no sweep) are not written."""
    tables = {
        "steps.csv": step_rows(run),
        "accuracy_matrix.csv": matrix_rows(run),
        "weight_norms.csv": weight_norm_rows(run),
        "gamma.csv": gamma_rows(run),
    }
    return [_write_csv(out / name, rows) for name, rows in tables.items() if rows]


# --------------------------------------------------------------------------------------------------
# Plots (matplotlib, imported lazily, Agg backend, no pyplot state)


def _figure(size: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=110, layout="constrained")


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def _title(run: Run) -> str:
    m = run.metrics
    encoder = (m.get("encoder") or {}).get("name", "?")
    return f"{run.dataset} · {encoder} · γ={m.get('gamma', '?')} · D={m.get('projection_dim', '?')}"


def plot_accuracy_matrix(run: Run, path: Path) -> Path:
    a = run.matrix
    T = len(a)
    grid = np.full((T, T), np.nan)
    for i, row in enumerate(a):
        grid[i, : i + 1] = 100 * np.asarray(row)
    fig = _figure((1.6 + 0.55 * max(T, 4), 1.2 + 0.5 * max(T, 4)))
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", origin="upper")
    fig.colorbar(image, ax=ax, label="accuracy (%)", shrink=0.85)
    if T <= 20:
        for i in range(T):
            for j in range(i + 1):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=8,
                        color="white" if grid[i, j] < 60 else "black")
    ticks = range(T) if T <= 20 else range(0, T, max(1, T // 10))
    ax.set_xticks(list(ticks), [str(t + 1) for t in ticks])
    ax.set_yticks(list(ticks), [str(t + 1) for t in ticks])
    ax.set_xlabel("evaluated on task j")
    ax.set_ylabel("after training through task i")
    ax.set_title(f"accuracy a[i][j]\n{_title(run)}", fontsize=9)
    return _save(fig, path)


def plot_steps(run: Run, path: Path) -> Path:
    rows = step_rows(run)
    x = [r["step"] for r in rows]
    fig = _figure((6.4, 4.0))
    ax = fig.add_subplot()
    ax.plot(x, [r["A_i"] for r in rows], "o-", label="A_i (mean over tasks seen)", lw=2)
    ax.plot(x, [r["newest_task"] for r in rows], "s--", label="newest task a[i][i]")
    ax.plot(x, [r["first_task"] for r in rows], "^:", label="first task a[i][1]")
    ax.set_xlabel("task (step i)")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(x if len(x) <= 20 else x[:: max(1, len(x) // 10)])
    low = min(min(r["A_i"], r["newest_task"], r["first_task"]) for r in rows)
    ax.set_ylim(max(0.0, low - 5), 100.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    m = run.metrics
    ax.set_title(f"A_avg {100 * m['A_avg']:.1f}%, A_last {100 * m['A_last']:.1f}%, F {100 * m['F']:.1f}%\n"
                 f"{_title(run)}", fontsize=9)
    return _save(fig, path)


def plot_weight_norms(run: Run, path: Path) -> Path:
    rows = weight_norm_rows(run)
    fig = _figure((7.2, 3.8))
    ax = fig.add_subplot()
    tasks = sorted({r["task"] for r in rows if r["task"] != ""})
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(tasks) <= 10 else "viridis"]
    color = {t: cmap(k % 10 if len(tasks) <= 10 else k / max(1, len(tasks) - 1)) for k, t in enumerate(tasks)}
    for t in tasks + [""]:
        sel = [r for r in rows if r["task"] == t]
        if sel:
            ax.bar([r["position"] for r in sel], [r["norm"] for r in sel], width=0.85,
                   color=color.get(t, "lightgray"), label=f"task {t}" if t != "" else "not in stream")
    mean = float(np.mean([r["norm"] for r in rows]))
    ax.axhline(mean, color="black", lw=0.8, ls="--", label="mean")
    if len(rows) <= 40:
        ticks = [str(r["name"] or r["label"])[:12] for r in rows]
        ax.set_xticks([r["position"] for r in rows], ticks, fontsize=7, rotation=90 if len(rows) > 12 else 0)
        ax.set_xlabel("class, in stream order")
    else:
        ax.set_xlabel("class, in stream order")
    ax.set_ylabel("‖W[:, c]‖₂")
    ax.set_title(f"per-class weight norms (recency bias shows as taller late tasks)\n{_title(run)}", fontsize=9)
    if len(tasks) <= 12:
        ax.legend(fontsize=7, ncol=min(6, len(tasks) + 1), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    return _save(fig, path)


def plot_gamma(run: Run, path: Path, paper: PaperMatch | None) -> Path:
    rows = gamma_rows(run)
    fig = _figure((6.4, 4.0))
    ax = fig.add_subplot()
    g = [r["gamma"] for r in rows]
    ax.plot(g, [r["A_avg"] for r in rows], "o-", lw=2, label="A_avg (ours)")
    ax.plot(g, [r["A_last"] for r in rows], "s--", label="A_last (ours)")
    best = max(rows, key=lambda r: r["A_avg"])
    ax.axvline(best["gamma"], color="gray", lw=0.8, ls=":", label=f"best γ = {best['gamma']:g}")
    if paper is not None and paper.comparable and paper.row.gamma_A_avg:
        ax.plot(GAMMAS, paper.row.gamma_A_avg, "x-.", color="black", label="A_avg (paper, appendix gamma table)")
    ax.set_xscale("log")
    ax.set_xlabel("γ (ridge regularisation, R0 = I/γ)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    s = run.sweep or {}
    enc = (s.get("encoder") or {}).get("name", "?")
    ax.set_title(f"gamma sweep · {s.get('dataset', run.dataset)} · {enc} · D={s.get('projection_dim', '?')}",
                 fontsize=9)
    return _save(fig, path)


# --------------------------------------------------------------------------------------------------
# summary.md


def pct(x: float | None, digits: int = 2) -> str:
    """A fraction as a percent string; ``-`` for missing or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}f}"


def describe(metrics: dict[str, Any]) -> str:
    """One line of the settings that produced a run."""
    m = metrics
    enc = m.get("encoder") or {}
    enc_bits = ", ".join(f"{k} {enc[k]}" for k in ("fusion", "image_size", "normalize") if k in enc)
    n_tasks = m.get("n_tasks", len(m.get("tasks") or []) or len(m["accuracy_matrix"]))
    parts = [
        f"encoder `{enc.get('name', '?')}`" + (f" ({enc_bits})" if enc_bits else ""),
        f"{n_tasks} tasks",
        f"D={m.get('projection_dim', '?')}",
        f"gamma={m.get('gamma', '?')}",
        f"batch {m.get('batch_size', '?')}",
        f"seed {m.get('seed', '?')}",
        f"engine {m.get('engine', '?')} {m.get('dtype', '')} {m.get('backend', '')}".rstrip(),
    ]
    if "n_train_seen" in m:
        parts.append(f"{m['n_train_seen']} training samples")
    if isinstance(m.get("seconds"), (int, float)):
        parts.append(f"{m['seconds']:.1f} s")
    return " · ".join(parts)


def summary_markdown(ev: Evaluation) -> str:
    """The ``summary.md`` text: settings, headline metrics (with the paper's), matrix, sweep, plots."""
    run, m = ev.run, ev.run.metrics
    lines = [f"# F-OAL run: {run.dataset}", "", f"Run `{run.path}`: {describe(m)}.", ""]
    paper = ev.paper
    show_paper = paper is not None and paper.comparable
    lines += ["## Results", ""]
    if show_paper:
        lines += [f"| metric | ours | paper ({paper.row.title}) | ours - paper |", "|---|---:|---:|---:|"]
    else:
        lines += ["| metric | ours |", "|---|---:|"]
    labels = {"A_avg": "A_avg (%)", "A_last": "A_last (%)", "F": "F (%)", "F_published_code": "F, published code (%)"}
    for key, label in labels.items():
        ours = m.get(key)
        if not isinstance(ours, (int, float)):
            continue
        if show_paper:
            ref = paper.row.metrics().get(key)
            ref_s = f"{100 * ref:.1f}" if ref is not None else "-"
            delta = f"{100 * (ours - ref):+.1f}" if ref is not None else "-"
            lines.append(f"| {label} | {pct(ours)} | {ref_s} | {delta} |")
        else:
            lines.append(f"| {label} | {pct(ours)} |")
    lines.append("")
    if paper is None:
        lines.append(f"The paper's Table 2 has no `{run.dataset}` column, so there is nothing to compare with.")
    elif paper.comparable:
        lines.append(
            f"Same dataset and settings as the {paper.row.title} column of {PAPER} "
            f"(ViT-B/16, D=1000, gamma 1, batch 10, {paper.row.n_tasks} tasks); the paper reports a mean of 3 runs."
        )
    else:
        r = paper.row
        lines.append(
            f"Not compared with the paper's {r.title} column (A_avg {r.A_avg}, A_last {r.A_last}, F {r.F}): "
            f"this run differs in {'; '.join(paper.differences)}."
        )
    notes = recipe_notes(m) if paper is not None else []
    if notes:
        lines.append(f"Departures from the published code: {'; '.join(notes)}.")
    for w in ev.warnings:
        lines.append(f"**Warning:** {w}.")
    lines.append("")

    a = run.matrix
    T = len(a)
    steps = summarize(a)["A_steps"]
    lines += ["## Accuracy matrix (%)", "", "Row i: after training through task i; column j: test set of task j.", ""]
    lines.append("| after task | " + " | ".join(f"T{j + 1}" for j in range(T)) + " | A_i |")
    lines.append("|---:|" + "---:|" * (T + 1))
    for i, row in enumerate(a):
        cells = [pct(v, 1) for v in row] + [""] * (T - i - 1)
        lines.append(f"| {i + 1} | " + " | ".join(cells) + f" | {pct(steps[i])} |")
    tasks = m.get("tasks")
    if isinstance(tasks, list) and tasks:
        lines += ["", "Classes per task (label ids, stream order): "
                  + "; ".join(f"T{t + 1}: {', '.join(map(str, labels))}" for t, labels in enumerate(tasks[:20]))
                  + ("; ..." if len(tasks) > 20 else "")]
    lines.append("")

    if run.sweep is not None:
        s = run.sweep
        sweep_paper = match_paper(s, ignore=("gamma",)) if s.get("dataset") else None
        with_paper = sweep_paper is not None and sweep_paper.comparable
        lines += ["## Gamma sweep", "", f"From `{run.sweep_path}`.", ""]
        head = "| gamma | A_avg (%) | A_last (%) | F (%) |" + (" paper A_avg (%) |" if with_paper else "")
        lines += [head, "|---:|---:|---:|---:|" + ("---:|" if with_paper else "")]
        for r in s["results"]:
            row = f"| {r['gamma']:g} | {pct(r['A_avg'])} | {pct(r['A_last'])} | {pct(r['F'])} |"
            if with_paper:
                ref = dict(zip(GAMMAS, sweep_paper.row.gamma_A_avg))
                match = next((v for g, v in ref.items() if math.isclose(g, r["gamma"], rel_tol=1e-9)), None)
                row += f" {match if match is not None else '-'} |"
            lines.append(row)
        best = max(s["results"], key=lambda r: r["A_avg"])
        lines += ["", f"Best gamma by A_avg: {best['gamma']:g} ({pct(best['A_avg'])}%).", ""]

    pngs = [f for f in ev.files if f.suffix == ".png"]
    if pngs:
        lines += ["## Plots", ""]
        lines += [f"![{f.stem.replace('_', ' ')}]({f.name})" for f in pngs]
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The whole evaluation


def evaluate(
    run_dir: str | Path,
    out: str | Path | None = None,
    sweep: str | Path | None = None,
    model: str | Path | None = None,
    plots: bool = True,
) -> Evaluation:
    """Read a run and write its plots, plot data and ``summary.md`` into ``out`` (default ``RUN/eval``).

    Returns the :class:`Evaluation`: the files written, the paper match and any consistency warnings.
    """
    run = load_run(run_dir, sweep=sweep, model=model)
    out = Path(out) if out is not None else run.path / DEFAULT_OUT
    if out.exists() and not out.is_dir():
        raise FoalPipeError(f"--out {out} is a file; give a directory for the plots and summary")
    out.mkdir(parents=True, exist_ok=True)
    ev = Evaluation(run=run, out=out, paper=match_paper(run.metrics), warnings=consistency_warnings(run.metrics))
    ev.files += write_plot_data(run, out)
    ev.files.append(write_json(out / SCORES_FILE, scores(run)))
    if plots:
        ev.files.append(plot_accuracy_matrix(run, out / "accuracy_matrix.png"))
        ev.files.append(plot_steps(run, out / "steps.png"))
        if run.weight_norms is not None:
            ev.files.append(plot_weight_norms(run, out / "weight_norms.png"))
        if run.sweep is not None:
            sweep_paper = match_paper(run.sweep, ignore=("gamma",)) if run.sweep.get("dataset") else None
            ev.files.append(plot_gamma(run, out / "gamma.png", sweep_paper))
    with atomic_path(out / SUMMARY_FILE) as tmp:
        tmp.write_text(summary_markdown(ev))
    ev.files.append(out / SUMMARY_FILE)
    for name in _OUTPUTS - {f.name for f in ev.files}:  # left by an earlier evaluation with a sweep or model
        (out / name).unlink(missing_ok=True)
    return ev


# --------------------------------------------------------------------------------------------------
# Summaries of many runs (``foal-pipe summary``)


@dataclass
class RunSummary:
    """One row of ``foal-pipe summary``: a learn run (``metrics``) or a sweep (``sweep``)."""

    path: Path
    metrics: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None


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
