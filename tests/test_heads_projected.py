"""The heads on projected rows, each against an independent float64 computation written plainly here:

* ``balanced`` (AIR's re-weighted ridge) against its closed form on all rows seen, at every boundary;
* ``dual`` (DS-AL) against ``DSAL.fit`` / ``RecursiveLinear.fit`` transcribed line by line (Woodbury inverse with
  ``np.linalg.inv``, weights by the recursive least-squares step), mini-batch by mini-batch, at every boundary.

Streams: random rows with imbalanced classes, classes that recur across tasks, non-contiguous class ids, and
scikit-learn's digits through a random projection; fed in blocks of 7 and of 4096 rows (the walk's blocks do not
line up with the recursion's mini-batches), on NumPy and on torch (CPU).
"""

from __future__ import annotations

import doctest
import importlib.util

import numpy as np
import pytest

from foal_pipe.core.backend import default_device, get_namespace, to_numpy
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import balanced, dual
from foal_pipe.heads.balanced import BalancedHead
from foal_pipe.heads.dual import DualHead

BACKENDS = [
    "numpy",
    "array_api_strict",
    pytest.param("torch", marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")),
]
TOL = 1e-9


# --- streams: a list of tasks, each (rows, labels) -----------------------------------------------------------


def random_stream(seed: int, task_classes: list[list[int]], dim: int = 12, per_class=(5, 60)) -> list:
    """Tasks of Gaussian rows around a mean per class; each class gets a random count in ``per_class`` (imbalanced)."""
    rng = np.random.default_rng(seed)
    means = {c: rng.normal(size=dim) for task in task_classes for c in task}
    tasks = []
    for classes in task_classes:
        labels = np.concatenate([np.full(int(rng.integers(*per_class)), c) for c in classes])
        labels = labels[rng.permutation(labels.size)]
        rows = np.stack([means[c] for c in labels]) + rng.normal(scale=1.5, size=(labels.size, dim))
        tasks.append((rows, labels))
    return tasks


def digits_stream(activation: str) -> list:
    """Digits (pixels in [-1, 1]) through a fixed random projection to 40 dimensions, 5 tasks of 2 classes."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    P = np.random.default_rng(3).uniform(-1 / 8, 1 / 8, size=(64, 40))
    h = (X / 8 - 1) @ P
    rows = 1 / (1 + np.exp(-h)) if activation == "sigmoid" else h
    return [(rows[np.isin(y, pair)], y[np.isin(y, pair)]) for pair in ([0, 1], [2, 3], [4, 5], [6, 7], [8, 9])]


STREAMS = {
    "imbalanced": lambda: random_stream(0, [[0, 1, 2], [3, 4], [5, 6, 7]], per_class=(3, 90)),
    "recurring": lambda: random_stream(1, [[2, 9], [5, 9, 14], [2, 20], [5, 14]]),
    "one-class-tasks": lambda: random_stream(2, [[7], [3], [7], [11]]),
}


@pytest.fixture(autouse=True)
def strict_off_host(monkeypatch):
    """array_api_strict arrays on a simulated device other than the CPU (as in test_array_api.py): a NumPy call on
    them raises instead of silently copying to the host."""
    import array_api_strict

    from foal_pipe.core import backend

    monkeypatch.setitem(backend.DEFAULT_DEVICES, "array_api_strict", lambda: array_api_strict.Device("device1"))


def on(xp, values):
    """``values`` as an array of ``xp`` on its default device."""
    return xp.asarray(values, device=default_device(xp))


def feed(head, tasks, xp, block: int) -> list:
    """Each task in blocks of ``block`` rows, then ``boundary()``; the models at every boundary."""
    models = []
    for rows, labels in tasks:
        for lo in range(0, labels.size, block):
            head.add(on(xp, rows[lo:lo + block]), labels[lo:lo + block])
        models.append(head.boundary())
    return models


def assert_scores(model, reference_classes, reference_scores, probe, xp) -> None:
    """Same classes, same scores (relative to their scale), same predictions where the reference has no near-tie."""
    np.testing.assert_array_equal(model.classes, reference_classes)
    got = to_numpy(model.scores(on(xp, probe)))
    scale = max(float(np.abs(reference_scores).max()), 1.0)
    assert float(np.abs(got - reference_scores).max()) <= TOL * scale
    top2 = np.sort(reference_scores, axis=1)[:, -2:] if reference_scores.shape[1] > 1 else None
    clear = np.ones(len(probe), bool) if top2 is None else top2[:, 1] - top2[:, 0] > 1e-6 * scale
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(got.argmax(axis=1)[clear], reference_scores.argmax(axis=1)[clear])


# --- balanced -----------------------------------------------------------------------------------------------


def balanced_closed_form(H: np.ndarray, y: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """AIR's GeneralizedARM.update from all rows: W = (sum_c w_c H_c^T H_c + gamma I)^-1 [w_c H_c^T 1]."""
    classes = np.unique(y)
    inverse = np.array([1.0 / np.sum(y == c) for c in classes])
    w = inverse * len(classes) / inverse.sum()
    A = gamma * np.eye(H.shape[1])
    B = np.zeros((H.shape[1], len(classes)))
    for k, c in enumerate(classes):
        Hc = H[y == c]
        A += w[k] * Hc.T @ Hc
        B[:, k] = w[k] * Hc.sum(axis=0)
    return classes, np.linalg.solve(A, B)


def check_balanced(tasks, gamma, xp, block) -> None:
    head = BalancedHead(gamma=gamma, xp=xp, dim=tasks[0][0].shape[1])
    probe = np.concatenate([rows for rows, _ in tasks])
    for t, model in enumerate(feed(head, tasks, xp, block)):
        H = np.concatenate([rows for rows, _ in tasks[: t + 1]])
        y = np.concatenate([labels for _, labels in tasks[: t + 1]])
        classes, W = balanced_closed_form(H, y, gamma)
        assert_scores(model, classes, probe @ W, probe, xp)


@pytest.mark.parametrize("block", [7, 4096])
@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_balanced_equals_its_closed_form_at_every_boundary(stream, block):
    check_balanced(STREAMS[stream](), 0.5, get_namespace("numpy"), block)


@pytest.mark.parametrize("block", [7, 4096])
def test_balanced_on_digits(block):
    check_balanced(digits_stream("sigmoid"), 1.0, get_namespace("numpy"), block)


def balanced_loo_brute_force(H: np.ndarray, y: np.ndarray, gamma: float) -> int:
    """Rows that the closed form refitted without them predicts right (a class of one row: wrong)."""
    hits = 0
    for i in range(y.size):
        rest = np.arange(y.size) != i
        if np.any(y[rest] == y[i]):
            classes, W = balanced_closed_form(H[rest], y[rest], gamma)
            hits += int(classes[np.argmax(H[i] @ W)] == y[i])
    return hits


def loo_stream(seed: int = 6) -> list:
    """Overlapping classes in 6 dimensions (leave-one-out misses some), one class of a single row, one of two."""
    tasks = random_stream(seed, [[0, 3, 5], [1, 3]], dim=6, per_class=(3, 40))
    rows, labels = tasks[1]
    return [tasks[0], (np.concatenate([rows, rows[:3] + 0.1]), np.concatenate([labels, [8, 9, 9]]))]


def check_balanced_loo(xp, block: int, gamma: float = 0.3) -> None:
    tasks = loo_stream()
    head = BalancedHead(gamma=gamma, xp=xp, dim=6)
    feed(head, tasks, xp, 4096)
    H, y = np.concatenate([r for r, _ in tasks]), np.concatenate([lab for _, lab in tasks])
    hits = sum(head.loo_hits(on(xp, H[lo:lo + block]), y[lo:lo + block]) for lo in range(0, y.size, block))
    expected = balanced_loo_brute_force(H, y, gamma)
    classes, W = balanced_closed_form(H, y, gamma)
    assert hits == expected < int(np.sum(classes[np.argmax(H @ W, axis=1)] == y))  # LOO is not training accuracy
    assert expected > 0.25 * y.size


@pytest.mark.parametrize("block", [7, 4096])
def test_balanced_leave_one_out_equals_refits_without_each_row(block):
    check_balanced_loo(get_namespace("numpy"), block)


def test_balanced_takes_no_rows_after_its_leave_one_out_pass():
    xp = get_namespace("numpy")
    head = BalancedHead(xp=xp, dim=2)
    head.add(np.eye(2).repeat(3, axis=0), np.array([0, 0, 0, 1, 1, 1]))
    head.loo_hits(np.eye(2), np.array([0, 1]))
    with pytest.raises(FoalPipeError, match="leave-one-out pass has used its per-class Grams"):
        head.add(np.eye(2), np.array([0, 1]))
    with pytest.raises(FoalPipeError, match="is not among the classes"):
        head.loo_hits(np.eye(2), np.array([0, 7]))


def test_balanced_weights_are_inverse_counts_with_mean_one():
    """The re-weighting itself: a class with 4x the rows weighs 4x less, and the weights average 1."""
    xp = get_namespace("numpy")
    head = BalancedHead(xp=xp, dim=2)
    head.add(np.ones((10, 2)), np.array([3] * 8 + [6] * 2))
    np.testing.assert_allclose(head.weights(), [0.4, 1.6])
    assert BalancedHead.bytes_per_class(100) == 8 * (100 * 100 + 100 + 1)
    assert BalancedHead.memory(3, 100) == 8 * (3 * (100 * 100 + 100 + 1) + 9 * 100 + 5 * 100 * 100 + 2 * 100 * 3)
    assert DualHead.memory(3, 100) == 8 * (6 * 100 * 100 + 4 * 100 * 3)


def test_balanced_is_ridge_when_every_class_has_as_many_rows():
    """Equal counts: every w_c is 1, and the head is ridge on one-hot targets (closed form written here)."""
    rng = np.random.default_rng(7)
    H, y = rng.normal(size=(60, 5)), np.repeat([1, 4, 8], 20)
    xp = get_namespace("numpy")
    head = BalancedHead(gamma=0.7, xp=xp, dim=5)
    head.add(H, y)
    ridge = np.linalg.solve(H.T @ H + 0.7 * np.eye(5), H.T @ (y[:, None] == [1, 4, 8]))
    np.testing.assert_allclose(head.boundary().W, ridge, rtol=1e-10, atol=1e-12)


def test_balanced_is_not_ridge_on_an_imbalanced_stream():
    """With classes of 80 and 4 rows the re-weighting changes the model (the test above could not pass by accident
    with plain ridge)."""
    (H, y), = random_stream(4, [[0, 1]], per_class=(4, 5))[:1]
    H, y = np.concatenate([H, H[y == 0].repeat(20, axis=0)]), np.concatenate([y, y[y == 0].repeat(20)])
    _, W = balanced_closed_form(H, y, 1.0)
    ridge = np.linalg.solve(H.T @ H + np.eye(H.shape[1]), H.T @ (y[:, None] == [0, 1]))
    assert np.abs(W - ridge).max() > 1e-3


# --- dual: DSAL.fit transcribed -----------------------------------------------------------------------------


def recursive_fit(R, W, X, Y):
    """RecursiveLinear.fit (analytic/AnalyticLinear.py): pad, Woodbury update of R, recursive least squares on W."""
    if Y.shape[1] > W.shape[1]:
        W = np.hstack([W, np.zeros((W.shape[0], Y.shape[1] - W.shape[1]))])
    elif Y.shape[1] < W.shape[1]:
        Y = np.hstack([Y, np.zeros((Y.shape[0], W.shape[1] - Y.shape[1]))])
    K = np.linalg.inv(np.eye(X.shape[0]) + X @ R @ X.T)
    R = R - R @ X.T @ K @ X @ R
    W = W + R @ X.T @ (Y - X @ W)
    return R, W


def dsal_published(tasks, gamma, gamma_comp, C, batch, plc="task"):
    """DSAL.fit per mini-batch of each task, as published (analytic/DSAL.py): ``plc="slice"`` zeroes
    ``Y_comp[:, :-increase_size]`` (increase_size: the task's number of classes), ``plc="task"`` the columns of the
    classes of earlier tasks, ``plc="none"`` nothing. Returns (seen classes, scores function) at every boundary."""
    D = tasks[0][0].shape[1]
    R_m, W_m = np.eye(D) / gamma, np.zeros((D, 0))
    R_c, W_c = np.eye(D) / gamma_comp, np.zeros((D, 0))
    earlier: set[int] = set()
    models = []
    for h, y in tasks:
        increase = len(np.unique(y))
        for lo in range(0, len(y), batch):
            hb, yb = h[lo:lo + batch], y[lo:lo + batch]
            num_classes = max(W_m.shape[1], int(yb.max()) + 1)
            Y_main = np.eye(num_classes)[yb]
            X_main = np.maximum(hb, 0)
            R_m, W_m = recursive_fit(R_m, W_m, X_main, Y_main)
            Y_comp = Y_main - X_main @ W_m
            if plc == "slice":
                Y_comp[:, :-increase] = 0
            elif plc == "task":
                Y_comp[:, [c for c in sorted(earlier) if c < num_classes]] = 0
            R_c, W_c = recursive_fit(R_c, W_c, np.tanh(hb), Y_comp)
        earlier |= {int(c) for c in y}
        seen = np.array(sorted(earlier))
        Wm, Wc = W_m[:, seen], W_c[:, seen]
        models.append((seen, lambda X, Wm=Wm, Wc=Wc: np.maximum(X, 0) @ Wm + C * np.tanh(X) @ Wc))
    return models


def check_dual(tasks, xp, block, batch=10, gamma=1.0, gamma_comp=0.5, C=0.7, plc="task") -> None:
    head = DualHead(gamma=gamma, gamma_comp=gamma_comp, compensation=C, batch_size=batch, xp=xp, dim=tasks[0][0].shape[1])
    probe = np.concatenate([rows for rows, _ in tasks])
    reference = dsal_published(tasks, gamma, gamma_comp, C, batch, plc)
    for model, (classes, scores) in zip(feed(head, tasks, xp, block), reference, strict=True):
        assert_scores(model, classes, scores(probe), probe, xp)


@pytest.fixture(params=[1, 6], ids=["batch-by-batch", "6-batch-blocks"])
def woodbury_blocks(request, monkeypatch):
    """Mini-batches per shared pass over the inverse (:func:`foal_pipe.heads.dual.block_batches`): 1 is the published
    step batch by batch; 6 runs the block recursion (the default picks by D, and the tests' D are small)."""
    monkeypatch.setattr(dual, "block_batches", lambda batch_size, dim: request.param)
    return request.param


@pytest.mark.parametrize("block", [7, 4096])
@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_dual_equals_the_published_recursion_at_every_boundary(stream, block, woodbury_blocks):
    check_dual(STREAMS[stream](), get_namespace("numpy"), block)


@pytest.mark.parametrize("batch", [1, 3, 256])
def test_dual_batch_sizes(batch, woodbury_blocks):
    """One-row batches, batches that do not divide a task, and a batch longer than any task (one short batch)."""
    check_dual(STREAMS["recurring"](), get_namespace("numpy"), 7, batch=batch, gamma=0.3, gamma_comp=2.0, C=1.0)


@pytest.mark.parametrize("block", [7, 4096])
def test_dual_on_digits(block, woodbury_blocks):
    check_dual(digits_stream("none"), get_namespace("numpy"), block, gamma=0.1, gamma_comp=0.1, C=1.0)


def test_block_size_follows_the_dimension():
    assert dual.block_batches(10, 1000) == 25 and dual.block_batches(10, 40) == 1 and dual.block_batches(300, 4096) == 1


def test_dual_matches_the_published_column_slice_when_ids_follow_the_tasks():
    """The published code keeps the last ``increase_size`` columns; with ids numbered in task order and each task's
    largest class in its first batch, those are exactly the classes first seen in the task (the rule here)."""
    tasks = []
    for rows, labels in random_stream(5, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]):
        first = int(np.flatnonzero(labels == labels.max())[0])
        order = np.r_[first, np.delete(np.arange(labels.size), first)]
        tasks.append((rows[order], labels[order]))
    check_dual(tasks, get_namespace("numpy"), 7, plc="slice")


def test_dual_compensation_and_cleansing_change_the_model():
    """The compensation stream is not zero, and zeroing earlier classes' residuals matters: without it the model
    differs (so the tests above tell the cleansing rule apart from none)."""
    tasks = STREAMS["imbalanced"]()
    probe = np.concatenate([rows for rows, _ in tasks])
    xp = get_namespace("numpy")
    with_comp, without = (feed(DualHead(compensation=c, xp=xp, dim=12), tasks, xp, 4096)[-1] for c in (1.0, 0.0))
    assert np.abs(with_comp.scores(probe) - without.scores(probe)).max() > 1e-3
    _, uncleansed = dsal_published(tasks, 1.0, 1.0, 1.0, 10, plc="none")[-1]
    assert np.abs(with_comp.scores(probe) - uncleansed(probe)).max() > 1e-3


# --- backends and refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_heads_on_every_backend(backend, woodbury_blocks):
    """The same generic code on the standard's own namespace (array_api_strict, off the host) and on torch (CPU)
    gives the numbers of the plain NumPy references."""
    xp = get_namespace(backend)
    check_balanced(STREAMS["recurring"](), 0.5, xp, 7)
    check_balanced_loo(xp, 7)
    check_dual(STREAMS["recurring"](), xp, 7)
    head = DualHead(xp=xp, dim=12)
    rows, labels = STREAMS["recurring"]()[0]
    head.add(on(xp, rows), labels)
    assert type(head.boundary().scores(on(xp, rows))) is type(on(xp, rows))


@pytest.mark.parametrize(("build", "message"), [
    (lambda xp: BalancedHead(gamma=0.0, xp=xp, dim=3), "gamma must be a positive number, got 0.0; try gamma=1"),
    (lambda xp: BalancedHead(gamma="auto", xp=xp, dim=3), "gamma must be a number, got 'auto'; try gamma=1"),
    (lambda xp: DualHead(gamma_comp=-1.0, xp=xp, dim=3), "gamma_comp must be a positive number"),
    (lambda xp: DualHead(batch_size=0, xp=xp, dim=3), "batch_size must be a whole number of at least 1, got 0"),
    (lambda xp: DualHead(batch_size=2.5, xp=xp, dim=3), "batch_size must be a whole number of at least 1, got 2.5"),
    (lambda xp: DualHead(compensation=float("nan"), xp=xp, dim=3), "compensation must be a finite number"),
    (lambda xp: BalancedHead(xp=xp, dim=3).boundary(), "no rows yet"),
    (lambda xp: DualHead(xp=xp, dim=3).boundary(), "no rows yet"),
    (lambda xp: BalancedHead(xp=xp, dim=3).add(np.ones((2, 4)), np.array([0, 1])), "built for dim=3"),
    (lambda xp: DualHead(xp=xp, dim=3).add(np.ones((2, 3)), np.array([0])), "2 rows but 1 labels"),
])
def test_bad_options_and_rows_are_refused_in_one_line(build, message):
    with pytest.raises(FoalPipeError, match=message):
        build(get_namespace("numpy"))


@pytest.mark.parametrize("module", [balanced, dual])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
