"""The feature-space heads (ncm, slda, fecam) against their definitions written plainly in float64, at every task
boundary of a stream fed in blocks of random sizes; on random data and on scikit-learn's digits."""

from __future__ import annotations

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import ref_cosine, ref_fecam, ref_ncm, ref_ncm_loo, ref_slda
from sklearn.datasets import load_digits

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.heads.fecam import (
    FeCAMHead,
    MahalanobisScorer,
    cholesky_factor,
    eigenvalue_floor,
    low_quadratic_forms,
    quadratic_bound,
    quadratic_forms,
    shrunk_normalised,
)
from foal_pipe.heads.moments import certified_definite, symmetric_pinv
from foal_pipe.protocol.headscores import boundary_argmax

REFERENCES = {
    ("ncm", ()): ref_ncm,
    ("slda", ()): ref_slda,
    ("slda", (("shrinkage", 0.3),)): lambda X, y, T: ref_slda(X, y, T, 0.3),
    ("slda", (("shrinkage", "oas"),)): lambda X, y, T: ref_slda(X, y, T, "oas"),
    ("fecam", ()): ref_fecam,
    ("fecam", (("shrinkage", 0.5), ("shrinkage_offdiag", 0.2))): lambda X, y, T: ref_fecam(X, y, T, 0.5, 0.2),
    ("cosine", ()): ref_cosine,
}


def walk(head, X, y, tasks, seed):
    """Feed each task's rows (shuffled) in random-size blocks; yield the rows seen and the boundary's scorer."""
    rng = np.random.default_rng(seed)
    seen = np.zeros(len(y), dtype=bool)
    for task in tasks:
        rows = rng.permutation(np.flatnonzero(np.isin(y, task)))
        lo = 0
        while lo < rows.size:
            hi = lo + int(rng.integers(1, 40))
            head.add(xnp.asarray(X[rows[lo:hi]]), y[rows[lo:hi]])
            lo = hi
        seen[rows] = True
        yield seen.copy(), head.boundary()


def check_boundaries(name, options, X, y, T, tasks, seed=0, xp=xnp):
    reference = REFERENCES[(name, options)]
    head = make_head(name, dict(options), xp, X.shape[1])
    checked = 0
    for seen, scorer in walk(head, X, y, tasks, seed):
        classes, expected = reference(X[seen], y[seen], T)
        np.testing.assert_array_equal(scorer.classes, classes)
        got = np.asarray(scorer.scores(xp.asarray(T)))
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
        top2 = np.sort(expected, axis=1)[:, -2:] if classes.size > 1 else None
        if top2 is not None:  # predictions equal wherever the reference has no near-tie
            clear = (top2[:, 1] - top2[:, 0]) > 1e-6 * np.abs(expected).max()
            assert clear.sum() > len(T) // 2
            np.testing.assert_array_equal(got.argmax(axis=1)[clear], expected.argmax(axis=1)[clear])
        checked += 1
    assert checked == len(tasks)


def random_data(seed=0, n=300, d=6, classes=6):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, d)) * 2
    X = centres[y] + rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 3.0  # far from the origin
    return X, y, rng.normal(size=(50, d)) * 2 + 3.0


@pytest.mark.parametrize(("name", "options"), list(REFERENCES))
def test_head_equals_its_definition_at_every_boundary_random(name, options):
    X, y, T = random_data()
    check_boundaries(name, options, X, y, T, [[3, 0], [5], [1, 2, 4]])


@pytest.mark.parametrize(("name", "options"), list(REFERENCES))
def test_head_equals_its_definition_at_every_boundary_digits(name, options):
    X, y = load_digits(return_X_y=True)
    train = np.arange(len(y)) % 5 != 0
    check_boundaries(name, options, X[train], y[train], X[~train], [[7, 1, 4], [0, 9], [2, 3, 5, 6, 8]], seed=1)


def test_heads_on_torch_equal_numpy():
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xt

    X, y, T = random_data(1)
    for name in ("ncm", "slda", "fecam", "cosine"):
        scorers = {}
        for key, xp in (("numpy", xnp), ("torch", xt)):
            head = make_head(name, {}, xp, X.shape[1])
            for lo in range(0, len(y), 64):
                head.add(xp.asarray(X[lo : lo + 64], dtype=xp.float64), y[lo : lo + 64])
            scorers[key] = head.boundary()
        got = scorers["torch"].scores(torch.asarray(T, dtype=torch.float64)).numpy()
        np.testing.assert_allclose(got, scorers["numpy"].scores(T), rtol=1e-9, atol=1e-9)


def test_registry_entries_are_complete():
    for name, entry in HEADS.items():
        assert entry.space in ("features", "activations", "projected"), name
        assert entry.memory(10, 100) > 0 and entry.source and entry.citation
        if entry.factory is not None:
            assert entry.factory.name == name and entry.factory.space == entry.space


def test_fecam_refuses_a_class_with_one_row():
    head = make_head("fecam", {}, xnp, 3)
    head.add(np.ones((3, 3)) + np.eye(3), np.array([0, 0, 1]))
    with pytest.raises(FoalPipeError, match="at least 2 training rows per class"):
        head.boundary()


def test_fecam_refuses_zero_variance_without_shrinkage():
    head = make_head("fecam", {"shrinkage": 0.0}, xnp, 3)
    X = np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [3.0, 1.0, 0.0]])
    head.add(X, np.zeros(3, dtype=np.int64))
    with pytest.raises(FoalPipeError, match="zero variance"):
        head.boundary()


@pytest.mark.parametrize(("name", "options", "match"), [
    ("slda", {"shrinkage": 2.0}, "must lie in"), ("slda", {"shrinkage": "x"}, "or 'oas'"),
    ("fecam", {"shrinkage": -1.0}, ">= 0"), ("fecam", {"shrinkage_offdiag": "oas"}, ">= 0"),
])
def test_bad_head_options_are_refused(name, options, match):
    with pytest.raises(FoalPipeError, match=match):
        make_head(name, options, xnp, 3)


@pytest.mark.parametrize("data", ["random", "digits"])
def test_ncm_leave_one_out_equals_refitting_without_each_row(data):
    if data == "random":
        X, y, _ = random_data(2, n=120)
        y[0] = 9  # a class of one row: no mean without it
    else:
        X, y = load_digits(return_X_y=True)
        X, y = X[::6], y[::6]
    head = make_head("ncm", {}, xnp, X.shape[1])
    for lo in range(0, len(y), 37):
        head.add(X[lo : lo + 37], y[lo : lo + 37])
    hits = sum(head.loo_hits(X[lo : lo + 50], y[lo : lo + 50]) for lo in range(0, len(y), 50))
    expected = ref_ncm_loo(X, y)
    assert hits / len(y) == expected
    assert 0.3 < expected < 1  # neither trivial nor perfect: the test can fail


@pytest.mark.parametrize("data", ["random", "digits"])
def test_cosine_leave_one_out_equals_refitting_without_each_row(data):
    if data == "random":
        X, y, _ = random_data(3, n=120)
        y[0] = 9  # a class of one row: no prototype without it
    else:
        X, y = load_digits(return_X_y=True)
        X, y = X[::6], y[::6]
    head = make_head("cosine", {}, xnp, X.shape[1])
    for lo in range(0, len(y), 37):
        head.add(X[lo : lo + 37].astype(np.float64), y[lo : lo + 37])
    hits = sum(head.loo_hits(X[lo : lo + 50].astype(np.float64), y[lo : lo + 50]) for lo in range(0, len(y), 50))
    expected = 0
    for i in range(len(y)):  # refit without each row
        keep = np.arange(len(y)) != i
        if (y[keep] == y[i]).any():
            classes, scores = ref_cosine(X[keep], y[keep], X[i : i + 1])
            expected += int(classes[scores.argmax()] == y[i])
    assert hits == expected
    assert 0.3 * len(y) < expected < len(y)  # neither trivial nor perfect: the test can fail


@pytest.mark.parametrize(("name", "options"), list(REFERENCES))
def test_head_is_exact_when_classes_recur_across_boundaries(name, options):
    X, y, T = random_data(3)
    head = make_head(name, dict(options), xnp, X.shape[1])
    for start, stop in ((0, 100), (100, 180), (180, 300)):  # every class in every part
        head.add(X[start:stop], y[start:stop])
        classes, expected = REFERENCES[(name, options)](X[:stop], y[:stop], T)
        scorer = head.boundary()
        np.testing.assert_array_equal(scorer.classes, classes)
        np.testing.assert_allclose(scorer.scores(T), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())


@pytest.mark.parametrize(("kind", "floor", "inverts"), [
    ("psd-singular", 0.0, False), ("indefinite", 0.0, False), ("definite", 0.0, False), ("definite", 1.0, True),
    ("definite", 1e-15, False),  # a floor too small to certify the condition number: eigh
])
def test_symmetric_pinv_equals_numpy_pinv(kind, floor, inverts, monkeypatch):
    rng = np.random.default_rng(7)
    A = rng.normal(size=(9, 4))
    S = {"psd-singular": A @ A.T,  # rank 4 of 9: pinv drops five eigenvalues
         "indefinite": A @ np.diag([3.0, -2.0, 1.0, -0.5]) @ A.T,
         "definite": A @ A.T + np.eye(9)}[kind]  # eigenvalues >= 1
    assert certified_definite(xnp.asarray(S), floor) is inverts
    expected = np.linalg.pinv(S, rtol=9 * np.finfo(np.float64).eps)  # the array API's default cutoff
    np.testing.assert_allclose(symmetric_pinv(xnp.asarray(S), floor), expected, rtol=1e-9,
                               atol=1e-11 * np.abs(expected).max())


@pytest.mark.parametrize(("a1", "a2"), [(1.0, 0.0), (0.5, 0.2), (0.01, 0.0), (2.0, 1.0)])
@pytest.mark.parametrize("sign", [1, -1])
def test_fecam_eigenvalue_floor_bounds_the_shrunk_covariance(a1, a2, sign):
    rng = np.random.default_rng(11)
    X = rng.normal(size=(40, 7)) @ rng.normal(size=(7, 7)) * np.arange(1, 8)
    X[:, 0] = sign * X[:, 1] + 0.1 * X[:, 0]  # a strongly correlated pair: off-diagonal mean of either sign
    C = np.cov(X, rowvar=False)
    floor = eigenvalue_floor(C, a1, a2)
    smallest = np.linalg.eigvalsh(shrunk_normalised(C, a1, a2)).min()
    assert 0 < floor <= smallest * (1 + 1e-12)


def fecam_boundaries(parts, X, y, options=()):
    """fecam fed each part of the stream (a list of row ranges) in blocks of 17 rows; its scorer at each part's end."""
    head = FeCAMHead(xp=xnp, dim=X.shape[1], **dict(options))
    scorers, seen = [], []
    for start, stop in parts:
        for lo in range(start, stop, 17):
            head.add(X[lo : min(lo + 17, stop)], y[lo : min(lo + 17, stop)])
        scorers.append(head.boundary())
        seen.append(stop)
    return scorers, seen


@pytest.mark.parametrize("stream", ["disjoint", "recurring"])
@pytest.mark.parametrize("options", [(), (("shrinkage", 0.5), ("shrinkage_offdiag", 0.2))])
def test_fecam_memoised_distances_equal_recomputation_at_every_boundary(stream, options):
    X, y, T = random_data(4, n=360)
    if stream == "disjoint":  # classes {0, 1}, {2, 3}, {4, 5}: each class's statistics stop changing
        order = np.argsort(y // 2, kind="stable")
        X, y = X[order], y[order]
        parts = [(0, int(np.sum(y < 2))), (int(np.sum(y < 2)), int(np.sum(y < 4))), (int(np.sum(y < 4)), len(y))]
    else:  # every class in every part: each class gets rows again, so its distances must be recomputed
        parts = [(0, 120), (120, 200), (200, 360)]
    scorers, seen = fecam_boundaries(parts, X, y, options)
    keys = [dict(zip(s.keys, s.classes.tolist(), strict=True)) for s in scorers]
    if stream == "disjoint":  # the earlier tasks' classes keep their keys: their columns are reused
        assert keys[0].items() <= keys[1].items() <= keys[2].items()
    else:  # no class keeps its key past a part that gave it rows
        assert not set(keys[0]) & set(keys[1]) and not set(keys[1]) & set(keys[2])
    a1, a2 = dict(options).get("shrinkage", 1.0), dict(options).get("shrinkage_offdiag", 0.0)
    ends = [20, 35, 50]  # each boundary scores a longer prefix of the test rows, as the walk's task-sorted blocks
    memoised = list(boundary_argmax(scorers, xnp.asarray(T), ends))
    for scorer, stop, n, got in zip(scorers, seen, ends, memoised, strict=True):
        classes, expected = ref_fecam(X[:stop], y[:stop], T[:n], a1, a2)
        np.testing.assert_array_equal(scorer.classes, classes)
        np.testing.assert_allclose(scorer.scores(T[:n]), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
        np.testing.assert_array_equal(got, np.argmax(scorer.scores(T[:n]), axis=1))
        top = np.sort(expected, axis=1)
        clear = top[:, -1] - top[:, -2] > 1e-6 * np.abs(expected).max()
        np.testing.assert_array_equal(got[clear], np.argmax(expected, axis=1)[clear])


@pytest.mark.parametrize(("d", "scale", "options"), [(2, 1.0, ()), (6, 1.0, ()), (40, 1e3, ()),
                                                     (40, 1.0, (("shrinkage", 0.01),)),
                                                     (40, 1.0, (("shrinkage", 0.5), ("shrinkage_offdiag", 0.2)))])
def test_fecam_float32_distances_lie_within_their_bound(d, scale, options):
    rng = np.random.default_rng(d)
    X = (rng.normal(size=(600, d)) @ rng.normal(size=(d, d)) + 5.0) * scale
    y = rng.integers(0, 4, size=600)
    T = (rng.normal(size=(300, d)) @ rng.normal(size=(d, d)) + 5.0) * scale
    head = FeCAMHead(xp=xnp, dim=d, **dict(options))
    head.add(X, y)
    scorer = head.boundary()
    prepared = scorer.prepare(T)
    low = scorer.prepare_low(prepared)
    for k in range(scorer.classes.size):
        values, bound = scorer.bounded_column(k, low)
        exact = scorer.column(k, prepared)
        error = np.abs(values - exact)
        assert np.all(error <= bound), (k, float((error / bound).max()))
        assert np.median(bound) < 1e-3 * np.median(np.abs(exact))  # a bound that decides rows, not a vacuous one
        assert error.max() > 0  # the float32 product differs: the bound is what makes it exact


def test_quadratic_bound_covers_rows_of_lengths_over_six_decades():
    rng = np.random.default_rng(3)
    d = 200
    C = np.linalg.cholesky(np.cov(rng.normal(size=(400, d)), rowvar=False) + np.eye(d))
    R = rng.normal(size=(500, d)) * 10.0 ** rng.uniform(-4, 2, size=(500, 1))  # lengths over six decades
    exact = quadratic_forms(R, None, C)
    low = low_quadratic_forms(R.astype(np.float32), C.astype(np.float32))
    columns = np.sqrt((C * C).sum(axis=0))
    bound = quadratic_bound(low, np.sqrt((R * R).sum(axis=1)) * (1 + 1e-12), float(np.sqrt((columns**2).sum())) * (1 + 1e-12),
                            float(columns.max()), d)
    assert np.all(np.abs(low - exact) <= bound)
    assert np.all(bound < 1e-3 * exact)


def test_fecam_screened_argmax_sends_ties_to_float64_and_equals_its_argmax(monkeypatch):
    rng = np.random.default_rng(5)
    d = 12
    base = rng.normal(size=(80, d)) + 3.0
    # class 1 is class 0's rows exactly (every distance tied); class 2 the same rows moved by 1e-10 (near ties that
    # float32 cannot order); class 3 apart
    X = np.concatenate([base, base, base * (1 + 1e-10), rng.normal(size=(80, d)) - 3.0])
    y = np.repeat(np.arange(4), 80)
    T = np.concatenate([base[:40] + 0.05 * rng.normal(size=(40, d)), rng.normal(size=(40, d)) - 3.0])
    head = FeCAMHead(xp=xnp, dim=d)
    head.add(X, y)
    scorer = head.boundary()
    rescored = []
    column = MahalanobisScorer.column

    def counted(self, k, prepared):
        rescored.append(prepared.shape[0])
        return column(self, k, prepared)

    monkeypatch.setattr(MahalanobisScorer, "column", counted)
    (got,) = list(boundary_argmax([scorer], xnp.asarray(T), [T.shape[0]]))
    monkeypatch.setattr(MahalanobisScorer, "column", column)
    np.testing.assert_array_equal(got, np.argmax(scorer.scores(T), axis=1))
    assert rescored == [40] * 4  # the 40 rows nearest the tied classes, every class in float64; the rest decided
    assert set(got[:40]) <= {0, 2} and set(got[40:]) == {3}


@pytest.mark.parametrize("d", [1, 5, 13])
def test_fecam_triangular_product_equals_the_quadratic_form(d):
    rng = np.random.default_rng(d)
    A, R = rng.normal(size=(d, d)), rng.normal(size=(30, d))
    P = A @ A.T + 0.1 * np.eye(d)
    expected = np.array([r @ P @ r for r in R])
    C = cholesky_factor(xnp.asarray(P))
    assert C is not None
    np.testing.assert_allclose(quadratic_forms(xnp.asarray(R), P, C), expected, rtol=1e-12)
    np.testing.assert_allclose(quadratic_forms(xnp.asarray(R), P), expected, rtol=1e-12)
    indefinite = P - 2 * np.abs(np.linalg.eigvalsh(P)).max() * np.outer(np.eye(d)[0], np.eye(d)[0])
    assert cholesky_factor(xnp.asarray(indefinite)) is None  # the dense form, which takes any symmetric precision


def test_fecam_scorer_from_saved_means_and_precisions_scores_the_same_bits():
    X, y, T = random_data(5)
    scorer = make_head("fecam", {}, xnp, X.shape[1])
    scorer.add(X, y)
    scorer = scorer.boundary()
    assert all(f is not None for f in scorer.factors)  # the default shrinkage gives definite precisions
    rebuilt = MahalanobisScorer(scorer.classes, [np.array(m) for m in scorer.means],
                                [np.array(p) for p in scorer.precisions])
    np.testing.assert_array_equal(rebuilt.scores(T), scorer.scores(T))


def test_a_head_lives_in_its_class_and_the_config_carries_its_options():
    from foal_pipe.heads.dual import DualOptions
    from foal_pipe.heads.state import file_options, head_file
    from foal_pipe.protocol.config import ModelConfig

    for name, entry in HEADS.items():
        assert entry.options == tuple(o for o in entry.head.option_names() if o != "batch_size"), name
        if name != "ridge":  # ridge's tensors are the ridge model file's own (tests/test_ridge_head.py)
            assert head_file(name).tensors == {**entry.head.scorer_tensors, **entry.head.state_tensors}
    assert file_options("dual") == ("gamma", "gamma_comp", "compensation", "batch_size")
    assert DualOptions(gamma=2.0).gamma_comp == 2.0
    with pytest.raises(FoalPipeError, match="batch_size"):
        DualOptions(batch_size=0)
    assert ModelConfig(head="slda", head_options={"shrinkage": 0.3}).options_for("slda") == {"shrinkage": 0.3}
    assert ModelConfig(head="cosine").options_for("cosine") == {}
    dual = ModelConfig(head="dual", head_options={"compensation": 0.5, "shrinkage": 0.1})
    assert dual.options_for("dual") == {"gamma": 1.0, "compensation": 0.5}  # each head takes its own options
    assert dual.options_for("fecam") == {"shrinkage": 0.1}
    with pytest.raises(FoalPipeError, match="head_rows must be one of features, activations"):
        ModelConfig(head_rows="pixels")


def test_head_factorisations_run_on_one_blas_thread(monkeypatch):
    """slda's and fecam's inverses, eigendecompositions and Cholesky factors run inside
    :func:`~foal_pipe.core.linalg.factor_threads` (one BLAS thread up to its dimension): on a busy 2-core machine a
    784 x 784 Cholesky factorisation took 2.1 s on two threads against 0.05 s on one."""
    from contextlib import contextmanager

    import foal_pipe.heads.fecam as fecam_module
    import foal_pipe.heads.moments as moments_module

    entered = []

    @contextmanager
    def recording(dim):
        entered.append(dim)
        yield

    monkeypatch.setattr(moments_module, "factor_threads", recording)
    monkeypatch.setattr(fecam_module, "factor_threads", recording)
    rng = np.random.default_rng(3)
    A = rng.normal(size=(6, 6))
    S = A @ A.T + np.eye(6)
    symmetric_pinv(xnp.asarray(S), 1.0)  # certified: inv
    symmetric_pinv(xnp.asarray(S))  # eigh
    cholesky_factor(xnp.asarray(S))
    assert entered == [6, 6, 6]


def test_definite_inverse_is_inv_exactly_symmetric_and_falls_back(monkeypatch):
    """A certified definite matrix is inverted from its Cholesky factor (NumPy): ``inv``'s matrix to rounding, exactly
    symmetric, in row-major order; where the factorisation stops (not positive definite to rounding) and for other
    dtypes, ``inv`` itself."""
    from foal_pipe.heads.moments import definite_inverse

    rng = np.random.default_rng(5)
    A = rng.normal(size=(40, 30))
    S = A.T @ A / 40 + 0.3 * np.eye(30)
    got = definite_inverse(S)
    np.testing.assert_allclose(got, np.linalg.inv(S), rtol=1e-11, atol=1e-12 * np.abs(got).max())
    np.testing.assert_allclose(got @ S, np.eye(30), atol=1e-12)
    assert got.flags.c_contiguous and np.array_equal(got, got.T)
    indefinite = S - 2.0 * np.eye(30) * np.linalg.eigvalsh(S).max()
    assert definite_inverse(indefinite).tobytes() == np.linalg.inv(indefinite).tobytes()
    low = S.astype(np.float32)
    assert definite_inverse(low).dtype == np.float32
    assert definite_inverse(low).tobytes() == np.linalg.inv(low).tobytes()
