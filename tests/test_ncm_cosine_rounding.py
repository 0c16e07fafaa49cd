"""ncm's and cosine's float64 scores on rows far from the origin that vary little (the heads audit, item 2): ncm's
expanded distances ``2 x.mu - |x|^2 - |mu|^2`` of unit rows and cosine's cosines all round alike there, so that 60%
of the predictions were rounding (A_last 0.39 and 0.42 where the definitions give 1.00). Such means are refused
at the boundary, naming centring as the fix; ordinary rows are scored as before, as their definitions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke, ref_cosine, ref_ncm, unit

from foal_pipe.core.backend import get_namespace
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import make_head
from foal_pipe.heads.cosine import CosineHead
from foal_pipe.heads.ncm import NCMHead
from foal_pipe.store import write_store

FIX = "centre the features (subtract their mean) or use another head"
SAID = {"ncm": "ncm: two class means lie ", "cosine": "cosine: two class prototypes have 1 - cos = "}
BACKENDS = ["numpy", "torch", "array_api_strict"]


def audit_rows(centred: bool = False):
    """The audit's store (mkstore2.py): d = 10, rows 1e6 + 1e-2 (m_y + 0.3 noise), 4 classes of 10 train rows."""
    rng = np.random.default_rng(5)
    d, off, m = 10, 1e6 * np.ones(10), rng.normal(size=(4, 10))
    y = np.repeat([0, 1, 2, 3], 10)
    X = off + 1e-2 * (m[y] + 0.3 * rng.normal(size=(40, d)))
    yt = np.repeat([0, 1, 2, 3], 25)
    T = off + 1e-2 * (m[yt] + 0.3 * rng.normal(size=(100, d)))
    if centred:
        X, T = X - X.mean(axis=0), T - X.mean(axis=0)
    return X, y, T, yt


def fitted(name: str, X: np.ndarray, y: np.ndarray, backend: str = "numpy"):
    xp = get_namespace(backend)
    head = make_head(name, {}, xp, X.shape[1])
    head.add(xp.asarray(X), y)
    return head, xp


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["ncm", "cosine"])
def test_rows_far_from_the_origin_that_vary_little_are_refused(name, backend):
    pytest.importorskip(backend)
    X, y, _, _ = audit_rows()
    head, _ = fitted(name, X, y, backend)
    with pytest.raises(FoalPipeError) as caught:
        head.boundary()
    message = str(caught.value)
    assert message.startswith(SAID[name]) and message.endswith(FIX), message
    gap = float(message[len(SAID[name]):].split(",")[0].split(" ")[0])
    assert 0 <= gap < 1e-15  # unit rows 1e-8 apart: separations near 1e-16, below the 1e-15 of the scores' rounding


@pytest.mark.parametrize("name", ["ncm", "cosine"])
def test_the_same_rows_centred_score_as_their_definition(name):
    X, y, T, yt = audit_rows(centred=True)
    head, _ = fitted(name, X, y)
    scores = np.asarray(head.boundary().scores(T))
    _, want = (ref_ncm if name == "ncm" else ref_cosine)(X, y, T)
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert (scores.argmax(axis=1) == yt).mean() == 1.0


def test_learn_and_sweep_refuse_the_audit_store(tmp_path: Path):
    X, y, T, yt = audit_rows()
    store = write_store(tmp_path / "s2.zarr", (X, y), (T, yt), ["a", "b", "c", "e"], dtype="float64", chunk_rows=64)
    for name in ("ncm", "cosine"):
        out = tmp_path / name
        result = invoke("learn", "--features", store, "--out", out, "--head", name, "--tasks", 1, "--backend", "numpy")
        assert_clean_error(result, SAID[name], out)
        assert result.output.strip().endswith(FIX), result.output
    out = tmp_path / "sweep"
    result = invoke("sweep", "--features", store, "--out", out, "--heads", "ridge,cosine", "--tasks", 1,
                    "--projection-dim", 16, "--gammas", "1", "--backend", "numpy")
    assert_clean_error(result, SAID["cosine"], out)


def loo_by_refitting(name: str, X: np.ndarray, y: np.ndarray) -> int:
    """Leave-one-out by its definition: each row predicted by the head refitted without it (a class of one: wrong)."""
    hits = 0
    for i in range(y.size):
        keep = np.arange(y.size) != i
        if not np.any(y[keep] == y[i]):
            continue
        classes, scores = (ref_ncm if name == "ncm" else ref_cosine)(X[keep], y[keep], X[i:i + 1])
        hits += int(classes[np.argmax(scores[0])] == y[i])
    return hits


@pytest.mark.parametrize("scale", [1.0, 1e3])
@pytest.mark.parametrize("rows, dim", [(30, 50), (300, 20)])
@pytest.mark.parametrize("name", ["ncm", "cosine"])
def test_ordinary_rows_are_not_refused_and_match_the_definitions(name, rows, dim, scale):
    rng = np.random.default_rng(rows + dim)
    y = np.arange(rows) % 5
    X = scale * (rng.normal(size=(5, dim))[y] + rng.normal(size=(rows, dim)))
    T = scale * rng.normal(size=(40, dim))
    head, _ = fitted(name, X, y)
    scores = np.asarray(head.boundary().scores(T))
    _, want = (ref_ncm if name == "ncm" else ref_cosine)(X, y, T)
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert np.array_equal(scores.argmax(axis=1), want.argmax(axis=1))
    assert head.loo_hits(X, y) == loo_by_refitting(name, X, y)


@pytest.mark.parametrize("name", ["ncm", "cosine"])
def test_the_refusal_starts_between_relative_spreads_1e_4_and_1e_5(name):
    """ViT-width rows about one point: at a relative spread of 1e-4 the means' separations (2e-9) lie 2e5 times above
    the scores' rounding (8e-15), past the 1e4 asked; at 1e-5 (2e-11) 2e3 times: refused."""
    rng = np.random.default_rng(0)
    centre, y = rng.normal(size=768), np.arange(100) % 10
    head, _ = fitted(name, centre + 1e-4 * rng.normal(size=(100, 768)), y)
    head.boundary()
    head, _ = fitted(name, centre + 1e-5 * rng.normal(size=(100, 768)), y)
    with pytest.raises(FoalPipeError, match=re.escape(FIX)):
        head.boundary()


def test_saved_means_too_close_are_refused_when_loaded():
    X, y, _, _ = audit_rows()
    classes = np.arange(4)
    means = np.stack([unit(X)[y == c].mean(axis=0) for c in classes])
    prototypes = np.stack([X[y == c].mean(axis=0) for c in classes])
    with pytest.raises(FoalPipeError, match=SAID["ncm"]):
        NCMHead.scorer_from(classes, {"means": means}, None)
    with pytest.raises(FoalPipeError, match=SAID["cosine"]):
        CosineHead.scorer_from(classes, {"prototypes": prototypes}, None)
    centred = prototypes - prototypes.mean(axis=0)
    assert CosineHead.scorer_from(classes, {"prototypes": centred}, None).scores(centred).argmax(axis=1).tolist() == [0, 1, 2, 3]


def test_means_that_coincide_are_a_tie_not_refused():
    """Zero or parallel prototypes (scikit-learn's ``check_classifier_data_not_an_array``: [1, 1] and [13/6, 13/6],
    unit rows one unit of rounding apart) and identical means (one feature: every unit row +-1) tie: not refused."""
    X = np.array([[1.0, 2.0], [-1.0, -2.0], [3.0, 1.0], [-3.0, -1.0], [1.0, 0.0]])
    head, _ = fitted("cosine", X, np.array([0, 0, 1, 1, 2]))
    assert np.asarray(head.boundary().scores(np.array([[0.0, 1.0]]))).tolist() == [[0.0, 0.0, 0.0]]
    X = np.array([[3, 0], [0, 1], [0, 2], [1, 1], [1, 2], [2, 1], [0, 3], [1, 0], [2, 0], [4, 4], [2, 3], [3, 2]], float)
    y = np.array([1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2])
    head, _ = fitted("cosine", X, y)
    np.testing.assert_allclose(np.asarray(head.boundary().scores(X)), ref_cosine(X, y, X)[1], rtol=0, atol=1e-15)
    X = np.random.default_rng(3).uniform(1, 2, size=(10, 1))
    head, _ = fitted("ncm", X, np.arange(10) % 3)
    assert np.asarray(head.boundary().scores(X)).tolist() == [[0.0, 0.0, 0.0]] * 10
    X = np.random.default_rng(4).normal(size=(20, 6))
    head, _ = fitted("ncm", np.concatenate([X, X[::-1]]), np.repeat([0, 1], 20))  # the same rows, another order
    head.boundary()


@pytest.mark.parametrize("backend", BACKENDS)
def test_unresolved_separation_in_blocks_checks_every_pair(backend):
    from foal_pipe.heads.ncm import unresolved_separation

    pytest.importorskip(backend)
    xp = get_namespace(backend)
    M = np.random.default_rng(1).normal(size=(25, 4)) + 100.0  # 25 rows in blocks of 4
    M[17], M[20] = M[3] + 1e-3, M[9]  # one close pair; one that coincides (a tie, left out)
    pairs = {(a, b): float(((M[a] - M[b]) ** 2).sum()) for a in range(25) for b in range(a)}
    assert pairs[(20, 9)] == 0 and min(v for v in pairs.values() if v > 0) == pairs[(17, 3)]
    assert unresolved_separation(xp.asarray(M), 1.0) == pytest.approx(pairs[(17, 3)], rel=1e-12)
    assert unresolved_separation(xp.asarray(M), pairs[(17, 3)]) == np.inf  # none below ``near``
    assert unresolved_separation(xp.asarray(M[:1]), 1.0) == np.inf
