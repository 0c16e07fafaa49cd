"""Heads audit (session 21): fecam's distances where float64 cannot give them, and fecam's refusal of ``oas``.

fecam's Mahalanobis distances are invariant to the order of the feature dimensions, so a run on the same rows with
the columns permuted must predict the same classes. Where the shrunk class covariance is too ill-conditioned for
float64 (a tiny ``--shrinkage``) or the unit rows vary little about a point far from the origin, float64's rounding
decided the predictions: a permutation changed up to half of them, with no refusal. Such classes are now refused in one
line; ordinary shrinkages and data keep passing and equal the closed form.
"""

from __future__ import annotations

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import assert_clean_error, invoke, ref_fecam

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import fecam, make_head
from foal_pipe.store import write_store

REFUSAL = "is too ill-conditioned for float64 at"


def few_rows(seed: int = 1, test: int = 500) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8 classes of 4 rows in 6 dimensions: each class covariance has rank 3, so a tiny shrinkage leaves it nearly
    singular."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(8, 6))
    y = np.repeat(np.arange(8), 4)
    return (centres[y] + 0.7 * rng.normal(size=(y.size, 6)), y,
            centres[rng.integers(0, 8, test)] + 0.7 * rng.normal(size=(test, 6)))


def far_rows(spread: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8 classes of 10 rows 1e3 from the origin, varying by ``spread`` of that: unit rows on one spot of the sphere."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(8, 6))
    y = np.repeat(np.arange(8), 10)
    return (1e3 + spread * (centres[y] + 0.7 * rng.normal(size=(y.size, 6))), y,
            1e3 + spread * (centres[rng.integers(0, 8, 500)] + 0.7 * rng.normal(size=(500, 6))))


def predictions(X: np.ndarray, y: np.ndarray, T: np.ndarray, options: dict, order: np.ndarray) -> np.ndarray:
    head = make_head("fecam", options, xnp, X.shape[1])
    head.add(X[:, order], y)
    return np.asarray(head.boundary().scores(T[:, order])).argmax(axis=1)


def moved_by_a_permutation(X: np.ndarray, y: np.ndarray, T: np.ndarray, options: dict) -> int:
    """How many test rows the same rows with their columns reversed predict otherwise (0 for an exact head)."""
    order = np.arange(X.shape[1])
    return int(np.count_nonzero(predictions(X, y, T, options, order) != predictions(X, y, T, options, order[::-1])))


@pytest.mark.parametrize(("rows", "options"), [
    (few_rows(), {"shrinkage": 1e-14}),
    (far_rows(1e-12), {}),
])
def test_fecam_refuses_distances_float64_rounding_decides(monkeypatch, rows, options):
    X, y, T = rows
    with pytest.raises(FoalPipeError, match=rf"^fecam: the shrunk covariance of class \d {REFUSAL} shrinkage="):
        head = make_head("fecam", options, xnp, X.shape[1])
        head.add(X, y)
        head.boundary()
    monkeypatch.setattr(fecam, "precision_drift", lambda *args: 0.0)  # as before: no check
    assert moved_by_a_permutation(X, y, T, options) > 10  # what the refusal stands for: rounding picked the classes


@pytest.mark.parametrize("shrinkage", [1.0, 1e-2, 1e-8])
def test_fecam_takes_ordinary_shrinkages_and_equals_the_closed_form(shrinkage):
    X, y, T = few_rows(test=200)
    assert moved_by_a_permutation(X, y, T, {"shrinkage": shrinkage}) == 0
    head = make_head("fecam", {"shrinkage": shrinkage}, xnp, X.shape[1])
    head.add(X, y)
    classes, expected = ref_fecam(X, y, T, shrinkage)
    got = np.asarray(head.boundary().scores(T))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))


def test_fecam_takes_rows_far_from_the_origin_that_vary_enough():
    X, y, T = far_rows(1e-4)
    assert moved_by_a_permutation(X, y, T, {}) == 0
    head = make_head("fecam", {}, xnp, X.shape[1])
    head.add(X, y)
    classes, expected = ref_fecam(X, y, T)
    np.testing.assert_array_equal(np.asarray(head.boundary().scores(T)).argmax(axis=1), expected.argmax(axis=1))


def test_learn_refuses_a_tiny_fecam_shrinkage_in_one_line_naming_the_class(tmp_path):
    X, y, T = few_rows(test=24)
    store = write_store(tmp_path / "s.zarr", (X, y), (T, np.arange(T.shape[0]) % 8), [f"k{i}" for i in range(8)],
                        chunk_rows=16, dtype="float64")
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--tasks", 2, "--shrinkage", 1e-13)
    assert_clean_error(result, "fecam: the shrunk covariance of class 'k", out)
    assert f"{REFUSAL} --shrinkage 1e-13" in result.output and "pass a larger --shrinkage" in result.output
    ok = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--tasks", 2, "--shrinkage", 1e-6)
    assert ok.exit_code == 0, ok.output


def test_fecam_names_oas_as_sldas_estimate(tmp_path):
    X, y, T = few_rows(test=24)
    store = write_store(tmp_path / "s.zarr", (X, y), (T, np.arange(T.shape[0]) % 8), [f"k{i}" for i in range(8)],
                        chunk_rows=16, dtype="float64")
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--head-option", "shrinkage=oas")
    assert_clean_error(result, "fecam's --shrinkage must be a number >= 0, got 'oas'; oas is slda's estimate, not "
                       "fecam's: try --shrinkage 1.0", out)
    with pytest.raises(FoalPipeError, match=r"got array\(\[1, 2\]\); try shrinkage=1\.0$"):
        fecam.check_alpha(np.array([1, 2]), "shrinkage", 1.0)  # not compared with "oas" as an array
