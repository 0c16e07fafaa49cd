"""Leave-one-out on a sample of the rows (issue 23): the sampled criterion against the exact one and against
refits by hand, the scores and leverages by hand, the row sample, the bound, and learn --loo-sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foal_pipe.core.gammapath import SampledLeaveOneOut, sample_bound
from foal_pipe.core.statistics import RidgeStatistics

GAMMAS = np.array([1e-3, 0.05, 1.0, 7.5, 300.0])


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    n, D = 90, 14
    labels = rng.choice([2, 5, 9], size=n)
    H = rng.normal(size=(n, D)) + labels[:, None] * 0.15
    return H, labels


def _sampled(path, H, labels, rows):
    loo = SampledLeaveOneOut(path, GAMMAS, len(rows))
    loo.add(H[rows], labels[rows])
    return loo


def test_scores_and_leverages_equal_the_closed_form(data):
    H, labels = data
    s_tri, l_tri = RidgeStatistics.from_batch(H, labels).eigen().fitted(H, GAMMAS)
    Y = (labels[:, None] == np.array([2, 5, 9])[None, :]).astype(float)
    for m, g in enumerate(GAMMAS):
        inv = np.linalg.inv(H.T @ H + g * np.eye(H.shape[1]))
        np.testing.assert_allclose(l_tri[:, m], np.einsum("id,de,ie->i", H, inv, H), rtol=0, atol=1e-9)
        np.testing.assert_allclose(s_tri[:, m, :], H @ inv @ H.T @ Y, rtol=0, atol=1e-9)


def test_all_rows_sampled_equal_the_exact_leave_one_out(data):
    H, labels = data
    stats = RidgeStatistics.from_batch(H, labels)
    exact = stats.eigen().loo(GAMMAS)
    exact.add(H, labels)
    sampled = _sampled(stats.eigen(), H, labels, np.arange(H.shape[0]))
    np.testing.assert_array_equal(sampled.accuracy(), exact.accuracy())
    np.testing.assert_allclose(sampled.mse(), exact.mse(), rtol=1e-9, atol=0)


def test_a_sample_equals_refits_without_each_sampled_row(data):
    H, labels = data
    classes = np.array([2, 5, 9])
    Y = (labels[:, None] == classes[None, :]).astype(float)
    rows = np.array([0, 3, 4, 17, 40, 41, 66, 89])
    sampled = _sampled(RidgeStatistics.from_batch(H, labels).eigen(), H, labels, rows)
    correct, squared = np.zeros(GAMMAS.size), np.zeros(GAMMAS.size)
    for m, g in enumerate(GAMMAS):
        for i in rows:
            keep = np.arange(H.shape[0]) != i
            W = np.linalg.solve(H[keep].T @ H[keep] + g * np.eye(H.shape[1]), H[keep].T @ Y[keep])
            score = H[i] @ W
            correct[m] += classes[np.argmax(score)] == labels[i]
            squared[m] += np.sum((Y[i] - score) ** 2)
    np.testing.assert_array_equal(sampled.accuracy(), correct / rows.size)
    np.testing.assert_allclose(sampled.mse(), squared / (rows.size * classes.size), rtol=1e-8, atol=0)


def test_an_incomplete_sample_is_refused(data):
    H, labels = data
    loo = SampledLeaveOneOut(RidgeStatistics.from_batch(H, labels).eigen(), GAMMAS, 10)
    loo.add(H[:9], labels[:9])
    with pytest.raises(Exception, match="saw 9 rows but the sample holds 10"):
        loo.accuracy()


def test_the_bound_is_hoeffding_with_a_union_over_the_gammas():
    assert sample_bound(4096, 97, 0.05) == pytest.approx(math.sqrt(math.log(2 * 97 / 0.05) / (2 * 4096)), rel=1e-15)
    assert sample_bound(4096, 97) == pytest.approx(0.03176, abs=5e-6)
    assert sample_bound(1000, 97) > sample_bound(4000, 97)
