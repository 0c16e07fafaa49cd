"""The one-thread BLAS limit of a factorisation (``core.linalg.factor_threads``) held by several holders at once (an
estimator's readers in threads): the pools' counts are global to the process, so limits given back in another order
than taken must neither drop the limit while one is held nor leave the pools at one thread after the last."""

from __future__ import annotations

import pytest

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
