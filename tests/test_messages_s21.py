"""Refusals that named the wrong thing: mixed object labels as "continuous values", an encoder setting that differs
as the same encoder named twice, and ``--eval-every``'s short class by label id instead of the store's name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

from foal_pipe import AnalyticClassifier, FoalPipeError, head_classifier
from foal_pipe.errors import ClassRefused
from foal_pipe.protocol.capabilities import check_points
from foal_pipe.store import write_store

X = np.random.default_rng(0).normal(size=(6, 4))
ESTIMATORS = [AnalyticClassifier, lambda: head_classifier("ncm")]


@pytest.mark.parametrize("make", ESTIMATORS, ids=["ridge", "ncm"])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
@pytest.mark.parametrize("y, kinds", [([1, "b", 2.0, 1, "b", 2.0], "float/int/str"), (["a", 1, "a", 1, "a", 1], "int/str")])
def test_mixed_object_labels_are_named_as_mixed_kinds(make, method, y, kinds):
    """Whether the first label is a number (scikit-learn: "unknown ... continuous values") or a name (NumPy: "'<' not
    supported"), the refusal says the labels mix kinds and to use one."""
    with pytest.raises(FoalPipeError) as info:
        getattr(make(), method)(X, np.array(y, dtype=object))
    message = str(info.value)
    assert f"y mixes labels of kinds {kinds}" in message and "use one kind of label" in message
    assert "continuous" not in message and "\n" not in message


@pytest.mark.parametrize("make", ESTIMATORS, ids=["ridge", "ncm"])
def test_numbers_in_an_object_array_are_refused_with_the_fix_that_works(make):
    y = np.array([0, 1, 2, 0, 1, 2], dtype=object)
    with pytest.raises(FoalPipeError, match="Unknown label type: y holds int labels in an object array.*numeric dtype") as info:
        make().fit(X, y)
    assert "continuous" not in str(info.value)
    fitted = make().fit(X, np.asarray(y, dtype=np.int64))  # the advice, followed
    assert fitted.classes_.tolist() == [0, 1, 2]


def test_values_that_are_no_labels_are_named_by_type():
    with pytest.raises(FoalPipeError, match="Unknown label type: y holds values of type object, which are not class labels"):
        AnalyticClassifier().fit(X, np.array([object() for _ in range(6)], dtype=object))


def _store(path: Path, encoder: dict) -> Path:
    rng = np.random.default_rng(0)
    y = np.tile(np.arange(3), 10)
    rows = [((rng.normal(size=(30, 5)) + y[:, None]).astype(np.float32), y) for _ in range(2)]
    return write_store(path, *rows, ["a", "b", "c"], encoder=encoder)


def _encoder(**changes) -> dict:
    return {"name": "synthetic", "fusion": "last", "image_size": 0, "normalize": False, **changes}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("enc")
    result = invoke("learn", "--features", _store(root / "a.zarr", _encoder()), "--out", root / "run", "--tasks", 1,
                    "--projection-dim", 16, "--gamma", 1.0, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    return root / "run" / "model.safetensors"


@pytest.mark.parametrize("command", ["predict", "learn"])
def test_a_setting_that_differs_is_named_not_the_same_encoder_twice(tmp_path, model, command):
    store = _store(tmp_path / "b.zarr", _encoder(fusion="mean"))
    args = (["predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv"] if command == "predict" else
            ["learn", "--init-model", model, "--features", store, "--out", tmp_path / "run", "--tasks", 1])
    result = invoke(*args)
    assert_one_line_error(result, "with the model's encoder 'synthetic' but other settings: 'fusion' is 'mean' in the store "
                          "but 'last' in the model", "extract the new images with the model's settings (fusion 'last')")
    assert "the model's 'synthetic'" not in result.output


def test_the_advice_followed_is_taken(tmp_path, model):
    store = _store(tmp_path / "b.zarr", _encoder())
    result = invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output


def test_every_setting_that_differs_is_named(tmp_path, model):
    store = _store(tmp_path / "b.zarr", _encoder(fusion="mean", image_size=224))
    result = invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv")
    assert_one_line_error(result, "'fusion' is 'mean' in the store but 'last' in the model, 'image_size' is 224 in the "
                          "store but 0 in the model", "(fusion 'last', image_size 0)")


def test_another_encoder_is_named_before_the_settings_it_brings(tmp_path, model):
    """'fusion' sorts before 'name': the refusal named the fusion of what is another encoder altogether."""
    store = _store(tmp_path / "b.zarr", _encoder(name="other", fusion="mean"))
    result = invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv")
    assert_one_line_error(result, "another encoder than the model's: the store's encoder is 'other', the model's "
                          "'synthetic'; extract the new images with the model's encoder")
    assert "fusion" not in result.output


def _first_short(labels: np.ndarray, every: int, least: int) -> int:
    """The class short of ``least`` rows at the first point, counted row by row (independent of the bincount)."""
    for n in range(every, labels.size + 1, every):
        seen: dict[int, int] = {}
        for label in labels[:n].tolist():
            seen[label] = seen.get(label, 0) + 1
        short = sorted(c for c, k in seen.items() if k < least)
        if short:
            return short[0]
    raise AssertionError("no short point")


def test_eval_every_names_the_short_class_as_the_store_does():
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2])
    names = ["cat", "owl", "fox"]
    short = _first_short(labels, 5, 2)
    with pytest.raises(FoalPipeError) as info:
        check_points("fecam", [labels], 5, names=names)
    assert f"class {names[short]!r} has fewer" in str(info.value)
    assert f"class {short} has" not in str(info.value)


def test_eval_every_refusal_without_names_can_be_named_by_its_caller():
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2])
    with pytest.raises(ClassRefused) as info:
        check_points("fecam", [labels], 5)
    assert info.value.label == _first_short(labels, 5, 2)
    assert "class 'fox' has fewer" in str(info.value.named({2: "fox"}))


@pytest.mark.parametrize("orders", [(), ("--order-seeds", "0,1")], ids=["one-order", "orders"])
def test_learn_eval_every_names_the_short_class_by_the_stores_name(tmp_path, orders):
    """The command line passes the store's class names: ``class 'c2'``, as fecam's own refusals say, not ``class 2``."""
    from helpers import blocks_store

    store = blocks_store(tmp_path / "b.zarr")
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--eval-every", 3, "--tasks", 2,
                    *orders)
    assert_one_line_error(result)
    text = " ".join(result.output.split())
    assert "class 'c" in text and "has fewer" in text and not (tmp_path / "run").exists()
    assert not any(f"class {k} has" in text for k in range(4))


@pytest.mark.parametrize("command", ["predict", "store_predictions"])
def test_a_fusion_models_store_without_blocks_is_refused_with_the_fix_that_holds(tmp_path, command):
    """A model learned with ``--fusion`` fixes the fusion: the store's advice to read its features unfused cannot be
    followed by predict (nor by DeployedModel.store_predictions), so only extracting with --keep-blocks is offered."""
    from helpers import blocks_store

    from foal_pipe import load_model

    store = blocks_store(tmp_path / "b.zarr")
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 8,
                  "--fusion", "mean:1-2").exit_code == 0
    model = tmp_path / "run" / "model.safetensors"
    rng = np.random.default_rng(0)
    y = np.tile(np.arange(4), 10)
    plain = write_store(tmp_path / "plain.zarr", (rng.normal(size=(40, 6)), y), (rng.normal(size=(40, 6)), y),
                        [f"c{i}" for i in range(4)], encoder={"name": "synthetic-vit-s", "fusion": "mean-cls",
                                                              "image_size": 0, "normalize": False})
    if command == "predict":
        result = invoke("predict", "--model", model, "--features", plain, "--out", tmp_path / "p.csv")
        assert_one_line_error(result, "keeps no per-block tokens", "--keep-blocks", "the model was learned on that fusion")
        text = result.output
    else:
        with pytest.raises(FoalPipeError, match="keeps no per-block tokens") as info:
            load_model(model).store_predictions(plain)
        text = str(info.value)
    assert "no fusion" not in text and not (tmp_path / "p.csv").exists()


def test_continuing_a_fusion_model_on_a_store_without_blocks_offers_only_keep_blocks(tmp_path):
    from helpers import blocks_store

    store = blocks_store(tmp_path / "b.zarr")
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 8,
                  "--fusion", "mean:1-2").exit_code == 0
    rng = np.random.default_rng(1)
    y = np.tile(np.arange(4), 10)
    plain = write_store(tmp_path / "plain.zarr", (rng.normal(size=(40, 6)), y), (rng.normal(size=(40, 6)), y),
                        [f"c{i}" for i in range(4)], encoder={"name": "synthetic-vit-s", "fusion": "mean-cls",
                                                              "image_size": 0, "normalize": False})
    result = invoke("learn", "--features", plain, "--init-model", tmp_path / "run" / "model.safetensors", "--out",
                    tmp_path / "c", "--tasks", 1)
    assert_one_line_error(result, "keeps no per-block tokens", "--keep-blocks", "the model was learned on that fusion")
    assert "no fusion" not in result.output and not (tmp_path / "c").exists()
