"""slda refuses, at the boundary, a pooled covariance whose float64 rounding the shrinkage does not resolve and scores
``x^T W + b`` that cannot resolve the classes (audit of the heads, items 1 and 3); ordinary rows keep their model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from array_api_compat import numpy as xnp
from helpers import assert_clean_error, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import make_head
from foal_pipe.store.write import write_store

COVARIANCE = re.escape("leave the pooled covariance's float64 rounding able to move the weights")
SCORES = re.escape("cannot tell the classes apart; centre the features (subtract their mean)")


def fit(X: np.ndarray, y: np.ndarray, shrinkage=1e-4, blocks: int = 1):
    head = make_head("slda", {"shrinkage": shrinkage}, xnp, X.shape[1])
    for rows in np.array_split(np.arange(y.size), blocks):
        head.add(X[rows], y[rows])
    return head.boundary()


def reference(X: np.ndarray, y: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """W and b from rows centred on their class means in long double (exact to float64 here)."""
    classes = np.unique(y)
    XL = X.astype(np.longdouble)
    M = np.stack([XL[y == c].mean(0) for c in classes])
    R = XL - M[np.searchsorted(classes, y)]
    S = (R.T @ R / y.size).astype(np.float64)
    A = (1 - eps) * S + eps * np.eye(X.shape[1])
    W = np.linalg.pinv(A, rtol=A.shape[0] * np.finfo(np.float64).eps) @ M.astype(np.float64).T
    return W, -0.5 * np.sum(M.astype(np.float64).T * W, axis=0)


def identical_rows(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The audit's s1.zarr: 4 classes, every row of a class the same, means ``scale`` from the origin."""
    m = np.random.default_rng(0).normal(size=(4, 20)) * scale
    y = np.repeat(np.arange(4), [7, 5, 3, 9])
    return m[y], y


def test_identical_rows_far_out_refused():
    """Before: a model 2.9x off (12.5% accuracy on its own training rows; the closed form, Lambda = I / eps, 100%)."""
    X, y = identical_rows(1e6)
    with pytest.raises(FoalPipeError, match=COVARIANCE) as caught:
        fit(X, y)
    assert "shrinkage 0.0001 resolves too little of it; centre or scale the features down" in str(caught.value)
    W, b = reference(X, y, 1e-4)
    assert np.array_equal((X @ W + b).argmax(1), y)  # what the refused model should have predicted


@pytest.mark.parametrize(("n", "dim"), [(30, 50), (200, 300)])
def test_rank_deficient_random_rows_refused(n, dim):
    """Rows at scale 1e4, N < D: before, W off by 0.14% (N 30) and 0.60% (N 200) from the closed form, no refusal.
    (At 1e5 and beyond pinv's cutoff drops the eps directions whatever the rounding, as its definition says.)"""
    rng = np.random.default_rng(1)
    m = rng.normal(size=(4, dim))
    y = rng.integers(0, 4, n)
    X = (m[y] + rng.normal(size=(n, dim))) * 1e4
    W, _ = reference(X, y, 1e-4)
    with pytest.raises(FoalPipeError, match=COVARIANCE):
        got = fit(X, y, blocks=3)
        assert np.linalg.norm(got.W - W) > 1e-4 * np.linalg.norm(W)  # what the old code returned


def test_smaller_shrinkage_refused_sooner():
    """eps 1e-12 resolves nothing of the rounding at scale 1e3 (before: no refusal); 1e-4 at scale 10 keeps W exact."""
    X, y = identical_rows(1e3)
    with pytest.raises(FoalPipeError, match="shrinkage 1e-12 resolves too little"):
        fit(X, y, shrinkage=1e-12)
    X, y = identical_rows(10.0)
    got = fit(X, y)
    W, b = reference(X, y, 1e-4)
    assert np.linalg.norm(got.W - W) / np.linalg.norm(W) < 1e-8


def offset_rows(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The audit's s2.zarr rows: 1e6 from the origin, a class signal of 1e-2."""
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(4, 10))
    y = np.repeat(np.arange(4), n_per_class)
    return 1e6 + 1e-2 * (m[y] + 0.3 * rng.normal(size=(y.size, 10))), y


def test_unresolvable_scores_refused():
    """Before: W and b exact (3e-15) but scores ~4.6e16 whose class differences round away: 49% accuracy (the
    Mahalanobis form: 100%)."""
    X, y = offset_rows(10, 5)
    with pytest.raises(FoalPipeError, match=SCORES):
        fit(X, y)
    centred = fit(X - 1e6, y)  # the way out the message names
    assert np.array_equal(centred.scores(X - 1e6).argmax(1), y)


def test_cli_refuses_before_writing(tmp_path):
    """The audit's repro: ``learn --head slda`` on s1.zarr exited 0 with A_last 12.5%."""
    X, y = identical_rows(1e6)
    store = tmp_path / "s1.zarr"
    write_store(str(store), (X, y), (X.copy(), y.copy()), ["a", "b", "c", "d"], dtype="float64", chunk_rows=32)
    out = tmp_path / "run"
    result = invoke("learn", "--features", str(store), "--out", str(out), "--head", "slda", "--tasks", "1")
    assert_clean_error(result, "pass a larger --shrinkage", out)


@pytest.mark.parametrize("scale", [1.0, 1e3])
@pytest.mark.parametrize(("n", "dim"), [(40, 46), (500, 50)])
def test_ordinary_rows_kept(scale, n, dim):
    """Rows at scales 1 and 1e3, N < D and N > D, in blocks: not refused, and the closed form."""
    rng = np.random.default_rng(7)
    m = rng.normal(size=(4, dim))
    y = rng.integers(0, 4, n)
    X = (m[y] + rng.normal(size=(n, dim))) * scale
    got = fit(X, y, blocks=3)
    W, b = reference(X, y, 1e-4)
    assert np.linalg.norm(got.W - W) / np.linalg.norm(W) < 1e-4
    T = (m[rng.integers(0, 4, 200)] + rng.normal(size=(200, dim))) * scale
    exact = T @ W + b
    assert np.abs(got.scores(T) - exact).max() <= 1e-4 * np.abs(exact).max()
    assert np.array_equal(got.scores(T).argmax(1), exact.argmax(1))
    fit(X - X.mean(0), y, shrinkage="oas")  # OAS's floor passes too
