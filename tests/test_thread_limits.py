"""The one-thread BLAS limit of a factorisation (``core.linalg.factor_threads``) held by several holders at once (an
estimator's readers in threads): the pools' counts are global to the process, so limits given back in another order
than taken must neither drop the limit while one is held nor leave the pools at one thread after the last."""

from __future__ import annotations

import threading

import pytest
from threadpoolctl import threadpool_limits

from foal_pipe.core.linalg import _threadpools, factor_threads


def _counts() -> list[int]:
    return [pool.num_threads for pool in _threadpools().lib_controllers if pool.user_api == "blas"]


def test_limits_given_back_out_of_order_keep_the_limit_then_give_every_thread_back():
    """A takes, B takes, A gives back, B gives back (what two threads' overlapping factorisations do): threadpoolctl's
    limiters, each restoring what it found, lifted the limit while B held it and then left the pools at one thread
    for the rest of the process (the test suite's readers in threads did)."""
    before = _counts()
    if max(before, default=1) < 2:
        pytest.skip("one BLAS thread here: no limit to give back")
    first = factor_threads(10)
    second = factor_threads(10)
    first.restore_original_limits()
    assert set(_counts()) == {1}  # still limited while the second holder factorises
    second.restore_original_limits()
    assert _counts() == before


def test_a_held_limit_given_back_twice_counts_once():
    before = _counts()
    outer = factor_threads(10)
    inner = factor_threads(10)
    inner.restore_original_limits()
    inner.restore_original_limits()  # a second give-back is no holder leaving
    assert set(_counts()) == {1}
    outer.restore_original_limits()
    assert _counts() == before
    with factor_threads(5000):  # above SINGLE_THREAD_FACTOR_DIM: the threads in force
        assert _counts() == before


def _threads_seen(before: list[int]) -> None:
    if max(before, default=1) < 2:
        pytest.skip("one BLAS thread here: no limit to see")


def test_a_limit_given_back_by_another_thread_is_given_back():
    """threadpoolctl 3.8 lets one Python thread at a time set OpenBLAS's process-wide count and ignores the others:
    A takes, B takes, A gives back, B gives back while A is alive left every pool at one thread."""
    before = _counts()
    _threads_seen(before)
    a_took, b_took, a_gave, done = (threading.Event() for _ in range(4))
    held: list[list[int]] = []

    def first() -> None:
        holder = factor_threads(10)
        a_took.set()
        b_took.wait()
        holder.restore_original_limits()
        a_gave.set()
        done.wait()

    def second() -> None:
        a_took.wait()
        holder = factor_threads(10)
        b_took.set()
        a_gave.wait()
        held.append(_counts())
        holder.restore_original_limits()

    a, b = threading.Thread(target=first), threading.Thread(target=second)
    a.start(), b.start()
    b.join()
    try:
        assert set(held[0]) == {1} and _counts() == before  # A is still alive here
    finally:
        done.set()
        a.join()


def test_a_limit_taken_in_a_thread_applies_beside_threadpool_limits_held_in_another():
    """A user's ``threadpool_limits`` in the main thread made threadpoolctl 3.8 ignore a worker's one-thread limit: the
    factorisation ran on every thread, with other bits."""
    before = _counts()
    _threads_seen(before)
    seen: list[list[int]] = []

    def worker() -> None:
        with factor_threads(10):
            seen.append(_counts())

    with threadpool_limits(max(before), user_api="blas"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert set(seen[0]) == {1} and set(_counts()) == {max(before)}
    assert _counts() == before
