"""Audit s30, second pass over the erased-rows module (``protocol/erasedrows.py``) and G's diagonal rounding
(``core/rounding.py``: ``Rounding.diagonal``, ``sums_rounding_diagonal``).

Faults (each has a test below, named test_fault_*, that fails on the audited code and passes once fixed); all three
are in (B), none found in (A). All fixed in session 30: the diagonal's relative error is its 2-norm ratio
``|errors| / |sizes|`` (tiny entries weigh as little as they err), ``checked_rounding`` reads values in one line and
refuses a rounding that errs by more than the sums' largest entry:

1. ``AnalyticClassifier(gamma=0.1, dtype="float32").partial_fit(H, y).predict(...)``, H: 400 float32 sigmoid rows
   (D=40) whose last column is 3e-21 in 7 rows, 0 elsewhere (G's last diagonal entry 6e-41, a float32 subnormal).
   Expected: learned as with that column all 0 or 1e-18 (rounding_top 628). Actual: rounding_top 1.89e4 (30x) and
   "at gamma 0.1 the rounding of the float32 Gram sums may move the weights by about 1.03% (more than 1%...)"
   (also at 0.01, 0.001). Cause: ``diagonal_estimate`` takes every diagonal entry's relative error (a subnormal's is
   ~1e-4) as every entry's; it skips only entries that are exactly 0 (``where=sizes > 0``).
2. ``RidgeStatistics(G, Q, classes, n, rounding=Rounding(v, None, ["a"] * D))`` (or ``[1j] * D``). Expected: a
   one-line FoalPipeError ("the rounding's diagonal errors must be D finite numbers ...", as for a wrong size, NaN
   or None). Actual: ValueError "could not convert string to float: 'a'" / TypeError (complex). Cause:
   ``checked_rounding`` converts with ``np.asarray(..., dtype=np.float64)`` outside a try (``errors`` alike).
3. A float32 model file edited to hold ``sums_rounding_diagonal`` = [1e200] * D (right length, finite), loaded,
   continued with ``partial_fit``, then ``predict``. Expected: a one-line FoalPipeError (on load, or naming the
   rounding). Actual: ``OverflowError: cannot convert float infinity to integer`` in ``core.drift.rounded_up`` (via
   ``linalg.drift_refusal`` -> ``larger_gamma``): ``diagonal_estimate``'s ``relative**2`` overflows, rounding_top is
   inf. (``sums_rounding_errors`` = [1e200] * 64 crashes the same way: older code.) Right after load, ``predict``
   works (the saved weights); 1e30 gives a one-line drift refusal.

Checked and found right (guards below, a few of them):

(A) Erased rows, ``learn`` (local walk) against ``--scheduler dask``, ``--order-seeds`` and ``table``:
- a float64 store whose class b rows are ~1e-30 and differ only in the 12th digit (equal once cast to float32):
  ``--dtype float32`` learns on both schedulers (exit 0, the same A_avg/A_last), float64 refuses on both (one line,
  nothing written); ``--order-seeds 0,1 --dtype float32`` learns alike;
- 4 classes, c and d erased, ``--tasks 2``: the plain walk refuses for order seeds 1, 2, 3 (a task of c and d) and
  learns for 0, 4, 5; ``--order-seeds S`` alone gives the same outcome per seed, ``--order-seeds 0,...,5`` refuses,
  ``table --order-seeds 0,...,5`` and ``table --tasks 4`` refuse (one line, nothing written);
- local, ``--scheduler dask`` and ``--order-seeds 0,1`` (chunk_rows 7: task boundaries inside chunks; with and
  without ``--dtype float32``) give the same exit code on: a class of rows exactly 0 (learned), rows exactly 0 with
  one 1e-30 row (refused), 0.0 and -0.0 rows (learned), a float16 store of 1e-6 rows (learned), a float32 store of
  1e-30 rows (refused), every row erased (refused); ``--stream si-blurry``, ``--drop-last``, ``--drop-remainder``
  and an ``--init-model`` continuation with one erased task: the same refusal line on both schedulers;
- ``--order-seeds`` with ``--eval-every`` walks each order (refusals at the eval cuts, as the plain walk);
- ``Expansion.transform(check=False)`` + ``ErasedRows.of`` against ``transform`` (sigmoid and cos with bias, float32
  and float64 projections, float16/32/64 rows): erased rows found exactly where the walk refuses;
- ``--eval-every`` is refused with ``--scheduler dask`` (so the walk's cut at eval points needs no emulation there);
- ``--activation cos`` with ridge is refused before any projection (its bias), on both schedulers;
- ``ErasedRows.of`` on usual rows finds nothing (one column's comparison); -0.0 and 0.0 rows get one mark.
(B) Diagonal rounding:
- a model file edited to hold a diagonal of the wrong length (5 or 13 for D=12, or empty) is refused on load in one
  line ("the rounding's diagonal errors must be 12 finite numbers ..."); NaN, inf, strings, nested lists, a
  number are refused by the file checks; negative entries are legal (errors are signed);
- save / load / continue: the same tensors and rounding as an uninterrupted stream (metadata differs only by the
  checksum and ``rows_outside_stores``, which counts rows learned after load, by design);
- merge keeps a diagonal; ``Rounding + Rounding`` with one side lacking it keeps the other's (documented);
- D=1, an all-zero column, float64 sums (diagonal errors 0), array_api_strict (bitwise as NumPy), torch (within a
  unit: its products differ) fit and predict;
- float32 rows ~1e19 (one batch), ~3.6e18 (overflow only when two batches are added) and float64 ~1e160 are refused
  naming the overflow; float32 ~1e18 is refused naming gamma's resolution, float64 ~1e150 naming that the sums are
  too large for their rounding to be counted: no crash in ``diagonal_estimate``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model, write_model
from foal_pipe.store import write_store

runner = CliRunner()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _learn(store: Path, out: Path, *options, command: str = "learn") -> tuple[int, str, bool]:
    backend = ["--backend", "numpy"] if command == "learn" else []
    result = runner.invoke(app, [command, "--features", str(store), "--out", str(out), *backend, *map(str, options)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    return result.exit_code, lines[-1] if lines else "", out.exists()


def test_order_seeds_and_table_refuse_as_any_one_orders_walk(tmp_path):
    """Classes c, d erased (1e-30, distinct rows), --tasks 2: order 0 learns, order 1 puts c and d in one task."""
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2, 3], 16)
    x = rng.normal(size=(64, 5))
    x[y >= 2] *= 1e-30
    store = write_store(tmp_path / "s.zarr", (x, y), (rng.normal(size=(8, 5)), np.arange(8) % 4), list("abcd"),
                        chunk_rows=16, dtype="float64")
    common = ("--tasks", 2, "--projection-dim", 20)
    for seed, refused in ((0, False), (1, True)):
        plain = _learn(store, tmp_path / f"p{seed}", *common, "--order-seed", seed)
        orders = _learn(store, tmp_path / f"o{seed}", *common, "--order-seeds", seed)
        assert (plain[0] == 1) == refused and (orders[0] == 1) == refused, (seed, plain, orders)
    both = _learn(store, tmp_path / "both", *common, "--order-seeds", "0,1")
    table = _learn(store, tmp_path / "t", "--tasks", "2", "--projection-dim", 20, "--order-seeds", "0,1", command="table")
    for code, line, written in (both, table):
        assert code == 1 and "all equal its value at 0 exactly" in line and not written, (code, line)


def test_rows_equal_in_float32_learn_with_dtype_float32_and_are_refused_in_float64(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 5)), np.repeat([0, 1], 32)
    x[32:] = rng.normal(size=(1, 5)) * 1e-30 * (1 + 1e-12 * np.arange(32)[:, None])
    store = write_store(tmp_path / "s.zarr", (x, y), (rng.normal(size=(4, 5)), np.arange(4) % 2), ["a", "b"],
                        chunk_rows=16, dtype="float64")
    common = ("--tasks", 2, "--projection-dim", 20)
    assert _learn(store, tmp_path / "f32", *common, "--dtype", "float32")[0] == 0
    assert _learn(store, tmp_path / "o32", *common, "--dtype", "float32", "--order-seeds", "0,1")[0] == 0
    code, line, written = _learn(store, tmp_path / "f64", *common)
    assert code == 1 and "all equal its value at 0 exactly" in line and not written


def test_erased_rows_of_usual_data_are_none_and_signed_zeros_share_a_mark():
    from foal_pipe.core.expansion import Expansion
    from foal_pipe.protocol.erasedrows import ErasedRows

    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 6))
    projection = Expansion.draw(6, 8, "uniform", "sigmoid", 0, "float64")
    assert ErasedRows.of(projection, X, projection.transform(X), np.arange(40)).rows.size == 0
    Z = np.zeros((2, 6))
    Z[1] = -0.0
    found = ErasedRows.of(projection, Z, projection.transform(Z), np.arange(2))
    assert found.rows.tolist() == [0, 1] and found.marks[0] == found.marks[1]


def _fitted(n: int = 100) -> tuple[AnalyticClassifier, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    H, y = rng.random((300, 12)).astype(np.float32), np.arange(300) % 3
    clf = AnalyticClassifier(gamma=1.0, dtype="float32")
    for lo in range(0, n, 50):
        clf.partial_fit(H[lo : lo + 50], y[lo : lo + 50], classes=np.arange(3))
    return clf, H, y


@pytest.mark.parametrize("size", [0, 5, 13])
def test_a_model_file_with_a_diagonal_of_the_wrong_length_is_refused_on_load(tmp_path, size):
    clf, _, _ = _fitted()
    tensors, meta = read_model(clf.save(tmp_path / "m.safetensors"))
    edited = write_model(tmp_path / "e.safetensors", tensors, {**meta, "sums_rounding_diagonal": [0.0] * size})
    with pytest.raises(FoalPipeError, match="diagonal errors must be 12 finite numbers") as info:
        AnalyticClassifier.load(edited)
    assert "\n" not in str(info.value)


def test_save_load_continue_keeps_the_sums_and_their_rounding(tmp_path):
    whole, H, y = _fitted(300)
    half, _, _ = _fitted(150)
    resumed = AnalyticClassifier.load(half.save(tmp_path / "half.safetensors"))
    for lo in range(150, 300, 50):
        resumed.partial_fit(H[lo : lo + 50], y[lo : lo + 50])
    assert resumed.statistics_.rounding == whole.statistics_.rounding
    a, b = read_model(whole.save(tmp_path / "a.safetensors")), read_model(resumed.save(tmp_path / "b.safetensors"))
    assert set(a[0]) == set(b[0]) and all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
    assert a[1]["sums_rounding_diagonal"] == b[1]["sums_rounding_diagonal"]


@pytest.mark.parametrize(("scale", "dtype", "batches"), [(1e19, "float32", 1), (3.6e18, "float32", 2),
                                                         (1e160, "float64", 1)])
def test_overflowed_sums_are_refused_naming_the_overflow(scale, dtype, batches):
    rng = np.random.default_rng(0)
    H, y = rng.random((50, 4)) * scale, np.arange(50) % 2
    clf = AnalyticClassifier(gamma=1.0, dtype=dtype)
    with pytest.raises(FoalPipeError, match="overflow"):
        for _ in range(batches):
            clf.partial_fit(H.astype(dtype), y, classes=np.arange(2))
        clf.predict(H[:3].astype(dtype))


def test_array_api_strict_measures_the_diagonal_as_numpy():
    pytest.importorskip("array_api_strict")
    ref, H, y = _fitted(300)
    clf = AnalyticClassifier(gamma=1.0, dtype="float32", backend="array_api_strict")
    for lo in range(0, 300, 50):
        clf.partial_fit(H[lo : lo + 50], y[lo : lo + 50], classes=np.arange(3))
    assert clf.statistics_.rounding == ref.statistics_.rounding


# --- faults ---------------------------------------------------------------------------------------------------------

def _sigmoid_rows(tiny: float) -> tuple[np.ndarray, np.ndarray]:
    """400 float32 sigmoid activations (D=40) of 4 classes whose last column is 0 but for ``tiny`` in its first 7
    rows (0: an all-zero column)."""
    rng = np.random.default_rng(0)
    y = np.arange(400) % 4
    Z = rng.normal(size=(4, 8))[y] + 0.5 * rng.normal(size=(400, 8))
    H = (1 / (1 + np.exp(-(Z @ rng.normal(size=(8, 40)))))).astype(np.float32)
    H[:, -1] = 0
    H[:7, -1] = np.float32(tiny)
    return H, y


def test_fault_a_subnormal_diagonal_entry_does_not_inflate_the_sums_rounding():
    """FAULT 1. ``AnalyticClassifier(gamma=0.1, dtype="float32").partial_fit(H, y)`` then ``predict``, H: 400 sigmoid
    rows, D=40, whose last column is 3e-21 in 7 rows and 0 elsewhere (so G's last diagonal entry, 6e-41, is a float32
    subnormal). Expected: learned as with that column all 0 (or 1e-18): rounding_top 628, predict works.
    Actual: rounding_top 1.89e4 (30x), and predict raises "at gamma 0.1 the rounding of the float32 Gram sums may move
    the weights by about 1.03% (more than 1%: ...)" (1.2% at 0.01, 1.3% at 0.001), where the zero column learns.
    Cause: ``core.rounding.diagonal_estimate`` takes each diagonal entry's RELATIVE error (a subnormal's is ~1e-4:
    few significant bits) as every entry's; one subnormal entry of 40 lifts the mean square 500x. Entries below
    float32's smallest normal (or weighted by size) should not stand for the whole matrix."""
    for tiny in (0.0, 3e-21):
        H, y = _sigmoid_rows(tiny)
        clf = AnalyticClassifier(gamma=0.1, dtype="float32").partial_fit(H, y, classes=np.arange(4))
        if tiny == 0.0:
            reference = clf.statistics_.rounding_top
            continue
        assert clf.statistics_.rounding_top <= 2 * reference, (clf.statistics_.rounding_top, reference)
        clf.predict(H[:3])


@pytest.mark.parametrize("bad", ["a", 1j], ids=["string", "complex"])
def test_fault_a_non_numeric_rounding_diagonal_is_refused_in_one_line(bad):
    """FAULT 2. ``RidgeStatistics(G, Q, classes, n, rounding=Rounding(1e-10, None, ["a"] * D))`` (also ``1j``).
    Expected: FoalPipeError "the rounding's diagonal errors must be D finite numbers ..." (as for a wrong size, NaN,
    or None entries). Actual: ValueError "could not convert string to float: 'a'" (TypeError "float() argument must
    be a string or a real number, not 'complex'"), a traceback. Cause: ``core.rounding.checked_rounding`` converts
    with ``np.asarray(diagonal, dtype=np.float64)`` outside a try; the same holds for ``errors`` (older code)."""
    from foal_pipe.core.rounding import Rounding
    from foal_pipe.core.statistics import RidgeStatistics

    rng = np.random.default_rng(0)
    s = RidgeStatistics.from_batch(rng.random((60, 6)).astype(np.float32), np.arange(60) % 3)
    with pytest.raises(FoalPipeError, match="diagonal"):
        RidgeStatistics(s.G, s.Q, s.classes, s.n, rounding=Rounding(1e-10, None, [bad] * 6))


def test_fault_a_model_file_with_an_absurd_diagonal_is_refused_not_crashed_on(tmp_path):
    """FAULT 3. A model file (float32 gram, D=12) edited to hold ``sums_rounding_diagonal`` = [1e200] * 12 (numbers,
    finite, the right length), loaded, ``partial_fit`` on 100 more rows, then ``predict``. Expected: a one-line
    FoalPipeError (on load, or naming the rounding when solving). Actual: ``OverflowError: cannot convert float
    infinity to integer`` from ``core.drift.rounded_up`` (via ``linalg.drift_refusal`` -> ``larger_gamma``): the
    diagonal's relative errors square past float64 in ``diagonal_estimate``, rounding_top is inf, and the refusal's
    suggested gamma is inf. ``checked_rounding`` bounds nothing but finiteness (``sums_rounding_errors`` = [1e200] *
    64 crashes the same way)."""
    clf, H, y = _fitted()
    tensors, meta = read_model(clf.save(tmp_path / "m.safetensors"))
    edited = write_model(tmp_path / "e.safetensors", tensors, {**meta, "sums_rounding_diagonal": [1e200] * 12})
    with pytest.raises(FoalPipeError) as info:
        loaded = AnalyticClassifier.load(edited)
        loaded.partial_fit(H[100:200], y[100:200])
        loaded.predict(H[:3])
    assert "\n" not in str(info.value)
