"""Faults found by auditing the float32 screen of ridge's test scoring and the shared lazy solve of the heads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from foal_pipe.core.scoring import ModelScores, Rows
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.state import export_head
from foal_pipe.model.headestimator import FeCAMClassifier
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.ondemand import SolvesOnDemand

D = 64


def _overflowing() -> tuple[np.ndarray, np.ndarray]:
    """A row and two classes' weights, every entry finite in float32: class 0 scores 6.4e14; class 1's exact score,
    5e37, is the largest, but its float32 partial sums pass -3.4e38 (32 terms of -1e38 before the positive ones)."""
    h = np.full((1, D), 1.0e19)
    W = np.zeros((D, 2))
    W[:, 0] = 1e-6
    W[:32, 1], W[32:, 1] = -1.0e19, 1.0e19
    W[-1, 1] += 0.5e19
    return h, W


@pytest.mark.parametrize("unseen", [False, True])
def test_a_float32_score_that_overflows_is_scored_in_float64(unseen):
    """A rival whose float32 sums overflowed to -inf was taken as far below the top score and the row decided
    without float64 (the argmax 0 where the float64 scores rank class 1 first; with the unseen classes' zeros, both
    seen classes at -inf gave the first unseen column): the argmax is now the float64 product's."""
    h, W = _overflowing()
    if unseen:
        W[:, 0] = W[:, 1]
        W[-1, 0] -= 1.0e19  # class 0's exact score -5e37: only class 1 beats the unseen classes' 0
    with np.errstate(over="ignore", invalid="ignore"):
        low = h.astype(np.float32) @ W.astype(np.float32)
    if np.isfinite(low).all():
        pytest.skip("this BLAS sums the float32 product in an order that does not overflow")
    exact = np.zeros((1, 3)) if unseen else np.zeros((1, 2))
    exact[:, :2] = h @ W
    models = ModelScores(W, 1, np.array([0, 1]), 3) if unseen else ModelScores(W, 1)
    assert models.low is not None  # the float32 screen is in use
    with np.errstate(over="ignore", invalid="ignore"):
        got = models.argmax(Rows.of(h))
    assert got.tolist() == [[int(np.argmax(exact))]] == [[1]]


def _refused_at_once(monkeypatch, owner: SolvesOnDemand, read, threads: int = 4) -> list:
    """What ``read()`` gives in ``threads`` threads whose solves are all refused and all reach the restore before
    any of them has restored (a barrier at its entry)."""
    barrier, original = threading.Barrier(threads, timeout=10), SolvesOnDemand._restore

    def restore(self, *args, **kwargs):
        barrier.wait()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SolvesOnDemand, "_restore", restore)
    out: list = [None] * threads

    def run(k):
        try:
            out[k] = read()
        except BaseException as exc:  # noqa: BLE001 - what a thread raised is the result
            out[k] = exc

    started = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return out


def _bad_call(est):
    est.partial_fit(np.ones((3, 3)), [5, 5, 5])  # class 5 has no variance: the solve is refused


def test_readers_refused_at_once_each_get_the_refusal_estimator(monkeypatch):
    """Readers whose solves are refused together: before, the first restored and the others raised a bare
    AssertionError; each now gets the one-line refusal, and the estimator is back at its last solved model."""
    r = np.random.default_rng(0)
    X, y = r.normal(size=(6, 3)), [0, 0, 1, 1, 2, 2]
    est = FeCAMClassifier(shrinkage=0.0).fit(X, y)
    want = est.predict(X)
    _bad_call(est)
    out = _refused_at_once(monkeypatch, est, lambda: est.predict(X))
    assert all(isinstance(o, FoalPipeError) and str(o).endswith("the rows of its last partial_fit call are undone")
               for o in out), out
    assert "_undo" not in vars(est) and np.array_equal(est.predict(X), want)


def test_readers_refused_at_once_each_get_the_refusal_head_file(monkeypatch):
    """The same for a head's model file (HeadClassifier, as DeployedModel holds it)."""
    r = np.random.default_rng(0)
    X, y = r.normal(size=(6, 3)), [0, 0, 1, 1, 2, 2]
    est = FeCAMClassifier(shrinkage=0.0).fit(X, y)
    model = HeadClassifier("fecam", {"shrinkage": 0.0}, export_head("fecam", est._head, est._solve()), 6)
    want = model.predict(X)
    model.partial_fit(np.ones((3, 3)), np.array([5, 5, 5]))
    out = _refused_at_once(monkeypatch, model, lambda: model.predict(X))
    assert all(isinstance(o, FoalPipeError) and str(o).endswith("the rows of its last partial_fit call are undone")
               for o in out), out
    assert model._undo is None and np.array_equal(model.predict(X), want)
