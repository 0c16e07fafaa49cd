"""Leave-one-out on a sample of the rows (issue 23): the sampled criterion against the exact one and against
refits by hand, the scores and leverages by hand, the row sample, the bound, and learn --loo-sample."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import N_CLASSES, assert_clean_error, build_store, invoke, learn, read

from foal_pipe.core import leaveoneout
from foal_pipe.core.gammapath import fitted_from
from foal_pipe.core.leaveoneout import LeaveOneOut, SampledLeaveOneOut, left_out, sample_bound
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.protocol.loosample import RowSample
from foal_pipe.protocol.stream import build_stream

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


FORMS = ("eigen", "tridiagonal")


def _path(H, labels, form):
    """The statistics' path in ``form``: ``G``'s eigenvectors, or the tridiagonal form with its recurrences."""
    return getattr(RidgeStatistics.from_batch(H, labels), form)()


@pytest.mark.parametrize("form", FORMS)
def test_scores_and_leverages_equal_the_closed_form(data, form):
    H, labels = data
    s_tri, l_tri = _path(H, labels, form).fitted(H, GAMMAS)
    Y = (labels[:, None] == np.array([2, 5, 9])[None, :]).astype(float)
    for m, g in enumerate(GAMMAS):
        inv = np.linalg.inv(H.T @ H + g * np.eye(H.shape[1]))
        np.testing.assert_allclose(l_tri[:, m], np.einsum("id,de,ie->i", H, inv, H), rtol=0, atol=1e-9)
        np.testing.assert_allclose(s_tri[:, m, :], H @ inv @ H.T @ Y, rtol=0, atol=1e-9)


def test_all_rows_sampled_equal_the_exact_leave_one_out(data):
    H, labels = data
    stats = RidgeStatistics.from_batch(H, labels)
    exact = LeaveOneOut(stats.eigen(), GAMMAS)
    exact.add(H, labels)
    sampled = _sampled(stats.eigen(), H, labels, np.arange(H.shape[0]))
    np.testing.assert_array_equal(sampled.accuracy(), exact.accuracy())
    np.testing.assert_allclose(sampled.mse(), exact.mse(), rtol=1e-9, atol=0)


@pytest.mark.parametrize("form", FORMS)
def test_a_sample_equals_refits_without_each_sampled_row(data, form):
    H, labels = data
    classes = np.array([2, 5, 9])
    Y = (labels[:, None] == classes[None, :]).astype(float)
    rows = np.array([0, 3, 4, 17, 40, 41, 66, 89])
    sampled = _sampled(_path(H, labels, form), H, labels, rows)
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


def test_tridiagonal_leverages_depend_on_their_own_row_and_gamma_only(data):
    """A leverage's bits are the same whichever rows and gammas are computed with it: the screen's counts and the
    float64 pipeline's then read the same leverages, and a zoom's stages do not change earlier values."""
    H, labels = data
    path = _path(H, labels, "tridiagonal")
    Z = path.coordinates(H)
    together = path.leverages(Z, path.scaling(GAMMAS)[0])
    for m in range(GAMMAS.size):
        for rows in (slice(0, 1), slice(5, 40), slice(None)):
            alone = path.leverages(Z[rows], path.scaling(GAMMAS[m : m + 1])[0])
            assert alone.tobytes() == np.ascontiguousarray(together[rows, m : m + 1]).tobytes()
    kept = np.array([np.einsum("d,de,e->", h, np.linalg.inv(H.T @ H + g * np.eye(H.shape[1])), h) for h in H[:5]
                     for g in GAMMAS]).reshape(5, GAMMAS.size)
    np.testing.assert_allclose(together[:5], kept, rtol=1e-10, atol=0)


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


# ---- learn --loo-sample: the sample, the curve, the record ---------------------------------------------------------

RANGE = "1e-3,1e3"  # 49 gammas at 8 per decade
POINTS = 10.0 ** np.linspace(-3, 3, 49)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("loosample") / "blobs.zarr", n_train=300, noise=2.5)


def _learn(store, out, *extra):
    return learn(store, out, "--gamma", "auto", "--gamma-grid", RANGE, *extra)


def test_the_sample_is_the_least_ranks_among_the_rows_seen():
    rng = np.random.default_rng(0)
    order = rng.permutation(120)  # a stream over 100 of a split's 120 rows, in tasks of 40, 25 and 35
    tasks = [order[:40], order[40:65], order[65:100]]
    sample = RowSample.draw(tasks, 120, 30, 5)
    ranks = np.random.default_rng([5, 23]).permutation(120)  # a rank for every row of the split
    for k in range(3):
        seen = np.concatenate(tasks[: k + 1])
        np.testing.assert_array_equal(sample.boundaries[k], np.sort(seen[np.argsort(ranks[seen])[:30]]))
    assert RowSample.draw(tasks, 120, 30, 5).kept.tolist() == sample.kept.tolist()  # deterministic
    assert RowSample.draw(tasks, 120, 30, 6).boundaries[0].tolist() != sample.boundaries[0].tolist()
    assert RowSample.draw(tasks, 120, 60, 5).boundaries[0].tolist() == np.sort(tasks[0]).tolist()  # M >= seen: all


def test_the_sample_depends_only_on_the_rows_seen():
    """Not on their order nor on the task cuts before: two streams that have seen the same rows sample the same ones
    (what lets ``table`` share a 5-task boundary with the 10-task boundary after the same classes)."""
    order = np.random.default_rng(1).permutation(200)
    coarse = RowSample.draw([order[:100], order[100:]], 200, 25, 2)
    fine = RowSample.draw([order[:50], np.sort(order[50:100]), order[100:150], order[150:][::-1]], 200, 25, 2)
    np.testing.assert_array_equal(coarse.boundaries[0], fine.boundaries[1])
    np.testing.assert_array_equal(coarse.boundaries[1], fine.boundaries[3])
    assert not np.array_equal(fine.boundaries[0], fine.boundaries[1])


def test_a_sample_of_every_row_gives_the_exact_curve_and_choice(tmp_path, store):
    exact, _ = _learn(store, tmp_path / "exact", "--loo-sample", 0)
    every, _ = _learn(store, tmp_path / "every", "--loo-sample", 10_000)
    a, b = exact["gamma_search"], every["gamma_search"]
    assert b["evaluated"] == a["evaluated"]  # the same zoom over the same values
    for vb, va in zip(b["values"], a["values"]):
        np.testing.assert_allclose(vb, va, rtol=0, atol=1e-12)
    assert b["gammas_selected"] == a["gammas_selected"]
    assert exact["accuracy_matrix"] == every["accuracy_matrix"]
    sizes = [len(r) for r in build_stream(read(store)[1], N_CLASSES, 4, 10, 3).rows]
    assert b["sample_eps"] == [0.0] * 4 and b["sample_rows"] == np.cumsum(sizes).tolist()
    assert "sample_rows" not in a and "loo_sample" not in a


def test_a_sample_gives_leave_one_out_of_the_sampled_rows_by_hand_and_the_bound(tmp_path, store):
    m = 50
    metrics, model = _learn(store, tmp_path / "s", "--loo-sample", m)
    search = metrics["gamma_search"]
    Xtr, ytr, _, _ = read(store)
    stream = build_stream(ytr, N_CLASSES, 4, 10, 3)
    walk = np.concatenate([np.sort(r) for r in stream.rows])  # each task's rows in dataset order
    ranks = np.random.default_rng([3, 23]).permutation(ytr.size)  # a rank for every train row of the store
    P = model["projection"]
    for k in range(4):
        end = sum(r.size for r in stream.rows[: k + 1])
        rows = walk[:end]
        chosen = np.sort(np.argsort(ranks[rows])[:m])  # the rows seen with the m least ranks
        H = 1 / (1 + np.exp(-(Xtr[rows].astype(np.float64) @ P)))
        seen = np.unique(ytr[rows])
        Y = (ytr[rows][:, None] == seen[None, :]).astype(float)
        accuracy = []
        for g in POINTS[search["evaluated"][k]]:  # the points the zoom evaluated
            hat = H[chosen] @ np.linalg.solve(H.T @ H + g * np.eye(H.shape[1]), H.T)  # sampled rows of the hat matrix
            E = (Y[chosen] - hat @ Y) / (1 - hat[np.arange(m), chosen])[:, None]
            accuracy.append(np.mean(seen[np.argmax(Y[chosen] - E, axis=1)] == ytr[rows][chosen]))
        np.testing.assert_allclose(search["values"][k], accuracy, rtol=0, atol=1e-12)
        assert search["sample_rows"][k] == m
        assert search["sample_eps"][k] == pytest.approx(math.sqrt(math.log(2 * 49 / 0.05) / (2 * m)), rel=1e-12)
    assert search["loo_sample"] == m and search["sample_delta"] == 0.05


def test_loo_sample_same_bytes_twice_and_a_bad_value_refused(tmp_path, store):
    for run in ("a", "b"):
        _learn(store, tmp_path / run, "--loo-sample", 40)
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert_clean_error(invoke("learn", "--features", store, "--out", tmp_path / "x", "--gamma", "auto",
                              "--loo-sample", -1, "--backend", "numpy"), "--loo-sample counts the rows", tmp_path / "x")


def test_tridiagonal_scores_and_leverages_equal_the_eigen_ones(data):
    H, labels = data
    stats = RidgeStatistics.from_batch(H, labels)
    s_tri, l_tri = stats.tridiagonal().fitted(H[:30], GAMMAS)
    s_eig, l_eig = stats.eigen().fitted(H[:30], GAMMAS)
    np.testing.assert_allclose(s_tri, s_eig, rtol=0, atol=1e-9)
    np.testing.assert_allclose(l_tri, l_eig, rtol=0, atol=1e-9)
    loo = SampledLeaveOneOut(stats.tridiagonal(), GAMMAS, 30)
    loo.add(H[:30], labels[:30])
    exact = _sampled(stats.eigen(), H, labels, np.arange(30))
    np.testing.assert_array_equal(loo.accuracy(), exact.accuracy())


def test_sampled_rows_kept_or_projected_again_give_the_same_bytes(tmp_path, store, monkeypatch):
    """The sampled rows' activations kept in memory, or projected again from the cached rows at every boundary
    (a --max-memory below their size): the same bytes, since the blocks holding sampled rows are projected again
    whole, as the Gram pass projected them (never more than the rows seen)."""
    import foal_pipe.protocol.learners.gram as gram

    projected = []
    project = gram._project
    monkeypatch.setattr(gram, "_project", lambda run, X: projected.append(X.shape[0]) or project(run, X))
    written, counts = {}, {}
    for budget in ("8GiB", "1KiB"):
        projected.clear()
        _learn(store, tmp_path / budget, "--loo-sample", 40, "--max-memory", budget)
        written[budget] = [(tmp_path / budget / name).read_bytes() for name in ("metrics.json", "model.safetensors")]
        counts[budget] = sum(projected)
    assert written["8GiB"] == written["1KiB"]
    sizes = [len(r) for r in build_stream(read(store)[1], N_CLASSES, 4, 10, 3).rows]
    assert counts["8GiB"] == sum(sizes)
    assert sum(sizes) + sum(min(40, e) for e in np.cumsum(sizes)) < counts["1KiB"] <= sum(sizes) + sum(np.cumsum(sizes))


def test_the_memory_estimate_counts_only_the_rows_ever_sampled(store, monkeypatch):
    from foal_pipe.protocol.config import KEPT_PART, EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.run import prepare

    parts = {}
    monkeypatch.setattr("foal_pipe.protocol.run.check_memory", lambda command, p, fix: parts.update(p) or 0)
    prepare(store, StreamConfig(tasks=3), ModelConfig(projection_dim=400, gamma="auto", loo_sample=100),
            EvaluationConfig(), ExecutionConfig(backend="numpy"), loo=True)
    ytr = read(store)[1]
    tasks = build_stream(ytr, N_CLASSES, 3, 10, 0).rows
    ranks = np.random.default_rng([0, 23]).permutation(ytr.size)  # a rank for every train row of the store
    ever: set[int] = set()
    for k in range(len(tasks)):
        seen = np.concatenate(tasks[: k + 1])
        ever |= set(seen[np.argsort(ranks[seen])[:100]].tolist())
    assert 100 < len(ever) < sum(t.size for t in tasks)
    assert parts[KEPT_PART] == len(ever) * 400 * 8


def test_left_out_scores_equal_the_one_hot_residuals_bit_for_bit(data):
    """The NumPy route shifts only the label entries; the formula with the whole one-hot Y, written out here, gives
    the same counts and the same squared sums to the last bit (a leverage of 1 included: inf)."""
    H, labels = data
    classes = np.array([2, 5, 9])
    fitted, leverage = RidgeStatistics.from_batch(H, labels).eigen().fitted(H, GAMMAS)
    leverage[3, 1] = 1.0
    Y = (labels[:, None] == classes[None, :]).astype(float)[:, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        residual = (fitted - Y) / (1.0 - leverage)[:, :, None]
    squared = np.sum(np.linalg.vecdot(residual, residual, axis=-1), axis=0)
    right = np.sum(np.argmax(residual + Y, axis=2) == np.searchsorted(classes, labels)[:, None], axis=0)
    got_right, got_squared = left_out(fitted.copy(), leverage, labels, classes)
    assert np.isinf(got_squared[1])
    np.testing.assert_array_equal(got_right, right)
    assert got_squared.tobytes() == squared.tobytes()


def test_reused_block_buffers_give_what_fresh_arrays_give(data, monkeypatch):
    """Evaluations of different gamma counts and blocks of different sizes reuse the same buffers: each result
    equals, bit for bit, the products and the left-out work on fresh arrays."""
    monkeypatch.setattr(leaveoneout, "LOO_BLOCK_VALUES", 3 * 2 * 3 * 7)  # blocks of 7 rows at 2 gammas, 2 at 5
    H, labels = data
    path = RidgeStatistics.from_batch(H, labels).eigen()
    rows = np.arange(0, H.shape[0], 2)
    loo = _sampled(path, H, labels, rows)
    Z = path.coordinates(H[rows])
    for indices in ([0, 4], [1, 2, 3], [2], [0, 1, 2, 3, 4], [3, 4]):
        indices = np.array(indices)
        inv, scaled = path.scaling(GAMMAS[indices])
        step = max(1, leaveoneout.LOO_BLOCK_VALUES // (3 * indices.size * 3))
        right, squared = np.zeros(indices.size, dtype=np.int64), np.zeros(indices.size)
        for lo in range(0, rows.size, step):
            block = Z[lo : lo + step]
            got = left_out(np.reshape(block @ scaled, (block.shape[0], indices.size, 3)), (block * block) @ inv,
                           labels[rows][lo : lo + step], path.classes)
            right, squared = right + got[0], squared + got[1]
        curves = loo.evaluate(indices)
        np.testing.assert_array_equal(curves["loo_accuracy"], right / rows.size)
        assert curves["loo"].tobytes() == (squared / (rows.size * 3)).tobytes()


def test_the_exact_pass_with_reused_buffers_equals_refits_in_blocks(data, monkeypatch):
    monkeypatch.setattr(leaveoneout, "LOO_BLOCK_VALUES", 200)  # blocks of 6 rows, the last one shorter
    H, labels = data
    path = RidgeStatistics.from_batch(H, labels).eigen()
    whole = LeaveOneOut(path, GAMMAS)
    whole.add(H, labels)
    Z = H @ path.vectors
    fitted, leverage = fitted_from(Z, *path.scaling(GAMMAS))
    right, squared = left_out(fitted, leverage, labels, path.classes)
    np.testing.assert_array_equal(whole.correct, right)
    np.testing.assert_allclose(whole.squared, squared, rtol=1e-12, atol=0)


def test_gcv_draws_no_sample(tmp_path, store, monkeypatch):
    """`--select gcv` scores no row, so no sample is drawn (drawing ranks every train row of the store)."""
    drawn = []
    original = RowSample.draw
    monkeypatch.setattr(RowSample, "draw", lambda *a, **k: drawn.append(1) or original(*a, **k))
    learn(store, tmp_path / "gcv", "--gamma", "auto", "--select", "gcv")
    assert not drawn
    learn(store, tmp_path / "loo", "--gamma", "auto", "--loo-sample", 50)
    assert drawn


def test_the_eigen_path_forms_every_gammas_leverages_once(data, monkeypatch):
    """A zoom evaluates a boundary's sample a few gammas at a time: on the eigen path the leverages of every gamma are
    one product per block of coordinates, formed once and sliced by each evaluation (and by the float32 screen),
    equal to each evaluation's own ``(Z * Z) @ (1 / (lambda + g))``."""
    H, labels = data
    path = RidgeStatistics.from_batch(H, labels).eigen()
    rows = np.arange(0, H.shape[0], 3)
    loo = SampledLeaveOneOut(path, GAMMAS, rows.size)
    loo.add(H[rows[:12]], labels[rows[:12]])
    loo.add(H[rows[12:]], labels[rows[12:]])
    calls = []
    real = type(path).leverages
    monkeypatch.setattr(type(path), "leverages", lambda self, *a, **k: calls.append(a[1].shape) or real(self, *a, **k))
    for indices in ([0, 1], [2], [1, 3, 4]):
        loo.evaluate(np.array(indices))
    loo.evaluate(np.array([2, 3]), ("loo_accuracy",))
    assert calls == [(H.shape[1], GAMMAS.size)] * 2  # two blocks of coordinates, every gamma at once
    Z = path.coordinates(H[rows])
    inv, _ = path.scaling(GAMMAS)
    np.testing.assert_allclose(np.concatenate([g for g, _ in loo._grid]), (Z * Z) @ inv, rtol=1e-13, atol=0)
    np.testing.assert_allclose(np.concatenate([n for _, n in loo._grid]), np.linalg.norm(Z, axis=1), rtol=1e-13)


def test_the_refined_grids_size_decides_whether_leverages_are_kept(data):
    """The leverages of every gamma are kept for refined grids of at most D gammas, judged on the whole grid the
    memory estimate counted (``grid``) even where the gammas given are its points above the sums' resolution: 5 gammas
    of a 20-point grid at D = 14 are not kept, the same 5 alone are; the curves are the same either way."""
    H, labels = data
    path = RidgeStatistics.from_batch(H, labels).eigen()
    rows = np.arange(0, H.shape[0], 2)
    curves = {}
    for grid in (None, 20):
        loo = SampledLeaveOneOut(path, GAMMAS, rows.size, grid=grid)
        loo.add(H[rows], labels[rows])
        curves[grid] = loo.evaluate(np.array([1, 3]))
        assert (loo._grid is None) is (grid == 20)
    for name in curves[None]:
        np.testing.assert_allclose(curves[20][name], curves[None][name], rtol=1e-13, atol=0)
