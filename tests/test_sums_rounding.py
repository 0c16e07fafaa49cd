"""The rounding of Gram sums formed by many additions (``RidgeStatistics.rounding``, ``core.rounding``,
``core.drift.rounding_top``).

Each addition into float32 running sums rounds every entry by up to a unit of the sum's size, so a stream of small
``partial_fit`` batches rounds its sums far more than ``learn``'s few blocks, whose rounding the drift estimate was
calibrated on. The sums count their products' and additions' rounding (a random walk's variance) and measure it
exactly at a few entries; the drift checks take both, and model files keep them. Checked against float64 sums and
float64 closed forms of the same rows.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from test_audit_stream_s26 import DIM, NAMES, _closed_form, _learned
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.core.drift import CALIBRATED_ROUNDING, DRIFTS, ROUNDING_SPREAD, UNITS, column_scales
from foal_pipe.core.linalg import probed_drift
from foal_pipe.core.rounding import sample_entries
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.ridgemodel import RidgeModel
from foal_pipe.store import write_store

U32 = UNITS["float32"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _activations(n: int, dim: int = 24, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid activations of ``n`` rows (float32: every entry near the largest, as a projection's are) and labels
    of 4 classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    X = rng.normal(size=(4, 8))[labels] + rng.normal(size=(n, 8))
    H = 1.0 / (1.0 + np.exp(-(X @ rng.normal(size=(8, dim)))))
    return H.astype(np.float32), labels


def _streamed(H: np.ndarray, labels: np.ndarray, batch: int) -> RidgeStatistics:
    s = RidgeStatistics.empty(H.shape[1], dtype=np.float32)
    for start in range(0, H.shape[0], batch):
        s += RidgeStatistics.from_batch(H[start : start + batch], labels[start : start + batch], np.arange(4))
    return s


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length])["__metadata__"]


@pytest.mark.parametrize("batch", [1, 3, 50, 4096])
def test_the_counted_rounding_covers_the_float32_sums_measured_rounding(batch):
    H, labels = _activations(3000)
    s = _streamed(H, labels, batch)
    exact = H.astype(np.float64).T @ H.astype(np.float64)
    measured = float(np.std(s.G.astype(np.float64) - exact)) / U32  # in units of rounding
    top = float(np.abs(s.G).max())
    assert measured <= ROUNDING_SPREAD * s.rounding_top  # what the drift estimate takes
    if batch == 4096:  # one product of rows that differ: its measured rounding within the calibration's reach
        assert top <= s.rounding_top <= 1.3 * top
    if batch == 1:  # 3,000 additions: their rounding is beyond the calibrated figure, which no longer covers it
        assert measured > ROUNDING_SPREAD * top
        assert s.rounding_top > 5 * top


def test_additions_count_each_parts_rounding_and_the_sums_own():
    H, labels = _activations(900)
    a = RidgeStatistics.from_batch(H[:300], labels[:300], np.arange(4))
    b = RidgeStatistics.from_batch(H[300:], labels[300:], np.arange(4))
    top = lambda G: float(np.max(np.diag(G)))  # noqa: E731
    rows, cols = sample_entries(H.shape[1])
    assert a.rounding.variance == (U32 * top(a.G)) ** 2
    exact = [h.astype(np.float64).T @ h.astype(np.float64) for h in (H[:300], H[300:])]  # float32 products: exact
    np.testing.assert_allclose(a.rounding.errors, (exact[0] - a.G)[rows, cols], rtol=0, atol=1e-6 * U32 * top(a.G))
    assert np.abs(a.rounding.errors).max() > 0  # a float32 product's own rounding, measured
    total = a + b
    assert total.rounding.variance == a.rounding.variance + b.rounding.variance + (U32 * top(total.G)) ** 2
    added = a.G.astype(np.float64) + b.G.astype(np.float64)  # exact: two float32 values
    np.testing.assert_array_equal(total.rounding.errors - a.rounding.errors - b.rounding.errors,
                                  (added - total.G)[rows, cols])  # the addition's, exactly
    np.testing.assert_allclose(total.rounding.errors, (exact[0] + exact[1] - total.G)[rows, cols], rtol=0,
                               atol=1e-6 * U32 * top(total.G))  # the products' and the addition's: all of it
    assert np.abs(total.rounding.errors).max() > 0
    c = a.copy()
    c += b
    assert c.rounding == total.rounding and np.array_equal(c.G, total.G)
    empty = RidgeStatistics.empty(H.shape[1], dtype=np.float32)
    assert (empty + a).rounding == a.rounding  # adding to zeros rounds nothing
    given = RidgeStatistics(a.G, a.Q, a.classes, a.n, a.counts)  # unknown: the calibrated figure of its size
    assert given.rounding is None and given.rounding_top == float(np.abs(a.G).max())
    variance = CALIBRATED_ROUNDING * (U32 * top(a.G)) ** 2 + b.rounding.variance + (U32 * top(total.G)) ** 2
    assert (given + b).rounding.variance == variance
    in_place = RidgeStatistics(a.G.copy(), a.Q.copy(), a.classes, a.n, a.counts)
    in_place += b  # its own size taken before G grows
    assert in_place.rounding == (given + b).rounding
    wider = RidgeStatistics.from_batch(H[:300].astype(np.float64), labels[:300], np.arange(4)) + b
    assert wider.G.dtype == np.float64 and wider.rounding.variance >= b.rounding.variance  # float32's rounding kept
    assert wider.rounding_top > 1e7 * float(np.abs(wider.G).max())  # in float64's units: checked at float32's


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "1", True, 10**400])
def test_a_rounding_that_no_sums_have_is_refused(value):
    H, labels = _activations(50)
    s = RidgeStatistics.from_batch(H, labels)
    with pytest.raises(FoalPipeError, match="rounding must be a finite number >= 0"):
        RidgeStatistics(s.G, s.Q, s.classes, s.n, s.counts, rounding=value)


def test_a_float32_stream_of_one_row_calls_is_refused_before_its_rounding_moves_the_weights_past_the_limit(tmp_path):
    """The drift estimate bounds the measured change of the weights (against a float64 closed form of the same
    rows) all along a stream of one-row calls into a learned model, so its weights are refused before the change
    passes 1% (the stream of ``test_audit_stream_s26``, which moves them by 1.8%)."""
    path, x, y, means = _learned(tmp_path, "--dtype", "float32", "--gamma", "1e-3", dim=30)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 4, 3000)
    rows = (means[ids] + rng.normal(size=(ids.size, DIM))).astype(np.float32)
    model = foal_pipe.load_model(path)
    refused_at = None
    for i in range(ids.size):
        model.partial_fit(rows[i : i + 1], [NAMES[ids[i]]])
        if i + 1 not in (10, 100, 500, 1000, 3000):
            continue
        exact = _closed_form(model, np.vstack([x, rows[: i + 1]]), np.concatenate([y, ids[: i + 1]]), 1e-3)
        s = model.classifier.statistics_
        moved = np.linalg.norm(s.solve(1e-3, drift_checked=True) - exact) / np.linalg.norm(exact)  # unchecked
        estimate = probed_drift(s.G, 1e-3, column_scales(s.G), top=s.rounding_top)
        assert estimate >= moved, f"after {i + 1} rows the estimate {estimate:.4f} is below the change {moved:.4f}"
        try:
            model.scores(x[:3])
        except FoalPipeError as exc:
            assert "rounding of the float32 Gram sums may move the weights" in str(exc)
            refused_at = refused_at or i + 1
        else:
            assert moved <= DRIFTS["float32"]
    assert refused_at is not None and refused_at < 3000


def test_a_stream_saved_and_reloaded_writes_the_file_of_the_uninterrupted_stream(tmp_path):
    H, labels = _activations(600, dim=16, seed=2)
    first = tmp_path / "first.safetensors"
    AnalyticClassifier(gamma=1.0, dtype="float32").partial_fit(H[:1], labels[:1], classes=np.arange(4)).save(first)
    whole = AnalyticClassifier.load(first)
    for i in range(1, 600):
        whole.partial_fit(H[i : i + 1], labels[i : i + 1])
    whole.save(tmp_path / "whole.safetensors")

    path = tmp_path / "saved.safetensors"  # saved after every call, and reloaded for the next
    path.write_bytes(first.read_bytes())
    for i in range(1, 600):
        AnalyticClassifier.load(path).partial_fit(H[i : i + 1], labels[i : i + 1]).save(path)
    assert path.read_bytes() == (tmp_path / "whole.safetensors").read_bytes()
    s = whole.statistics_
    assert json.loads(_header(path)["sums_rounding"]) == s.rounding.variance
    assert json.loads(_header(path)["sums_rounding_errors"]) == s.rounding.errors.tolist()
    assert s.rounding_top > float(np.abs(s.G).max())  # beyond the calibration: it counts


def test_a_file_without_the_rounding_reads_as_calibrated_and_a_save_cannot_set_it(tmp_path):
    H, labels = _activations(300)
    clf = AnalyticClassifier(gamma=1.0, dtype="float32").fit(H, labels)
    path = clf.save(tmp_path / "m.safetensors")
    assert json.loads(_header(path)["sums_rounding"]) == clf.statistics_.rounding.variance
    model = RidgeModel.load(path)
    older = RidgeModel({k: v for k, v in model.state.items() if k != "rounding"}, model.weights, model.classes,
                       model.gamma, model.engine, model.dtype, model.n_samples)  # as a writer before it kept it
    older.save(tmp_path / "older.safetensors")
    assert "sums_rounding" not in _header(tmp_path / "older.safetensors")
    loaded = AnalyticClassifier.load(tmp_path / "older.safetensors").statistics_
    assert loaded.rounding is None and loaded.rounding_top == float(np.abs(loaded.G).max())
    with pytest.raises(FoalPipeError, match="sums_rounding"):
        clf.save(tmp_path / "n.safetensors", sums_rounding=1.0)


def test_learn_orders_count_the_additions_of_the_class_sums(tmp_path):
    """``learn --order-seeds`` sums each boundary class by class: 60 additions, counted; the file keeps the count,
    which covers the measured rounding of its float32 ``G``."""
    rng = np.random.default_rng(3)
    classes = 60
    y = np.repeat(np.arange(classes), 30)
    x = (rng.normal(size=(classes, 6))[y] + rng.normal(size=(y.size, 6))).astype(np.float32)
    store = write_store(tmp_path / "s.zarr", (x, y), (x[::10], y[::10]), [f"c{i}" for i in range(classes)])
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "3",
                                 "--projection-dim", "16", "--dtype", "float32", "--order-seeds", "0,1",
                                 "--backend", "numpy"])
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    s = model.classifier.statistics_
    H = np.asarray(model.projection.transform(x), dtype=np.float64)
    measured = float(np.std(s.G.astype(np.float64) - H.T @ H)) / U32
    assert s.rounding.variance > CALIBRATED_ROUNDING * (U32 * float(np.abs(s.G).max())) ** 2
    assert measured <= ROUNDING_SPREAD * s.rounding_top


def test_sums_of_a_dtype_whose_rounding_is_not_bounded_are_refused():
    H, labels = _activations(20)
    with pytest.raises(FoalPipeError, match="sums of dtype float16 are not supported"):
        RidgeStatistics.from_batch(H.astype(np.float16), labels)
    G = (H.T @ H).astype(np.float16)
    with pytest.raises(FoalPipeError, match="sums of dtype float16 are not supported"):
        RidgeStatistics(G, np.zeros((G.shape[0], 1), np.float16), np.array([0]), 20)
