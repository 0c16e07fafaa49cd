"""``Q = H^T Y`` is formed and held in float64 whatever the sums' dtype (the drift checks count ``G``'s rounding
only; a float32 ``Q`` of repeated rows rounded alike in every product and moved the weights past them): from rows,
given directly, added, and in model files, where a file that holds it in float32 (written before) is still read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.model.modelfile import read_model, write_model


def _rows(seed: int, n: int, dim: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, dim), dtype=np.float32), rng.integers(0, 3, n)


def _exact_q(H: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each entry as ``math.fsum`` of the float32 rows' values: the correctly rounded sum."""
    return np.array([[math.fsum(H[labels == c, j].astype(np.float64)) for c in range(3)] for j in range(H.shape[1])])


def test_float32_rows_give_the_correctly_rounded_class_sums_in_float64():
    H, labels = _rows(0, 20_000)
    s = RidgeStatistics.from_batch(H, labels)
    assert (s.G.dtype, s.Q.dtype) == (np.float32, np.float64)
    exact = _exact_q(H, labels)
    np.testing.assert_allclose(s.Q, exact, rtol=1e-13, atol=0)
    float32_q = H.T @ (labels[:, None] == np.arange(3)).astype(np.float32)
    assert np.abs(float32_q - exact).max() > 1e3 * np.abs(s.Q - exact).max()  # what holding it in float32 lost
    added = RidgeStatistics.from_batch(H[:7_000], labels[:7_000]) + RidgeStatistics.from_batch(H[7_000:], labels[7_000:])
    assert added.Q.dtype == np.float64
    np.testing.assert_allclose(added.Q, exact, rtol=1e-13, atol=0)


def test_q_given_in_float32_is_held_in_float64():
    H, labels = _rows(1, 50)
    s = RidgeStatistics.from_batch(H, labels)
    given = RidgeStatistics(s.G, s.Q.astype(np.float32), s.classes, s.n, s.counts)
    assert given.Q.dtype == np.float64
    np.testing.assert_array_equal(given.Q, s.Q.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("engine_dtype", ["float32", "float64"])
def test_a_model_file_holding_q_in_its_dtype_is_read_and_learns_on(tmp_path, engine_dtype):
    H, labels = _rows(2, 400)
    H2, labels2 = _rows(3, 100)
    clf = AnalyticClassifier(gamma=0.5, dtype=engine_dtype).fit(H, labels)
    tensors, metadata = read_model(clf.save(tmp_path / "new.safetensors"))
    assert tensors["Q"].dtype == np.float64
    # the file a writer before the twenty-eighth stop made: Q in the dtype, W solving it
    tensors["Q"] = tensors["Q"].astype(engine_dtype)
    G = tensors["G"].astype(np.float64)
    tensors["W"] = np.linalg.solve(G + 0.5 * np.eye(G.shape[0]), tensors["Q"].astype(np.float64))
    old = AnalyticClassifier.load(write_model(tmp_path / "old.safetensors", tensors, metadata))
    assert old.statistics_.Q.dtype == np.float64
    np.testing.assert_array_equal(old.statistics_.Q, tensors["Q"].astype(np.float64))
    old.partial_fit(H2, labels2)
    X = np.vstack([H, H2]).astype(np.float64)
    Y = (np.concatenate([labels, labels2])[:, None] == np.arange(3)).astype(np.float64)
    exact = np.linalg.solve(X.T @ X + 0.5 * np.eye(X.shape[1]), X.T @ Y)
    np.testing.assert_allclose(old.weights_, exact, rtol=0, atol=(1e-5 if engine_dtype == "float32" else 1e-12))
