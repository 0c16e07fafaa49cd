"""The rounding of Gram sums measured on their whole diagonal (``Rounding.diagonal``, ``core.rounding.diagonal_estimate``).

A few sampled entries miss the coherent rounding of a ReLU store of repeated rows (a sparse column's products are
often exactly 0); the diagonal's relative errors, taken for every entry's, stand close to the root mean square error
over every entry (0.93-1.39x in benchmarks/RESULTS.md). Checked against float64 sums of the same float32 rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier
from foal_pipe.core.drift import UNITS
from foal_pipe.core.rounding import Rounding, checked_rounding, diagonal_estimate, sample_entries
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model

U32 = UNITS["float32"]


def _rows(n: int, dim: int, relu: bool, seed: int = 0, copies: int = 1) -> np.ndarray:
    """Activations of ``n`` rows of 6 Gaussian classes through a random projection to ``dim``, tiled ``copies``
    times."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, n)
    X = rng.normal(size=(6, 16))[labels] + rng.normal(size=(n, 16))
    Z = X @ rng.normal(size=(16, dim)) / 4.0
    H = (np.maximum(Z, 0.0) if relu else 1.0 / (1.0 + np.exp(-Z))).astype(np.float32)
    return np.tile(H, (copies, 1))


def _sums(H: np.ndarray, block: int) -> RidgeStatistics:
    s = RidgeStatistics.empty(H.shape[1], dtype=np.float32)
    labels = np.zeros(H.shape[0], dtype=np.int64)
    for lo in range(0, H.shape[0], block):
        s += RidgeStatistics.from_batch(H[lo : lo + block], labels[lo : lo + block], np.arange(1))
    return s


CASES = {  # name: (rows, dim, relu, copies, block)
    "sigmoid, distinct, one block": (3000, 64, False, 1, 4096),
    "sigmoid, distinct, five blocks": (5000, 64, False, 1, 1000),
    "relu, distinct": (4096, 100, True, 1, 4096),
    "sigmoid, 16 rows 512 times": (16, 40, False, 512, 4096),
    "relu, 16 rows 256 times, two blocks": (16, 100, True, 256, 2048),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_diagonal_errors_are_exact_and_estimate_every_entrys(case):
    n, dim, relu, copies, block = CASES[case]
    H = _rows(n, dim, relu, copies=copies)
    s = _sums(H, block)
    exact = H.astype(np.float64).T @ H.astype(np.float64)
    error = exact - s.G.astype(np.float64)
    top = U32 * float(np.abs(s.G).max())
    # measured: the products' rounding and the additions', exactly (to float64's precision)
    np.testing.assert_allclose(s.rounding.diagonal, np.diag(error), rtol=0, atol=1e-4 * top)
    rows, cols = sample_entries(dim)
    np.testing.assert_allclose(s.rounding.errors, error[rows, cols], rtol=0, atol=1e-4 * top)
    every = float(np.sqrt(np.mean(error**2)))
    estimate = diagonal_estimate(s.rounding.diagonal, s.G)
    assert 0.8 * every <= estimate <= 1.5 * every, (estimate / every, case)
    assert s.rounding.measured(s.G) >= 0.8 * every


def test_a_relu_store_of_repeated_rows_is_seen_on_the_diagonal_where_the_sampled_entries_miss_it():
    H = _rows(16, 100, True, seed=1, copies=256)
    s = _sums(H, 2048)
    error = H.astype(np.float64).T @ H.astype(np.float64) - s.G.astype(np.float64)
    every = float(np.sqrt(np.mean(error**2)))
    sampled_only = float(np.sqrt(np.mean(s.rounding.errors**2)))
    assert sampled_only < 0.8 * every  # what the sums measured before the diagonal: short of it
    assert s.rounding.measured(s.G) >= 0.8 * every


def test_a_model_file_keeps_the_diagonal_and_a_file_without_it_reads_as_before(tmp_path):
    H = _rows(600, 24, False)
    labels = np.arange(600) % 3
    clf = AnalyticClassifier(gamma=1.0, dtype="float32")
    for lo in range(0, 600, 100):
        clf.partial_fit(H[lo : lo + 100], labels[lo : lo + 100], classes=np.arange(3))
    path = clf.save(tmp_path / "m.safetensors")
    meta = read_model(path)[1]
    assert meta["sums_rounding_diagonal"] == clf.statistics_.rounding.diagonal.tolist()
    assert AnalyticClassifier.load(path).statistics_.rounding == clf.statistics_.rounding
    old = Rounding(clf.statistics_.rounding.variance, clf.statistics_.rounding.errors)  # a file written before
    assert old.measured(clf.statistics_.G) == float(np.sqrt(np.mean(old.errors**2)))
    continued = old + clf.statistics_.rounding  # continuing measures the diagonal from then on
    np.testing.assert_array_equal(continued.diagonal, clf.statistics_.rounding.diagonal)


def test_a_diagonal_of_the_wrong_size_or_not_finite_is_refused():
    errors = np.zeros(sample_entries(8)[0].size)
    assert checked_rounding(Rounding(1.0, errors, np.zeros(8)), 8).diagonal.shape == (8,)
    for diagonal in (np.zeros(7), np.array([np.nan] + [0.0] * 7)):
        with pytest.raises(FoalPipeError, match="diagonal errors must be 8 finite numbers"):
            checked_rounding(Rounding(1.0, errors, diagonal), 8)
