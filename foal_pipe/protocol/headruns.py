"""``learn --head`` and ``sweep --heads``: the heads of :mod:`foal_pipe.heads` through the one-read walk, their
settings checked before any work and recorded with their options (defaults included)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from foal_pipe.core.activations import BIASED
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import HEADS, head_entry, make_head
from foal_pipe.protocol.capabilities import Settings, check_capabilities
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig

#: ModelConfig fields of the projection and the ridge solver: a head on the store's features takes none of them.
PROJECTION_FIELDS = ("projection_dim", "projection_init", "activation", "gamma", "select", "gamma_grid", "engine")
#: ModelConfig fields of ridge's own solver: no other head takes them.
RIDGE_FIELDS = ("select", "gamma_grid", "engine", "loo_sample")


def _numpy() -> Any:
    import array_api_compat.numpy as xp

    return xp


def head_space(name: str, model: ModelConfig) -> str:
    """The rows head ``name`` takes in a run of ``model``: its own (:data:`foal_pipe.heads.SPACES`), or the
    activations where ``head_rows`` puts a head on the store's features there."""
    own = HEADS[name].space
    return "activations" if own == "features" and model.head_rows == "activations" else own


def check_head_rows(names: Sequence[str], model: ModelConfig) -> None:
    """``head_rows`` applies to the heads on the store's features; any other head is refused with it."""
    if model.head_rows is None:
        return
    for name in names:
        own = HEADS[name].space
        if own != "features":
            rows = "rows (before the activation)" if own == "projected" else "activations"
            raise FoalPipeError(f"{param('head', name)} is defined on the projection's {rows}; drop "
                                f"{param('head_rows', model.head_rows)} (it moves a head on the store's features)")


def check_ridge_model_file(model: ModelConfig) -> None:
    """``learn`` with ridge writes a ridge model file, which holds no projection bias: ``--activation cos`` (random
    Fourier features, whose bias it would drop) refused before any work; ``sweep`` writes no model and takes it."""
    if model.resolved_activation in BIASED:
        raise FoalPipeError(f"{param('activation', model.resolved_activation)} draws a projection bias that ridge's "
                            f"model file does not hold; use it with a head ({param('head', 'slda')} "
                            f"{param('head_rows', 'activations')}) or in `sweep`, or pass {param('activation', 'relu')}")


def resolved_options(name: str, model: ModelConfig) -> dict[str, Any]:
    """The options head ``name`` runs with, as the head holds them (its attribute of each option's name): those
    ``model`` gives, else the head's defaults (dual's ``gamma_comp``: its ``gamma``)."""
    entry = HEADS[name]
    given = model.options_for(name)
    if entry.gram_lanes:
        return given
    if given.get("gamma") == "auto":  # ridge's search, no value of another head's: its default
        del given["gamma"]
    head = make_head(name, given, _numpy(), 1)
    return {key: getattr(head, key) for key in entry.options}


def _refusal(name: str, options: Mapping[str, Any]) -> FoalPipeError | None:
    """Head ``name``'s refusal of ``options`` (None: it takes them)."""
    try:
        make_head(name, options, _numpy(), 1)
    except FoalPipeError as exc:
        return exc
    return None


def _check_own_options(name: str, names: Sequence[str], model: ModelConfig) -> None:
    """Head ``name``'s own checks of its options. One option sets every head of ``names`` that takes it (slda's and
    fecam's ``shrinkage``): a value ``name`` refuses and another takes is refused with the head's reason and the way
    out, not the head's own fix, which would change the other's value too."""
    if _refusal(name, model.head_options) is None:
        return
    for option, value in model.head_options.items():
        takers = [n for n in names if n != name and option in HEADS[n].options and _refusal(n, {option: value}) is None]
        own = _refusal(name, {option: value}) if option in HEADS[name].options and takers else None
        if own is not None:
            others = " and ".join(takers)
            raise FoalPipeError(f"{own.reason}, and {param('heads')} gives {others} the same {param(option)} (one sets every "
                                f"head that takes it): run {name} and {others} in separate commands, each with its own "
                                f"{param(option)}, or drop one of them from {param('heads')}")
    make_head(name, model.head_options, _numpy(), 1)  # the head's own refusal


def check_head_options(names: Sequence[str], model: ModelConfig, explicit: Sequence[str] | None = None) -> None:
    """Refuse an option that none of ``names`` takes: one of ``model.head_options`` (each given), or, when every
    head works on the store's features, a projection option (``explicit``: the fields the user gave; None: those that
    differ from the defaults)."""
    defaults = ModelConfig()
    if explicit is None:
        explicit = [f for f in PROJECTION_FIELDS if getattr(model, f) != getattr(defaults, f)]
    entries = {name: head_entry(name) for name in names}
    taken = {option for entry in entries.values() for option in entry.options}
    for option in model.head_options:
        if option not in taken:
            users = [n for n, e in HEADS.items() if option in e.options]
            raise FoalPipeError(f"{param(option)} is an option of {' and '.join(users)}, not of "
                                f"{', '.join(names)}: drop it")
    for name, entry in entries.items():  # the head's own checks of its options, before any work
        if not entry.gram_lanes:
            _check_own_options(name, names, model)
    if "ridge" not in names:
        for option in RIDGE_FIELDS:
            if option in explicit:
                raise FoalPipeError(f"{param(option)} sets ridge's solver, which {', '.join(names)} do"
                                    f"{'es' if len(names) == 1 else ''} not use: drop it")
    check_head_rows(names, model)
    if "activation" in explicit and all(e.space == "projected" for e in entries.values()):
        raise FoalPipeError(f"{', '.join(names)} applie{'s' if len(names) == 1 else ''} its own activations to the "
                            f"projected rows: drop {param('activation')}")
    if all(head_space(name, model) == "features" for name in names):
        for option in PROJECTION_FIELDS:
            if option in explicit:
                hint = (f"; or pass {param('head_rows', 'activations')} to give it the projection's activations"
                        if option != "gamma" and len(names) == 1 else "")
                raise FoalPipeError(f"{', '.join(names)} work{'s' if len(names) == 1 else ''} on the store's features "
                                    f"(after {param('fusion')}), without a projection or gamma: drop {param(option)}"
                                    f"{hint}")
    elif "gamma" in explicit and not any("gamma" in entries[name].options for name in names):
        raise FoalPipeError(f"{', '.join(names)} take{'s' if len(names) == 1 else ''} no gamma: drop {param('gamma')}")


def check_learn_head(model: ModelConfig, evaluation: EvaluationConfig, execution: ExecutionConfig,
                     stream: StreamConfig | None = None) -> ModelConfig:
    """``learn --head`` other than ridge: its settings checked against the capability table
    (:data:`~foal_pipe.protocol.capabilities.CAPABILITIES`); the model settings it runs with (a head on the store's
    features: no projection; a head on the projected rows: no activation, as its model file records)."""
    head_entry(model.head)
    check_capabilities([model.head], Settings(stream or StreamConfig(), model, evaluation, execution))
    space = head_space(model.head, model)
    if space == "features":
        return replace(model, projection_dim=0, activation=None)
    if space == "projected":
        return replace(model, activation="identity")
    return model


def check_sweep_heads(sweep: SweepConfig, model: ModelConfig) -> list[str]:
    """``sweep --heads``: the names checked (ridge among them: its gamma sweep gives the sweep's own keys) and the
    heads other than ridge, which the walk adds."""
    names = list(sweep.heads)
    if not names:
        check_head_options(["ridge"], model)
        return []
    for name in names:
        head_entry(name, "heads")
    if len(set(names)) < len(names):
        raise FoalPipeError(f"{param('heads')} names a head twice; name each once")
    if "ridge" not in names:
        raise FoalPipeError(f"{param('heads')} compares heads beside ridge's gamma sweep; add ridge (for one head alone: "
                            "`learn --head NAME`)")
    if model.head_rows is not None:
        raise FoalPipeError(f"{param('heads')} compares the heads on their own rows; drop {param('head_rows')} (or run "
                            f"`learn --head NAME --head-rows {model.head_rows}`)")
    check_head_options(names, model)
    return [name for name in names if not HEADS[name].gram_lanes]
