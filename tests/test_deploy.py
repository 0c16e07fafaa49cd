"""load_model: a saved model predicts from features and images, keeps learning (new classes by name), saves again."""

from __future__ import annotations

import numpy as np
import pytest

import foal_pipe
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.protocol.commands import run_learn
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.store import write_store


def learned(tmp_path, rng, names=("ant", "bee", "cow"), dim=6, n=60, projection_dim=20):
    x = rng.normal(size=(n, dim)).astype(np.float32)
    y = np.arange(n) % len(names)
    store = write_store(tmp_path / "a.zarr", (x, y), (x[:15], y[:15]), list(names), chunk_rows=16)
    run_learn(store, tmp_path / "run", StreamConfig(tasks=1), ModelConfig(projection_dim=projection_dim),
              EvaluationConfig(), ExecutionConfig(backend="numpy"), log=lambda _: None)
    return tmp_path / "run" / "model.safetensors", x, y


def test_load_predict_matches_classifier(tmp_path):
    rng = np.random.default_rng(0)
    path, x, y = learned(tmp_path, rng)
    model = foal_pipe.load_model(path)
    assert model.class_names == ["ant", "bee", "cow"]
    assert model.encoder_spec["name"] == "synthetic"
    H = model.projection.transform(x.astype(np.float64))
    ref = AnalyticClassifier(gamma=1.0).fit(H, y)
    np.testing.assert_array_equal(model.predict(x), ref.predict(H))
    assert model.predict_names(x) == [model.class_names[k] for k in ref.predict(H)]


def test_save_load_continue_keeps_names_and_is_exact(tmp_path):
    rng = np.random.default_rng(1)
    path, x, y = learned(tmp_path, rng)
    model = foal_pipe.load_model(path)
    x2 = rng.normal(size=(12, 6))
    names2 = ["cow", "dog", "ant", "dog"] * 3  # one known name, one new
    model.partial_fit(x2, names2)
    assert model.class_names == ["ant", "bee", "cow", "dog"]
    model.save(tmp_path / "again.safetensors")
    again = foal_pipe.load_model(tmp_path / "again.safetensors")
    assert again.class_names == ["ant", "bee", "cow", "dog"]
    assert again.classifier.classes_.tolist() == [0, 1, 2, 3]
    # exact: closed-form ridge over both row sets with the merged label ids
    H = model.projection.transform(np.vstack([x.astype(np.float64), x2]))
    labels = np.concatenate([y, [{"ant": 0, "bee": 1, "cow": 2, "dog": 3}[n] for n in names2]])
    Y = np.eye(4)[labels]
    W = np.linalg.solve(H.T @ H + np.eye(H.shape[1]), H.T @ Y)
    np.testing.assert_allclose(again.classifier.weights_, W, atol=1e-9)
    # continuing the reloaded model gives the same as continuing the first one
    x3 = rng.normal(size=(5, 6))
    model.partial_fit(x3, ["emu"] * 5)
    again.partial_fit(x3, ["emu"] * 5)
    np.testing.assert_allclose(again.classifier.weights_, model.classifier.weights_, atol=1e-12)
    assert again.class_names[-1] == "emu"


def test_new_label_id_without_name_refused(tmp_path):
    path, _, _ = learned(tmp_path, np.random.default_rng(2))
    model = foal_pipe.load_model(path)
    with pytest.raises(FoalPipeError, match="no name"):
        model.partial_fit(np.zeros((2, 6)), [7, 7])


def test_model_from_another_tool_refused(tmp_path):
    from safetensors.numpy import save_file

    save_file({"W": np.zeros((2, 2))}, str(tmp_path / "other.safetensors"))
    with pytest.raises(FoalPipeError, match="another tool"):
        foal_pipe.load_model(tmp_path / "other.safetensors")


def test_docs_deploying_example(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    section = page.split("\n## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["again"].classifier.n_samples_seen_ == 66


def test_predict_proba_is_the_clipped_normalised_scores(tmp_path):
    path, x, _ = learned(tmp_path, np.random.default_rng(3))
    model = foal_pipe.load_model(path)
    proba = model.predict_proba(x)
    scores = model.scores(x)
    assert proba.shape == scores.shape and (proba >= 0).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(model.classifier.classes_[np.argmax(proba, axis=1)], model.predict(x))
    positive = np.clip(scores, 0, None)
    np.testing.assert_allclose(proba, positive / positive.sum(axis=1, keepdims=True))
    hopeless = foal_pipe.load_model(path)
    hopeless.scores = lambda features: -np.abs(model.scores(features))  # no positive score: uniform
    np.testing.assert_allclose(hopeless.predict_proba(np.abs(x[:2])), np.full((2, 3), 1 / 3))


def test_store_predictions_match_classes_by_name(tmp_path):
    path, x, y = learned(tmp_path, np.random.default_rng(4))
    model = foal_pipe.load_model(path)
    other = write_store(tmp_path / "other.zarr", (x[:6], y[:6]), (x[:9], (y[:9] + 1) % 3), ["cow", "ant", "owl"],
                        chunk_rows=4)  # store ids 0, 1, 2 are the model's 2, 0 and an unknown class
    true, predicted = model.store_predictions(other)
    np.testing.assert_array_equal(true, np.array([2, 0, -1])[(y[:9] + 1) % 3])
    np.testing.assert_array_equal(predicted, model.predict(x[:9]))
    with pytest.raises(FoalPipeError, match="unknown split 'val'; choose train or test"):
        model.store_predictions(other, "val")
    with pytest.raises(FoalPipeError, match="another encoder than the model's"):
        model.store_predictions(write_store(tmp_path / "pix.zarr", (x[:6], y[:6]), (x[:3], y[:3]), ["a", "b", "c"],
                                            encoder={"name": "pixels", "fusion": "none", "image_size": 0, "normalize": False}))


def test_an_encoder_mismatch_names_both_encoders(tmp_path):
    """'blocks' is 4 in the store but None in the model said nothing of which encoders differ."""
    from foal_pipe.model.deploy import check_encoder
    from foal_pipe.store import open_store

    x, y = np.random.default_rng(0).normal(size=(6, 4)), np.array([0, 1, 2, 0, 1, 2])
    store = open_store(write_store(tmp_path / "b.zarr", (x, y), (x, y), ["a", "b", "c"],
                                             encoder={"name": "vit_small_patch16_224", "blocks": 4,
                                                      "fusion": "none", "image_size": 0, "normalize": False}))
    with pytest.raises(FoalPipeError) as info:
        check_encoder({"name": "pixels"}, store, "b.zarr")
    assert "the store's encoder is 'vit_small_patch16_224', the model's 'pixels'" in str(info.value)


@pytest.mark.parametrize("estimators", [True, False])
def test_a_ridge_model_answers_as_every_head_does(tmp_path, estimators):
    """DeployedModel has one path for every head: a ridge classifier (the estimator or the saved model) names its
    head, gives the rows it scores and turns scores into probabilities by the registry's rule, as a head's does."""
    from foal_pipe.heads import HEADS, probabilities
    from foal_pipe.heads.base import PROBABILITY_RULES

    path, x, _ = learned(tmp_path, np.random.default_rng(4))
    model = foal_pipe.load_model(path, estimators=estimators)
    assert model.classifier.name == "ridge" and HEADS["ridge"].head.probabilities == "shares"
    np.testing.assert_array_equal(model.classifier.rows(x.astype(np.float64), model.projection),
                                  model.projection.transform(x.astype(np.float64)))
    scores = model.scores(x)
    np.testing.assert_array_equal(model.predict_proba(x), PROBABILITY_RULES["shares"](scores))
    np.testing.assert_array_equal(probabilities("ridge", scores), PROBABILITY_RULES["shares"](scores))
    with pytest.raises(FoalPipeError, match="ncm head's scores are distances"):
        probabilities("ncm", scores)
