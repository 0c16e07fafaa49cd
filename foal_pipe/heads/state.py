"""A head's model as tensors and back: what the model file stores (:mod:`foal_pipe.model.modelfile`) for every head.

Each head's class names its tensors with their shapes in named dimensions (C: classes, d: the store's features,
D: the projection's width), split into what scoring needs (``scorer_tensors``) and what continuing needs
(``state_tensors``: the head's sufficient statistics, so a restored head adds rows exactly as if its stream had
never stopped), and converts both ways (:meth:`~foal_pipe.heads.base.HeadBase.state_dict`,
:meth:`~foal_pipe.heads.base.HeadBase.load_state_dict`). This module reads them from the registry. Every float is
float64, every integer int64, as the heads keep them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.core.backend import to_numpy
from foal_pipe.errors import FoalPipeError, clipped
from foal_pipe.heads import DEFAULT_HEAD, HEADS, make_head, taken_options
from foal_pipe.heads.base import HeadBase, Scorer
from foal_pipe.heads.moments import on_device


@dataclass(frozen=True)
class HeadFile:
    """One head's tensors in a model file, read from its class: ``scorer`` and ``state`` map names to named
    dimensions; ``weights`` names a linear head's weights (``evaluate``'s weight norms)."""

    head: type[HeadBase]

    @property
    def scorer(self) -> Mapping[str, tuple[str, ...]]:
        return self.head.scorer_tensors

    @property
    def state(self) -> Mapping[str, tuple[str, ...]]:
        return self.head.state_tensors

    @property
    def weights(self) -> str | None:
        return self.head.weight_tensor

    @property
    def tensors(self) -> dict[str, tuple[str, ...]]:
        return {**self.scorer, **self.state}


def file_heads() -> tuple[str, ...]:
    """The heads a head model file holds, read from the registry now (a head registered later is among them): every
    head but ridge, whose tensors (the same names) are the ridge model file's own, without a ``head`` key."""
    return tuple(name for name in HEADS if name != DEFAULT_HEAD)


def head_file(name: str) -> HeadFile:
    """Head ``name``'s tensors in its model file, read from its class (one of :func:`file_heads`)."""
    return HeadFile(HEADS[name].head)


def file_bytes(name: str, n_classes: int, width: int) -> int:
    """What writing head ``name``'s model file adds to the run's memory: its tensors exported to host float64 (fecam's
    and balanced's per-class stacks are new copies; on a device every tensor is), plus the finiteness check's
    one byte per value of the largest (:func:`~foal_pipe.model.modelfile.write_model` checks one at a time)."""
    sizes = [math.prod(n_classes if dim == "C" else width for dim in dims) for dims in head_file(name).tensors.values()]
    return 8 * (sum(sizes) + n_classes) + max(sizes)


def takes_batch_size(name: str) -> bool:
    """Whether head ``name`` depends on the stream's mini-batches (dual's recursion): its model file records them
    among its options."""
    return "batch_size" in HEADS[name].head.option_names()


def file_options(name: str) -> tuple[str, ...]:
    """The options a model file of head ``name`` records: the registry's, and ``batch_size`` where it matters."""
    return (*HEADS[name].options, *(("batch_size",) if takes_batch_size(name) else ()))


def file_schema(name: str, moved: bool) -> dict[str, tuple[tuple[str, ...], str]]:
    """Head ``name``'s model-file tensors: named dimensions and kind (``iu`` int64, ``f`` float); ``moved``: a head on
    the store's features given the activations (``--head-rows``), whose tensors are D wide where they say d, beside the
    projection (and ``cos``'s bias), which a head on projected rows or activations holds too."""
    named = {key: tuple("D" if moved and n == "d" else n for n in dims) for key, dims in head_file(name).tensors.items()}
    schema = {"classes": (("C",), "iu"), **{key: (dims, "iu" if key == "counts" else "f") for key, dims in named.items()}}
    projected = {"projection": (("d", "D"), "f"), "projection_bias": (("D",), "f")}
    return schema | (projected if HEADS[name].space != "features" or moved else {})


def options_problem(name: str, options: Mapping[str, Any]) -> str | None:
    """Why head ``name``'s options in a model file are not as the head holds them (a value it refuses, or one it
    converts: ``true`` or ``"0.5"`` for a float, ``10.0`` for an integer, which a continuation would write back), or
    None. ``options`` maps exactly :func:`file_options`."""
    try:
        head = make_head(name, options, np, 1)
    except FoalPipeError as exc:
        return f"holds a value the {name} head refuses ({exc})"
    for key, value in options.items():  # None: the head's default
        held = getattr(head, key)
        if value is not None and (type(value) is not type(held) or value != held):
            return (f"holds {key}={clipped(repr(value), 40)} ({type(value).__name__}), but the {name} head takes it as {held!r} "
                    f"({type(held).__name__})")
    return None


def export_head(name: str, head: Any, scorer: Scorer) -> dict[str, np.ndarray]:
    """The model-file tensors of ``head`` after its last boundary (``scorer``): host float64, ``classes`` int64."""
    tensors = {key: np.asarray(to_numpy(value), dtype=np.float64) for key, value in head.state_dict(scorer).items()}
    if "counts" in tensors:
        tensors["counts"] = tensors["counts"].astype(np.int64)
    tensors["classes"] = np.asarray(scorer.classes, dtype=np.int64)
    return tensors


def scorer_from(name: str, tensors: Mapping[str, np.ndarray], options: Any, xp: Any) -> Scorer:
    """The scorer the tensors hold, its arrays in namespace ``xp``. ``options``: the head's ``Options`` (a built head's
    ``options``), or a mapping of its option names to values, None the head's default as :func:`make_head` reads it;
    the head's ``scorer_from`` is given the ``Options``, so it never reads a None for a default it would refuse."""
    head = HEADS[name].head
    if isinstance(options, Mapping):
        options = head.Options(**taken_options(head, options))
    return head.scorer_from(np.asarray(tensors["classes"], dtype=np.int64),
                            {key: on_device(xp, tensors[key]) for key in head.scorer_tensors}, options)


def restore_head(head: Any, name: str, tensors: Mapping[str, np.ndarray]) -> Any:
    """``head`` (fresh, built with the model's options) holding the statistics the tensors hold."""
    head.load_state_dict(tensors)
    return head
