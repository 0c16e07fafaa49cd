"""Leave-one-out of a row that is its class's only row: left out, the class has no rows, so the row's own-class
score is exactly 0 (not the rounding of ``s - h``, equal in exact arithmetic). Every figure is checked against
ridge refitted without each scored row by ``np.linalg.solve`` (an argmax tie to the first class, as NumPy's), on
the full pass, the sampled one (eigenvectors and tridiagonal form, with and without the float32 screen), the
generic namespace code and a boundary as the protocol builds it."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest

from foal_pipe.core.leaveoneout import LeaveOneOut, SampledLeaveOneOut, lonely_classes
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.solvers import ManyGammas

GAMMAS = [1e-3, 1e-1, 1.0, 10.0, 1e3]


def refits(H: np.ndarray, y: np.ndarray, gammas, scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per gamma, the scored rows whose refit without them predicts their label, and their summed squared residuals."""
    classes = np.unique(y)
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    n, D = H.shape
    right, squared = np.zeros(len(gammas), dtype=np.int64), np.zeros(len(gammas))
    for k, gamma in enumerate(gammas):
        for i in scored:
            keep = np.arange(n) != i
            W = np.linalg.solve(H[keep].T @ H[keep] + gamma * np.eye(D), H[keep].T @ Y[keep])
            s = H[i] @ W
            right[k] += int(np.argmax(s) == np.searchsorted(classes, y[i]))
            squared[k] += float(np.sum((Y[i] - s) ** 2))
    return right, squared


def rows(seed: int, tied: bool) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian classes (1, 3, 5) and six classes of one row each (0, 2, 4, 6, 7, 8). ``tied``: the lonely
    rows are scaled unit vectors orthogonal to every other row, so their left-out scores are all exactly 0 (a tie
    that the first class, 0, wins); else they are Gaussian too."""
    rng = np.random.default_rng(seed)
    D, lonely = 16, 6
    labels = np.array([1, 3, 5])[rng.integers(0, 3, 30)]
    centres = {c: rng.normal(size=D - lonely) for c in (1, 3, 5)}
    crowd = np.hstack([np.zeros((30, lonely)), np.stack([centres[c] for c in labels]) + rng.normal(size=(30, D - lonely))])
    alone = np.eye(D)[:lonely] * rng.uniform(0.5, 3.0, lonely)[:, None] if tied else rng.normal(size=(lonely, D))
    return np.vstack([alone, crowd]), np.concatenate([[0, 2, 4, 6, 7, 8], labels])


def check(got: dict[str, np.ndarray], right: np.ndarray, squared: np.ndarray, n: int, C: int) -> None:
    np.testing.assert_array_equal(np.rint(got["loo_accuracy"] * n).astype(np.int64), right)
    if "loo" in got:
        np.testing.assert_allclose(got["loo"], squared / (n * C), rtol=1e-9)


@pytest.mark.parametrize("tied", [True, False])
def test_full_leave_one_out_matches_refits(tied):
    H, y = rows(3, tied)
    stats = RidgeStatistics.from_batch(H, y)
    loo = LeaveOneOut(stats.eigen(), GAMMAS, stats.counts)
    loo.add(H[:20], y[:20])
    loo.add(H[20:], y[20:])
    check(loo.evaluate(), *refits(H, y, GAMMAS, np.arange(y.size)), y.size, 9)


@pytest.mark.parametrize("form", ["eigen", "tridiagonal"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("names", [("loo_accuracy",), ("loo_accuracy", "loo")])  # the float32 screen, the float64 pass
def test_sampled_leave_one_out_matches_refits(form, tied, names):
    H, y = rows(4, tied)
    stats = RidgeStatistics.from_batch(H, y)
    pick = np.concatenate([np.arange(6), np.random.default_rng(0).choice(np.arange(6, y.size), 14, replace=False)])
    loo = SampledLeaveOneOut(getattr(stats, form)(), GAMMAS, pick.size, stats.counts)
    loo.add(H[pick], y[pick])
    check(loo.evaluate(names=names), *refits(H, y, GAMMAS, pick), pick.size, 9)


def test_generic_namespace_matches_refits():
    """array_api_strict: the code every namespace but NumPy runs."""
    H, y = rows(5, True)
    stats = RidgeStatistics.from_batch(array_api_strict.asarray(H), y)
    loo = LeaveOneOut(stats.eigen(), GAMMAS, stats.counts)
    loo.add(array_api_strict.asarray(H), y)
    check(loo.evaluate(), *refits(H, y, GAMMAS, np.arange(y.size)), y.size, 9)


def test_a_boundary_of_the_protocol_counts_its_lonely_classes():
    """:class:`ManyGammas` hands the statistics' counts to its leave-one-out pass."""
    H, y = rows(6, True)
    solver = ManyGammas(GAMMAS, loo=True, choose=None)
    pending = solver.start(RidgeStatistics.from_batch(H, y), 0)
    assert pending.loo is not None
    pending.loo.add(H, y)
    check(pending.loo.evaluate(), *refits(H, y, solver.fine, np.arange(y.size)), y.size, 9)


def test_lonely_classes():
    classes = np.array([2, 5, 7])
    np.testing.assert_array_equal(lonely_classes(np.array([1, 4, 1]), classes), [True, False, True])
    assert lonely_classes(np.array([2, 4, 3]), classes) is None
    assert lonely_classes(None, classes) is None
    with pytest.raises(FoalPipeError, match="counts has 2 entries for 3 classes"):
        lonely_classes(np.array([1, 2]), classes)
