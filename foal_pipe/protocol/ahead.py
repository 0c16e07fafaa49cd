"""Work on a second thread beside the walk's: a task boundary's factorisation (or its whole GCV boundary) while the
next rows are summed or projected (:class:`FactorAhead`), every BLAS pool at one thread until it joins."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from array_api_compat import is_numpy_namespace

from foal_pipe.core.linalg import SINGLE_THREAD_FACTOR_DIM, factor_threads
from foal_pipe.core.statistics import Factored, RidgeStatistics
from foal_pipe.protocol.run import Run

#: A boundary's work on one BLAS thread costs about as long as this many ``D^3`` flops of the walk's matrix products on
#: one thread: ``eigh`` (leave-one-out needs the eigenvectors) and ``dsytrd`` with ``U^T Q``; GCV's whole boundary adds
#: its weights' back-transform, ``2 D^2`` a column. A projection's elementwise steps (the cast, the activation) cost
#: about ``ELEMENT_COST`` flops an activation. They set :func:`ahead_blocks`. Measured on the 2-core machine (AVX-512
#: EPYC, 2026-11-29, ``benchmarks/ahead_bench.py``) at D = 600 to 2,000: ``eigh`` 11.2-12.3, the reduction 4.2-5.2,
#: the elementwise steps 370-1,400 (the Gram's products at about 100 GFlop/s on one thread).
EIGH_COST, REDUCTION_COST, ELEMENT_COST = 11.0, 4.0, 1000.0


def can_run_ahead(run: Run) -> bool:
    """Whether ``run``'s factorisations can run beside other work: on NumPy, each on one BLAS thread (D <= 2048)."""
    return is_numpy_namespace(run.xp) and 2 <= run.dim <= SINGLE_THREAD_FACTOR_DIM


def second_thread() -> ThreadPoolExecutor:
    """The one worker thread that work ahead runs on."""
    return ThreadPoolExecutor(1, thread_name_prefix="foal-pipe-factor")


def ahead_blocks(run: Run, flops: float) -> int:
    """How many of the next task's blocks are projected beside a boundary's work of ``flops`` (:class:`FactorAhead`),
    each but the last also summed there: the number whose cost lies nearest the work, so that the core left idle,
    whichever thread waits at the join, is at most half a block's. The last block's Gram product waits for the join
    and runs on every BLAS thread: a whole block beside a shorter factorisation left the second core idle for the
    rest of it (at D = 1,000 an ``eigh`` lasts about as long as one block's projection). A function of the shapes
    alone, so that which products run on one BLAS thread, and with them every bit, is the same from run to run."""
    D, rows = run.dim, run.block_rows
    projection = 2.0 * rows * D * run.store.dim + ELEMENT_COST * rows * D
    block = projection + 2.0 * rows * D * (D + len(run.store.classes))
    return 1 + max(0, round((flops - projection) / block))


class FactorAhead:
    """A boundary whose work runs on the walk's other thread while the next task's first :attr:`blocks` blocks are
    projected on this one (all but the last also summed): each lane's factorisation (:meth:`RidgeStatistics.factor`
    of a copy of its sums), or, without leave-one-out, its whole boundary
    (:meth:`~foal_pipe.protocol.learners.gram.Lane.ahead`); or, from the per-class sums
    (:func:`~foal_pipe.protocol.classsums.order_boundaries`), the factorisation while the boundary's sampled rows are
    projected.

    That work runs on one BLAS thread wherever it runs (up to ``SINGLE_THREAD_FACTOR_DIM``), so the second core idled
    through it; now it projects and sums rows meanwhile. Every BLAS pool stays at one thread until :meth:`join`: two
    single-threaded jobs share busy cores fairly, while a second pool thread beside other work lost up to 4.5x
    (issue 31's measurements). Which products run on one thread is fixed by the shapes (:func:`ahead_blocks`), so a
    run's bytes are the same twice. On the stores measured the projection's and the Gram's products also gave the same bits
    on one thread as on two (``benchmarks/identity_check.py`` and the wide store's outputs: no output changed), but
    OpenBLAS does not promise it at every row count (a 789-row block of a 768 x 1,000 projection differs in its last
    bits): there the walk's weights differ from `learn --gamma G`'s in their last bits. Leave-one-out's route follows the
    BLAS threads in force (:func:`~foal_pipe.core.leaveoneout.sample_needs_vectors`): it must be chosen outside this
    window, or a run's bytes would follow where the choice ran."""

    def __init__(self, executor: ThreadPoolExecutor, k: int, jobs: dict[str | None, Callable[[], Any]],
                 blocks: int) -> None:
        self.k, self.blocks = k, blocks
        self._limit: Any = factor_threads(1)  # in force from here: every BLAS pool at one thread
        self._futures: dict[str | None, Future[Any]] = {}
        try:
            for key, job in jobs.items():
                self._futures[key] = executor.submit(job)
        except BaseException:
            self.release()
            raise

    def __enter__(self) -> FactorAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def join(self) -> dict[str | None, Any]:
        """Each lane's result, once all have ended (the first error raised), with the pools' threads back."""
        self.release()
        return {key: future.result() for key, future in self._futures.items()}

    def release(self) -> None:
        """Wait for the jobs to end, then give the BLAS pools their threads back (once). Not before they end: a
        factorisation's own one-thread limit, on leaving, restores the count it found."""
        wait(self._futures.values())
        if self._limit is not None:
            self._limit.restore_original_limits()
            self._limit = None


def factored_copy(statistics: RidgeStatistics, vectors: bool) -> tuple[RidgeStatistics, Factored]:
    """``statistics`` (a copy the walk no longer changes) with their :meth:`~RidgeStatistics.factor`."""
    return statistics, statistics.factor(vectors)
