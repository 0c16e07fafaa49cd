"""Never silently wrong in float32: the solve runs in float64, and a gamma the float32 sums cannot resolve is refused.

The reported failure: `--dtype float32 --gamma 1e-6` on digits gave A_avg 47% (float64: 99%) with exit 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.store import write_store


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """scikit-learn's digits as the `pixels` encoder stores them ([-1, 1]), every 5th image a test image."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    test = np.arange(len(y)) % 5 == 4
    path = tmp_path_factory.mktemp("digits") / "digits.zarr"
    return write_store(path, (X[~test] / 8 - 1, y[~test]), (X[test] / 8 - 1, y[test]), [str(i) for i in range(10)],
                       chunk_rows=256)


def run(store, out, *args):
    return invoke("learn", "--features", store, "--out", out, "--tasks", 5, "--backend", "numpy", *args)


@pytest.mark.parametrize(("gamma", "message"), [
    ("1e-6", "below the resolution of the float32 Gram sums"),  # gamma vanishes beside the diagonal
    ("1e-4", "not positive definite at this gamma"),  # rounding outweighs gamma in some direction
])
def test_unresolvable_gamma_is_refused_in_float32(tmp_path, digits, gamma, message):
    assert run(digits, tmp_path / "f64", "--gamma", gamma).exit_code == 0  # float64 resolves it
    assert json.loads((tmp_path / "f64" / "metrics.json").read_text())["A_avg"] > 0.95
    assert_clean_error(run(digits, tmp_path / "f32", "--gamma", gamma, "--dtype", "float32"), message, tmp_path / "f32")


@pytest.mark.parametrize("gamma", ["1e-2", "1"])
def test_accepted_float32_gamma_gives_the_float64_answer(tmp_path, digits, gamma):
    metrics = {}
    for dtype in ("float64", "float32"):
        result = run(digits, tmp_path / dtype, "--gamma", gamma, "--dtype", dtype)
        assert result.exit_code == 0, result.output
        metrics[dtype] = json.loads((tmp_path / dtype / "metrics.json").read_text())
    assert metrics["float32"]["dtype"] == "float32"
    flat = {dtype: np.concatenate(m["accuracy_matrix"]) for dtype, m in metrics.items()}
    np.testing.assert_allclose(flat["float32"], flat["float64"], rtol=0, atol=0.005)
    assert metrics["float32"]["A_avg"] > 0.95


def test_sweep_refuses_float32_gammas_below_resolution(tmp_path, digits):
    out = tmp_path / "sw"
    result = invoke("sweep", "--features", digits, "--out", out, "--tasks", 5, "--backend", "numpy", "--dtype", "float32",
                    "--gammas", "1e-6,1")
    assert_clean_error(result, "below the resolution of the Gram sums", out)


def test_rls_float32_gamma_that_overflows_r0_is_refused(tmp_path, digits):
    assert_clean_error(run(digits, tmp_path / "o", "--engine", "rls", "--dtype", "float32", "--gamma", "1e-40"),
                       "underflows in float32", tmp_path / "o")
