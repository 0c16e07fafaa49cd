"""Image files predicted with a model learned from a read-time fusion of a ``--keep-blocks`` store: the images are
fused as the store's rows were (the norm only where the model applied it), and a record whose norm or encoder cannot
be honoured is refused. Expectations come from the stored blocks with NumPy, not from foal-pipe's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import KWARGS_4, PIXELS, TINY_VIT, make_image_tree
from safetensors.numpy import load_file
from typer.testing import CliRunner

import foal_pipe
from foal_pipe import FoalPipeError
from foal_pipe.cli import app
from foal_pipe.extract.encoding import build_recorded_encoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()


def _ok(*args: object) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def blocks_images(tmp_path_factory, vit4_checkpoint) -> tuple[Path, Path, Path]:
    """Image tree (3 classes, 8 train / 4 test each) and its float32 --keep-blocks store."""
    from foal_pipe.encoders import format_model_kwargs

    root = tmp_path_factory.mktemp("predict-images-fusion")
    images = make_image_tree(root / "imgs", {"ant": 8, "bee": 8, "cat": 8}, test_per_class=4, seed=3)
    store = root / "img.zarr"
    _ok("extract", "--dataset", "imagefolder", "--data-dir", images, "--model", TINY_VIT, "--model-kwargs",
        format_model_kwargs(KWARGS_4), "--checkpoint", vit4_checkpoint, "--out", store, "--workers", "0",
        "--device", "cpu", "--keep-blocks", "--blocks-dtype", "float32")
    return images, store, vit4_checkpoint


def test_predict_images_of_a_no_norm_mean_fusion_model_gives_the_stores_unnormed_mean(blocks_images, tmp_path):
    """DeployedModel.encode_images/predict_images of a `learn --fusion mean:2-3 --no-fusion-norm` model: the float32
    mean of blocks 2 and 3, no norm (it used to be normed), and the label ids that those rows score highest."""
    images, store, checkpoint = blocks_images
    _ok("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "1", "--projection-dim", "12", "--gamma",
        "0.1", "--fusion", "mean:2-3", "--no-fusion-norm")
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    paths = sorted((images / "test").rglob("*.png"))  # the test split's order: class folder, then file name
    tokens = np.asarray(zarr.open_group(str(store), mode="r")["test/blocks"][:], dtype=np.float32)
    expected = (tokens[:, 1] + tokens[:, 2]) / np.float32(2)
    np.testing.assert_allclose(model.encode_images(paths, checkpoint), expected, rtol=1e-5, atol=1e-5)
    tensors = load_file(str(tmp_path / "run" / "model.safetensors"))
    scores = (1 / (1 + np.exp(-(expected.astype(np.float64) @ tensors["projection"])))) @ tensors["W"]
    np.testing.assert_array_equal(model.predict_images(paths, checkpoint),
                                  model.classifier.classes_[np.argmax(scores, axis=1)])


def test_a_model_recording_no_norm_on_features_its_encoder_norms_is_refused(blocks_images, tmp_path):
    """A model read from the store's own features (normed by the encoder) whose record says no norm was applied:
    the rebuilt encoder would norm, so the difference is named rather than the images encoded otherwise."""
    _, store, checkpoint = blocks_images
    _ok("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "1", "--projection-dim", "12")
    spec = dict(foal_pipe.load_model(tmp_path / "run" / "model.safetensors").encoder_spec)
    assert spec["final_norm"].startswith("applied") and "blocks_dtype" not in spec
    with pytest.raises(FoalPipeError, match="'final_norm' is .* but the model records 'not applied"):
        build_recorded_encoder({**spec, "final_norm": "not applied (--no-fusion-norm)"}, checkpoint)


def test_a_block_fusion_of_an_encoder_without_blocks_is_refused_naming_predict_features():
    spec = {**PIXELS, "weights": {"source": "none"}, "fusion": "last", "blocks_dtype": "float16",
            "final_norm": "applied once to the block's token"}
    with pytest.raises(FoalPipeError, match="encoder pixels has no blocks; predict with .*features the store") as caught:
        build_recorded_encoder(spec)
    assert "\n" not in str(caught.value)
