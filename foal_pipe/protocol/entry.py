"""The library's entry points, ``learn(features, out, settings)`` and ``sweep(features, out, settings)``: they refuse
the option combinations no run can take (one declarative table, :data:`LEARN_RULES`, :data:`SWEEP_RULES`, in the
spirit of scikit-learn's ``_parameter_constraints``; what a head cannot take is the capability table,
:mod:`foal_pipe.protocol.capabilities`) and dispatch: a continued model (its part chosen by the model file's head), many
class orders, or one run. The command line is a thin face over them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.protocol.config import (
    EvaluationConfig,
    ExecutionConfig,
    ModelConfig,
    StreamConfig,
    SweepConfig,
    check_order_seeds,
)
from foal_pipe.protocol.records import Learned, Swept


@dataclass(frozen=True)
class LearnSettings:
    """Everything ``learn`` takes besides its store and output folder. ``order_seeds``: many class orders (None:
    one, ``stream.order_seed``); ``init_model``: a model file to continue, ``eval_features`` the stores it is also
    scored on; ``given``: the setting names the caller set explicitly (a continued model fixes some of them and
    checks those against its own; the command line passes what was typed, a default value included); a setting of
    another value than its default, and every option in ``model.head_options``, is given by being there."""

    stream: StreamConfig = field(default_factory=StreamConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    order_seeds: tuple[int, ...] | None = None
    init_model: Path | None = None
    eval_features: tuple[Path, ...] = ()
    given: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "order_seeds", check_order_seeds(self.order_seeds))


@dataclass(frozen=True)
class SweepSettings:
    """Everything ``sweep`` takes besides its store and output folder (``order_seeds`` as in :class:`LearnSettings`)."""

    sweep: SweepConfig = field(default_factory=SweepConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    order_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "order_seeds", check_order_seeds(self.order_seeds))


@dataclass(frozen=True)
class Rule:
    """A combination refused: ``when(settings)`` is true for it, and ``message`` (one line, :func:`param` marks)
    names the problem and the fix."""

    when: Callable[[LearnSettings], bool] | Callable[[SweepSettings], bool]
    message: str


#: The option combinations ``learn`` refuses before any work, in this order.
LEARN_RULES: tuple[Rule, ...] = (
    Rule(lambda s: bool(s.eval_features) and s.init_model is None,
         f"{param('eval_features')} scores a continued model; use it with {param('init_model')}"),
    Rule(lambda s: s.init_model is not None and s.order_seeds is not None,
         f"{param('init_model')} continues one stream (one class order); leave out {param('order_seeds')}"),
    Rule(lambda s: s.init_model is not None and ("seed" in s.given or s.stream.seed != StreamConfig.seed),
         f"{param('seed')} draws the projection, which comes from {param('init_model')}; drop {param('seed')}"),
    Rule(lambda s: s.init_model is not None and ("projection_init" in s.given
                                                 or s.model.projection_init != ModelConfig.projection_init),
         f"{param('projection_init')} draws the projection, which comes from {param('init_model')}; drop "
         f"{param('projection_init')}"),
)

#: ``ModelConfig``'s defaults: its settings that are ``learn``'s alone (a sweep's are its ``SweepConfig``'s).
_LEARN_MODEL = ModelConfig()

#: The option combinations ``sweep`` refuses before any work; the command line cannot reach those on ``learn``'s
#: settings (``sweep`` has no such option), the library can.
SWEEP_RULES: tuple[Rule, ...] = (
    Rule(lambda s: s.order_seeds is not None and bool(s.sweep.fusions),
         f"{param('fusions')} compares fusions on one class order; leave out {param('order_seeds')}, or pass "
         f"{param('fusion', 'X')} with {param('order_seeds')}"),
    Rule(lambda s: s.model.gamma != _LEARN_MODEL.gamma or tuple(s.model.gamma_grid) != tuple(_LEARN_MODEL.gamma_grid),
         "sweep evaluates SweepConfig.gammas; ModelConfig.gamma and gamma_grid are learn's: leave them at their "
         "defaults and pass the gammas as SweepConfig(gammas=...)"),
    Rule(lambda s: s.model.select != _LEARN_MODEL.select,
         "sweep chooses by SweepConfig.select; ModelConfig.select is learn --gamma auto's: leave it at its default "
         "and pass SweepConfig(select=...)"),
    Rule(lambda s: s.model.per_decade != s.sweep.per_decade,
         "sweep's refined search takes SweepConfig.per_decade; ModelConfig.per_decade differs from it: give both "
         "the same value (as --per-decade does)"),
    Rule(lambda s: s.model.engine != _LEARN_MODEL.engine,
         "sweep sums Gram matrices; ModelConfig.engine is learn's: leave it at its default"),
    Rule(lambda s: s.evaluation.eval_every is not None,
         "sweep scores at the task ends; EvaluationConfig.eval_every is learn's: leave it None"),
)


def check_rules(rules: tuple[Rule, ...], settings: LearnSettings | SweepSettings) -> None:
    """Refuse the first combination of ``rules`` that ``settings`` hold, in one line."""
    for rule in rules:
        if rule.when(settings):  # type: ignore[arg-type]
            raise FoalPipeError(rule.message)


def learn(features: str | Path, out: str | Path, settings: LearnSettings | None = None,
          log: Callable[[str], None] = print) -> Learned:
    """``foal-pipe learn``: train every head (``settings.model.head``; ridge by default) through the stream, scored
    after every task; writes ``metrics.json``, ``model.safetensors`` and ``timings.json`` into ``out`` as one unit."""
    s = settings or LearnSettings()
    check_rules(LEARN_RULES, s)
    if s.init_model is not None:
        from foal_pipe.protocol.continuation import run_continue

        return run_continue(s.init_model, features, out, s.stream, s.model, s.evaluation, s.execution,
                            list(s.eval_features), log, s.given)
    if s.order_seeds is not None:
        from foal_pipe.protocol.orders import run_learn_orders

        return run_learn_orders(features, out, s.order_seeds, s.stream, s.model, s.evaluation, s.execution, log=log)
    from foal_pipe.protocol.commands import run_learn

    return run_learn(features, out, s.stream, s.model, s.evaluation, s.execution, log=log)


def sweep(features: str | Path, out: str | Path, settings: SweepSettings | None = None,
          log: Callable[[str], None] = print) -> Swept:
    """``foal-pipe sweep``: every gamma (and ``--heads``, ``--fusions``) from one walk; writes ``sweep.json`` and
    ``timings.json`` into ``out`` as one unit."""
    s = settings or SweepSettings()
    check_rules(SWEEP_RULES, s)
    if s.order_seeds is not None:
        from foal_pipe.protocol.orders import run_sweep_orders

        return run_sweep_orders(features, out, s.order_seeds, s.sweep, s.stream, s.model, s.evaluation, s.execution,
                                log=log)
    from foal_pipe.protocol.commands import run_sweep

    return run_sweep(features, out, s.sweep, s.stream, s.model, s.evaluation, s.execution, log=log)
