"""Audit s24: docs/cli.md's `--max-memory` promise, "every run's estimated peak is checked against the memory the
machine has before any work". Each test compares the estimate the command itself computes (its check_memory
parts, spied) with the peak its run allocates (tracemalloc, a warm second run), or gives a command a machine of a
few MiB and asks that it refuse in one line or stay within it. Scaled by classes (many columns, 4,096 test rows in
one chunk), not by rows."""

from __future__ import annotations

import shutil
import tracemalloc

import numpy as np
import pytest
from helpers import invoke, memory_checks

import foal_pipe.memory as memory

MIB = 2**20
C = 1000  # classes: one float64 test block of scores is 4,096 x 1,000 x 8 = 31 MiB
N_TEST = 4096


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """C Gaussian classes of width 16, about 20 train rows each (fecam needs 2 per class), the test split in one chunk
    of 4,096 rows (as a store from write_store's default chunk)."""
    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(C, 16))
    y_train = np.repeat(np.arange(C), 20)
    y_test = rng.integers(0, C, N_TEST)
    x_train = centres[y_train] + rng.normal(size=(y_train.size, 16))
    x_test = centres[y_test] + rng.normal(size=(N_TEST, 16))
    return write_store(tmp_path_factory.mktemp("mem24") / "many.zarr", (x_train.astype(np.float32), y_train),
                       (x_test.astype(np.float32), y_test), [f"c{k}" for k in range(C)], chunk_rows=N_TEST)


@pytest.fixture(scope="module")
def model(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("mem24run") / "run"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 64, "--gamma", 1,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    return out


def _peak(*args, out) -> tuple[object, int]:
    """The command's result and its peak of traced allocations (warm: imports and first-call caches left out)."""
    invoke(*args, "--out", out)
    shutil.rmtree(out, ignore_errors=True)
    tracemalloc.start()
    try:
        result = invoke(*args, "--out", out)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _estimate_vs_peak(monkeypatch, tmp_path, *args) -> tuple[float, float]:
    calls = memory_checks(monkeypatch)
    result, peak = _peak(*args, out=tmp_path / "out")
    assert result.exit_code == 0, result.output
    estimate = max(sum(parts.values()) for parts in calls[len(calls) // 2:])  # the measured run's checks
    return estimate / MIB, peak / MIB


# --- (b) estimates below the measured peak ----------------------------------------------------------------------


@pytest.mark.parametrize("head", ["fecam", "dual", "ncm"])
def test_a_heads_test_pass_is_charged_what_it_holds(store, tmp_path, monkeypatch, head):
    """memory_parts charges the test pass one float64 rows x classes block (``min(rows, test) * n_models * C * 8``),
    but a head's scoring holds several: fecam's memo of columns and bounds, their np.stack copies and
    _screened_argmax's ``ceiling`` (headscores.boundary_argmax); dual's two products, and Ties.check's top_two
    (full_like and where: two more copies); ncm's ``2 * (X M^T) - ...`` temporaries. Measured at 1,000 classes and
    4,096 test rows: fecam 172 MiB vs an estimate of 48 MiB, dual 103 vs 39, ncm 66 vs 38."""
    estimate, peak = _estimate_vs_peak(monkeypatch, tmp_path, "learn", "--features", store, "--tasks", 2,
                                       "--projection-dim", 0, "--head", head, "--backend", "numpy")
    assert peak <= 1.1 * estimate, f"{head}: measured peak {peak:.0f} MiB, estimate {estimate:.0f} MiB"


def test_gamma_auto_charges_the_zooms_scaled_weights(store, tmp_path, monkeypatch):
    """learn --gamma auto (select loo_accuracy): SampledLeaveOneOut._correct builds RidgeEigen.scaling of the gammas
    it evaluates, a (D, gammas x C) float64 array (gammapath.py, ``projected[:, None, :] * inv[:, :, None]``) and its
    float32 copy, for up to the 97 gammas of the default grid: D x C x 8 bytes per gamma that memory_parts does not
    charge. Measured at D=400 and 1,000 classes: 342 MiB vs an estimate of 202 MiB (D=1,000 and 10,000 classes:
    some 6 GiB uncounted)."""
    estimate, peak = _estimate_vs_peak(monkeypatch, tmp_path, "learn", "--features", store, "--tasks", 2,
                                       "--projection-dim", 400, "--gamma", "auto", "--backend", "numpy")
    assert peak <= 1.1 * estimate, f"measured peak {peak:.0f} MiB, estimate {estimate:.0f} MiB"


# --- an estimate far above the peak: a run that fits is refused -------------------------------------------------


def test_sweep_leave_one_out_is_not_refused_on_a_machine_that_holds_it(store, tmp_path, monkeypatch):
    """memory_parts charges leave-one-out ``block_rows x 3 x gammas x C`` float64 (1.2 GiB here, 13 gammas), but
    LeaveOneOut.add and SampledLeaveOneOut cut the rows so that a block holds about LOO_BLOCK_VALUES (2**22) values:
    the run peaks at about 360 MiB. With 1 GiB free the sweep is refused ("sweep needs about 1.5 GiB")."""
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + 2**30)
    result = invoke("sweep", "--features", store, "--out", tmp_path / "out", "--tasks", 2, "--projection-dim", 200,
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output


# --- (a) commands that score every class and check nothing --------------------------------------------------------


def _refused_or_within(result, peak: int, room: int, out) -> None:
    """A machine of ``room`` bytes beyond the interpreter: refused in one line naming the memory (nothing written), or
    run within it."""
    if result.exit_code == 0:
        assert peak <= room, f"exit 0 with a peak of {peak / MIB:.0f} MiB on a machine with {room / MIB:.0f} MiB free"
        return
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("Error: ") and "memory" in lines[-1] and "available" in lines[-1], result.output
    assert not out.exists()


def test_predict_checks_its_scores_against_the_machine(model, store, tmp_path, monkeypatch):
    """predict scores a whole chunk at once (model/predict.py predict_split -> SavedRidge.scores_with_ties ->
    best_of -> Ties.check): chunk rows x C float64 about three times over (X @ W, top_two's full_like and where),
    with no memory check. 4,096 x 1,000 here: a 103 MiB peak; a store of 16,384-row chunks and 10,000 classes: about
    3.7 GiB. On a machine with 24 MiB free it neither refuses nor scores in smaller blocks."""
    room = 24 * MIB
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + room)
    out = tmp_path / "p.csv"
    invoke("predict", "--model", model / "model.safetensors", "--features", store, "--out", tmp_path / "warm.csv")
    tracemalloc.start()
    try:
        result = invoke("predict", "--model", model / "model.safetensors", "--features", store, "--out", out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _refused_or_within(result, peak, room, out)


def test_evaluate_checks_its_test_scoring_against_the_machine(model, tmp_path, monkeypatch):
    """evaluate scores the run's test split for the per-class accuracy (report/classes.class_results ->
    DeployedModel.store_predictions, chunk by chunk, as predict) with no memory check: a 134 MiB peak here."""
    room = 24 * MIB
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + room)
    invoke("evaluate", "--run", model, "--out", tmp_path / "warm", "--no-plots")
    out = tmp_path / "ev"
    tracemalloc.start()
    try:
        result = invoke("evaluate", "--run", model, "--out", out, "--no-plots")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _refused_or_within(result, peak, room, out)


# --- a refusal's fix: options that lower what takes the memory ----------------------------------------------------


def test_a_feature_space_heads_refusal_does_not_offer_projection_dim(store, tmp_path, monkeypatch):
    """memory_fix's branch for a head without ridge (run.py) says "a head's per-class statistics grow as classes x
    d^2 ... (a lower --projection-dim)" for every head. ncm works on the store's features (its state is C x d, not
    C x d^2) and this run has --projection-dim 0 already: the option cannot lower anything (table refuses
    --projection-dim beside ncm as ignored). What takes the memory here is the test block of rows x classes."""
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + 20 * MIB)
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 0, "--head", "ncm",
                    "--backend", "numpy")
    assert result.exit_code == 1 and "learn needs about" in result.output, result.output
    fix = result.output.split("is available;", 1)[-1]
    assert "--projection-dim" not in fix and "x d^2" not in fix, fix
    assert not out.exists()


def test_a_sweep_refusal_names_no_loo_where_leave_one_out_takes_the_most():
    """memory_fix words the refusal by what takes the memory: leave-one-out's parts the largest, ``sweep`` offers
    ``--no-loo`` with their size; a test pass that takes more does not."""
    from types import SimpleNamespace

    from foal_pipe.cli.flags import cli_form
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.protocol.memoryparts import memory_fix

    run = SimpleNamespace(model=SimpleNamespace(gamma=1.0), evaluation=SimpleNamespace(eval_every=None),
                          execution=SimpleNamespace(scheduler="local"))
    looped = {"a block of rows": 10 * MIB, "leave-one-out's scaled weights": 30 * MIB, "state at D=8": MIB}
    fix = FoalPipeError(memory_fix("sweep", run, parts=looped)).render(cli_form)
    assert fix.startswith("skip leave-one-out (--no-loo), which takes 30.0 MiB of it"), fix
    tested = {**looped, "a block of rows": 40 * MIB}
    assert "--no-loo" not in FoalPipeError(memory_fix("sweep", run, parts=tested)).render(cli_form)
