"""Input-kinds audit: every kind of array and label a Python user may pass, against the NumPy float64 equivalent.

Audited (features): lists, tuples, memoryview, NumPy float16/float32/int8/int64/uint8/bool/object/structured arrays,
Fortran-ordered, non-contiguous, negative-stride, read-only and big-endian views, np.matrix, SciPy csr/coo/csr_array,
DataFrames, masked arrays, torch (float64/32/16, bfloat16, int, bool, requires_grad, non-contiguous, transposed, meta),
array_api_strict, dask and zarr arrays, 0-row / 1-row / 1-D / 3-D / scalar inputs; (labels): lists, tuples, memoryview,
int8/uint8/uint64 (huge), float 1.0 and 1.5, negative ids, (n, 1) columns, str/np.str_/np.bytes_, pandas Series,
Categorical and nullable Int64, torch and array_api_strict labels, partial_fit's and predict's ``classes=``. Entry points:
AnalyticClassifier fit/partial_fit/predict/class_scores/score (numpy, torch, array_api_strict backends; float32; rls),
every head estimator, SmoothProjection fit/transform, DeployedModel scores/predict/partial_fit/encode_images/
predict_images, write_store / open_store / read_split.

Held: the float64 values of every dense kind above give the NumPy float64 bytes in the estimators, the projection and
the deployed model (C order); meta and sparse tensors, masked entries, NaN, complex and wrong shapes are refused in one
line; uint64 ids beyond int64 and mixed label kinds are refused; the deployed model refuses float, bool and (n, 1)
labels by name.

Faults (each test below failed on 40c031c for its reason; all fixed):
1. pandas' nullable ``Int64`` labels are read by scikit-learn as float64: ``classes_`` become floats and ids above
   2**53 merge (three classes fitted, two kept), in AnalyticClassifier and every head estimator.
2. Results depend on memory layout: a head (ncm, fecam, dual) fitted on a Fortran-ordered copy of X (or a DataFrame,
   whose values are Fortran-ordered, or a transposed tensor) scores other bytes (~1e-15), ncm/fecam/cosine score a
   Fortran-ordered X otherwise than its C-ordered copy, and a float32 ridge state fitted on Fortran rows differs by
   ~1e-6 (float64 ridge, the projection and the deployed model held). Not a batch effect: the same rows, one call.
3. ``predict(X, classes=[0, 1, 2, 3.5])`` takes a fractional "label" (and returns float labels), which partial_fit's
   ``classes=`` refuses; ``partial_fit(classes={...})`` (a set) dies in a bare ``TypeError: unhashable type``.
4. ``score(X, memoryview(y))`` is refused (scikit-learn's words) where ``fit(X, memoryview(y))`` is read; a torch
   tensor that needs a gradient, read by fit as its values, ends score (as ``y`` or ``sample_weight``) and ``classes=``
   (predict, partial_fit) in torch's bare ``RuntimeError: Can't call numpy() on Tensor that requires grad``.
5. DeployedModel refuses a NumPy object array of numbers that the projection and classifier it was saved from read,
   and calls a SciPy sparse matrix "object values" (the estimators say sparse, .toarray()).
6. AnalyticClassifier(backend="array_api_strict") dies in array_api_strict's TypeError on a torch bool tensor.
7. DeployedModel.encode_images / predict_images die in a bare ``TypeError`` (os.fspath) on a torch uint8 tensor.
8. write_store: float labels 1.5 truncated to 1; complex features lose their imaginary part; masked entries written
   as the values behind the mask; float32 overflow written as inf; str / None labels, bytes class names, bfloat16 or
   gradient tensors, sparse and array_api_strict features end in bare NumPy/torch/json errors; ``classes="abc"`` is
   three classes; duplicate class names are written, then refused by open_store.
9. read_split of a store with an empty train split (write_store writes one) dies in a bare reshape ValueError.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import foal_pipe
from foal_pipe import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.headestimator import ESTIMATORS
from foal_pipe.model.projection import SmoothProjection
from foal_pipe.store import open_store, read_split, write_store

torch = pytest.importorskip("torch")

CLASSES = ["a", "b", "c"]


def _data(n: int = 90, d: int = 8, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    return rng.normal(size=(n, d)) + 2.0 * y[:, None], y


def _deployed(tmp_path: Path) -> tuple[foal_pipe.DeployedModel, np.ndarray, np.ndarray]:
    X, y = _data()
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    path = AnalyticClassifier().fit(projection.transform(X), y).save(tmp_path / "m.safetensors", projection=projection)
    return foal_pipe.load_model(path), X, y


# --- 1. nullable Int64 labels -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ridge", "ncm", "slda"])
def test_nullable_int64_labels_keep_their_ids(name: str) -> None:
    X, y = _data()
    ids = y.astype(np.int64) + 2**53  # three distinct int64 ids
    make = AnalyticClassifier if name == "ridge" else ESTIMATORS[name]
    reference = make().fit(X, ids)
    np.testing.assert_array_equal(reference.classes_, np.unique(ids))
    fitted = make().fit(X, pd.array(ids.tolist(), dtype="Int64"))  # no missing value: the same ids
    assert fitted.classes_.dtype.kind in "iu", fitted.classes_.dtype  # was float64
    np.testing.assert_array_equal(fitted.classes_, reference.classes_)  # was two classes: 2**53 + 1 merged


# --- 2. memory layout -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ncm", "fecam", "dual"])
def test_a_head_fitted_on_fortran_rows_scores_the_same_bytes(name: str) -> None:
    X, y = _data(200, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c_order = ESTIMATORS[name]().fit(X, y).class_scores(X)
        f_order = ESTIMATORS[name]().fit(np.asfortranarray(X), y).class_scores(X)
    assert c_order.tobytes() == f_order.tobytes(), np.abs(c_order - f_order).max()


@pytest.mark.parametrize("name", ["ncm", "fecam", "cosine"])
def test_a_head_scores_fortran_rows_as_it_scores_c_rows(name: str) -> None:
    X, y = _data(200, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = ESTIMATORS[name]().fit(X, y)
        c_order, f_order = head.class_scores(X), head.class_scores(np.asfortranarray(X))
    assert c_order.tobytes() == f_order.tobytes(), np.abs(c_order - f_order).max()


def test_a_float32_ridge_state_does_not_depend_on_the_rows_layout() -> None:
    X, y = _data(200, 16)
    c_order = AnalyticClassifier(dtype="float32").fit(X, y).class_scores(X)
    f_order = AnalyticClassifier(dtype="float32").fit(np.asfortranarray(X), y).class_scores(X)
    assert c_order.tobytes() == f_order.tobytes(), np.abs(c_order - f_order).max()


# --- 3. classes= of predict and partial_fit ---------------------------------------------------------------------------

def test_predict_refuses_a_fractional_label_in_classes_as_partial_fit_does() -> None:
    X, y = _data()
    clf = AnalyticClassifier().fit(X, y)
    with pytest.raises(FoalPipeError):
        AnalyticClassifier().partial_fit(X, y, classes=[0, 1, 2, 3.5])  # held: not a class label
    with pytest.raises(FoalPipeError):
        clf.predict(X[:3], classes=[0, 1, 2, 3.5])  # was: accepted, predictions turned into floats


def test_partial_fit_classes_given_as_a_set_is_read_or_refused_in_one_line() -> None:
    X, y = _data()
    try:
        clf = AnalyticClassifier().partial_fit(X, y, classes={0, 1, 2, 5})
    except FoalPipeError:
        return  # a clear refusal is fine
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2, 5])  # was: TypeError: unhashable type: 'set'


# --- 4. score's labels read as fit's ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ridge", "ncm"])
def test_score_reads_a_memoryview_of_labels_as_fit_does(name: str) -> None:
    X, y = _data()
    labels = memoryview(y.astype(np.int64))
    clf = (AnalyticClassifier if name == "ridge" else ESTIMATORS[name])().fit(X, labels)  # held: fit reads it
    assert clf.score(X, labels) == clf.score(X, y)


@pytest.mark.parametrize("name", ["ridge", "ncm"])
def test_score_reads_tensors_that_need_a_gradient_as_fit_does(name: str) -> None:
    X, y = _data()
    labels = torch.tensor(y, dtype=torch.float64, requires_grad=True)
    clf = (AnalyticClassifier if name == "ridge" else ESTIMATORS[name])().fit(X, labels)  # held: fit reads it
    assert clf.score(X, labels) == clf.score(X, y.astype(float))  # was: RuntimeError: Can't call numpy() ...
    weights = (np.arange(len(y)) % 4).astype(float)
    graded = torch.tensor(weights, requires_grad=True)
    assert clf.score(X, y.astype(float), sample_weight=graded) == clf.score(X, y.astype(float), sample_weight=weights)


def test_classes_given_as_a_tensor_that_needs_a_gradient_are_read_as_their_values() -> None:
    X, y = _data()
    task = torch.tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True)
    fitted = AnalyticClassifier().fit(X, y.astype(float))
    expected = fitted.predict(X[:5], classes=task.detach().numpy())
    np.testing.assert_array_equal(fitted.predict(X[:5], classes=task), expected)  # was: RuntimeError (numpy())
    declared = AnalyticClassifier().partial_fit(X, y.astype(float), classes=task)
    np.testing.assert_array_equal(declared.classes_, [0.0, 1.0, 2.0, 3.0])


# --- 5. the deployed model's features ---------------------------------------------------------------------------------

def test_deployed_model_reads_an_object_array_of_numbers_as_its_siblings_do(tmp_path: Path) -> None:
    model, X, _ = _deployed(tmp_path)
    objects = X.astype(object)
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    np.testing.assert_array_equal(projection.transform(objects), projection.transform(X))  # held: the projection reads it
    np.testing.assert_array_equal(model.scores(objects), model.scores(X))  # was: "they hold object values"


@pytest.mark.parametrize("kind", [sp.csr_matrix, sp.coo_matrix, sp.csr_array])
def test_deployed_model_names_a_sparse_matrix(tmp_path: Path, kind) -> None:
    model, X, _ = _deployed(tmp_path)
    with pytest.raises(FoalPipeError, match=r"(?i)sparse"):  # was: "but they hold object values"
        model.predict(kind(X))


# --- 6. array_api_strict backend and torch bool -----------------------------------------------------------------------

def test_array_api_strict_backend_reads_a_torch_bool_tensor_or_refuses_it_in_one_line() -> None:
    pytest.importorskip("array_api_strict")
    X, y = _data()
    bits = X > 2.0
    try:
        scores = AnalyticClassifier(backend="array_api_strict").fit(torch.tensor(bits), y).class_scores(bits.astype(float))
    except FoalPipeError:
        return
    expected = AnalyticClassifier(backend="array_api_strict").fit(bits.astype(float), y).class_scores(bits.astype(float))
    np.testing.assert_array_equal(scores, expected)  # was: TypeError from array_api_strict's isfinite


# --- 7. images as a tensor --------------------------------------------------------------------------------------------

def test_encode_images_reads_a_uint8_tensor_as_its_array(tmp_path: Path) -> None:
    pixels = {"name": "pixels", "fusion": "none", "token": "none", "image_size": 4, "normalize": False, "dim": 48,
              "weights": {"source": "none"}}
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 48)), np.arange(30) % 3
    projection = SmoothProjection(n_components=16, random_state=0).fit(X)
    path = AnalyticClassifier().fit(projection.transform(X), y).save(tmp_path / "m.safetensors", projection=projection,
                                                                     encoder=pixels)
    model = foal_pipe.load_model(path)
    images = rng.integers(0, 256, size=(5, 3, 4, 4), dtype=np.uint8)
    expected = model.encode_images(images)
    np.testing.assert_array_equal(model.encode_images(torch.tensor(images)), expected)  # was: TypeError (os.fspath)
    np.testing.assert_array_equal(model.predict_images(torch.tensor(images)), model.predict(expected))


# --- 8. write_store ---------------------------------------------------------------------------------------------------

def _rows(n: int = 20, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)), np.arange(n) % 3


def test_write_store_refuses_fractional_labels(tmp_path: Path) -> None:
    x, y = _rows()
    with pytest.raises(FoalPipeError):  # was: 0.5, 1.5, 2.5 written as 0, 1, 2
        write_store(tmp_path / "s.zarr", (x, y + 0.5), _rows(), CLASSES)


@pytest.mark.parametrize("case", ["complex", "masked", "float32 overflow"])
def test_write_store_refuses_features_it_would_change(tmp_path: Path, case: str) -> None:
    x, y = _rows()
    features = {"complex": x + 1j, "masked": np.ma.MaskedArray(x, mask=x > 1.0), "float32 overflow": x * 1e300}[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy's ComplexWarning / overflow warning
        with pytest.raises(FoalPipeError):  # was: imaginary part dropped / masked values written / inf written
            write_store(tmp_path / "s.zarr", (features, y), _rows(), CLASSES)


@pytest.mark.parametrize("case", ["str labels", "None label"])
def test_write_store_refuses_labels_that_are_no_ids_in_one_line(tmp_path: Path, case: str) -> None:
    x, y = _rows()
    labels = np.array(CLASSES)[y] if case == "str labels" else [None, *y[1:].tolist()]
    with pytest.raises(FoalPipeError):  # was: UFuncTypeError / TypeError from the range check
        write_store(tmp_path / "s.zarr", (x, labels), _rows(), CLASSES)


@pytest.mark.parametrize("case", ["bfloat16", "requires_grad", "csr", "array_api_strict"])
def test_write_store_reads_features_of_other_kinds_or_refuses_them_in_one_line(tmp_path: Path, case: str) -> None:
    x, y = _rows()
    exact = x.astype(np.float32) if case != "bfloat16" else torch.tensor(x, dtype=torch.bfloat16).float().numpy()
    if case == "bfloat16":
        features = torch.tensor(x, dtype=torch.bfloat16)
    elif case == "requires_grad":
        features = torch.tensor(x, requires_grad=True)
    elif case == "csr":
        features = sp.csr_matrix(x)
    else:
        features = pytest.importorskip("array_api_strict").asarray(x)
    try:
        path = write_store(tmp_path / "s.zarr", (features, y), _rows(), CLASSES)
    except FoalPipeError:
        return
    np.testing.assert_array_equal(np.asarray(read_split(path, "train")[0]), exact)


def test_write_store_refuses_class_names_that_are_one_string_or_bytes(tmp_path: Path) -> None:
    with pytest.raises(FoalPipeError):  # was: "abc" written as three classes a, b, c
        write_store(tmp_path / "s.zarr", _rows(), _rows(), "abc")
    try:  # was: TypeError: Object of type bytes is not JSON serializable
        path = write_store(tmp_path / "t.zarr", _rows(), _rows(), [b"a", b"b", b"c"])
    except FoalPipeError:
        return
    assert list(open_store(path).classes) == CLASSES


def test_write_store_refuses_duplicate_class_names_that_open_store_refuses(tmp_path: Path) -> None:
    with pytest.raises(FoalPipeError):  # was: written, then refused by open_store ("names 'a' twice")
        write_store(tmp_path / "s.zarr", _rows(), _rows(), ["a", "a", "c"])
    assert not os.path.exists(tmp_path / "s.zarr")


# --- 9. read_split of an empty train split ----------------------------------------------------------------------------

def test_read_split_of_an_empty_train_split_is_one_line(tmp_path: Path) -> None:
    x, y = _rows()
    path = write_store(tmp_path / "s.zarr", (x[:0], y[:0]), (x, y), CLASSES)
    open_store(path)  # held: opens
    try:  # was: ValueError: cannot reshape array of size 0 into shape (0,newaxis)
        features = read_split(path, "train")[0]
    except FoalPipeError:
        return
    assert np.shape(features) == (0, 4)
