"""A model refuses a store whose features have another width, in one line, wherever it meets one: ``predict``,
``learn --init-model`` (ridge's and a head's model) and :meth:`DeployedModel.store_predictions`
(``--eval-features``)."""

from __future__ import annotations

import pytest
from helpers import DIM, assert_clean_error, assert_one_line_error, build_store, invoke, learn

from foal_pipe import load_model
from foal_pipe.errors import FoalPipeError

NARROW = DIM - 4
MESSAGE = f"the model expects {DIM}-dimensional features but"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("width")
    wide = build_store(root / "wide.zarr")
    narrow = build_store(root / "narrow.zarr", seed=1, train_dim=NARROW, test_dim=NARROW)
    learn(wide, root / "ridge", tasks=2)
    result = invoke("learn", "--features", wide, "--out", root / "ncm", "--head", "ncm", "--tasks", 2, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    return root, narrow


def test_predict_refuses_another_width(stores):
    root, narrow = stores
    result = invoke("predict", "--model", root / "ridge" / "model.safetensors", "--features", narrow,
                    "--out", root / "p.csv")
    assert_one_line_error(result, MESSAGE, f"has {NARROW}", "use a store made with the model's encoder")
    assert not (root / "p.csv").exists()


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_continuing_refuses_another_width(stores, head):
    root, narrow = stores
    out = root / f"continued-{head}"
    result = invoke("learn", "--features", narrow, "--init-model", root / head / "model.safetensors", "--out", out,
                    "--tasks", 2)
    assert_clean_error(result, MESSAGE, out)


def test_store_predictions_refuse_another_width(stores):
    root, narrow = stores
    with pytest.raises(FoalPipeError, match=f"{MESSAGE} .* has {NARROW}"):
        load_model(root / "ridge" / "model.safetensors", estimators=False).store_predictions(narrow)
