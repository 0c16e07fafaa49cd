"""Any head on any rows: a head on the store's features given the projection's activations (``--head-rows
activations``) equals its definition on those rows, computed plainly here; its model file predicts and continues;
the combinations that do not apply are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, invoke, read, ref_cosine, ref_slda, written_copy
from safetensors.numpy import load_file

from foal_pipe.model.deploy import load_model
from foal_pipe.model.predict import predict_split

REFERENCES = {"slda": lambda H, y, T: ref_slda(H, y, T, 0.25), "cosine": ref_cosine}
ARGS = {"slda": ("--shrinkage", "0.25"), "cosine": ()}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    return written_copy(build_store(root / "blobs.zarr"), root / "current.zarr")


@pytest.mark.parametrize("name", ["slda", "cosine"])
def test_feature_head_on_relu_activations_equals_its_definition(store, tmp_path, name):
    result = invoke("learn", "--features", store, "--out", tmp_path / name, "--head", name, *ARGS[name],
                    "--head-rows", "activations", "--projection-dim", 24, "--activation", "relu", "--tasks", 3,
                    "--seed", 4, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    ridge = invoke("learn", "--features", store, "--out", tmp_path / "ridge", "--projection-dim", 24, "--activation",
                   "relu", "--tasks", 3, "--seed", 4, "--backend", "numpy")
    assert ridge.exit_code == 0, ridge.output
    path = tmp_path / name / "model.safetensors"
    P = load_file(str(path))["projection"]
    # the rows ridge's Gram sums: the same projection for the same seed
    np.testing.assert_array_equal(P, load_file(str(tmp_path / "ridge" / "model.safetensors"))["projection"])
    x, y, xt, yt = read(store)
    H, Ht = np.maximum(x.astype(np.float64) @ P, 0), np.maximum(xt.astype(np.float64) @ P, 0)
    classes, expected = REFERENCES[name](H, y, Ht)
    top2 = np.sort(expected, axis=1)[:, -2:]
    assert ((top2[:, 1] - top2[:, 0]) > 1e-9 * np.abs(expected).max()).all()
    predicted = classes[expected.argmax(axis=1)]
    deployed = load_model(path)
    np.testing.assert_allclose(deployed.scores(xt), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
    assert (deployed.predict(xt) == predicted).all()
    assert (predict_split(path, store).predicted == predicted).all()
    metrics = json.loads((tmp_path / name / "metrics.json").read_text())
    last = [float((predicted == yt)[np.isin(yt, task)].mean()) for task in metrics["tasks"]]
    assert last == metrics["accuracy_matrix"][-1]
    assert metrics["projection_dim"] == 24 and metrics["activation"] == "relu"
    # continuing it: the activations of the new rows through the model's own projection
    new_rows = written_copy(build_store(tmp_path / "b.zarr", seed=1), tmp_path / "new.zarr")
    again = invoke("learn", "--init-model", path, "--features", new_rows, "--out", tmp_path / "more", "--tasks", 2)
    assert again.exit_code == 0, again.output
    x2, y2, _, _ = read(new_rows)
    classes, expected = REFERENCES[name](np.vstack([H, np.maximum(x2.astype(np.float64) @ P, 0)]), np.concatenate([y, y2]), Ht)
    assert (load_model(tmp_path / "more" / "model.safetensors").predict(xt) == classes[expected.argmax(axis=1)]).all()


@pytest.mark.parametrize(("args", "message"), [
    (("--head", "slda", "--head-rows", "features", "--projection-dim", "20"), "or pass --head-rows activations"),
    (("--head", "dual", "--head-rows", "activations"), "drop --head-rows activations"),
    (("--head", "ridge", "--head-rows", "features"), "drop --head-rows features"),
    (("--head", "ncm", "--head-rows", "activations", "--gamma", "2"), "ncm takes no gamma: drop --gamma"),
    (("--head", "ncm", "--head-rows", "nope"), "nope"),
])
def test_head_rows_combinations_that_do_not_apply_are_refused(store, tmp_path, args, message):
    result = invoke("learn", "--features", store, "--out", tmp_path / "x", *args)
    assert result.exit_code != 0 and message in " ".join(result.output.split()), result.output
    if "nope" not in args:
        assert_one_line_error(result, message)
    assert not (tmp_path / "x").exists()


def test_a_projection_option_gives_a_feature_head_the_activations(store, tmp_path):
    """`learn --head slda --projection-dim D --activation relu` (KLDA's recipe as the issue wrote it) runs on the
    activations: the same bytes as with `--head-rows activations`, recorded as such; a projection option stays
    refused where `--head-rows features` is typed (above) and for a head on the projection it means what it did."""
    common = ("--features", store, "--tasks", 3, "--head", "slda", "--projection-dim", 24, "--activation", "relu")
    implied = invoke("learn", *common, "--out", tmp_path / "implied")
    explicit = invoke("learn", *common, "--head-rows", "activations", "--out", tmp_path / "explicit")
    assert implied.exit_code == 0 and explicit.exit_code == 0, implied.output + explicit.output
    for name in ("model.safetensors", "metrics.json"):
        assert (tmp_path / "implied" / name).read_bytes() == (tmp_path / "explicit" / name).read_bytes()
    assert json.loads((tmp_path / "implied" / "metrics.json").read_text())["head_rows"] == "activations"
    plain = invoke("learn", "--features", store, "--tasks", 3, "--head", "slda", "--out", tmp_path / "plain")
    assert plain.exit_code == 0, plain.output
    assert "head_rows" not in json.loads((tmp_path / "plain" / "metrics.json").read_text())


# --- random Fourier features: --activation cos ------------------------------------------------------------------

def test_cos_expansion_is_random_fourier_features_written_plainly():
    from foal_pipe.core.expansion import Expansion

    X = np.random.default_rng(0).normal(size=(5, 7))
    cos = Expansion.draw(7, 30, "normal", "cos", 3, "float64")
    relu = Expansion.draw(7, 30, "normal", "relu", 3, "float64")
    np.testing.assert_array_equal(cos.components_, relu.components_)  # the bias is drawn after the matrix
    b = cos.bias_
    assert b.shape == (30,) and b.min() >= 0 and b.max() < 2 * np.pi and np.unique(b).size == 30
    expected = np.sqrt(2 / 30) * np.cos(X @ cos.components_ + b[None, :])
    np.testing.assert_allclose(cos.transform(X), expected, rtol=1e-13, atol=1e-13)
    assert relu.bias_ is None


def test_cos_features_approximate_the_gaussian_kernel():
    """phi(x)^T phi(y) -> exp(-||x - y||^2 / (2 sigma^2)) for W ~ N(0, 1/sigma^2): with the normal init's 1/(3d),
    sigma^2 = 3d (Rahimi & Recht 2007); the error of D features is about 1/sqrt(D)."""
    from foal_pipe.core.expansion import Expansion

    d, D = 6, 40000
    X = np.random.default_rng(1).normal(size=(8, d)) * 3
    Phi = Expansion.draw(d, D, "normal", "cos", 0, "float64").transform(X)
    kernel = np.exp(-((X[:, None, :] - X[None, :, :]) ** 2).sum(axis=2) / (6 * d))
    assert np.abs(Phi @ Phi.T - kernel).max() < 0.03


def test_slda_on_cos_features_equals_its_definition_and_round_trips(store, tmp_path):
    result = invoke("learn", "--features", store, "--out", tmp_path / "klda", "--head", "slda", "--head-rows",
                    "activations", "--projection-dim", 40, "--projection-init", "normal", "--activation", "cos",
                    "--tasks", 3, "--seed", 1, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    path = tmp_path / "klda" / "model.safetensors"
    tensors = load_file(str(path))
    P, b = tensors["projection"], tensors["projection_bias"]
    x, y, xt, _ = read(store)
    phi = lambda X: np.sqrt(2 / 40) * np.cos(X.astype(np.float64) @ P + b)  # noqa: E731
    classes, expected = ref_slda(phi(x), y, phi(xt), 1e-4)
    deployed = load_model(path)
    np.testing.assert_allclose(deployed.scores(xt), expected, rtol=1e-7, atol=1e-7 * np.abs(expected).max())
    assert (predict_split(path, store).predicted == classes[expected.argmax(axis=1)]).all()
    deployed.save(tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()


def test_cos_where_its_bias_cannot_be_kept_is_refused(store, tmp_path):
    from foal_pipe import AnalyticClassifier, SmoothProjection

    result = invoke("learn", "--features", store, "--out", tmp_path / "r", "--activation", "cos")
    assert_one_line_error(result, "--activation cos draws a projection bias that ridge's model file does not hold")
    assert not (tmp_path / "r").exists()
    proj = SmoothProjection(n_components=8, activation="cos", random_state=0).fit(np.zeros((1, 4)))
    clf = AnalyticClassifier().fit(proj.transform(np.eye(4)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="a ridge model file holds no projection bias"):
        clf.save(tmp_path / "m.safetensors", projection=proj)
    assert not (tmp_path / "m.safetensors").exists()
    with pytest.raises(ValueError, match="needs the projection's bias"):
        SmoothProjection.from_matrix(proj.components_, activation="cos")


def test_a_cos_head_file_without_its_bias_is_refused_in_one_line(store, tmp_path):
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.model.modelfile import read_model, write_model

    result = invoke("learn", "--features", store, "--out", tmp_path / "k", "--head", "cosine", "--head-rows",
                    "activations", "--projection-dim", 12, "--activation", "cos", "--tasks", 2)
    assert result.exit_code == 0, result.output
    path = tmp_path / "k" / "model.safetensors"
    tensors, meta = read_model(path)
    meta = {k: v for k, v in meta.items() if k not in ("format", "format_version", "checksum")}
    write_model(tmp_path / "bad.safetensors", {k: v for k, v in tensors.items() if k != "projection_bias"}, meta)
    with pytest.raises(FoalPipeError, match="activation 'cos' needs the projection's bias") as info:
        load_model(tmp_path / "bad.safetensors")
    assert "\n" not in str(info.value)
    out = invoke("predict", "--model", tmp_path / "bad.safetensors", "--features", store, "--out", tmp_path / "p.csv")
    assert_one_line_error(out, "needs the projection's bias")
