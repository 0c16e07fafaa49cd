"""Audit s27: the sums' counted rounding (``RidgeStatistics.rounding``, commit bffd990) against the float64 closed form.

Checked without a fault: float32 sums of one product (NumPy and torch CPU, 300,000 x 200 sigmoid: estimate 1.6-1.8x
the measured change), streams of distinct one-row batches of ReLU, cubed-ReLU and column-scaled (1 to 1e4) features
(the estimate 27-1,200x the change: conservative), tree sums of 1,024 and 4,096 parts and one 18,001-row batch
followed by 1,999 one-row ones (20,000 x 200 sigmoid: 4.5-5.6x), learn --dtype float32 with and without
--order-seeds on 200,000 distinct rows (2.0-4.9x), a model file whose ``sums_rounding`` was edited (refused
by the checksum), ``rounding=`` given as a NumPy scalar or a 0-d array.

Faults found (each test below failed on the code of bffd990; 1 is fixed for rows added again by ``partial_fit`` and
open for a store of repeated rows, a strict xfail; 2 and 3 are fixed):

1. Sums that add the same rows more than once (``partial_fit`` over the same batch in several epochs; a store
   holding repeated rows, through ``learn`` and ``learn --order-seeds``) round their float32 sums systematically,
   not as a random walk: each addition of the same increment to a running sum in one binade rounds by the same
   amount, so the error grows like the number of additions K, while :func:`~foal_pipe.core.drift.rounding_top`
   counts ``sqrt(K)``. The estimate falls to 0.2-0.44x of the measured change (0.12x at 3,000 additions), and
   weights 1.7-3.6% from the closed form are accepted.
2. float32 sums held by a float64 classifier (``from_statistics(s32, dtype="float64")``, ``merge`` of a float64
   classifier with a float32 one, ``s64 + s32``) are checked as float64 sums: their float32 rounding moves the
   weights by 2.4e-4 (above float64's 1e-4) while the estimate says 6e-12, and they are accepted.
   Fixed for the additions: the sums now measure their additions' rounding exactly (TwoSum) at 64 fixed entries
   (``core.rounding``), and the checks take it where it exceeds the walk: 500 epochs of one batch estimate 2.4%
   against 1.67% and are refused. Open: on a store whose every block holds the same rows the estimate is 0.24-0.52x
   the change (``learn`` gamma 200, ``--order-seeds`` gamma 100: 1.02% accepted; gammas 40 and 20 are refused).
   Measured in the twenty-eighth stop: ``G``'s rounding alone is within the estimate (it moves the weights 0.18%
   against 0.32% estimated; with ``--order-seeds``, 0.22% against 0.24%); the change comes from ``Q = H^T Y``,
   whose rounding no figure counts: every 4,096-row product of the same rows rounds ``Q`` alike (5e-6 of it, 83
   units, nearly all inside the products), which alone moves the weights 0.57% (0.96% with ``--order-seeds``).
3. ``RidgeStatistics(..., rounding=10**400)`` (or a huge ``Fraction``) raises a bare ``OverflowError`` instead of
   the ``FoalPipeError`` every other invalid rounding gets.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.core.drift import DRIFTS, column_scales
from foal_pipe.core.linalg import probed_drift
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store

CLASSES = 4
runner = CliRunner()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _sigmoid_rows(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid activations (float32) of ``n`` rows of 4 Gaussian classes in 8 latent dimensions, and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    X = rng.normal(size=(CLASSES, 8))[labels] + rng.normal(size=(n, 8))
    H = 1.0 / (1.0 + np.exp(-(X @ rng.normal(size=(8, dim)))))
    return H.astype(np.float32), labels


def _closed(H: np.ndarray, labels: np.ndarray, gamma: float, times: int = 1) -> np.ndarray:
    """The float64 closed form of ``times`` copies of the float32 rows ``H``."""
    H64 = H.astype(np.float64)
    Y = (labels[:, None] == np.arange(CLASSES)).astype(np.float64)
    G, Q = times * (H64.T @ H64), times * (H64.T @ Y)
    return np.linalg.solve(G + gamma * np.eye(H.shape[1]), Q)


def _moved(W: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(W, dtype=np.float64) - exact) / np.linalg.norm(exact))


def _repeated_partial_fit() -> tuple[float, float, float | None]:
    """500 ``partial_fit`` calls of the same 64 rows (D = 200, gamma 1e-3 max|G|)."""
    H, labels = _sigmoid_rows(64, 200)
    epochs = 500
    H64 = H.astype(np.float64)
    gamma = float(f"{1e-3 * epochs * np.abs(H64.T @ H64).max():.3g}")
    clf = AnalyticClassifier(gamma=gamma, dtype="float32")
    for _ in range(epochs):
        clf.partial_fit(H, labels, classes=np.arange(CLASSES))
    exact = _closed(H, labels, gamma, epochs)
    s = clf.statistics_
    moved = _moved(s.solve(gamma, drift_checked=True), exact)  # the weights, unchecked
    estimate = probed_drift(s.G, gamma, column_scales(s.G), top=s.rounding_top)
    try:
        accepted = _moved(clf.weights_, exact)
    except FoalPipeError:
        accepted = None
    return moved, estimate, accepted


def _repeated_store(root: Path, gamma: str, *options: str) -> tuple[float, float, float | None]:
    """``learn --dtype float32`` of a store whose 2 classes each hold the same 64 rows 2,048 times (262,144 rows,
    ``--projection-dim 100``): every 4,096-row block of a class is the same rows."""
    rng = np.random.default_rng(3)
    base = np.repeat(np.arange(2), 64)
    rows = (2 * rng.normal(size=(2, 6))[base] + rng.normal(size=(base.size, 6))).astype(np.float32)
    copies = 2048
    idx = np.concatenate([np.tile(np.arange(c * 64, (c + 1) * 64), copies) for c in range(2)])
    store = write_store(root / "s.zarr", (rows[idx], base[idx]), (rows, base), ["c0", "c1"])
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(root / "run"), "--tasks", "2",
                                 "--projection-dim", "100", "--dtype", "float32", "--backend", "numpy", "--gamma", gamma,
                                 *options])
    if result.exit_code != 0:  # refused
        assert "rounding of the float32 Gram sums" in result.output, result.output
        return math.nan, math.nan, None
    g, model = float(gamma), foal_pipe.load_model(root / "run" / "model.safetensors")
    H = np.asarray(model.projection.transform(rows), dtype=np.float64)
    exact = np.linalg.solve(copies * (H.T @ H) + g * np.eye(H.shape[1]), copies * (H.T @ np.eye(2)[base]))
    s = model.classifier.statistics_
    moved = _moved(s.solve(g, drift_checked=True), exact)
    estimate = probed_drift(s.G, g, column_scales(s.G), top=s.rounding_top)
    accepted = _moved(model.classifier.weights_, exact)
    return moved, estimate, accepted


@pytest.mark.parametrize("route", ["partial_fit", "learn", "learn --order-seeds"])
def test_float32_sums_of_repeated_rows_are_refused_before_their_rounding_moves_the_weights_past_one_percent(
        route, tmp_path):
    """The same rows added again and again: measured change of W against the float64 closed form of all the rows vs
    ``probed_drift(G, gamma, column_scales(G), top=s.rounding_top)``, the weights accepted each time:

    * ``partial_fit`` of the same 64 rows 500 times (D = 200, gamma 23.5 = 1e-3 max|G|): 1.67% vs 0.73% (0.44x);
      (as ``RidgeStatistics``, 400 rows added 3,000 times: 3.8% vs 0.62%; 1,000 times at D = 300: 1.7% vs 0.64%);
    * ``learn --dtype float32 --gamma 40`` of a store holding 64 rows per class 2,048 times each: 2.16% vs 0.91%;
    * the same with ``--order-seeds 0,1 --gamma 20``: 3.6% vs 0.70% (the class sums counted as calibrated).

    An identical increment added to a running float32 sum rounds the same way at every addition within a binade
    (and inside one BLAS product of repeated rows), so the error grows with the number of additions K, not with
    sqrt(K) as ``rounding`` counts it (a random walk)."""
    if route == "partial_fit":
        moved, estimate, accepted = _repeated_partial_fit()
    elif route == "learn":
        moved, estimate, accepted = _repeated_store(tmp_path, "40")
    else:
        moved, estimate, accepted = _repeated_store(tmp_path, "20", "--order-seeds", "0,1")
    if accepted is None:
        return  # refused: the promise holds
    assert estimate >= moved, f"the estimate {estimate:.4f} is below the measured change {moved:.4f}"
    assert accepted <= DRIFTS["float32"], f"weights {accepted:.4f} from the closed form, accepted"


@pytest.mark.parametrize("route", ["from_statistics", "merge", "sum"])
def test_float32_sums_held_as_float64_are_checked_at_float32s_rounding(route):
    """2,000 sigmoid rows (D = 200) summed in float32, held by a float64 classifier (gamma 1e-5 max|G| = 18.6): the
    weights lie 2.4e-4 (from_statistics), 2.5e-4 (merge, sum) from the float64 closed form, above float64's 1e-4,
    and are accepted; ``probed_drift(G, gamma, column_scales(G), top=s.rounding_top)`` says 6.0e-12: the float64
    sums' figure, though their entries carry float32 rounding (``_like``/``from_statistics``/``+`` upcast G and keep
    ``rounding`` in float64's units)."""
    H, labels = _sigmoid_rows(2000, 200)
    H64 = H.astype(np.float64)
    gamma = float(f"{1e-5 * np.abs(H64.T @ H64).max():.3g}")
    try:
        if route == "from_statistics":
            clf = AnalyticClassifier.from_statistics(RidgeStatistics.from_batch(H, labels, np.arange(CLASSES)),
                                                     gamma=gamma, dtype="float64")
        elif route == "merge":
            a = AnalyticClassifier(gamma=gamma, dtype="float64").fit(H[:10], labels[:10])
            b = AnalyticClassifier(gamma=gamma, dtype="float32").fit(H[10:], labels[10:])
            clf = a.merge(b)
        else:
            s = (RidgeStatistics.from_batch(H64[:10], labels[:10], np.arange(CLASSES))
                 + RidgeStatistics.from_batch(H[10:], labels[10:], np.arange(CLASSES)))
            clf = AnalyticClassifier.from_statistics(s, gamma=gamma)
    except FoalPipeError:
        return  # float32 sums refused as float64 ones: the promise holds
    s = clf.statistics_
    assert str(s.G.dtype) == "float64"
    exact = _closed(H, labels, gamma)
    unchecked = s.solve(gamma, drift_checked=True)
    moved = _moved(unchecked, exact)
    estimate = probed_drift(s.G, gamma, column_scales(s.G), top=s.rounding_top)
    assert estimate >= moved, f"the estimate {estimate:.3g} is below the measured change {moved:.3g}"
    try:
        W = clf.weights_
    except FoalPipeError:
        return
    assert _moved(W, exact) <= DRIFTS["float64"], f"weights {_moved(W, exact):.3g} from the closed form, accepted"


@pytest.mark.parametrize("value", [10**400, Fraction(10**400)], ids=["int", "fraction"])
def test_a_rounding_too_large_for_a_float_is_refused_not_a_bare_error(value):
    """``checked_rounding`` catches TypeError and ValueError of ``float(value)``, not OverflowError: 10**400 and
    Fraction(10**400) raise a bare ``OverflowError`` (Decimal('1e400'), inf and nan are refused)."""
    H, labels = _sigmoid_rows(50, 6)
    s = RidgeStatistics.from_batch(H, labels)
    with pytest.raises(FoalPipeError, match="rounding must be a finite number >= 0"):
        RidgeStatistics(s.G, s.Q, s.classes, s.n, s.counts, rounding=value)


@pytest.mark.xfail(strict=True, reason="open (owner): a store of repeated rows rounds Q = H^T Y alike inside every BLAS "
                   "product, and only G's rounding is counted (core/rounding.py)")
@pytest.mark.parametrize(("gamma", "options"), [("200", ()), ("100", ("--order-seeds", "0,1"))], ids=["learn", "orders"])
def test_the_estimate_bounds_the_change_of_a_store_of_repeated_rows(tmp_path, gamma, options):
    moved, estimate, _ = _repeated_store(tmp_path, gamma, *options)  # measured 0.61% vs 0.32%, 1.02% vs 0.24%
    assert estimate >= moved, f"the estimate {estimate:.4f} is below the measured change {moved:.4f}"


def test_the_estimate_bounds_what_the_rounding_of_g_does_on_a_store_of_repeated_rows(tmp_path):
    """The xfail above is ``Q``'s rounding: the float32 ``G`` alone, solved with the exact ``Q``, moves the weights less
    than the estimate (measured 0.18% against 0.32%); the float32 ``Q`` alone, with the exact ``G``, moved them 0.57%."""
    _repeated_store(tmp_path, "200")
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    rng = np.random.default_rng(3)  # the rows of _repeated_store
    base = np.repeat(np.arange(2), 64)
    rows = (2 * rng.normal(size=(2, 6))[base] + rng.normal(size=(base.size, 6))).astype(np.float32)
    H = np.asarray(model.projection.transform(rows), dtype=np.float64)
    G, Q = 2048 * (H.T @ H), 2048 * (H.T @ np.eye(2)[base])
    s = model.classifier.statistics_
    shifted = 200.0 * np.eye(H.shape[1])
    exact = np.linalg.solve(G + shifted, Q)
    by_g = _moved(np.linalg.solve(np.asarray(s.G, dtype=np.float64) + shifted, Q), exact)
    estimate = probed_drift(s.G, 200.0, column_scales(s.G), top=s.rounding_top)
    assert 0 < by_g <= estimate, (by_g, estimate)
