"""The learner on other array namespaces: array_api_strict (the standard, nothing more), torch, and CuPy.

Every computation runs through the same generic code as NumPy and must match it to 1e-9 in float64;
this is what proves the CuPy and torch-CUDA paths on machines without a GPU.
"""

from __future__ import annotations

import importlib.util
import json

import array_api_strict  # the dev extra: the generic code runs on every CI run
import numpy as np
import pytest
from array_api_compat import device
from helpers import build_store

from foal_pipe.core.activations import ACTIVATIONS, BIASED
from foal_pipe.core.backend import _cupy, default_device, get_namespace, to_numpy
from foal_pipe.core.leaveoneout import LeaveOneOut, SampledLeaveOneOut
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.projection import SmoothProjection

BACKENDS = [
    "array_api_strict",
    pytest.param("torch", marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")),
    pytest.param("cupy", marks=pytest.mark.skipif(_cupy() is None, reason="CuPy or a CUDA GPU is missing")),
]  # torch runs on CUDA where it has it, else on the CPU: on a GPU machine this file checks both GPU paths
TOL = 1e-9


@pytest.fixture(autouse=True)
def strict_off_host(monkeypatch):
    """array_api_strict arrays live on a simulated device other than the CPU, as CuPy's and torch-CUDA's do:
    any NumPy call on them (``np.asarray``, NumPy indexing) raises instead of silently copying to the host."""
    from foal_pipe.core import backend

    monkeypatch.setitem(backend.DEFAULT_DEVICES, "array_api_strict", lambda: array_api_strict.Device("device1"))


def close(a, b, tol=TOL) -> None:
    a, b = to_numpy(a), to_numpy(b)
    assert a.shape == b.shape
    scale = max(float(np.abs(b).max()), 1.0)
    assert float(np.abs(a - b).max()) <= tol * scale, float(np.abs(a - b).max())


def on(xp, values, **kwargs):
    """``values`` as an array of ``xp`` on its default device (the simulated one for array_api_strict)."""
    return xp.asarray(values, device=default_device(xp), **kwargs)


def data(seed=0, n=90, d=12, classes=(2, 5, 7, 9)):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.choice(np.array(classes), n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_statistics_match_numpy(backend):
    xp = get_namespace(backend)
    H, y = data()
    Hx = on(xp, H)
    ref = RidgeStatistics.from_batch(H[:40], y[:40]) + RidgeStatistics.from_batch(H[40:], y[40:])
    got = RidgeStatistics.from_batch(Hx[:40, ...], y[:40])
    got += RidgeStatistics.from_batch(Hx[40:, ...], y[40:])
    assert type(got.G).__module__.split(".")[0] == type(Hx).__module__.split(".")[0]
    np.testing.assert_array_equal(got.classes, ref.classes)
    np.testing.assert_array_equal(got.counts, ref.counts)
    close(got.G, ref.G)
    close(got.Q, ref.Q)
    wider = np.array([1, 2, 5, 7, 8, 9])
    close(got.aligned(wider).Q, ref.aligned(wider).Q)
    close(got.restrict([5, 9]).Q, ref.restrict([5, 9]).Q)
    close((got + got.copy()).G, (ref + ref).G)
    closed_form = np.linalg.solve(H.T @ H + 0.3 * np.eye(H.shape[1]), H.T @ (y[:, None] == ref.classes[None, :]))
    close(got.solve(0.3), closed_form)
    grid = [1e-3, 0.3, 10.0]
    e_ref, e_got = ref.eigen(), got.eigen()
    close(e_got.weights(grid), e_ref.weights(grid))
    close(e_got.gcv(grid), e_ref.gcv(grid))
    close(e_got.dof(grid), e_ref.dof(grid))
    loo_ref, loo_got = LeaveOneOut(e_ref, grid), LeaveOneOut(e_got, grid)
    loo_ref.add(H, y)
    loo_got.add(Hx, y)
    np.testing.assert_array_equal(loo_got.accuracy(), loo_ref.accuracy())
    close(loo_got.mse(), loo_ref.mse())
    sampled = SampledLeaveOneOut(e_got, grid, 10)  # the zoom's: coordinates kept on the device, gammas scored later
    sampled.add(Hx[:10, :], y[:10])
    picked = sampled.evaluate(np.array([2, 0]))
    reference = SampledLeaveOneOut(e_ref, [grid[2], grid[0]], 10)
    reference.add(H[:10], y[:10])
    np.testing.assert_array_equal(picked["loo_accuracy"], reference.accuracy())
    close(picked["loo"], reference.mse())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine,gamma", [("gram", 0.5), ("gram", "auto"), ("rls", 0.5)])
def test_classifier_matches_numpy(backend, engine, gamma):
    H, y = data(1)
    ref = AnalyticClassifier(gamma=gamma, engine=engine, backend="numpy")
    got = AnalyticClassifier(gamma=gamma, engine=engine, backend=backend)
    xp = get_namespace(backend)
    for lo in range(0, H.shape[0], 7):  # classes arrive over time: columns are inserted as they do
        ref.partial_fit(H[lo : lo + 7], y[lo : lo + 7])
        got.partial_fit(H[lo : lo + 7], y[lo : lo + 7])
    got_device = AnalyticClassifier(gamma=gamma, engine=engine, backend=backend).fit(on(xp, H), y)
    np.testing.assert_array_equal(got.classes_, ref.classes_)
    assert got.gamma_ == ref.gamma_
    close(got.weights_, ref.weights_)
    close(got_device.weights_, ref.weights_)
    close(got.decision_function(H), ref.decision_function(H))
    np.testing.assert_array_equal(got.predict(on(xp, H)), ref.predict(H))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("activation", "dim"), [(a, d) for a in sorted(ACTIVATIONS) for d in (0, 20)
                                                  if d or a not in BIASED])  # cos needs a projection
def test_projection_matches_numpy(backend, activation, dim):
    xp = get_namespace(backend)
    X = np.random.default_rng(2).normal(size=(15, 9))
    projection = SmoothProjection(n_components=dim, activation=activation, random_state=0).fit(X)
    ref = projection.transform(X)
    close(projection.transform(X, xp), ref)
    close(projection.transform(on(xp, X)), ref)


@pytest.mark.parametrize("backend", ["numpy", *BACKENDS])
def test_not_positive_definite_is_the_same_error_everywhere(backend):
    xp = get_namespace(backend)
    # eigenvalues 4, 1 and -2 (a positive diagonal, as the statistics' checks ask): G + I is indefinite, no ridge solution
    G = xp.asarray([[1.0, 3.0, 0.0], [3.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=xp.float64, device=default_device(xp))
    stats = RidgeStatistics(G, xp.zeros((3, 1), dtype=xp.float64, device=default_device(xp)), np.array([0]), 3)
    with pytest.raises(FoalPipeError, match=r"not positive definite at gamma 1: .* use a gamma of at least 2\.01 "):
        stats.solve(1.0)  # the least the sums take, just past -min(lambda) = 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store") / "blobs.zarr", n_train=300, n_test=120)


def _learn(store, out, backend, **model):
    from foal_pipe.protocol.commands import run_learn
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    run_learn(store, out, StreamConfig(tasks=3, seed=1, batch_size=20), ModelConfig(projection_dim=24, **model),
              EvaluationConfig(), ExecutionConfig(backend=backend), log=lambda _: None)
    from safetensors.numpy import load_file

    return json.loads((out / "metrics.json").read_text()), load_file(out / "model.safetensors")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", [{"engine": "gram", "gamma": 0.7}, {"engine": "rls", "gamma": 0.7},
                                   {"engine": "gram", "gamma": "auto"}, {"engine": "gram", "gamma": 10.0, "dtype": "float32"}])
def test_learn_matches_numpy(tmp_path, store, backend, model):
    """float32 sums (whose scoring multiplies float32 rows by float64 weights: torch needs one dtype) are summed in
    another order by each BLAS, so they agree to float32's rounding."""
    ref_metrics, ref_model = _learn(store, tmp_path / "ref", "numpy", **model)
    metrics, saved = _learn(store, tmp_path / "got", backend, **model)
    assert metrics["backend"] == backend
    assert metrics["accuracy_matrix"] == ref_metrics["accuracy_matrix"]
    assert set(saved) == set(ref_model)
    for name in saved:
        close(saved[name], ref_model[name], 1e-5 if model.get("dtype") == "float32" else TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_matches_numpy(tmp_path, store, backend):
    from foal_pipe.protocol.commands import run_sweep
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig

    reports = {}
    for name in ("numpy", backend):
        run_sweep(store, tmp_path / name, SweepConfig(gammas=(0.01, 1.0, 100.0)), StreamConfig(tasks=3, seed=1),
                  ModelConfig(projection_dim=24), EvaluationConfig(), ExecutionConfig(backend=name), log=lambda _: None)
        reports[name] = json.loads((tmp_path / name / "sweep.json").read_text())
    ref, got = reports["numpy"], reports[backend]
    assert got["best_gamma"] == ref["best_gamma"]
    for r_got, r_ref in zip(got["results"], ref["results"], strict=True):
        assert r_got["accuracy_matrix"] == r_ref["accuracy_matrix"]
        for key in ("loo_mse", "gcv"):
            if key in r_ref:
                close(np.asarray(r_got[key], dtype=float), np.asarray(r_ref[key], dtype=float))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_sampled_leave_one_out_matches_numpy(tmp_path, store, backend):
    """`sweep --loo-sample`: the sampled rows kept, scored and left out on the device, as NumPy does on the host."""
    from foal_pipe.protocol.commands import run_sweep
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig

    reports = {}
    for name in ("numpy", backend):
        run_sweep(store, tmp_path / name, SweepConfig(gammas=(0.01, 1.0, 100.0)), StreamConfig(tasks=3, seed=1),
                  ModelConfig(projection_dim=24, loo_sample=25), EvaluationConfig(), ExecutionConfig(backend=name),
                  log=lambda _: None)
        reports[name] = json.loads((tmp_path / name / "sweep.json").read_text())
    ref, got = reports["numpy"], reports[backend]
    assert ref["leave_one_out"]["exact"] is False and got["leave_one_out"] == ref["leave_one_out"]
    for r_got, r_ref in zip(got["results"], ref["results"], strict=True):
        assert r_got["loo_accuracy"] == r_ref["loo_accuracy"]
        close(np.asarray(r_got["loo_mse"], dtype=float), np.asarray(r_ref["loo_mse"], dtype=float))


@pytest.mark.parametrize("backend", BACKENDS)
def test_orders_sampled_leave_one_out_in_one_pass_matches_numpy(tmp_path, store, backend):
    """`learn --order-seeds --gamma auto`: the per-class sums and each boundary's sampled rows, projected again, on the
    backend, choose and score as NumPy does on the host."""
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.orders import run_learn_orders

    docs = {}
    for name in ("numpy", backend):
        run_learn_orders(store, tmp_path / name, (0, 2), StreamConfig(tasks=3, seed=1),
                         ModelConfig(projection_dim=24, gamma="auto", loo_sample=25), EvaluationConfig(),
                         ExecutionConfig(backend=name), log=lambda _: None)
        docs[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    ref, got = docs["numpy"], docs[backend]
    assert got["one_pass"] is True and ref["one_pass"] is True
    assert max(ref["gamma_search"]["sample_eps"]) > 0  # a true sample
    for o_got, o_ref in zip(got["orders"], ref["orders"], strict=True):
        assert o_got["gammas_selected"] == o_ref["gammas_selected"]
        assert o_got["accuracy_matrix"] == o_ref["accuracy_matrix"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_stays_in_the_backend(backend):
    from foal_pipe.core.backend import backend_of

    H, y = data(3)
    xp = get_namespace(backend)
    stats = RidgeStatistics.from_batch(on(xp, H), y)
    clf = AnalyticClassifier.from_statistics(stats, gamma=0.5)
    assert clf.backend == backend and backend_of(clf.statistics_.G) == backend
    assert backend_of(RidgeStatistics.empty(4, xp).G) == backend
    rls = AnalyticClassifier(engine="rls", backend=backend).fit(H, y)
    assert backend_of(rls._engine.R) == backend
    for array in (stats.G, clf.statistics_.G, rls._engine.R, RidgeStatistics.empty(4, xp).G):
        assert str(device(array)) == str(device(on(xp, [0.0])))
    close(clf.weights_, AnalyticClassifier(gamma=0.5).fit(H, y).weights_)


@pytest.mark.parametrize("backend", ["numpy", *BACKENDS])
def test_singular_rls_update_is_the_same_error_everywhere(backend):
    from foal_pipe.core.engines import RLSEngine

    xp = get_namespace(backend)
    engine = RLSEngine(2, 1.0, xp, xp.float64, default_device(xp))
    engine.R = -1.0 * xp.eye(2, dtype=xp.float64, device=default_device(xp))  # M = I + H R H^T = 0 for H = e_1: singular
    with pytest.raises(FoalPipeError, match="the RLS update is singular"):
        engine.update(on(xp, [[1.0, 0.0]], dtype=xp.float64), np.array([0]), np.array([0]))


def test_torch_backend_without_torch_is_one_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as in the light install
    with pytest.raises(FoalPipeError, match=r"pip install -e '\.\[extract\]'"):
        get_namespace("torch")


def test_auto_picks_cupy_then_torch_on_cuda_then_numpy(monkeypatch):
    import foal_pipe.core.backend as backend

    monkeypatch.setattr(backend, "_cupy", lambda: None)
    monkeypatch.setattr(backend, "_torch_cuda", lambda: False)
    assert backend.resolve_backend("auto") == "numpy"
    monkeypatch.setattr(backend, "_torch_cuda", lambda: True)
    assert backend.resolve_backend("auto") == "torch"
    monkeypatch.setattr(backend, "_cupy", lambda: object())
    assert backend.resolve_backend("auto") == "cupy"
    assert backend.resolve_backend("torch") == "torch"
    with pytest.raises(FoalPipeError, match="unknown backend 'tpu'; choose one of auto, numpy, cupy, torch"):
        backend.resolve_backend("tpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_statistics_join_a_device_state(backend):
    """Dask workers sum on the host; their statistics add into the running state of any backend."""
    from foal_pipe.core.backend import backend_of

    xp = get_namespace(backend)
    H, y = data(4)
    host = RidgeStatistics.from_batch(H[50:], y[50:])
    running = RidgeStatistics.from_batch(on(xp, H[:50]), y[:50])
    total = running + host
    running += host
    ref = RidgeStatistics.from_batch(H, y)
    for got in (total, running):
        assert backend_of(got.G) == backend
        close(got.G, ref.G)
        close(got.Q, ref.Q)
