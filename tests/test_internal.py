"""The narrowed Optionals (:mod:`foal_pipe.protocol.internal`): where the code knows a value is set, a value that is
not stops the run with an internal error naming it, instead of a TypeError far away or a wrong result."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.protocol.internal import known
from foal_pipe.protocol.solvers import FixedGamma
from foal_pipe.protocol.walk import Learner


def test_known_hands_back_a_set_value_and_refuses_none():
    value = np.arange(3)
    assert known(value, "x") is value
    assert known(0, "zero") == 0  # falsy but set
    with pytest.raises(AssertionError, match="internal error: the anytime curve is not set"):
        known(None, "the anytime curve")


def test_learner_cache_is_the_rows_start_was_given():
    learner = Learner(run=None)  # the base learner keeps the run and the rows only
    rows = object()
    learner.start(rows)
    assert learner.cache is rows
    learner.start(None)
    with pytest.raises(AssertionError, match="internal error: the walk gave no rows to Learner"):
        _ = learner.cache


def test_fixed_gamma_model_is_the_last_boundary_solved():
    solver = FixedGamma(0.5)
    with pytest.raises(AssertionError, match="internal error: FixedGamma.model read before its first boundary"):
        _ = solver.model
    rng = np.random.default_rng(0)
    H, y = rng.normal(size=(12, 4)), np.array([0, 1, 2] * 4)
    statistics = RidgeStatistics.from_batch(H, y)
    boundary = solver.solve(statistics, 0)
    Y = np.eye(3)[y]
    W = np.linalg.solve(H.T @ H + 0.5 * np.eye(4), H.T @ Y)  # ridge's closed form
    np.testing.assert_allclose(solver.model.weights, W, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(boundary.W[:, 0, :], W, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(boundary.classes, [0, 1, 2])
