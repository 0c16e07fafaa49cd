"""RidgeStatistics: sums that add, solves, GCV against a direct computation, exact leave-one-out against refits."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe import FoalPipeError
from foal_pipe.core.gammapath import RidgeEigen, RidgeTridiagonal
from foal_pipe.core.leaveoneout import LeaveOneOut
from foal_pipe.core.linalg import class_positions
from foal_pipe.core.statistics import RidgeStatistics

GAMMAS = [1e-2, 0.3, 1.0, 10.0, 300.0]


def one_hot(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return (y[:, None] == classes[None, :]).astype(np.float64)


def ridge(H: np.ndarray, Y: np.ndarray, gamma: float) -> np.ndarray:
    return np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ Y)


def data(n: int, D: int, seed: int = 0, n_classes: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping classes in D sigmoid-like features, labels 2, 4, 6, ... (non-contiguous)."""
    rng = np.random.default_rng(seed)
    y = 2 * (1 + rng.integers(0, n_classes, n))
    centres = rng.normal(size=(2 * n_classes + 3, D))
    H = 1 / (1 + np.exp(-(centres[y] + 2.0 * rng.normal(size=(n, D)))))
    return H, y


@pytest.mark.parametrize(("n", "D"), [(90, 12), (40, 60)])  # n > D and n < D
def test_sums_add_exactly_and_align_classes(n, D):
    H, y = data(n, D)
    parts = [slice(0, 13), slice(13, 30), slice(30, n)]
    total = RidgeStatistics.from_batch(H[parts[0]], y[parts[0]])
    for part in parts[1:]:
        total = total + RidgeStatistics.from_batch(H[part], y[part])
    whole = RidgeStatistics.from_batch(H, y)
    classes = np.unique(y)
    np.testing.assert_array_equal(total.classes, classes)
    np.testing.assert_array_equal(total.counts, [np.sum(y == c) for c in classes])
    assert total.n == whole.n == n
    np.testing.assert_allclose(total.G, H.T @ H, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(total.Q, H.T @ one_hot(y, classes), rtol=1e-12, atol=1e-12)
    running = RidgeStatistics.empty(D)
    G = running.G
    for part in parts:
        running += RidgeStatistics.from_batch(H[part], y[part])
    assert running.G is G  # += accumulates in place: no second D x D array
    np.testing.assert_allclose(running.Q, total.Q, rtol=1e-12, atol=1e-12)
    some = classes[[0, 2]]
    sub = whole.restrict(some)
    np.testing.assert_array_equal(sub.Q, whole.Q[:, [0, 2]])
    assert sub.target_norm2 == np.isin(y, some).sum() and sub.n == n
    wide = RidgeStatistics.from_batch(H[:5], y[:5]).aligned(np.arange(20))
    assert wide.Q.shape == (D, 20) and np.count_nonzero(wide.Q[:, ~np.isin(np.arange(20), y[:5])]) == 0


@pytest.mark.parametrize(("n", "D"), [(80, 20), (30, 45), (12, 2)])
def test_solve_eigen_and_tridiagonal_weights_equal_closed_form(n, D):
    H, y = data(n, D, seed=1)
    s = RidgeStatistics.from_batch(H, y)
    Y = one_hot(y, s.classes)
    W_eigen, W_tri = s.eigen().weights(GAMMAS), s.tridiagonal().weights(GAMMAS)
    for m, gamma in enumerate(GAMMAS):
        expected = ridge(H, Y, gamma)
        for W in (s.solve(gamma), W_eigen[:, m, :], W_tri[:, m, :]):
            assert np.abs(W - expected).max() / np.abs(expected).max() < 1e-9


def test_gamma_path_is_tridiagonal_only_without_leave_one_out_on_numpy():
    H, y = data(40, 6)
    s = RidgeStatistics.from_batch(H, y)
    assert isinstance(s.gamma_path(vectors=False), RidgeTridiagonal)
    assert isinstance(s.gamma_path(vectors=True), RidgeEigen)  # leave-one-out needs the eigenvectors
    assert isinstance(RidgeStatistics.from_batch(H[:, :1], y).gamma_path(vectors=False), RidgeEigen)  # D = 1
    tri, eigen = s.tridiagonal(), s.eigen()
    wide = np.logspace(-4, 8, 13)  # df from T's factors, not from eigenvalues: the same at every scale
    np.testing.assert_allclose(tri.dof(wide), eigen.dof(wide), rtol=1e-9)
    assert tri.floor == pytest.approx(eigen.floor, rel=1e-6)


def test_tridiagonal_floor_is_the_most_negative_eigenvalue():
    """Rounding can leave G with a negative eigenvalue; gammas up to it are refused, as by the eigen form."""
    rng = np.random.default_rng(7)
    V = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    G = (V * np.array([-1e-3, *np.linspace(1, 8, 7)])) @ V.T
    s = RidgeStatistics(G, rng.normal(size=(8, 3)), np.arange(3), 40)
    tri, eigen = s.tridiagonal(), s.eigen()
    assert tri.floor == pytest.approx(1e-3, rel=1e-6) and eigen.floor == pytest.approx(1e-3, rel=1e-6)
    for form in (tri, eigen):
        with pytest.raises(FoalPipeError, match="below the resolution"):
            form.gcv([9e-4, 1.0])
    np.testing.assert_allclose(tri.gcv([2e-3, 1.0]), eigen.gcv([2e-3, 1.0]), rtol=1e-8)


@pytest.mark.parametrize("form", ["eigen", "tridiagonal"])
@pytest.mark.parametrize(("n", "D"), [(90, 12), (40, 60)])
def test_gcv_equals_direct_computation_from_H(n, D, form):
    H, y = data(n, D, seed=2)
    s = RidgeStatistics.from_batch(H, y)
    Y = one_hot(y, s.classes)
    e = getattr(s, form)()
    gcv, df, rss = e.gcv(GAMMAS), e.dof(GAMMAS), e.rss(GAMMAS)
    for m, gamma in enumerate(GAMMAS):
        hat = H @ np.linalg.solve(H.T @ H + gamma * np.eye(D), H.T)  # the hat matrix, written out
        direct_rss = np.sum((Y - hat @ Y) ** 2)
        direct_df = np.trace(hat)
        assert rss[m] == pytest.approx(direct_rss, rel=1e-8)
        assert df[m] == pytest.approx(direct_df, rel=1e-10)
        assert gcv[m] == pytest.approx(n * direct_rss / (n - direct_df) ** 2, rel=1e-8)
    assert len(set(np.round(gcv, 12))) == len(GAMMAS)  # the gammas really differ


def brute_force_loo(H: np.ndarray, y: np.ndarray, classes: np.ndarray, gamma: float) -> tuple[float, float]:
    """Refit without each row in turn: (accuracy, mean squared error over rows and classes)."""
    Y = one_hot(y, classes)
    hits, squared = 0, 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        scores = H[i] @ ridge(H[keep], Y[keep], gamma)
        hits += classes[np.argmax(scores)] == y[i]
        squared += np.sum((Y[i] - scores) ** 2)
    return hits / len(y), squared / (len(y) * classes.size)


@pytest.mark.parametrize(("n", "D"), [(70, 12), (35, 50)])
def test_loo_equals_brute_force_refits(n, D):
    H, y = data(n, D, seed=3)
    s = RidgeStatistics.from_batch(H, y)
    loo = LeaveOneOut(s.eigen(), GAMMAS)
    order = np.random.default_rng(0).permutation(n)  # any order, any blocks
    for rows in np.array_split(order, 4):
        loo.add(H[rows], y[rows])
    accuracy, mse = loo.accuracy(), loo.mse()
    for m, gamma in enumerate(GAMMAS):
        acc_ref, mse_ref = brute_force_loo(H, y, s.classes, gamma)
        assert accuracy[m] == acc_ref
        assert mse[m] == pytest.approx(mse_ref, rel=1e-8)
    assert 0.2 < accuracy.max() < 1.0


@pytest.mark.parametrize(("n", "D"), [(120, 30), (50, 80)])
def test_loo_mse_equals_sklearn_ridgecv(n, D):
    from sklearn.linear_model import RidgeCV

    H, y = data(n, D, seed=4)
    s = RidgeStatistics.from_batch(H, y)
    loo = LeaveOneOut(s.eigen(), GAMMAS)
    loo.add(H, y)
    cv = RidgeCV(alphas=GAMMAS, fit_intercept=False, store_cv_results=True).fit(H, one_hot(y, s.classes))
    np.testing.assert_allclose(loo.mse(), cv.cv_results_.mean(axis=(0, 1)), rtol=1e-8)


def test_loo_needs_every_row_once():
    H, y = data(30, 5)
    loo = LeaveOneOut(RidgeStatistics.from_batch(H, y).eigen(), [1.0])
    loo.add(H[:20], y[:20])
    with pytest.raises(FoalPipeError, match="saw 20 rows but the statistics hold 30"):
        loo.mse()


def test_float32_sums_are_solved_in_float64_and_tiny_gammas_refused():
    H, y = data(400, 30, seed=5)
    s64 = RidgeStatistics.from_batch(H, y)
    s32 = RidgeStatistics.from_batch(H.astype(np.float32), y)
    W32 = s32.solve(1.0)
    assert W32.dtype == np.float64
    W64 = s64.solve(1.0)
    assert np.abs(W32 - W64).max() / np.abs(W64).max() < 1e-4
    floor = np.finfo(np.float32).eps * np.diag(s32.G).max()
    with pytest.raises(FoalPipeError, match="below the resolution of the float32 Gram sums"):
        s32.solve(floor / 2)
    for form in (s32.eigen(), s32.tridiagonal()):
        with pytest.raises(FoalPipeError, match="below the resolution"):
            form.gcv([floor / 2, 1.0])
    s32.solve(floor * 2)  # just above: accepted
    s64.solve(floor / 2)  # float64 sums resolve it


def test_bad_inputs():
    H, y = data(10, 4)
    with pytest.raises(FoalPipeError, match="one label per row"):
        RidgeStatistics.from_batch(H, y[:5])
    with pytest.raises(FoalPipeError, match="is not among the classes"):
        RidgeStatistics.from_batch(H, y, classes=[2, 4])
    with pytest.raises(FoalPipeError, match="sorted and unique"):
        RidgeStatistics(np.eye(2), np.zeros((2, 2)), np.array([3, 1]), 0)
    with pytest.raises(FoalPipeError, match="do not fit"):
        RidgeStatistics(np.eye(2), np.zeros((3, 2)), np.array([1, 3]), 0)
    with pytest.raises(FoalPipeError, match="dimension 5 to dimension 4"):
        RidgeStatistics.from_batch(H, y) + RidgeStatistics.empty(5)
    with pytest.raises(FoalPipeError, match="positive number"):
        RidgeStatistics.from_batch(H, y).solve(0.0)
    np.testing.assert_array_equal(class_positions(np.array([2, 5, 9]), [9, 2]), [2, 0])


def test_torch_arrays_give_the_numpy_numbers():
    """The statistics are written against the array API: torch tensors (CPU) run the same code."""
    torch = pytest.importorskip("torch")
    H, y = data(60, 10, seed=6)
    ref = RidgeStatistics.from_batch(H, y)
    got = RidgeStatistics.from_batch(torch.asarray(H[:25]), y[:25]) + RidgeStatistics.from_batch(torch.asarray(H[25:]), y[25:])
    assert isinstance(got.G, torch.Tensor)
    np.testing.assert_allclose(got.solve(0.5).numpy(), ref.solve(0.5), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.eigen().gcv(GAMMAS), ref.eigen().gcv(GAMMAS), rtol=1e-10)
    loo_t, loo_n = LeaveOneOut(got.eigen(), GAMMAS), LeaveOneOut(ref.eigen(), GAMMAS)
    loo_t.add(torch.asarray(H), y)
    loo_n.add(H, y)
    np.testing.assert_allclose(loo_t.mse(), loo_n.mse(), rtol=1e-9)
    np.testing.assert_array_equal(loo_t.accuracy(), loo_n.accuracy())
