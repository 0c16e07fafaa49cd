"""HDF5 inputs: labels and pixels that are not what they should be are refused with the dataset key, never cast.

Before: float labels were truncated to integers (2.7 became class 2), NaN pixels became 0, integer images
were multiplied by 255 and clipped (every non-zero pixel became 255), floats above 1 were clipped to white.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.datasets import open_dataset
from foal_pipe.errors import FoalPipeError

h5py = pytest.importorskip("h5py")
runner = CliRunner()


def _write(path, train_images, train_labels, test_images=None, test_labels=None):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["train/images"], f["train/labels"] = train_images, train_labels
        f["test/images"] = test_images if test_images is not None else rng.integers(0, 256, (2, 6, 6), dtype=np.uint8)
        f["test/labels"] = test_labels if test_labels is not None else np.array([0, 1])
    return path


def _images(dtype, values=None, n=4):
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (n, 6, 6, 3)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        imgs = (imgs / 255.0).astype(dtype)
    if values is not None:
        imgs[2, 1, 1, 0] = values
    return imgs


@pytest.mark.parametrize("labels", [np.array([0.0, 1.0, 1.0, 0.0]), np.array([0, 1, np.nan, 0]),
                                    np.array([True, False, True, False])])
def test_labels_that_are_not_integers_are_refused(tmp_path, labels):
    path = _write(tmp_path / "d.h5", _images(np.uint8), labels)
    with pytest.raises(FoalPipeError, match=rf"dataset train/labels has dtype {labels.dtype}; labels must be integers "
                                            r"0..K-1: store them with an integer dtype"):
        open_dataset("hdf5", path)


def test_test_labels_are_checked_too(tmp_path):
    path = _write(tmp_path / "d.h5", _images(np.uint8), np.array([0, 1, 1, 0]), test_labels=np.array([0.5, 1.0]))
    with pytest.raises(FoalPipeError, match="dataset test/labels has dtype float64"):
        open_dataset("hdf5", path)


@pytest.mark.parametrize("dtype,value,message", [
    (np.float32, np.nan, r"train/images\[2\] has NaN or inf pixel values"),
    (np.float64, np.inf, r"train/images\[2\] has NaN or inf pixel values"),
    (np.float32, 200.0, r"train/images\[2\] has float values 0..200, outside \[0, 1\] \(0..255 data: store it as uint8\)"),
    (np.float32, -0.5, r"train/images\[2\] has float values -0.5..1, outside \[0, 1\]"),
    (np.int16, 300, r"train/images\[2\] has values 0..300, outside 0..255"),
    (np.int32, -1, r"train/images\[2\] has values -1..255, outside 0..255"),
])
def test_pixels_outside_their_range_are_refused_naming_the_key(tmp_path, dtype, value, message):
    path = _write(tmp_path / "d.h5", _images(dtype, value), np.array([0, 1, 1, 0]))
    data = open_dataset("hdf5", path)
    data.train.load(1)  # the other images are fine
    with pytest.raises(ValueError, match=message):
        data.train.load(2)
    result = runner.invoke(app, ["extract", "--dataset", "hdf5", "--data-dir", str(path), "--model", "pixels",
                                 "--out", str(tmp_path / "s.zarr"), "--workers", "0", "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    text = " ".join(result.output.split())
    assert "Error: cannot read image" in text and f"{path}:train/images[2]" in text
    assert "images must be uint8, integers in 0..255, or floats in [0, 1]" in text


def test_images_that_are_not_numbers_are_refused(tmp_path):
    path = _write(tmp_path / "d.h5", np.zeros((4, 6, 6), dtype=bool), np.array([0, 1, 1, 0]))
    with pytest.raises(FoalPipeError, match=r"dataset train/images has dtype bool; images must be uint8, integers "
                                            r"in 0..255, or floats in \[0, 1\]"):
        open_dataset("hdf5", path)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int64, np.float32, np.float64])
def test_valid_pixels_of_any_numeric_dtype_read_exactly(tmp_path, dtype):
    """Integers in 0..255 are taken as they are (not multiplied by 255); floats in [0, 1] are scaled."""
    reference = _images(np.uint8)
    images = reference.astype(dtype) if np.dtype(dtype).kind in "iu" else (reference / 255.0).astype(dtype)
    path = _write(tmp_path / "d.h5", images, np.array([0, 1, 1, 0], dtype=np.int32))
    data = open_dataset("hdf5", path)
    for i in range(4):
        np.testing.assert_array_equal(data.train.load(i), reference[i])
    assert data.train.labels.dtype == np.int64 and list(data.train.labels) == [0, 1, 1, 0]
