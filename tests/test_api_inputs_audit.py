"""Faults of the Python API's array inputs found by an audit: complex and misshapen tensors into the projection, a G
that is not symmetric, reversed or byte-swapped NumPy views into torch, tensors that need a gradient, are bfloat16,
sparse or on the meta device, a backend given as a list, and a projection's pickle after a torch transform."""

from __future__ import annotations

import pickle

import array_api_compat
import array_api_strict as xs
import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, SmoothProjection, head_classifier, load_model
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
H = RNG.random((60, 8))
Y = np.repeat(np.arange(3), 20)
T = torch.from_numpy


def _refused(f, *fragments: str) -> None:
    with pytest.raises(FoalPipeError) as exc:
        f()
    assert "\n" not in str(exc.value) and all(part in str(exc.value) for part in fragments), str(exc.value)


def _projection() -> SmoothProjection:
    return SmoothProjection(n_components=5, random_state=0).fit(H)


# 1. the projection checks a tensor as it checks a NumPy array


@pytest.mark.parametrize("make", [T, xs.asarray], ids=["torch", "array_api_strict"])
def test_projection_refuses_complex_arrays_of_every_namespace(make) -> None:
    complex_rows = H[:4] + 5j * RNG.normal(size=(4, 8))
    _refused(lambda: _projection().transform(make(complex_rows)), "complex")


@pytest.mark.parametrize("rows", [H[0], H[None, :4], H[:0]], ids=["1-D", "3-D", "no row"])
def test_projection_refuses_tensor_shapes_that_numpy_input_may_not_have(rows) -> None:
    with pytest.raises(FoalPipeError):
        _projection().transform(rows)
    _refused(lambda: _projection().transform(T(np.ascontiguousarray(rows))), "(n, 8)", "n >= 1")


# 2. G must be symmetric, and G and Q real floats of one namespace


@pytest.mark.parametrize("make", [np.asarray, T, xs.asarray], ids=["numpy", "torch", "array_api_strict"])
def test_a_g_that_is_not_symmetric_is_refused(make) -> None:
    ref = RidgeStatistics.from_batch(H, Y)
    G = ref.G + np.triu(np.ones((8, 8)), 1)
    _refused(lambda: RidgeStatistics(make(G), make(ref.Q), ref.classes, ref.n, ref.counts), "not symmetric")


def test_a_g_off_exact_symmetry_by_rounding_is_accepted() -> None:
    ref = RidgeStatistics.from_batch(H, Y)
    G = ref.G.copy()
    G[0, 5] += 4 * np.spacing(np.abs(ref.G).max())  # as torch's float64 product H^T H on a CPU may miss it
    W = AnalyticClassifier.from_statistics(RidgeStatistics(T(G), T(ref.Q), ref.classes, ref.n, ref.counts)).weights_
    assert np.allclose(W, np.linalg.solve(ref.G + np.eye(8), ref.Q), rtol=1e-12, atol=1e-14)


def test_g_and_q_must_be_floats_of_one_namespace() -> None:
    ref = RidgeStatistics.from_batch(H, Y)
    _refused(lambda: RidgeStatistics(T(ref.G), ref.Q, ref.classes, ref.n, ref.counts), "one namespace")
    _refused(lambda: RidgeStatistics(ref.G.astype(np.int64), ref.Q, ref.classes, ref.n, ref.counts), "real floats")


def test_tridiagonal_off_numpy_is_refused() -> None:
    _refused(lambda: RidgeStatistics.from_batch(xs.asarray(H), Y).tridiagonal(), "NumPy", "eigen()")
    stats = RidgeStatistics.from_batch(xs.asarray(H), Y)
    expected = np.linalg.solve(H.T @ H + np.eye(8), H.T @ np.eye(3)[Y])
    assert np.allclose(np.asarray(stats.eigen().weights(np.array([1.0])))[:, 0, :], expected)


# 3. reversed and byte-swapped NumPy views into torch are copied


def test_reversed_and_byte_swapped_views_reach_torch() -> None:
    numpy_fit = AnalyticClassifier().fit(H[::-1], Y[::-1])
    torch_fit = AnalyticClassifier(backend="torch").fit(H[::-1], Y[::-1])
    assert np.allclose(torch_fit.weights_, numpy_fit.weights_, rtol=1e-12, atol=1e-14)
    assert np.allclose(AnalyticClassifier(backend="torch").fit(H[:, ::-1], Y).weights_,
                       AnalyticClassifier().fit(np.ascontiguousarray(H[:, ::-1]), Y).weights_, rtol=1e-12, atol=1e-14)
    assert np.array_equal(torch_fit.predict(H[::-1]), numpy_fit.predict(H[::-1]))
    p = _projection()
    for view in (H[::-1], H.astype(">f8")):
        on_torch = p.transform(view, xp=array_api_compat.torch)
        assert np.allclose(on_torch.cpu().numpy(), p.transform(np.ascontiguousarray(view, dtype=np.float64)), rtol=1e-12)


# 4. tensors that need a gradient, bfloat16, sparse or meta tensors, a backend given as a list


def test_bfloat16_tensors_and_labels_that_need_a_gradient_are_read_as_their_values() -> None:
    half = T(H).bfloat16()
    exact = half.float().numpy()
    assert np.array_equal(AnalyticClassifier().fit(half, Y).weights_, AnalyticClassifier().fit(exact, Y).weights_)
    labels = T(Y.astype(np.float64)).requires_grad_()
    assert np.array_equal(AnalyticClassifier().fit(H, labels).weights_, AnalyticClassifier().fit(H, Y.astype(float)).weights_)
    assert np.array_equal(head_classifier("ncm").fit(half, Y).class_scores(H),
                          head_classifier("ncm").fit(exact, Y).class_scores(H))


@pytest.mark.parametrize("name", ["slda", "ncm"])
def test_heads_and_the_projection_detach_tensors_that_need_a_gradient(name: str) -> None:
    expected = head_classifier(name).fit(H, Y).class_scores(H)
    for X in (T(H.copy()).requires_grad_(), torch.nn.Parameter(T(H.copy()))):
        assert np.array_equal(head_classifier(name).fit(X, T(Y)).class_scores(X), expected)
    grad = T(H.copy()).requires_grad_()
    assert np.array_equal(SmoothProjection(n_components=5, random_state=0).fit(grad).components_, _projection().components_)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_sparse_and_meta_tensors_are_refused(backend: str) -> None:
    _refused(lambda: AnalyticClassifier(backend=backend).fit(T(H).to_sparse(), Y), "sparse", "to_dense()")
    _refused(lambda: AnalyticClassifier(backend=backend).fit(torch.empty(60, 8, device="meta"), Y), "meta", "no values")
    _refused(lambda: _projection().transform(T(H).to_sparse()), "sparse")
    _refused(lambda: _projection().transform(torch.empty(3, 8, device="meta")), "meta")


def test_a_backend_given_as_a_list_is_refused() -> None:
    _refused(lambda: AnalyticClassifier(backend=["torch"]).fit(H, Y), "unknown backend", "choose one of")


# 5. a deployed model reads tensors as the classifier does


def test_deployed_model_reads_tensors_as_the_classifier_does(tmp_path) -> None:
    projection = _projection()
    AnalyticClassifier().fit(projection.transform(H), Y).save(tmp_path / "m.safetensors", projection=projection)
    model = load_model(tmp_path / "m.safetensors")
    half = T(H[:6]).bfloat16()
    assert np.array_equal(model.predict(half), model.predict(half.float().numpy()))
    assert np.array_equal(model.predict(T(H[:6].copy()).requires_grad_()), model.predict(H[:6]))
    _refused(lambda: model.predict(torch.empty(6, 8, device="meta")), "meta")
    _refused(lambda: model.predict([row for row in half]), "cannot read a list as numbers")
    ids = np.array([0, 1, 2, 0, 1, 2])
    by_tensor = load_model(tmp_path / "m.safetensors").partial_fit(H[:6], T(ids))
    by_array = load_model(tmp_path / "m.safetensors").partial_fit(H[:6], ids)
    assert np.array_equal(by_tensor.classifier.weights_, by_array.classifier.weights_)


# 6. a projection's pickle holds no per-device copy of its matrix


def test_projection_pickle_does_not_depend_on_a_torch_transform() -> None:
    p = _projection()
    clean = pickle.dumps(p)
    p.transform(T(H))
    dirty = pickle.dumps(p)
    assert dirty == clean and b"torch" not in dirty
    assert np.array_equal(pickle.loads(dirty).transform(H), p.transform(H))
