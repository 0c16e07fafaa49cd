"""Which of a caller's settings ``learn --init-model`` checks against the model: those the model fixes, a head's and
the gamma search's, each where the caller gave it (:func:`given_settings`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from foal_pipe.protocol.config import ModelConfig, StreamConfig

#: ModelConfig fields a saved model fixes (its sums were computed with them).
FIXED_BY_MODEL = ("gamma", "projection_dim", "activation", "dtype")
#: ModelConfig fields of the gamma search: a continued model with a fixed gamma, or a head, would ignore them.
SEARCH_SETTINGS = ("select", "gamma_grid", "per_decade", "loo_sample")
#: Every ModelConfig field a continuation checks against the model, where given.
CHECKED = (*FIXED_BY_MODEL, "head", "head_rows", "engine", *SEARCH_SETTINGS)


def _plain(value: Any) -> Any:
    """A list as the tuple a default holds (a grid given as ``[0.1, 1]`` is the grid ``(0.1, 1)``)."""
    return tuple(value) if isinstance(value, list) else value


def given_settings(model: ModelConfig, named: Collection[str] = ()) -> list[str]:
    """The fields of :data:`CHECKED` the caller gave: those ``named`` (typed on the command line, a default value
    included) and those set to another value than ``ModelConfig()``'s (a Python caller names none, yet gave them):
    each is checked against the model, none is replaced by the model's in silence."""
    default = ModelConfig()
    return [name for name in CHECKED if name in named or _plain(getattr(model, name)) != _plain(getattr(default, name))]


def model_batches(stream: StreamConfig, options: dict[str, Any], explicit: Collection[str]) -> StreamConfig:
    """The stream on the mini-batches a continued head's recursion ran on (``options["batch_size"]``, dual's), where
    the caller gave none: ``batch_size`` not typed (``explicit``) and at its default, as the model supplies its
    projection and gamma (docs/heads.md); a batch size given that differs is refused where the head is checked."""
    if "batch_size" not in options or "batch_size" in explicit or stream.batch_size != StreamConfig().batch_size:
        return stream
    return replace(stream, batch_size=int(options["batch_size"]))
