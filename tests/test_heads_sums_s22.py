"""Faults of the heads' class sums and shares (stop 22): a model solved here scored in other last bits than the same
model saved and loaded (its class means and balanced's W were column-major, and NumPy sums a row of those in another
order); ``shares`` (ridge's, balanced's and dual's ``predict_proba``) gave rows of zeros where the positive scores
summed past float64's largest number; cosine's leave-one-out left ``n p - x`` to overflow on rows near 1e307, whose
NaN cosines won every argmax (LOO accuracy 100% where refitting gives 77%)."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import invoke, ref_cosine

from foal_pipe import head_classifier, load_model
from foal_pipe.core.backend import get_namespace, to_numpy
from foal_pipe.heads import make_head
from foal_pipe.heads.base import shares, softmax
from foal_pipe.heads.cosine import CosineHead
from foal_pipe.heads.state import export_head
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.projection import SmoothProjection
from foal_pipe.store import write_store

#: 2^1017 (about 1.4e306): a power of two, so that the scaled rows are the rows exactly, times it.
HUGE = 2.0**1017


def _rows(d: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), 30)
    return rng.normal(size=(y.size, d)) + 0.3 * y[:, None], y


def _saved_and_loaded(name: str, head, scorer, X: np.ndarray, path: Path):
    identity = SmoothProjection(n_components=0, activation="identity").fit(X)
    HeadClassifier(name, asdict(head.options), export_head(name, head, scorer), X.shape[0]).save(path, projection=identity)
    return load_model(path).classifier


@pytest.mark.parametrize("name", ["ncm", "cosine", "slda", "balanced", "dual"])
def test_a_solved_model_scores_the_bits_of_its_saved_file(name, tmp_path):
    """d = 100: the scores and (balanced) the ties' column lengths of the model a boundary solves equal those of its
    file loaded back, bit for bit (ncm's and cosine's scores differed by 2.2e-16, balanced's lengths in their last
    bits)."""
    X, y = _rows()
    head = make_head(name, {}, xnp, X.shape[1])
    head.add(X, y)
    scorer = head.boundary()
    loaded = _saved_and_loaded(name, head, scorer, X, tmp_path / "m.safetensors")
    assert np.array_equal(np.asarray(scorer.scores(X)), loaded.class_scores(X))
    if name in ("balanced", "dual"):
        assert np.array_equal(scorer.ties(X)[0].lengths, loaded.scorer.ties(X)[0].lengths)


@pytest.mark.parametrize("backend", ["numpy", "torch", "array_api_strict"])
def test_class_means_equal_the_mean_rows_on_every_backend(backend):
    """Laid out by rows, the means still hold each class's mean row (within the rounding of shifted sums)."""
    pytest.importorskip(backend)
    X, y = _rows(d=7)
    xp = get_namespace(backend)
    head = make_head("ncm", {}, xp, X.shape[1])
    head.add(xp.asarray(X), y)
    means = to_numpy(head.boundary().means)
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    expected = np.stack([unit[y == c].mean(axis=0) for c in range(4)])
    np.testing.assert_allclose(means, expected, rtol=0, atol=1e-15)


def _exact_shares(row: np.ndarray) -> list[float]:
    kept = [Fraction(max(float(v), 0.0)) for v in row]
    return [float(v / sum(kept)) for v in kept]


def test_shares_of_scores_summing_past_float64s_largest_still_sum_to_one():
    scores = np.array([[1e308, 1.2e308, -1e308], [0.2, 0.6, -1.0], [-1.0, -2.0, -3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = shares(scores)
    np.testing.assert_allclose(got[0], _exact_shares(scores[0]), rtol=1e-15, atol=0)
    assert np.array_equal(got[1], np.array([0.2, 0.6, 0.0]) / 0.8000000000000000444)  # an ordinary row: as before
    assert np.array_equal(got[2], np.full(3, 1 / 3))


@pytest.mark.parametrize("name", ["balanced", "dual"])
def test_predict_proba_of_scores_near_float64s_largest_sums_to_one(name):
    """One feature: classes 0 and 1 score positively on positive rows; a row whose two scores are near 1e308 had
    probabilities of all zeros."""
    y = np.repeat(np.arange(3), 10)
    X = np.array([0.01, 0.012, -0.01])[y][:, None]
    estimator = head_classifier(name, gamma=1e-6).fit(X, y)
    row = np.array([[1.0]]) * (1.2e308 / estimator.class_scores(np.array([[1.0]])).max())
    scores = estimator.class_scores(row)
    with np.errstate(over="ignore"):
        assert np.sort(scores[0])[-2] > 0 and np.isinf(np.clip(scores, 0, None).sum())  # the case: a sum that overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proba = estimator.predict_proba(row)
    np.testing.assert_allclose(proba[0], _exact_shares(scores[0]), rtol=1e-15, atol=0)


def test_softmax_of_scores_further_apart_than_float64s_largest_is_exact_and_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = softmax(np.array([[-1e308, 1e308, 0.0]]))
    assert got.tolist() == [[0.0, 1.0, 0.0]]


def _huge_cosine_rows():
    """3 classes of 50 rows near 10 (relative spread 1e-2), exactly ``HUGE`` times: ``n p`` overflows, the class sums
    of the rows less the first do not."""
    rng = np.random.default_rng(0)
    m = rng.normal(size=(3, 5))
    y = np.repeat(np.arange(3), 50)
    return 10 + 0.1 * (m[y] + rng.normal(size=(y.size, 5))), y


def _brute_force_loo(X: np.ndarray, y: np.ndarray) -> int:
    hits = 0
    for i in range(y.size):
        keep = np.arange(y.size) != i
        classes, scores = ref_cosine(X[keep], y[keep], X[i : i + 1])
        hits += int(classes[scores.argmax()] == y[i])
    return hits


@pytest.mark.parametrize("backend", ["numpy", "torch", "array_api_strict"])
def test_cosine_leave_one_out_on_rows_near_float64s_largest_equals_refitting(backend):
    pytest.importorskip(backend)
    X, y = _huge_cosine_rows()
    expected = _brute_force_loo(X, y)  # a positive scale moves no cosine: the rows unscaled
    assert 0 < expected < y.size
    xp = get_namespace(backend)
    for scale in (1.0, HUGE):
        head = CosineHead(xp=xp, dim=X.shape[1])
        head.add(xp.asarray(X * scale), y)
        head.boundary()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert head.loo_hits(xp.asarray(X * scale), y) == expected, scale


def test_sweep_ranks_cosine_by_its_true_leave_one_out_on_huge_features(tmp_path):
    X, y = _huge_cosine_rows()
    store = write_store(tmp_path / "s.zarr", (X * HUGE, y), (X[::3] * HUGE, y[::3]), list("abc"), dtype="float64")
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sweep", "--tasks", 1, "--heads", "ridge,cosine")
    assert result.exit_code == 0, result.output
    heads = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["heads"]
    assert heads["cosine"]["loo_accuracy"] == _brute_force_loo(X, y) / y.size
