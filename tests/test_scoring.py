"""The argmax of float64 scores, decided from float32 products where a proven bound allows."""

import numpy as np
import pytest

from foal_pipe.core.scoring import FOLLOW, ModelScores, Rows, followers, relative_bound


def sigmoid_rows(n: int, D: int, seed: int = 0) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.random.default_rng(seed).normal(size=(n, D))))


def float64_argmax(H: np.ndarray, W: np.ndarray, models: int) -> np.ndarray:
    return np.argmax((H @ W).reshape(H.shape[0], models, -1), axis=2)


def test_equals_the_float64_argmax_of_every_model():
    H = sigmoid_rows(600, 300)
    W = np.random.default_rng(1).normal(size=(300, 4 * 20)) * np.repeat([1e-6, 1e-2, 1.0, 1e4], 20)
    found = ModelScores(W, 4).argmax(Rows.of(H))
    np.testing.assert_array_equal(found, float64_argmax(H, W, 4))
    np.testing.assert_array_equal(ModelScores(W, 4).argmax(Rows.of(H).head(70)), float64_argmax(H[:70], W, 4))


def test_rows_float32_cannot_rank_are_scored_again_in_float64():
    """Two classes whose weights differ below float32's resolution: float32 alone calls them a tie."""
    rng = np.random.default_rng(2)
    H = sigmoid_rows(400, 64, seed=3)
    W = rng.normal(size=(64, 5))
    W[:, 3] = W[:, 1] + 1e-7 * rng.normal(size=64)  # the winner between 1 and 3 depends on the row
    W[:, 1] += 5.0  # classes 1 and 3 lead every row by far, so only their order is in doubt
    W[:, 3] += 5.0
    exact = float64_argmax(H, W, 1)
    float32_only = np.argmax(H.astype(np.float32) @ W.astype(np.float32), axis=1)[:, None]
    assert set(np.unique(exact)) == {1, 3} and np.any(float32_only != exact)  # float32 alone gets rows wrong
    np.testing.assert_array_equal(ModelScores(W, 1).argmax(Rows.of(H)), exact)


def test_unseen_classes_scoring_zero_can_win():
    """The published code's evaluation: scores at their class positions, 0 for every other class."""
    H = sigmoid_rows(300, 40, seed=4)
    W = np.random.default_rng(5).normal(size=(40, 2 * 3)) - 0.1  # often all negative: a zero wins
    positions, width = np.array([1, 4, 6]), 8
    full = np.zeros((300, 2, width))
    full[:, :, positions] = (H @ W).reshape(300, 2, 3)
    expected = np.argmax(full, axis=2)
    assert np.any(~np.isin(expected, positions)) and np.any(np.isin(expected, positions))
    np.testing.assert_array_equal(ModelScores(W, 2, positions, width).argmax(Rows.of(H)), expected)


def test_weights_beyond_float32_range_and_float32_weights_use_float64_products():
    H = sigmoid_rows(50, 10, seed=6)
    W = np.random.default_rng(7).normal(size=(10, 6)) * 1e39
    scores = ModelScores(W, 2)
    assert scores.low is None  # float32 would overflow
    np.testing.assert_array_equal(scores.argmax(Rows.of(H)), float64_argmax(H, W, 2))
    W32 = np.random.default_rng(8).normal(size=(10, 6)).astype(np.float32)
    assert ModelScores(W32, 2).low is None  # float32 models: their own product is the reference
    np.testing.assert_array_equal(ModelScores(W32, 2).argmax(Rows.of(H.astype(np.float32))),
                                  float64_argmax(H.astype(np.float32), W32, 2))


def test_other_namespaces_score_in_their_own():
    xps = pytest.importorskip("array_api_strict")
    H, W = sigmoid_rows(30, 8, seed=9), np.random.default_rng(10).normal(size=(8, 6))
    found = ModelScores(xps.asarray(W), 2).argmax(Rows.of(xps.asarray(H)))
    np.testing.assert_array_equal(found, float64_argmax(H, W, 2))


@pytest.mark.parametrize("D", [16, 1000, 4000])
def test_float32_error_stays_within_the_bound(D):
    """The bound holds with room on large random products, including cancelling ones (mixed signs)."""
    rng = np.random.default_rng(D)
    H = np.concatenate([sigmoid_rows(200, D, seed=D), rng.normal(size=(200, D)) * 1e3])
    W = rng.normal(size=(D, 50)) * np.logspace(-8, 8, 50)
    error = np.abs((H.astype(np.float32) @ W.astype(np.float32)).astype(np.float64) - H @ W)
    allowed = relative_bound(D) * np.linalg.norm(H, axis=1)[:, None] * np.linalg.norm(W, axis=0)[None, :]
    assert np.all(error <= allowed)
    assert error.max() > 0  # float32 really rounds here


def test_unseen_zeros_act_as_one_rival_at_the_first_unseen_column():
    """Rows where every seen class scores far below 0 go to the first unseen column (float64's first of equal
    scores), and a seen class scoring exactly 0 before it wins that tie."""
    H = sigmoid_rows(200, 30, seed=11)
    W = np.random.default_rng(12).normal(size=(30, 2 * 4)) - 0.3
    W[:, 4] = 0.0  # model 1's first class (position 0) scores exactly 0 on every row
    W[:, 5:] -= 1.0
    positions, width = np.array([0, 5, 7, 9]), 10
    full = np.zeros((200, 2, width))
    full[:, :, positions] = (H @ W).reshape(200, 2, 4)
    expected = np.argmax(full, axis=2)
    assert np.any(expected[:, 0] == 1) and np.all(expected[:, 1] == 0)
    np.testing.assert_array_equal(ModelScores(W, 2, positions, width).argmax(Rows.of(H)), expected)
    seen_all = np.arange(4)  # every column seen: no zeros compete
    np.testing.assert_array_equal(ModelScores(W, 2, seen_all, 4).argmax(Rows.of(H)), float64_argmax(H, W, 2))


def near_gammas(rng: np.random.Generator, D: int, C: int) -> np.ndarray:
    """Five models, as neighbouring gammas give: 0, then 1 and 2 within a hair of it, 3 far, 4 within a hair of 3.
    Classes 1 and 3 of model 0 tie to 1e-10, so the hair flips the winner on some rows."""
    W0 = rng.normal(size=(D, C))
    W0[:, 3] = W0[:, 1] + 1e-10 * rng.normal(size=D)
    W0[:, [1, 3]] += 2.0
    W3 = rng.normal(size=(D, C))
    hair = lambda scale: scale * rng.normal(size=(D, C))  # noqa: E731
    return np.concatenate([W0, W0 + hair(1e-9), W0 + hair(1e-7), W3, W3 + hair(1e-8)], axis=1)


def test_models_close_to_a_leader_are_decided_from_its_scores_and_equal_the_float64_argmax():
    rng = np.random.default_rng(13)
    H = sigmoid_rows(500, 40, seed=14)
    W = near_gammas(rng, 40, 6)
    scores = ModelScores(W, 5)
    assert scores.leaders.tolist() == [0, 3] and scores.low.shape == (40, 12)  # the product skips three models
    expected = float64_argmax(H, W, 5)
    assert np.any(expected[:, 0] != expected[:, 1])  # the hair flips near-tie rows: followers are not copies
    np.testing.assert_array_equal(scores.argmax(Rows.of(H)), expected)
    np.testing.assert_array_equal(scores.argmax(Rows.of(H).head(33)), expected[:33])


def test_followers_bound_the_distance_to_their_leader():
    rng = np.random.default_rng(15)
    W = near_gammas(rng, 30, 4)
    blocks = W.reshape(30, 5, 4)
    norms = np.linalg.norm(blocks, axis=0).max(axis=1)
    leader, distance = followers(W, 5, norms)
    assert leader.tolist() == [0, 0, 0, 3, 3]
    for m in (1, 2, 4):
        actual = np.linalg.norm(blocks[:, m] - blocks[:, leader[m]], axis=0).max()
        assert actual <= distance[m] <= 1.01 * actual and distance[m] <= FOLLOW * norms[leader[m]]
    far = W.copy()
    far[:, 4:8] += 1e-3 * np.linalg.norm(blocks[:, 0], axis=0).max()  # beyond FOLLOW: model 1 leads
    assert followers(far, 5, norms)[0].tolist()[:2] == [0, 1]


def test_followers_with_unseen_zeros_equal_the_float64_argmax():
    rng = np.random.default_rng(16)
    H = sigmoid_rows(400, 30, seed=17)
    W = near_gammas(rng, 30, 4) - np.tile(np.r_[0.3, 2.2, 0.3, 2.2], 5)  # zeros often win
    positions, width = np.array([0, 2, 5, 7]), 9
    full = np.zeros((400, 5, width))
    full[:, :, positions] = (H @ W).reshape(400, 5, 4)
    expected = np.argmax(full, axis=2)
    assert np.any(~np.isin(expected, positions)) and np.any(np.isin(expected, positions))
    found = ModelScores(W, 5, positions, width)
    assert found.leaders.tolist() == [0, 3]
    np.testing.assert_array_equal(found.argmax(Rows.of(H)), expected)
