"""Audit s28: Q held in float64 (float32 gram models), the rls file's checking sums, ``copy.copy`` of an estimator.

Faults found (each test below failed on the code of 64abd04 for its reason; all three are fixed in the same stop: the
rls engine adds each batch's product to its checking sums as it comes, ``DeployedModel`` copies as the estimator
does, and an rls file with one checking sum is refused):

1. An rls model's file still depends on when the stream was read or saved. The rls engine adds pending rows to its
   float64 checking sums only when the weights are read (``verify``: ``save``, ``predict``, ``weights_``) or 4,096 rows
   are pending. So a stream saved and reloaded after its first batch sums ``G`` in two products, and the same stream
   never read mid-way sums it in one. ``R`` and ``W`` are the same bits, but ``G``, ``Q``, ``drift`` and
   ``sums_rounding`` differ. AnalyticClassifier, D = 4, six batches of 10 rows, one save/reload after batch 1: ``G``
   differs by 1.4e-14 (of 54), ``Q`` by 1.8e-15, ``drift`` by 2.8e-17 (of 2.2e-16), ``sums_rounding`` 3.6e-29 against
   6.2e-29. A DeployedModel made by ``learn --engine rls`` and streamed like the s26 test but with no
   ``predict_names`` between batches gives the same result: saving every 3 batches changes ``drift`` by 1.7e-14 (of
   2.1e-14) and ``sums_rounding`` from 7.0e-29 to 1.1e-28. The s26 strict test passes only because it reads the model
   after every batch. One ``predict``, ``weights_``, pickle or ``copy.copy`` mid-stream with no save changes the final
   file too, because ``__getstate__`` verifies.
2. ``copy.copy`` of a DeployedModel still shares its classifier (the OwnState fix covers AnalyticClassifier only).
   ``partial_fit`` on the copy with a new class 'cow' moves the original: 40 -> 45 samples seen, 3 columns of scores,
   but ``class_names`` stays ['ant', 'bee'], so ``original.save`` is refused ("class_names has 2 names but W has 3
   columns"). The original cannot be saved any more.
3. (minor) An rls file that holds ``G`` but not ``Q`` (or ``Q`` but not ``G``) passes ``validate_model``. Its ``G`` is
   not checked against W (check_solution needs both) and is silently dropped on load: ``load_state`` rebuilds the
   checking sums from ``R``. A gram file missing ``Q`` is refused, and so is any stray tensor.

Checked and found correct: ``RidgeStatistics.from_batch`` of float32 rows gives float64 ``Q`` equal to ``math.fsum``
(NumPy, torch, array_api_strict); ``+`` and ``+=`` of float32/float64 statistics, ``aligned``, ``restrict`` and
``from_statistics`` (dtype float32, torch statistics) and ``merge`` (float32 with float32 or float64, either order,
saved) keep ``Q`` float64 and equal to the fsum; for float32 gram models ``learn`` (plain,
``--gamma auto``, ``--order-seeds 0,1``, ``--batch-size 7``, ``--stream si-blurry``, ``--init-model`` continuation,
``--scheduler dask`` on an in-process cluster) writes ``Q`` float64, equal to the fsum of the store's rows;
``learn --init-model`` of an rls file is refused in one line; gram/rls save/load, pickle and ``copy.copy`` followed by
``partial_fit`` agree bit for bit (AnalyticClassifier) and with the NumPy closed form (<= 1e-15); rls and gram files
with declared classes without rows round-trip their classes and counts and learn on to the closed form; edited rls
``G``/``Q`` (scaled entry, wrong shape, 1-d, NaN, int, float32, asymmetric), bad counts and bad ``sums_rounding``
are refused with a FoalPipeError; rls files written before the sums (no ``G``/``Q``) still load and learn on;
head estimators (ncm, slda) under ``copy.copy`` keep their own state. Seen but not traced (``Q`` agrees): dask and
local float32 learns of the same store differ in ``G``'s float32 bits and so in ``W``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model, write_model
from foal_pipe.store import write_store

runner = CliRunner()
NAMES = ["ant", "bee", "cow", "dog"]
DIM = 6


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _rls_stream(tmp_path: Path, save_after: set[int], tag: str) -> tuple[dict, dict]:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 4))
    y = rng.integers(0, 4, 60)
    y[:30] = np.minimum(y[:30], 1)
    clf = AnalyticClassifier(gamma=0.5, engine="rls")
    for i in range(6):
        clf.partial_fit(X[10 * i : 10 * i + 10], y[10 * i : 10 * i + 10])
        if i in save_after:
            clf = AnalyticClassifier.load(clf.save(tmp_path / f"{tag}_{i}.safetensors"))
    return read_model(clf.save(tmp_path / f"{tag}.safetensors"))


def _learned(root: Path, *options: str) -> Path:
    rng = np.random.default_rng(0)
    means = 2 * rng.normal(size=(4, DIM))
    y = np.arange(40) % 2
    x = (means[y] + rng.normal(size=(40, DIM))).astype(np.float32)
    store = write_store(root / "a.zarr", (x, y), (x[:8], y[:8]), NAMES[:2], chunk_rows=16)
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(root / "run"), "--projection-dim", "20",
                                 "--tasks", "1", "--backend", "numpy", *options])
    assert result.exit_code == 0, result.output
    return root / "run" / "model.safetensors"


# --- 1. an rls file depends on when its stream was saved (or read) ------------------------------------------------

def test_an_rls_stream_saved_and_reloaded_once_writes_the_sums_of_the_uninterrupted_stream(tmp_path):
    (plain, plain_meta), (saved, saved_meta) = _rls_stream(tmp_path, set(), "plain"), _rls_stream(tmp_path, {0}, "saved")
    np.testing.assert_array_equal(plain["R"], saved["R"])  # the recursion itself continues exactly
    np.testing.assert_array_equal(plain["W"], saved["W"])
    differ = {name: float(np.abs(plain[name] - saved[name]).max()) for name in ("G", "Q", "drift")
              if not np.array_equal(plain[name], saved[name])}
    assert not differ, (f"one save and reload after the first batch changes the rls file's checking sums and drift "
                        f"(max abs differences {differ}; sums_rounding {plain_meta.get('sums_rounding')} against "
                        f"{saved_meta.get('sums_rounding')}): the pending rows are summed when the model is read, so "
                        "the file depends on where the stream was saved")
    assert plain_meta.get("sums_rounding") == saved_meta.get("sums_rounding")


# --- 2. copy.copy of a DeployedModel shares its classifier ---------------------------------------------------------

def test_a_copied_deployed_model_learns_without_moving_the_original(tmp_path):
    original = foal_pipe.load_model(_learned(tmp_path))
    queries = np.random.default_rng(5).normal(size=(5, DIM)).astype(np.float32)
    before, seen = original.scores(queries).copy(), int(original.classifier.n_samples_seen_)
    copied = copy.copy(original)
    copied.partial_fit(queries, ["ant", "bee", "cow", "bee", "cow"])
    assert copied.class_names == NAMES[:3]
    after = original.scores(queries)
    assert int(original.classifier.n_samples_seen_) == seen and after.shape == before.shape, (
        f"partial_fit on copy.copy(model) moved the original: {seen} -> {int(original.classifier.n_samples_seen_)} "
        f"samples seen, scores {before.shape} -> {after.shape}, class_names {original.class_names}")
    np.testing.assert_array_equal(after, before)
    original.save(tmp_path / "original.safetensors")  # refused when the shared classifier grew a class


# --- 3. an rls file with half of its checking sums -----------------------------------------------------------------

@pytest.mark.parametrize("dropped", ["Q", "G"])
def test_an_rls_file_with_only_one_of_its_checking_sums_is_refused(tmp_path, dropped):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 4)), np.arange(60) % 4
    tensors, metadata = read_model(AnalyticClassifier(gamma=0.5, engine="rls").partial_fit(X, y).save(tmp_path / "m.safetensors"))
    assert {"G", "Q"} <= set(tensors)
    half = {name: a for name, a in tensors.items() if name != dropped}
    try:
        AnalyticClassifier.load(write_model(tmp_path / "half.safetensors", half, metadata))
    except FoalPipeError:
        return
    pytest.fail(f"an rls file without {dropped!r} but with the other checking sum was accepted; that sum is neither "
                "checked against W nor used (the sums are rebuilt from R)")


# --- held: Q in float64 on every route -----------------------------------------------------------------------------

def _fsum_q(X: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    return np.array([[math.fsum(X[y == k, j].astype(np.float64)) for k in range(n_classes)] for j in range(X.shape[1])])


def test_float32_statistics_hold_the_correctly_rounded_q_through_sums_and_views():
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(600, 4)) + 1000).astype(np.float32)
    y = np.arange(600) % 3
    exact = _fsum_q(X, y, 3)
    a, b = RidgeStatistics.from_batch(X[:300], y[:300]), RidgeStatistics.from_batch(X[300:].astype(np.float64), y[300:])
    assert a.G.dtype == np.float32 and a.Q.dtype == np.float64
    for total in (a + b, b + a):
        assert total.Q.dtype == np.float64
        np.testing.assert_array_equal(total.Q, exact)
    inplace = a.copy()
    inplace += b
    assert inplace.Q.dtype == np.float64
    np.testing.assert_array_equal(inplace.Q, exact)
    assert a.aligned(np.arange(5)).Q.dtype == a.restrict(np.array([0, 1])).Q.dtype == np.float64
    clf = AnalyticClassifier.from_statistics(b, gamma=1.0, dtype="float32")
    assert clf.statistics_.G.dtype == np.float32 and clf.statistics_.Q.dtype == np.float64


def test_torch_and_array_api_strict_float32_rows_give_float64_q():
    torch = pytest.importorskip("torch")
    strict = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(600, 4)) + 1000).astype(np.float32)
    y = np.arange(600) % 3
    exact = _fsum_q(X, y, 3)
    t = RidgeStatistics.from_batch(torch.asarray(X), y)
    assert t.Q.dtype == torch.float64
    np.testing.assert_array_equal(t.Q.numpy(), exact)
    s = RidgeStatistics.from_batch(strict.asarray(X), y)
    assert s.Q.dtype == strict.float64
    np.testing.assert_array_equal(np.asarray(s.Q), exact)


@pytest.mark.parametrize("options", [(), ("--order-seeds", "0,1"), ("--stream", "si-blurry")])
def test_learn_float32_writes_float64_q_equal_to_the_fsum_and_continues(tmp_path, options):
    rng = np.random.default_rng(0)
    y = np.arange(48) % 4
    x = (rng.normal(size=(48, 5)) * 3 + 100).astype(np.float32)
    x2, y2 = (rng.normal(size=(24, 5)) * 3 + 100).astype(np.float32), np.arange(24) % 4
    first = write_store(tmp_path / "a.zarr", (x, y), (x[:8], y[:8]), NAMES, chunk_rows=16)
    second = write_store(tmp_path / "b.zarr", (x2, y2), (x2[:8], y2[:8]), NAMES, chunk_rows=16)
    common = ["--projection-dim", "0", "--activation", "identity", "--backend", "numpy", "--tasks", "2"]
    result = runner.invoke(app, ["learn", "--features", str(first), "--out", str(tmp_path / "one"), *common, "--dtype",
                                 "float32", "--gamma", "10", *options])
    assert result.exit_code == 0, result.output
    tensors, _ = read_model(tmp_path / "one" / "model.safetensors")
    assert tensors["G"].dtype == np.float32 and tensors["Q"].dtype == np.float64
    np.testing.assert_array_equal(tensors["Q"], _fsum_q(x, y, 4))
    result = runner.invoke(app, ["learn", "--features", str(second), "--out", str(tmp_path / "two"), *common,
                                 "--init-model", str(tmp_path / "one" / "model.safetensors")])
    assert result.exit_code == 0, result.output
    tensors, _ = read_model(tmp_path / "two" / "model.safetensors")
    assert tensors["Q"].dtype == np.float64
    np.testing.assert_array_equal(tensors["Q"], _fsum_q(np.vstack([x, x2]), np.concatenate([y, y2]), 4))


# --- held: rls files, copies and pickles ----------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_declared_classes_round_trip_and_copies_learn_on_to_the_closed_form(tmp_path, engine):
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(30, 4)), np.arange(30) % 3
    X2, y2 = rng.normal(size=(12, 4)), np.arange(12) % 6
    clf = AnalyticClassifier(gamma=0.7, engine=engine).partial_fit(X, y, classes=np.arange(6))
    tensors, _ = read_model(clf.save(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(tensors["counts"], [10, 10, 10, 0, 0, 0])
    assert tensors["Q"].shape == (4, 6) and tensors["Q"].dtype == np.float64
    loaded = AnalyticClassifier.load(tmp_path / "m.safetensors").partial_fit(X2, y2)
    copied = copy.copy(clf).partial_fit(X2, y2)
    assert clf.n_samples_seen_ == 30  # the original did not move
    H, labels = np.vstack([X, X2]), np.concatenate([y, y2])
    exact = np.linalg.solve(H.T @ H + 0.7 * np.eye(4), H.T @ np.eye(6)[labels])
    for model in (loaded, copied):
        np.testing.assert_allclose(np.asarray(model.weights_), exact, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(np.asarray(loaded.weights_), np.asarray(copied.weights_))


@pytest.mark.parametrize("edit", ["scale G", "scale Q", "G float32", "Q float32", "Q shape"])
def test_edited_rls_checking_sums_are_refused_in_one_line(tmp_path, edit):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 4)), np.arange(60) % 4
    tensors, metadata = read_model(AnalyticClassifier(gamma=0.5, engine="rls").partial_fit(X, y).save(tmp_path / "m.safetensors"))
    name = edit.split()[1] if edit.startswith("scale") else edit[0]
    changed = tensors[name].copy()
    if edit.startswith("scale"):
        changed[0, 0] *= 1.5
    elif edit.endswith("float32"):
        changed = changed.astype(np.float32)
    else:
        changed = changed[:, :3].copy()
    with pytest.raises(FoalPipeError):  # by the writer's validation or the reader's
        AnalyticClassifier.load(write_model(tmp_path / "bad.safetensors", {**tensors, name: changed}, metadata))
