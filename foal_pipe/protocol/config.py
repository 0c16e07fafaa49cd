"""The settings of ``learn`` and ``sweep``, grouped by what they decide, and the protocol's constants."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.core.engines import check_gamma
from foal_pipe.core.gammasearch import PER_DECADE, search_grid
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.memory import DEFAULT_MAX_MEMORY
from foal_pipe.protocol.criteria import CRITERIA
from foal_pipe.protocol.stream import DEFAULT_RATIOS, check_disjoint_options, check_ratio

#: Rows projected at once on the RLS path (bounds memory at window x (d + D) values).
RLS_WINDOW = 8192
#: The part of the memory estimate that the kept leave-one-out activations take.
KEPT_PART = "activations kept for leave-one-out"
#: The rows a head on the store's features may take instead (``--head-rows``): its own, or the projection's
#: activations (KLDA's kernel expansion before LDA: ``--head slda --head-rows activations --activation cos``).
HEAD_ROWS = ("features", "activations")
#: Where the Gram statistics are summed: in this process, or on a Dask cluster.
SCHEDULERS = ("local", "dask")


def check_seed(value: object, name: str = "seed") -> int:
    """A seed NumPy's generators take: a non-negative integer (not a boolean); anything else refused, naming the
    parameter ``name``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise FoalPipeError(f"{param(name)} must be a non-negative integer, got {value!r}; pass e.g. {param(name, 0)}")
    return int(value)


def check_order_seeds(value: object) -> tuple[int, ...] | None:
    """``order_seeds`` as Python ints (a NumPy integer recorded as JSON's), None left as it is: a non-empty sequence
    of distinct seeds, as ``--order-seeds`` takes them (a repeated seed would count one order twice in the mean)."""
    if value is None:
        return None
    example = "pass e.g. order_seeds=(0, 1, 2), or leave it None for one order"  # the command line parses its own
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise FoalPipeError(f"{param('order_seeds')} must be a sequence of seeds, got {value!r}; {example}")
    wrong = [seed for seed in value if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0]
    if wrong:
        raise FoalPipeError(f"{param('order_seeds')} holds {wrong[0]!r}, which is not a seed (a non-negative integer); "
                            f"{example}")
    seeds = tuple(int(seed) for seed in value)
    if not seeds:
        raise FoalPipeError(f"{param('order_seeds')} is empty; {example}")
    repeated = next((seed for k, seed in enumerate(seeds) if seed in seeds[:k]), None)
    if repeated is not None:
        raise FoalPipeError(f"{param('order_seeds')} ({', '.join(map(str, seeds))}) repeats seed {repeated}; list each "
                            "class order once")
    return seeds


@dataclass(frozen=True)
class StreamConfig:
    """How the stream is built (docs/protocol.md section 3; the task split: :mod:`foal_pipe.protocol.stream`)."""

    tasks: int | None = None  # None: stream.DEFAULT_TASKS, at most one task per class
    batch_size: int = 10
    seed: int = 0
    class_order: Path | str | None = None  # a JSON file of task lists, or a named order (pilot, pilot:SEED)
    drop_last: bool = False
    order_seed: int | None = None  # the class order's and shuffles' seed; None: ``seed`` (which fixes the projection)
    drop_remainder: bool = False  # split evenly and drop the classes left over (the published code)
    stream: str = "disjoint"  # stream.STREAMS: disjoint tasks, or si-blurry (classes recur, task sizes drawn)
    disjoint_ratio: int = DEFAULT_RATIOS["disjoint_ratio"]  # si-blurry: % of the classes seen in one task only
    blurry_ratio: int = DEFAULT_RATIOS["blurry_ratio"]  # si-blurry: % of the other classes' rows dealt over the tasks

    def __post_init__(self) -> None:
        for name, value in (("seed", self.seed), ("order_seed", self.order_seed)):
            if value is not None:
                object.__setattr__(self, name, check_seed(value, name))  # a NumPy integer is recorded as JSON's
        for name in ("disjoint_ratio", "blurry_ratio"):
            check_ratio(getattr(self, name), name)
        for name, value in (("tasks", self.tasks), ("batch_size", self.batch_size)):  # a float or True is no count
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)):
                raise FoalPipeError(f"{param(name)} must be an integer (not a float or a boolean), got {value!r}; pass e.g. "
                                    f"{param(name, 10)}")
            if value is not None:
                object.__setattr__(self, name, int(value))  # a NumPy integer is recorded as JSON's
        if self.batch_size is not None and self.batch_size < 1:
            raise FoalPipeError(f"{param('batch_size')} must be at least 1, got {self.batch_size}")
        for name in ("drop_last", "drop_remainder"):  # "no" is truthy
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise FoalPipeError(f"{param(name)} is a flag, True or False, got {getattr(self, name)!r}; pass "
                                    f"{param(name, True)} or {param(name, False)}")
        if self.class_order is not None and not isinstance(self.class_order, (str, PathLike)):
            raise FoalPipeError(f"{param('class_order')} names a class order or a JSON file of task lists, got "
                                f"{self.class_order!r}; write the lists to a file and pass its path, or e.g. "
                                f"{param('class_order', 'pilot')}")
        if self.class_order is not None and not str(self.class_order).strip():  # an unset variable, not the seeded order
            raise FoalPipeError(f"{param('class_order')} is empty; pass a JSON file of task lists or a named order, e.g. "
                                f"{param('class_order', 'pilot')}, or leave it None for the seeded order")
        if not isinstance(self.stream, str):
            raise FoalPipeError(f"{param('stream')} is a stream's name, got {self.stream!r}; pass e.g. "
                                f"{param('stream', 'disjoint')}")
        check_disjoint_options(self.stream, self.class_order is not None, bool(self.drop_remainder))

    @property
    def resolved_order_seed(self) -> int:
        return self.seed if self.order_seed is None else self.order_seed


#: Head options that are settings of their own: ``gamma`` (:attr:`ModelConfig.gamma`, ridge's too) and the stream's
#: ``batch_size`` (dual's recursion runs on the stream's batches).
OWN_SETTINGS = ("gamma", "batch_size")


def head_option_names() -> dict[str, list[str]]:
    """Every head option of the registry (:data:`foal_pipe.heads.HEADS`, read now) -> the heads that take it, in the
    registry's order; the :data:`OWN_SETTINGS` left out."""
    from foal_pipe.heads import HEADS

    taken: dict[str, list[str]] = {}
    for name, entry in HEADS.items():
        for option in entry.options:
            if option not in OWN_SETTINGS:
                taken.setdefault(option, []).append(name)
    return taken


class HeadOptions(Mapping[str, Any]):
    """The heads' own options a run gives, option name -> value (e.g. ``{"shrinkage": "oas"}``): read-only and
    hashable, so that :class:`ModelConfig` stays a frozen value. Each head takes those of its ``Options``."""

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = tuple(sorted((items or {}).items()))

    def __getitem__(self, key: str) -> Any:
        return dict(self._items)[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"HeadOptions({dict(self._items)!r})"


def check_head_option_names(options: object) -> HeadOptions:
    """``head_options`` as :class:`HeadOptions`, None values (the head's default) left out; refused in one line
    unless it maps names of the registry's head options (gamma and batch_size are settings of their own)."""
    if not isinstance(options, Mapping):
        raise FoalPipeError(f"{param('head_options')} must map head option names to values, got {options!r}; pass "
                            f"e.g. head_options={{'shrinkage': 'oas'}}")
    known = head_option_names()
    for key in options:
        if key in OWN_SETTINGS:
            raise FoalPipeError(f"{key} is a setting of its own, not a head option: pass {param(key)} and drop it from "
                                f"{param('head_options')}")
        if key not in known:
            listed = "; ".join(f"{option} ({', '.join(heads)})" for option, heads in known.items())
            raise FoalPipeError(f"no head takes an option {key!r}; the heads' options are: {listed}")
    return HeadOptions({key: value for key, value in options.items() if value is not None})


def gamma_list(values: Any, name: str) -> tuple[float, ...]:
    """A grid of gammas as the command line reads one (``cli/options.floats``): any sequence of numbers (a NumPy array
    too) as a tuple of floats, each listed once (a sweep would score a repeat twice and write results its readers
    refuse); each gamma is checked positive where the run reads it."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise FoalPipeError(f"{param(name)} must be a sequence of gammas, got {values!r}; pass e.g. (0.1, 1.0, 10.0)")
    try:
        grid = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        shown = f"an array of shape {values.shape}" if isinstance(values, np.ndarray) else repr(values)
        raise FoalPipeError(f"{param(name)} must hold numbers, got {shown}; pass e.g. (0.1, 1.0, 10.0)") from None
    twice = next((g for i, g in enumerate(grid) if g in grid[:i]), None)
    if twice is not None:
        raise FoalPipeError(f"{param(name)} lists {twice:g} twice; list each gamma once")
    return grid


def whole(value: Any) -> Any:
    """A NumPy integer as the Python int a JSON record holds (anything else as given, checked where it is read)."""
    return int(value) if isinstance(value, np.integer) else value


@dataclass(frozen=True)
class ModelConfig:
    """The expansion and the ridge classifier on it.

    ``gamma`` is a number, or ``"auto"``: chosen at every task boundary on the training rows seen so far,
    by leave-one-out MSE (``select="loo"``), GCV (``select="gcv"``) or leave-one-out accuracy
    (``select="loo_accuracy"``), over ``per_decade`` log-spaced points per decade of ``gamma_grid``'s range.
    ``activation=None`` means the paper's sigmoid, or identity when ``projection_dim`` is 0 (raw features).
    ``fusion`` (a :func:`~foal_pipe.store.blockfusion.parse_fusion` spec) fuses the store's per-block tokens at read
    time instead of using its stored features (stores made with ``extract --keep-blocks``); ``fusion_norm``
    applies the stored final norm after it. ``head`` names the classifier (:mod:`foal_pipe.heads`);
    ``head_options`` maps the heads' own options (those of their ``Options`` dataclass but gamma) to values, each head
    taking those it has (``{"shrinkage": 0.25}``: slda's and fecam's; a head left out: its default); ``head_rows``
    puts a head on the store's features on the projection's activations instead.
    """

    projection_dim: int = 1000
    projection_init: str = "uniform"
    activation: str | None = None
    gamma: float | str = 1.0
    select: str = "loo_accuracy"  # the selector best or tied most often (benchmarks/RESULTS.md, issue 23)
    gamma_grid: tuple[float, ...] = DEFAULT_GAMMA_GRID
    per_decade: int = PER_DECADE
    loo_sample: int = 4096  # leave-one-out on this many sampled rows per boundary (protocol/loosample.py); 0: all rows
    engine: str = "gram"
    dtype: str = "float64"
    fusion: str | None = None
    fusion_norm: bool = True
    head: str = "ridge"  # a key of foal_pipe.heads.HEADS; ridge: this learner
    head_options: Mapping[str, Any] = HeadOptions()  # the heads' own options by name; made a HeadOptions
    head_rows: str | None = None  # a feature head's rows (HEAD_ROWS): features or activations; None: the head's own

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_options", check_head_option_names(self.head_options))
        object.__setattr__(self, "gamma_grid", gamma_list(self.gamma_grid, "gamma_grid"))
        object.__setattr__(self, "per_decade", whole(self.per_decade))
        object.__setattr__(self, "loo_sample", whole(self.loo_sample))
        if self.head_rows is not None and self.head_rows not in HEAD_ROWS:
            raise FoalPipeError(f"{param('head_rows')} must be one of {', '.join(HEAD_ROWS)}, got {self.head_rows!r}; "
                                f"e.g. {param('head_rows', 'activations')}")

    def head_arguments(self) -> dict[str, Any]:
        """Every head option these settings give, gamma included: each head is built from those it takes."""
        return {"gamma": self.gamma, **self.head_options}

    def options_for(self, name: str) -> dict[str, Any]:
        """The options of head ``name`` that these settings give (the registry names them), None left out: the
        mapping the head is built from."""
        from foal_pipe.heads import head_entry

        given = self.head_arguments()
        return {key: given[key] for key in head_entry(name).options if given.get(key) is not None}

    @property
    def loo(self) -> bool:
        """Whether ``--gamma auto``'s criterion needs the leave-one-out pass over the rows."""
        return self.gamma == "auto" and self.select in CRITERIA and CRITERIA[self.select].rows

    @property
    def resolved_activation(self) -> str:
        if self.activation is not None:
            return self.activation
        return "identity" if self.projection_dim == 0 else "sigmoid"


@dataclass(frozen=True)
class EvaluationConfig:
    """How the test split is scored: ``mask_unseen`` restricts the argmax to the classes seen so far;
    ``eval_every`` (training rows) adds the anytime curve (docs/streams.md), None: task ends only."""

    mask_unseen: bool = True
    eval_every: int | None = None

    def __post_init__(self) -> None:
        value = self.eval_every
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
            raise FoalPipeError(f"{param('eval_every')} counts training rows between evaluations and must be at least 1, "
                                f"got {value!r}; pass e.g. {param('eval_every', 1000)}")


@dataclass(frozen=True)
class ExecutionConfig:
    """Where the work runs: the array backend, ``dask`` for the Gram statistics on a cluster, and ``max_memory``
    (bytes), the most an optional speed-up may hold: the activations kept for leave-one-out."""

    backend: str = "auto"
    scheduler: str = "local"
    dask_address: str | None = "local"
    workers: int = 2
    max_memory: int = DEFAULT_MAX_MEMORY

    def __post_init__(self) -> None:
        """Each field's type and range, refused in one line here rather than as a TypeError deep in a run."""
        if not isinstance(self.backend, str):
            raise FoalPipeError(f"{param('backend')} must be a backend name, got {self.backend!r}; pass e.g. "
                                f"{param('backend', 'numpy')}")
        if not isinstance(self.scheduler, str) or self.scheduler not in SCHEDULERS:
            raise FoalPipeError(f"{param('scheduler')} must be {' or '.join(SCHEDULERS)}, got {self.scheduler!r}; pass "
                                f"e.g. {param('scheduler', 'dask')}")
        if self.dask_address is not None and not isinstance(self.dask_address, str):
            raise FoalPipeError(f"{param('dask_address')} must be 'local' or a scheduler address such as tcp://host:8786, "
                                f"got {self.dask_address!r}")
        for name, least in (("workers", 1), ("max_memory", 0)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
                raise FoalPipeError(f"{param(name)} must be at least {least} (an integer), got {value!r}; pass e.g. "
                                    f"{param(name, 2 if name == 'workers' else DEFAULT_MAX_MEMORY)}")


@dataclass(frozen=True)
class SweepConfig:
    """Which gammas ``sweep`` scores and how it names the best: ``loo`` (LOO MSE), ``gcv`` or ``test`` (an oracle)."""

    gammas: tuple[float, ...] = DEFAULT_GAMMA_GRID  # the grid `learn --gamma auto` chooses from
    select: str | None = None  # None: loo, or gcv with loo=False
    loo: bool = True
    per_decade: int = PER_DECADE  # the refined search of every criterion (``selections`` in sweep.json)
    fusions: tuple[str, ...] = ()  # fusion specs of a blocks store, all from one walk; (): the store's features
    heads: tuple[str, ...] = ()  # heads of foal_pipe.heads.HEADS, all from one read; (): the gamma sweep alone

    def __post_init__(self) -> None:
        object.__setattr__(self, "gammas", gamma_list(self.gammas, "gammas"))
        object.__setattr__(self, "per_decade", whole(self.per_decade))

    @property
    def resolved_select(self) -> str:
        return self.select or ("loo" if self.loo else "gcv")

    @property
    def search_points(self) -> int:
        """The gammas of the refined search over :attr:`gammas` (its leave-one-out may hold every one's leverages a
        boundary: the memory estimate counts them); 0 without leave-one-out."""
        return int(search_grid(self.gammas, self.per_decade).size) if self.loo else 0


def config_record(config: Any) -> dict[str, Any]:
    """A settings dataclass as ``table.json`` records it: its fields, ModelConfig's ``head_options`` spread into one
    key per head option of the registry (None where not given), as the record has held them since the first heads."""
    record = asdict(config)
    if isinstance(config, ModelConfig):
        given = record.pop("head_options")
        record.update({option: given.get(option) for option in head_option_names()})
    return record


def parse_gamma(value: float | str) -> float | str:
    """A positive number (or its text, as the command line gives it), or ``"auto"``."""
    if value == "auto":
        return "auto"
    number: float | str = value
    if isinstance(value, str):
        with suppress(ValueError):  # else refused below, as it was typed
            number = float(value)
    return check_gamma(number)
