"""The checks of many class orders (``--order-seeds``) before any order is walked.

The seeds are parsed and each order's run is prepared with its refusals naming the order (:func:`each_order`); the
orders must stream as many tasks each, for their matrices to have a position-wise mean; and :func:`fallback_reason`
says why the orders cannot come from one pass over the per-class sums, which ``table`` asks too. Kept apart from the
commands that walk the orders (:mod:`foal_pipe.protocol.orders`): the command line and ``table`` ask these alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from foal_pipe.errors import FoalPipeError, comma_items, param
from foal_pipe.memory import human, human_up
from foal_pipe.protocol.classsums import class_statistics_bytes
from foal_pipe.protocol.config import ExecutionConfig, ModelConfig, StreamConfig, check_seed
from foal_pipe.protocol.run import ClassRowsError, Run
from foal_pipe.protocol.stream import OrderError


def parse_order_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``: distinct integers."""
    items = comma_items(text, param("order_seeds"))
    try:
        seeds = tuple(int(s) for s in items)
    except ValueError:
        raise FoalPipeError(f"{param('order_seeds')} {text!r} is not a comma-separated list of integers; write e.g. "
                            "0,1,2,3,4") from None
    if not seeds:
        raise FoalPipeError(f"{param('order_seeds')} is empty; write e.g. 0,1,2,3,4")
    if len(set(seeds)) != len(seeds):
        raise FoalPipeError(f"{param('order_seeds')} {text!r} repeats a seed; list each class order once")
    for seed in seeds:
        check_seed(seed, "order_seeds")
    return seeds


def fallback_reason(stream: StreamConfig, model: ModelConfig, execution: ExecutionConfig, loo: bool,
                    n_classes: int, anytime: bool = False, dim: int | None = None) -> str | None:
    """Why the orders cannot come from one pass (None: they can). ``dim``: the run's D (:attr:`Run.dim`; the
    store's width with ``--projection-dim 0``, which ``model.projection_dim`` does not say)."""
    reasons = {
        "--stream si-blurry spreads a class's rows over several tasks": stream.stream != "disjoint",
        "--eval-every solves inside the tasks": anytime,
        "--engine rls replays the rows in stream order": model.engine == "rls",
        "the leave-one-out pass needs every row at every boundary (use --loo-sample M, --select gcv, or sweep --no-loo)":
            loo,
        "--drop-last drops rows that depend on each order's shuffle": stream.drop_last,
        "--scheduler dask sums per task on the cluster": execution.scheduler == "dask",
    }
    for reason, applies in reasons.items():
        if applies:
            return reason
    D = model.projection_dim if dim is None else dim
    need = class_statistics_bytes(n_classes, D, model.dtype)
    if need > execution.max_memory:  # the figure to raise it to rounded up: the one rounded down still falls back
        return (f"the per-class statistics need {human(need)} ({n_classes} classes x D^2 at D={D}, "
                f"{model.dtype}), above --max-memory {human(execution.max_memory)}; raise --max-memory to "
                f"{human_up(need)}, use --dtype float32 or a lower --projection-dim for one pass")
    return None


def check_orders(stream: StreamConfig, seeds: Sequence[int]) -> None:
    if stream.class_order is not None and len(seeds) > 1:
        raise FoalPipeError(f"{param('class_order')} fixes the class order, so {param('order_seeds')} has nothing to "
                            "vary; pass one of them")


def check_task_counts(seeds: Sequence[int], runs: Sequence[Run]) -> None:
    """Refuse orders that stream different numbers of tasks (Si-Blurry leaves out a task that receives no row): the
    record of many orders averages their matrices position-wise, which has no meaning across lengths."""
    counts = [run.stream.n_tasks for run in runs]
    if len(set(counts)) > 1:
        each = ", ".join(f"{s}: {n}" for s, n in zip(seeds, counts))
        raise FoalPipeError(f"{param('order_seeds')} {','.join(map(str, seeds))} stream different numbers of tasks ({each}; "
                            f"{param('stream', 'si-blurry')} leaves out a task that receives no row), so their accuracy "
                            f"matrices have no position-wise mean; pass order seeds that stream as many tasks each, or run "
                            f"each seed alone with {param('order_seed')}")


def each_order(seeds: Sequence[int], prepared: Callable[[int], Run]) -> list[Run]:
    """Every order's prepared run; a refusal of one order's stream or of a head's class rows names that order (the
    others may pass: which classes a task holds, and its rows, depend on the order)."""
    runs = []
    for seed in seeds:
        try:
            runs.append(prepared(seed))
        except (ClassRowsError, OrderError) as exc:
            raise FoalPipeError(f"{exc.template} (class order seed {seed}; {param('order_seed', seed)} alone is refused "
                                "too)") from None
    return runs
