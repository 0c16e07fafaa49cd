"""Faults the deployment audit of session 21 found in DeployedModel: a class name in another Unicode normalisation (as
macOS spells file names) became a second class of one name, label_ids read a string letter by letter and integer ids as
new names, a label id beyond int64 wrapped negative or raised NumPy's OverflowError, and features of another width were
told to be reshaped; and the stream that DeployedModel.partial_fit is exact over, checked against NumPy."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

import foal_pipe
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.commands import run_learn
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.store import write_store

CAFE, CAFE_NFD = "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9")
DIM = 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A ridge model (D = 20, gamma 0.5) of 60 rows of three classes, one named with an accent (NFC, as a store keeps
    folder names), and those rows."""
    root = tmp_path_factory.mktemp("deploy_s21")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, DIM)).astype(np.float32), np.arange(60) % 3
    store = write_store(root / "a.zarr", (x, y), (x[:15], y[:15]), ["ant", CAFE, "cow"], chunk_rows=16)
    run_learn(store, root / "run", StreamConfig(tasks=1), ModelConfig(projection_dim=20, gamma=0.5), EvaluationConfig(),
              ExecutionConfig(backend="numpy"), log=lambda _: None)
    return root / "run" / "model.safetensors", x.astype(np.float64), y


def ridge_by_hand(model, X: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(H^T H + gamma I)^-1 H^T Y over every row, H = sigmoid(X P), in NumPy."""
    H = 1.0 / (1.0 + np.exp(-(X @ np.asarray(model.projection.components_, dtype=np.float64))))
    Y = np.eye(int(labels.max()) + 1)[labels]
    return np.linalg.solve(H.T @ H + 0.5 * np.eye(H.shape[1]), H.T @ Y)


def test_a_stream_of_odd_batches_is_the_ridge_solution_over_every_row(trained, tmp_path):
    torch = pytest.importorskip("torch")
    path, x, y = trained
    model = foal_pipe.load_model(path)
    rng = np.random.default_rng(1)
    bf16 = torch.from_numpy(rng.normal(size=(2, DIM))).to(torch.bfloat16)
    batches = [(rng.normal(size=(1, DIM)), ["dog"]),  # one row, a new class
               (rng.normal(size=(3, DIM)).astype(np.float16), ["ant", "dog", "emu"]),
               (bf16, ["cow", "fox"]),
               (rng.normal(size=(2, DIM)), np.array([0, 3])),  # label ids
               (rng.normal(size=(2, DIM)), np.array(["emu", CAFE_NFD]))]  # the known class, spelled NFD
    rows, labels = [x], [y]
    for features, names in batches:
        model.partial_fit(features, names)
        rows.append(features.float().numpy().astype(np.float64) if isinstance(features, torch.Tensor)
                    else np.asarray(features, dtype=np.float64))
        labels.append(np.asarray(names) if np.asarray(names).dtype.kind == "i" else np.array(
            [{"ant": 0, CAFE: 1, CAFE_NFD: 1, "cow": 2, "dog": 3, "emu": 4, "fox": 5}[n] for n in names]))
    for refused in (np.zeros((0, DIM)), np.zeros((2, DIM + 1))):  # an empty batch, another width: nothing learned
        with pytest.raises(FoalPipeError, match=r"features have shape \((0|2), \d\)"):
            model.partial_fit(refused, ["ant"] * len(refused))
    assert model.class_names == ["ant", CAFE, "cow", "dog", "emu", "fox"]
    X, L = np.vstack(rows), np.concatenate(labels)
    assert model.classifier.n_samples_seen_ == L.size == 70
    np.testing.assert_allclose(model.classifier.weights_, ridge_by_hand(model, X, L), rtol=0, atol=1e-12)
    T = rng.normal(size=(40, DIM))
    proba = model.predict_proba(T)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    positive = (model.scores(T) > 0).any(axis=1)  # the documented rule: the argmax is predict's where a score is > 0
    np.testing.assert_array_equal(model.classifier.classes_[proba.argmax(axis=1)][positive], model.predict(T)[positive])
    model.save(tmp_path / "a.safetensors")
    again = foal_pipe.load_model(tmp_path / "a.safetensors")
    again.save(tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    np.testing.assert_array_equal(again.scores(T), model.scores(T))
    assert again.class_names == model.class_names and again.rows_outside_stores == 10


def test_a_name_in_another_normalisation_is_the_class_it_prints_as(trained):
    """'cafe\\u0301' (NFD) was a fourth class beside 'caf\\xe9': two columns of one name splitting its rows."""
    path, x, y = trained
    model = foal_pipe.load_model(path)
    extra = np.random.default_rng(2).normal(size=(4, DIM))
    model.partial_fit(extra, [CAFE_NFD, CAFE_NFD, "ant", CAFE_NFD])
    assert model.class_names == ["ant", CAFE, "cow"]
    assert model.label_ids([CAFE_NFD, "gnu", "gn\u00fb", "gnu"]).tolist() == [1, 3, 4, 3]
    labels = np.concatenate([y, [1, 1, 0, 1]])
    np.testing.assert_allclose(model.classifier.weights_, ridge_by_hand(model, np.vstack([x, extra]), labels), atol=1e-12)
    with pytest.raises(FoalPipeError) as info:  # one batch spelling a name both ways: refused, nothing learned
        model.partial_fit(extra[:2], [CAFE, CAFE_NFD])
    assert "'caf\\xe9' and 'cafe\\u0301', one name" in str(info.value) and "\n" not in str(info.value)
    assert model.classifier.n_samples_seen_ == 64


def test_store_predictions_match_a_store_of_nfd_names(trained, tmp_path):
    path, x, y = trained
    model = foal_pipe.load_model(path)
    store = write_store(tmp_path / "nfd.zarr", (x[:6], y[:6]), (x[:9], y[:9]), ["ant", CAFE_NFD, "cow"], chunk_rows=4)
    true, predicted = model.store_predictions(store)
    np.testing.assert_array_equal(true, y[:9])
    np.testing.assert_array_equal(predicted, model.predict(x[:9]))


@pytest.mark.parametrize("names", ["cow", [0, 1], ["ant", 2]])
def test_label_ids_takes_names_only(trained, names):
    """A string was read letter by letter and integer ids as new names: ids that mean other classes."""
    with pytest.raises(FoalPipeError, match="label_ids takes a sequence of class names"):
        foal_pipe.load_model(trained[0]).label_ids(names)


@pytest.mark.parametrize("labels", [np.array([2**63 + 1, 0], dtype=np.uint64), [2**63 + 1, 0], [-(2**70), 0]])
def test_an_id_beyond_int64_is_named_not_wrapped(trained, labels):
    model = foal_pipe.load_model(trained[0])
    with pytest.raises(FoalPipeError) as info:
        model.partial_fit(np.zeros((2, DIM)), labels)
    assert f"label id {int(labels[0])} lies outside the int64 range" in str(info.value)
    assert model.classifier.n_samples_seen_ == 60


def test_features_of_another_width_name_the_encoder_not_a_reshape(trained):
    model = foal_pipe.load_model(trained[0])
    with pytest.raises(FoalPipeError) as info:
        model.predict(np.zeros((3, DIM + 2)))
    assert str(info.value) == (f"features have shape (3, {DIM + 2}) but the model expects {DIM}-dimensional features "
                               f"(n, {DIM}); pass the features of the model's encoder (that of the store it learned)")
