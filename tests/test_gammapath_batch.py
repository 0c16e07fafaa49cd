"""RidgeTridiagonal's many-gamma figures: each gamma's against a closed form written out, and the same bits
whichever other gammas are asked with it (so the refined grid can reuse the coarse grid's)."""

from __future__ import annotations

import numpy as np
import pytest
from test_statistics import data, one_hot, ridge

from foal_pipe.core.statistics import RidgeStatistics

COARSE = np.array([1e-2, 1.0, 100.0, 1e4])
FINE = np.sort(np.concatenate([COARSE, [0.05, 0.3, 3.0, 30.0, 700.0]]))


@pytest.mark.parametrize(("n", "D", "classes"), [(90, 12, 5), (40, 60, 3), (30, 8, 1)])
def test_tridiagonal_figures_do_not_depend_on_the_other_gammas(n, D, classes):
    H, y = data(n, D, seed=3, n_classes=classes)
    s = RidgeStatistics.from_batch(H, y)
    coarse_first = s.tridiagonal()
    coarse = coarse_first.gcv(COARSE)
    fine = coarse_first.gcv(FINE)  # reuses the coarse gammas' sums
    np.testing.assert_array_equal(fine[np.searchsorted(FINE, COARSE)], coarse)
    fresh = s.tridiagonal()
    np.testing.assert_array_equal(fresh.gcv(FINE[::-1])[::-1], fine)  # computed in another order, from scratch
    for m, gamma in enumerate(FINE):
        alone = s.tridiagonal()
        assert alone.gcv([gamma])[0] == fine[m] and alone.dof([gamma])[0] == fresh.dof(FINE)[m]
    Y = one_hot(y, s.classes)
    for m, gamma in enumerate(FINE):
        hat = H @ np.linalg.solve(H.T @ H + gamma * np.eye(D), H.T)
        rss, df = np.sum((Y - hat @ Y) ** 2), np.trace(hat)
        assert fine[m] == pytest.approx(n * rss / (n - df) ** 2, rel=1e-8)


def test_tridiagonal_weights_of_repeated_and_unordered_gammas_equal_closed_form():
    H, y = data(60, 15, seed=4)
    s = RidgeStatistics.from_batch(H, y)
    path = s.tridiagonal()
    path.gcv(FINE)  # the weights reuse these solves
    gammas = [100.0, 0.3, 100.0, 7.0]
    W = path.weights(gammas)
    assert W.shape == (15, 4, s.classes.size)
    for m, gamma in enumerate(gammas):
        expected = ridge(H, one_hot(y, s.classes), gamma)
        assert np.abs(W[:, m, :] - expected).max() / np.abs(expected).max() < 1e-9
    np.testing.assert_array_equal(W[:, 0, :], W[:, 2, :])
