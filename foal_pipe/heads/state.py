"""A head's model as tensors and back: what the model file stores (:mod:`foal_pipe.model.modelfile`) for every head.

Each head's entry (:data:`HEAD_FILES`) names its tensors with their shapes in named dimensions (C: classes, d: the
store's features, D: the projection's width), splits them into what scoring needs (``scorer``) and what continuing
needs (``state``: the head's sufficient statistics, so a restored head adds rows exactly as if its stream had never
stopped), and converts both ways. Every float is float64, every integer int64, as the heads keep them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.core.backend import default_device, to_numpy
from foal_pipe.heads import HEADS
from foal_pipe.heads.balanced import BalancedHead
from foal_pipe.heads.balanced import LinearScorer as BalancedScorer
from foal_pipe.heads.base import Head, Scorer
from foal_pipe.heads.dual import DualHead, DualScorer
from foal_pipe.heads.fecam import FeCAMHead, MahalanobisScorer
from foal_pipe.heads.ncm import DistanceScorer, NCMHead
from foal_pipe.heads.slda import LinearScorer, SLDAHead


@dataclass(frozen=True)
class HeadFile:
    """One head's tensors in a model file: ``scorer`` and ``state`` map names to named dimensions; ``export(head,
    scorer)`` gives them all (host NumPy; ``classes`` apart), ``scorer_of(classes, tensors, options)`` the scorer
    and ``restore(head, tensors)`` loads the state into a fresh head; ``weights`` names a linear head's weights."""

    scorer: Mapping[str, tuple[str, ...]]
    state: Mapping[str, tuple[str, ...]]
    export: Callable[[Any, Any], dict[str, Any]]
    scorer_of: Callable[[np.ndarray, Mapping[str, Any], Mapping[str, Any]], Scorer]
    restore: Callable[[Any, Mapping[str, Any]], None]
    weights: str | None = None  # the tensor whose column k scores class k linearly (``evaluate``'s weight norms)

    @property
    def tensors(self) -> dict[str, tuple[str, ...]]:
        return {**self.scorer, **self.state}


def _on(xp: Any, a: Any) -> Any:
    return xp.asarray(np.asarray(a, dtype=np.float64), device=default_device(xp))


def _class_sums(sums: Any) -> dict[str, Any]:
    return {"counts": sums.counts.copy(), "sums": sums.sums, "shift": sums.shift[0, :]}


def _load_class_sums(sums: Any, classes: np.ndarray, t: Mapping[str, Any]) -> None:
    xp = sums.xp
    sums.classes, sums.counts = classes.copy(), np.asarray(t["counts"], dtype=np.int64).copy()
    sums.sums, sums.shift = _on(xp, t["sums"]), _on(xp, t["shift"])[None, :]
    sums.n = int(sums.counts.sum())
    if sums.gram is not None:
        sums.gram = _on(xp, t["gram"])


def _restore_class_sums(head: NCMHead | SLDAHead, t: Mapping[str, Any]) -> None:
    _load_class_sums(head.sums, t["classes"], t)


def _restore_fecam(head: FeCAMHead, t: Mapping[str, Any]) -> None:
    m, xp = head.moments, head.xp
    m.classes = np.asarray(t["classes"], dtype=np.int64).copy()
    m.counts = [int(n) for n in t["counts"]]
    m.shifts = [_on(xp, row) for row in t["shifts"]]
    m.sums = [_on(xp, row) for row in t["sums"]]
    m.grams = [_on(xp, gram) for gram in t["grams"]]


def _restore_balanced(head: BalancedHead, t: Mapping[str, Any]) -> None:
    xp = head.xp
    for k, c in enumerate(np.asarray(t["classes"]).tolist()):
        head._grams[c], head._sums[c] = _on(xp, t["grams"][k]), _on(xp, t["sums"][k])
        head._counts[c] = int(t["counts"][k])


def _restore_dual(head: DualHead, t: Mapping[str, Any]) -> None:
    """The recursion's state right after a boundary: no partial batch, ``R`` the exact inverse, every class seen
    an earlier task's (its residual columns zeroed from the next row on)."""
    head.classes_ = np.asarray(t["classes"], dtype=np.int64).copy()
    head.earlier_ = head.classes_.copy()
    head._state = {key: _on(head.xp, t[key]) for key in ("R", "G_main", "Q_main", "G_comp", "Q_comp")}


#: Every head but ridge (whose tensors are the model file's own): its tensors, scorer and restore.
HEAD_FILES: dict[str, HeadFile] = {
    "ncm": HeadFile(
        scorer={"means": ("C", "d")}, state={"counts": ("C",), "sums": ("d", "C"), "shift": ("d",)},
        export=lambda head, s: {"means": s.means, **_class_sums(head.sums)},
        scorer_of=lambda classes, t, _: DistanceScorer(classes, t["means"]),
        restore=_restore_class_sums),
    "slda": HeadFile(
        scorer={"W": ("d", "C"), "b": ("C",)},
        state={"counts": ("C",), "sums": ("d", "C"), "shift": ("d",), "gram": ("d", "d")},
        export=lambda head, s: {"W": s.W, "b": s.b, **_class_sums(head.sums), "gram": head.sums.gram},
        scorer_of=lambda classes, t, _: LinearScorer(classes, t["W"], t["b"]),
        restore=_restore_class_sums, weights="W"),
    "fecam": HeadFile(
        scorer={"means": ("C", "d"), "precisions": ("C", "d", "d")},
        state={"counts": ("C",), "shifts": ("C", "d"), "sums": ("C", "d"), "grams": ("C", "d", "d")},
        export=lambda head, s: {
            "means": np.stack([to_numpy(m) for m in s.means]), "precisions": np.stack([to_numpy(p) for p in s.precisions]),
            "counts": np.asarray(head.moments.counts, dtype=np.int64),
            **{key: np.stack([to_numpy(a) for a in getattr(head.moments, key)]) for key in ("shifts", "sums", "grams")}},
        scorer_of=lambda classes, t, _: MahalanobisScorer(classes, list(t["means"]), list(t["precisions"])),
        restore=_restore_fecam),
    "balanced": HeadFile(
        scorer={"W": ("D", "C")}, state={"counts": ("C",), "sums": ("C", "D"), "grams": ("C", "D", "D")},
        export=lambda head, s: {"W": s.W, "counts": head.counts_,
                                **{key: np.stack([to_numpy(part[c]) for c in head.classes_.tolist()])
                                   for key, part in (("sums", head._sums), ("grams", head._grams))}},
        scorer_of=lambda classes, t, _: BalancedScorer(classes, t["W"]),
        restore=_restore_balanced, weights="W"),
    "dual": HeadFile(
        scorer={"W_main": ("D", "C"), "W_comp": ("D", "C")},
        state={"R": ("D", "D"), "G_main": ("D", "D"), "Q_main": ("D", "C"), "G_comp": ("D", "D"), "Q_comp": ("D", "C")},
        export=lambda head, s: {"W_main": s.W_main, "W_comp": s.W_comp, **head._state},
        scorer_of=lambda classes, t, options: DualScorer(classes, t["W_main"], t["W_comp"],
                                                         float(options["compensation"])),
        restore=_restore_dual, weights="W_main"),
}


def file_bytes(name: str, n_classes: int, width: int) -> int:
    """What writing head ``name``'s model file adds to the run's memory: its tensors exported to host float64 (fecam's
    and balanced's per-class stacks are new copies; on a device every tensor is), plus the finiteness check's
    one byte per value of the largest (:func:`~foal_pipe.model.modelfile.write_model` checks one at a time)."""
    sizes = [math.prod(n_classes if dim == "C" else width for dim in dims) for dims in HEAD_FILES[name].tensors.values()]
    return 8 * (sum(sizes) + n_classes) + max(sizes)


def takes_batch_size(name: str) -> bool:
    """Whether head ``name`` depends on the stream's mini-batches (dual's recursion): its model file records them
    among its options."""
    return "batch_size" in inspect.signature(HEADS[name].factory).parameters


def file_options(name: str) -> tuple[str, ...]:
    """The options a model file of head ``name`` records: the registry's, and ``batch_size`` where it matters."""
    return (*HEADS[name].options, *(("batch_size",) if takes_batch_size(name) else ()))


def export_head(name: str, head: Head, scorer: Scorer) -> dict[str, np.ndarray]:
    """The model-file tensors of ``head`` after its last boundary (``scorer``): host float64, ``classes`` int64."""
    tensors = {key: np.asarray(to_numpy(value), dtype=np.float64)
               for key, value in HEAD_FILES[name].export(head, scorer).items()}
    if "counts" in tensors:
        tensors["counts"] = tensors["counts"].astype(np.int64)
    tensors["classes"] = np.asarray(scorer.classes, dtype=np.int64)
    return tensors


def scorer_from(name: str, tensors: Mapping[str, np.ndarray], options: Mapping[str, Any], xp: Any) -> Scorer:
    """The scorer the tensors hold, its arrays in namespace ``xp``."""
    entry = HEAD_FILES[name]
    return entry.scorer_of(np.asarray(tensors["classes"], dtype=np.int64),
                           {key: _on(xp, tensors[key]) for key in entry.scorer}, options)


def restore_head(head: Head, name: str, tensors: Mapping[str, np.ndarray]) -> Head:
    """``head`` (fresh, built with the model's options) holding the statistics the tensors hold."""
    HEAD_FILES[name].restore(head, tensors)
    return head
