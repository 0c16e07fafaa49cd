"""The array backends audited side by side (numpy, torch on the CPU, array_api_strict): faults that only one namespace,
or one engine, showed.

- A refusal of rows whose float64 scores tie within their own rounding counted (row, model) pairs where a backend
  scored every model in one product (torch, CuPy, array_api_strict): `sweep --backend torch` on 60 test rows said
  "the float64 scores of 300 test rows tie" (5 models), NumPy 60.
- The RLS engine updated ``W`` in place, so a ``weights_`` read before a later ``partial_fit`` changed under the
  caller (the gram engine's did not), on every backend.
- A float16 torch tensor given to ``backend="array_api_strict"`` ended in a TypeError traceback (the namespace has no
  float16); it is widened to float32, exactly, as for the other backends.
"""

from __future__ import annotations

import importlib.util

import array_api_strict
import numpy as np
import pytest
from helpers import invoke

from foal_pipe import AnalyticClassifier, FoalPipeError
from foal_pipe.core.scoring import ModelScores, Rows, Ties
from foal_pipe.store import write_store

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
BACKENDS = ["numpy", pytest.param("torch", marks=needs_torch), "array_api_strict"]
TIED = "tie within their own rounding"


def tied_count(error: FoalPipeError) -> int:
    """The number of rows a ties refusal names ("the float64 scores of N test rows tie ...")."""
    return int(str(error).split("the float64 scores of ")[1].split(" ")[0])


def tied_rows_and_weights(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``1e8 + 1e-7 z`` (their last digits differ) and columns that share the offset alike: every row's top
    two scores lie within float64's rounding of each other."""
    H = 1e8 + 1e-7 * np.random.default_rng(0).normal(size=(n, 10))
    rng = np.random.default_rng(1)
    V = rng.normal(size=(10, 4))
    return H, np.abs(rng.normal(size=(10, 1))) + 1e-3 * (V - V.mean(axis=0))


def test_a_tie_refusal_counts_each_row_once_however_many_models_tie_on_it():
    """Three copies of one model tie on the same rows: the refusal names as many rows as the model alone, never
    more than the rows scored (it named three times as many)."""
    H, W = tied_rows_and_weights()
    with pytest.raises(FoalPipeError, match=TIED) as one:
        Ties.of(W).check((H @ W)[:, None, :], H)
    W3 = np.concatenate([W, W, W], axis=1)
    with pytest.raises(FoalPipeError, match=TIED) as three:
        Ties.of(W3, 3).check((H @ W3).reshape(H.shape[0], 3, -1), H)
    assert tied_count(three.value) == tied_count(one.value) <= H.shape[0]
    # the path of every namespace but NumPy's (all models in one product), and NumPy's (model by model), alike
    for namespace in (array_api_strict, np):
        with pytest.raises(FoalPipeError, match=TIED) as scored:
            ModelScores(namespace.asarray(W3), 3).argmax(Rows.of(namespace.asarray(H)))
        assert tied_count(scored.value) == tied_count(one.value)


@needs_torch
def test_sweep_on_torch_names_the_tied_test_rows_as_numpy_does(tmp_path):
    """The audit's store (classes 1e-17 apart around 1e8): every one of its 60 test rows ties at every gamma."""
    rng = np.random.default_rng(7)
    means = rng.normal(size=(4, 10))

    def split(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(4), per_class)
        return 1e8 + 1e-7 * (means[y] + 0.3 * np.random.default_rng(seed).normal(size=(y.size, 10))), y

    store = write_store(tmp_path / "s.zarr", split(10, 1), split(15, 2), ["a", "b", "c", "e"], dtype="float64")
    counts = {}
    for backend in ("numpy", "torch"):
        out = tmp_path / backend
        result = invoke("sweep", "--features", store, "--out", out, "--tasks", 1, "--projection-dim", 0,
                        "--gammas", "1e8,1e9", "--backend", backend)
        assert result.exit_code == 1 and TIED in result.output and "Traceback" not in result.output, result.output
        assert not out.exists()
        counts[backend] = int(result.output.split("the float64 scores of ")[1].split(" ")[0])
    assert counts == {"numpy": 60, "torch": 60}


def ridge(X: np.ndarray, y: np.ndarray, gamma: float, classes: np.ndarray) -> np.ndarray:
    """The closed-form ridge weights ``(X^T X + gamma I)^-1 X^T Y`` (one-hot ``Y`` over ``classes``)."""
    Y = (y[:, None] == classes[None, :]).astype(float)
    return np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine", ["rls", "gram"])
def test_weights_read_before_a_later_partial_fit_keep_their_values(backend, engine):
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(90, 7)), np.tile(np.arange(3), 30)
    classes = np.arange(3)
    model = AnalyticClassifier(gamma=0.5, engine=engine, backend=backend).partial_fit(X[:40], y[:40])
    first, first_coef = model.weights_, model.coef_
    model.partial_fit(X[40:], y[40:])
    np.testing.assert_allclose(first, ridge(X[:40], y[:40], 0.5, classes), rtol=0, atol=1e-9)
    np.testing.assert_allclose(first_coef, ridge(X[:40], y[:40], 0.5, classes).T, rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.weights_, ridge(X, y, 0.5, classes), rtol=0, atol=1e-9)


@needs_torch
@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_a_float16_tensor_is_widened_for_array_api_strict(engine):
    import torch

    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(60, 5)), np.tile(np.arange(3), 20)
    half = torch.asarray(X, dtype=torch.float16)
    exact = half.double().numpy()  # float16 -> float64 is exact: the rows the model must have learnt
    model = AnalyticClassifier(gamma=1.0, engine=engine, backend="array_api_strict").fit(half, y)
    np.testing.assert_allclose(model.weights_, ridge(exact, y, 1.0, np.arange(3)), rtol=0, atol=1e-9)
    expected = np.argmax(exact[:10] @ ridge(exact, y, 1.0, np.arange(3)), axis=1)
    np.testing.assert_array_equal(model.predict(half[:10]), expected)
    numpy = AnalyticClassifier(gamma=1.0, engine=engine, backend="numpy").fit(half, y)
    np.testing.assert_array_equal(model.predict(half[:10]), numpy.predict(half[:10]))


def test_score_takes_torch_labels_and_weights():
    """``np.size`` of a torch tensor is its ``size`` method: score refused torch weights as "<built-in method size ...>
    values"; the weighted accuracy is now the weighted share of rows predicted right."""
    import torch

    from foal_pipe import AnalyticClassifier

    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    X = rng.normal(size=(60, 4)) + y[:, None]
    model = AnalyticClassifier(gamma=1.0).fit(X, y)
    weights = rng.random(60)
    right = model.predict(X) == y
    expected = float(np.sum(weights * right) / np.sum(weights))
    assert model.score(X, torch.as_tensor(y), sample_weight=torch.as_tensor(weights)) == pytest.approx(expected, rel=1e-12)
