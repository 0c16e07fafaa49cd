"""dual's compensation weights where the residuals they fit are a cancellation (heads audit, item 4): the residuals
``Y - relu(h) W_main`` of rows the main stream fits nearly exactly (alike rows, large against gamma) are far smaller
than the per-batch recursion's rounding of them, which left ``W_comp`` 12x to 46x off with every check passing. Such
runs are refused at the boundary; ordinary ones are not, and equal exact per-batch solves."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.core.backend import get_namespace
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.dual import DualHead
from foal_pipe.store import write_store

REFUSAL = "dual's compensation weights may be off by"


def stable_dual(tasks, gamma, gamma_comp, batch):
    """The published recursion by exact solves per batch (no Woodbury steps): after each batch the main stream's
    weights solve its sums so far; the batch's residual under them, earlier tasks' columns zeroed, is summed into
    the compensation stream's right-hand side. Returns W_comp over the classes seen."""
    D = tasks[0][0].shape[1]
    classes = np.unique(np.concatenate([y for _, y in tasks]))
    G_m, Q_m, G_c, Q_c = np.zeros((D, D)), np.zeros((D, classes.size)), np.zeros((D, D)), np.zeros((D, classes.size))
    earlier: list[int] = []
    for h, y in tasks:
        for lo in range(0, y.size, batch):
            X, Y = h[lo:lo + batch], (y[lo:lo + batch, None] == classes[None, :]).astype(float)
            Z, T = np.maximum(X, 0), np.tanh(X)
            G_m += Z.T @ Z
            Q_m += Z.T @ Y
            residual = Y - Z @ np.linalg.solve(G_m + gamma * np.eye(D), Q_m)
            residual[:, np.isin(classes, earlier)] = 0
            G_c += T.T @ T
            Q_c += T.T @ residual
        earlier = sorted(set(earlier) | set(y.tolist()))
    return np.linalg.solve(G_c + gamma_comp * np.eye(D), Q_c)


def fit(tasks, gamma, gamma_comp=None, batch=10):
    head = DualHead(gamma=gamma, gamma_comp=gamma_comp, batch_size=batch, xp=get_namespace("numpy"),
                    dim=tasks[0][0].shape[1])
    for h, y in tasks:
        head.add(h, y)
        model = head.boundary()
    return model


def identical_rows(seed: int, scale: float):
    """The audit's direct case: 3 classes of identical rows (d = 8), classes 0 and 1 in one task, 2 in the next."""
    m = np.random.default_rng(seed).normal(size=(3, 8)) * scale
    first, second = np.repeat([0, 1], [7, 6]), np.repeat([2], [5])
    return [(m[first], first), (m[second], second)]


def gaussian(seed: int, dim: int, per_task: int, scale: float):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, dim))
    tasks = []
    for classes in ([0, 1, 2], [3, 4, 5]):
        y = rng.choice(classes, per_task)
        tasks.append(((centres[y] + rng.normal(size=(per_task, dim))) * scale, y))
    return tasks


@pytest.mark.parametrize(("seed", "scale", "gamma"), [
    (0, 100, 1e-4),  # W_comp at the first boundary was 1.2% off before (mpmath reference of the recursion)
    (1, 100, 1e-4),  # 8.7x
    (1, 100, 1e-3),  # 5.2%
    (1, 10, 1e-4),  # 4.2e-4
    (1, 100, 1e-2),  # 1.1e-3
    (2, 100, 1e-4),  # 18x
    (2, 100, 1e-3),  # 34%
    (2, 10, 1e-4),  # 7.5e-4
    (2, 100, 1e-2),  # 4.1e-3
])
def test_compensation_weights_the_rounding_moved_are_refused(seed, scale, gamma):
    with pytest.raises(FoalPipeError, match=rf"^{REFUSAL} .* \(more than 0.0001\): the per-batch recursion's rounding at "
                                            rf"gamma {gamma:g} .* use a larger gamma for dual, or scale the features down$"):
        fit(identical_rows(seed, scale), gamma, gamma, batch=4)


def test_the_audit_store_is_refused_before_anything_is_written(tmp_path):
    """``learn --head dual --gamma 1e-4 --tasks 2 --batch-size 4 --projection-dim 8`` on the audit's store: W_comp
    was 48% off, exit 0."""
    rng = np.random.default_rng(4)
    m = rng.normal(size=(3, 8)) * 100
    y = np.repeat([0, 1, 2], [7, 6, 5])
    store = write_store(tmp_path / "s3.zarr", (m[y], y), (m[y], y.copy()), ["a", "b", "c"], dtype="float64", chunk_rows=64)
    out = tmp_path / "r3"
    result = invoke("learn", "--features", store, "--out", out, "--head", "dual", "--gamma", "1e-4", "--tasks", 2,
                    "--batch-size", 4, "--projection-dim", 8)
    assert_clean_error(result, REFUSAL, out)
    assert "use a larger gamma for dual" in result.output


@pytest.mark.parametrize(("dim", "per_task", "scale", "gamma"), [
    (16, 200, 1.0, 1.0),  # N > d
    (16, 4000, 1e3, 0.3),  # N > d, large rows: the probe path of the check (its cheap bound does not pass)
    (40, 30, 1.0, 1e-2),  # N < d
    (40, 30, 1e3, 1e6),  # N < d, large rows at a gamma of their scale
])
def test_ordinary_runs_are_not_refused_and_equal_exact_per_batch_solves(dim, per_task, scale, gamma):
    tasks = gaussian(5, dim, per_task, scale)
    W_comp = np.asarray(fit(tasks, gamma, 1.0).W_comp)
    reference = stable_dual(tasks, gamma, 1.0, 10)
    assert np.linalg.norm(W_comp - reference) <= 1e-4 * np.linalg.norm(reference)  # the promise (1.3e-6 at most here)


def test_identical_rows_at_a_gamma_that_resolves_them_run():
    """The audit's rows at gamma 1 (scale 1): the main stream fits them, yet their residuals' rounding is small."""
    tasks = identical_rows(0, 1.0)
    W_comp = np.asarray(fit(tasks, 1.0, batch=4).W_comp)
    reference = stable_dual(tasks, 1.0, 1.0, 4)
    assert np.linalg.norm(W_comp - reference) <= 1e-9 * np.linalg.norm(reference)


def test_the_inverse_stays_symmetric_through_the_steps_and_the_boundary():
    """The Woodbury step kept an antisymmetric error in ``R`` that the residuals' estimate counted in full (60x the
    weights' true change on digits); the steps and the boundary's inverse are averaged with their transposes."""
    tasks = gaussian(3, 12, 300, 10.0)
    head = DualHead(gamma=1e-3, gamma_comp=1.0, batch_size=10, xp=get_namespace("numpy"), dim=12)
    for h, y in tasks:
        head.add(h, y)
        R = head._state["R"]
        assert np.array_equal(R, R.T)
        head.boundary()
        R = head._state["R"]
        assert np.array_equal(R, R.T)


@pytest.mark.parametrize(("seed", "dim", "per_task", "scale", "gamma"), [
    (0, 16, 200, 100.0, 1e-3),  # refused before: W_comp "may be off by 4e-4", 6e-7 off exact per-batch solves
    (1, 16, 2000, 1.0, 1e-6),  # refused before: "5e-4", 1e-7 off
])
def test_alike_rows_the_recursion_resolves_are_not_refused(seed, dim, per_task, scale, gamma):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, dim))
    tasks = []
    for classes in ([0, 1, 2], [3, 4, 5]):
        y = rng.choice(classes, per_task)
        tasks.append(((centres[y] + 0.05 * rng.normal(size=(per_task, dim))) * scale, y))
    W_comp = np.asarray(fit(tasks, gamma, 1.0).W_comp)
    reference = stable_dual(tasks, gamma, 1.0, 10)
    assert np.linalg.norm(W_comp - reference) <= 1e-4 * np.linalg.norm(reference)
