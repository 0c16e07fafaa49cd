"""ridge's statistics per class, and every boundary of a class order summed from them (``learn --order-seeds``' one
pass, ``table``).

The ridge solution after task k depends only on the sums ``G``, ``Q`` over the rows of tasks 1..k, not on the
order of those rows: one pass over the rows grouped by class forms each class's sums (:func:`class_statistics`),
and each order's boundary adds its seen classes' sums (:func:`order_boundaries`); a sampled leave-one-out
projects its boundary's rows again from the rows read once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from array_api_compat import is_numpy_namespace

from foal_pipe.core.backend import default_device
from foal_pipe.core.linalg import target_sums
from foal_pipe.core.rounding import Rounding, addition_rounding, product_rounding, sampled
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.progress import progress_bar
from foal_pipe.protocol.ahead import FactorAhead, can_run_ahead, second_thread
from foal_pipe.protocol.erasedrows import NO_ERASED, ErasedRows, check_erased_blocks
from foal_pipe.protocol.internal import internal_error, known
from foal_pipe.protocol.run import Run
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas
from foal_pipe.protocol.walk import SharedRows


def class_statistics_bytes(n_classes: int, dim: int, dtype: str) -> int:
    """What the per-class statistics take: ``C (D^2 + D)`` values."""
    return n_classes * (dim * dim + dim) * np.dtype(dtype).itemsize


@dataclass
class ClassSums:
    """Every class's ``G_c = H_c^T H_c`` (stacked, C x D x D), ``Q``'s column ``q_c = H_c^T 1`` (C x D x 1) and
    row count: one preallocated array per sum, each class's Gram one product over all its rows (blocks of
    ``block_rows`` beyond that), so the per-class sums cost about one Gram of the same rows."""

    G: Any
    Q: Any
    counts: np.ndarray
    #: Each class's ``G_c``'s rounding (:attr:`~foal_pipe.core.statistics.RidgeStatistics.rounding`), None before rows.
    rounding: list[Rounding | None]
    #: The rows the activation erased, judged in each order's walk blocks (:func:`order_boundaries`).
    erased: ErasedRows = NO_ERASED


def class_statistics(run: Run, rows: SharedRows) -> ClassSums:
    """The statistics of each class's rows (every row some order trains on), from the rows read once and grouped
    by class: the cache projected in full-size blocks of consecutive rows (as ``learn`` projects a task, not in
    one thin block per class), and each class's part of a block summed as
    :meth:`~foal_pipe.core.statistics.RidgeStatistics.from_batch` forms ``H^T H`` and ``H^T Y``, written into the
    stacked arrays without a D x D temporary per class on NumPy."""
    train, xp = rows.train, run.xp
    n_classes = len(run.store.classes)
    dtype = getattr(xp, run.model.dtype)
    sums = ClassSums(xp.zeros((n_classes, run.dim, run.dim), dtype=dtype, device=default_device(xp)),
                     xp.zeros((n_classes, run.dim, 1), dtype=xp.float64, device=default_device(xp)),
                     np.diff(train.offsets).astype(np.int64)[:n_classes], [None] * n_classes)
    host = is_numpy_namespace(xp)
    started = np.zeros(n_classes, dtype=bool)
    with progress_bar("train (per-class gram)", train.n_rows) as advance:
        for lo in range(0, train.n_rows, run.block_rows):
            hi = min(lo + run.block_rows, train.n_rows)
            with run.timed("project"):
                X = train.block(None, lo, hi, xp)
                H = run.projection.transform(X, xp, check=False)  # blocks of classes: judged in each order's blocks
                sums.erased = sums.erased + ErasedRows.of(run.projection, X, H, train.rows[lo:hi])
            with run.timed("gram"):
                labels = train.labels[lo:hi]
                cuts = np.flatnonzero(np.diff(labels)) + 1
                for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), hi - lo]):
                    c, part = int(labels[a]), H[a:b, ...]
                    Ht, q = part.T, target_sums(part, labels[a:b], np.array([c]))
                    if started[c]:
                        product, before = Ht @ part, sampled(sums.G[c, ...])
                        sums.G[c, ...] += product
                        sums.Q[c, ...] += q
                        sums.rounding[c] = known(sums.rounding[c], "a class's rounding") + product_rounding(
                            part, product) + addition_rounding(before, sampled(product), sums.G[c, ...])
                    else:
                        if host:
                            np.matmul(Ht, part, out=sums.G[c])
                        else:
                            sums.G[c, ...] = Ht @ part
                        sums.Q[c, ...] = q
                        sums.rounding[c] = product_rounding(part, sums.G[c, ...])
                    started[c] = True
            advance(hi - lo)
    return sums


def order_boundaries(run: Run, sums: ClassSums, solver: FixedGamma | ManyGammas, rows: SharedRows | None = None,
                     split: Sequence[Sequence[int]] | None = None,
                     memo: dict[tuple[int, ...], Boundary] | None = None) -> tuple[list[Boundary], RidgeStatistics]:
    """Every boundary of ``run``'s order from the per-class sums: ``G`` summed class by class, in place, in the order
    of ``split``'s tasks (default: ``run``'s tasks; each ascending); ``Q`` the seen classes' columns (sorted, as the
    statistics keep them). A solver that needs the rows (a sampled leave-one-out) scores each boundary's sample
    (:class:`~foal_pipe.protocol.loosample.RowSample`: the rows ``run``'s walk scores) from ``rows``, projected, in
    the order a walk over ``split`` adds them.

    Boundaries that summed the same classes in the same order hold the same bits, the leave-one-out pass included;
    with ``memo`` (a :class:`ManyGammas` solver, shared by runs of one store, order and settings), each is solved
    once: ``table``'s 5-task boundary and the 10-task boundary after the same classes, both over the 10-task split."""
    xp = run.xp
    if memo is not None and not isinstance(solver, ManyGammas):
        raise internal_error("boundaries shared between runs without a gamma path")
    check_erased_blocks(sums.erased, run.stream.rows, run.block_rows, run.store.train.n_rows, run.projection.activation)
    G = xp.zeros((run.dim, run.dim), dtype=sums.G.dtype, device=default_device(xp))
    columns = xp.zeros((run.dim, sums.counts.size), dtype=sums.Q.dtype, device=default_device(xp))
    seen = np.zeros(sums.counts.size, dtype=bool)
    n_groups = len(split if split is not None else run.stream.tasks)
    group = n_groups + np.arange(sums.counts.size)  # a class outside the split after every task of it
    for i, task in enumerate(split if split is not None else run.stream.tasks):
        group[list(task)] = i
    summed: list[int] = []
    rounding = Rounding(0.0)  # RidgeStatistics.rounding of G: each class's sums' and every addition's
    boundaries, running = [], RidgeStatistics.empty(run.dim, xp, sums.G.dtype)
    sample = solver.sample if solver.needs_rows else None
    bar = (progress_bar("leave-one-out (sampled rows)", sum(b.size for b in sample.boundaries)) if sample is not None
           else nullcontext(lambda n: None))
    with bar as advance, (second_thread() if sample is not None and can_run_ahead(run) else nullcontext()) as thread:
        for k, task in enumerate(run.stream.tasks):
            with run.timed("sum"):
                for c in sorted(task, key=lambda c: (group[c], c)):
                    if sums.counts[c]:
                        rounding += known(sums.rounding[c], "a class's rounding")
                        before = sampled(G) if summed else None  # the first is added to zeros: exact
                        G += sums.G[c, ...]
                        if before is not None:
                            rounding += addition_rounding(before, sampled(sums.G[c, ...]), G)
                        columns[:, c : c + 1] += sums.Q[c, ...]
                        seen[c] = True
                        summed.append(int(c))
                classes = np.flatnonzero(seen)
                Q = xp.take(columns, xp.asarray(classes, device=default_device(xp)), axis=1)
                running = RidgeStatistics(G, Q, classes, int(sums.counts[classes].sum()), sums.counts[classes],
                                          rounding=rounding if summed else None, symmetric=True)  # sums of products
            key = tuple(summed)
            if memo is not None and key in memo:
                boundaries.append(memo[key])
                advance(0 if sample is None else sample.boundaries[k].size)  # scored once, for the run that solved it
                continue
            if sample is None:
                with run.timed("solve"):
                    boundary = solver.solve(running, k)
            else:
                boundary = _sampled_boundary(run, solver, running, k, known(rows, "the rows a sample scores"), group,
                                             advance, thread)
            boundaries.append(boundary)
            if memo is not None:
                memo[key] = boundary
    return boundaries, running


def _sampled_boundary(run: Run, solver: FixedGamma | ManyGammas, running: RidgeStatistics, k: int, rows: SharedRows,
                      group: np.ndarray, advance: Callable[[int], None], thread: ThreadPoolExecutor | None) -> Boundary:
    """Boundary ``k`` with its leave-one-out pass over the boundary's sampled rows, projected again in full-size
    blocks in a walk's order (by the ``group`` of their class, each group's rows in storage order). With ``thread``
    (:func:`~foal_pipe.protocol.ahead.second_thread`), the sums are factored there while the first block is
    projected (:class:`~foal_pipe.protocol.ahead.FactorAhead`)."""
    if not isinstance(solver, ManyGammas) or solver.sample is None:
        raise internal_error("a sampled leave-one-out pass without a gamma path and its sample")
    train, xp = rows.train, run.xp
    sampled = train.position[solver.sample.boundaries[k]]  # in storage order
    positions = sampled[np.argsort(group[train.labels[sampled]], kind="stable")]
    blocks = [positions[lo : lo + run.block_rows] for lo in range(0, positions.size, run.block_rows)]

    def projected(block: np.ndarray) -> Any:
        with run.timed("read"):
            X = train.take(None, block, xp)
        with run.timed("project"):
            return run.projection.transform(X, xp)

    factored, first = None, None
    if thread is not None and blocks:  # one block beside it: what the pass holds at once stays one block's activations
        with FactorAhead(thread, k, {None: partial(running.factor, solver.vectors(running, k))}, 1) as ahead:
            first = projected(blocks[0])
            with run.timed("solve"):
                factored = ahead.join()[None]
    with run.timed("solve"):
        pending = solver.start(running, k, factored)
    loo = pending.loo
    if loo is None:
        raise internal_error("a pending boundary without its leave-one-out pass")
    for i, block in enumerate(blocks):
        H = first if i == 0 and first is not None else projected(block)
        with run.timed("loo"):
            loo.add(H, train.labels[block])
        advance(block.size)
    with run.timed("loo"):
        solver.zoom(pending)
    with run.timed("solve"):
        return solver.finish(pending)
