"""`extract`'s HDF5 inputs and Pillow's conversion warnings, as an audit found them.

Before: a group where a dataset belongs, scalar labels, a `classes` that is one string or a group ended in a
traceback; images of no pixels ((20, 0, 0, 3)) made a store of identical rows, exit 0; pixel values that are not
pixels (floats in 0..255, NaN, integers above 255) stopped the run partway, with advice ("re-run the same command
to resume") that the store's recorded SHA-256 of the images then refused; a palette PNG's conversion warning
reached stderr raw instead of as a `note: FILE: ...` line.
"""

from __future__ import annotations

import csv
import io
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, invoke, store_files

from foal_pipe.datasets import open_dataset
from foal_pipe.datasets.h5pixels import h5_layout, h5_side
from foal_pipe.datasets.h5source import H5Source
from foal_pipe.datasets.sources import TorchvisionSource, open_image, to_rgb_array
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.run import fix_images

h5py = pytest.importorskip("h5py")
SHAPES = "(N, H, W), (N, H, W, C) or (N, C, H, W) with C = 1 (grey), 3 (RGB) or 4 (RGBA)"
PIXELS = "images must be uint8, integers in 0..255, or floats in [0, 1]"


def _h5(path: Path, **replace) -> Path:
    """An HDF5 file of 8 train and 4 test 6x6 RGB images of 2 classes; ``replace``: name (``/`` as ``__``) -> an
    array to store instead, None to leave it out, or a callable ``(f, name)`` that makes it."""
    rng = np.random.default_rng(0)
    plain = {"train/images": rng.integers(0, 256, (8, 6, 6, 3), dtype=np.uint8), "train/labels": np.arange(8) % 2,
             "test/images": rng.integers(0, 256, (4, 6, 6, 3), dtype=np.uint8), "test/labels": np.arange(4) % 2}
    with h5py.File(path, "w") as f:
        for name, value in {**plain, **{k.replace("__", "/"): v for k, v in replace.items()}}.items():
            if callable(value):
                value(f, name)
            elif value is not None:
                f[name] = value
    return path


def _extract(data: Path, out: Path, *extra):
    return invoke("extract", "--dataset", "hdf5", "--data-dir", data, "--model", "pixels", "--out", out,
                  "--chunk-rows", 4, "--batch-size", 2, "--workers", 0, "--device", "cpu", *extra)


def _group(f, name):
    f.create_group(name)


def _classes_attr(value):
    def make(f, name):
        f.attrs["classes"] = value
    return make


# -- 1: layouts that crashed are one line naming the dataset, what it is and what it should be --------------------
@pytest.mark.parametrize("replace,fragments", [
    ({"train__images": _group}, ["train/images is a group, not a dataset of values; it should be N images of shape "
                                 + SHAPES]),
    ({"test__labels": _group}, ["test/labels is a group, not a dataset of values; it should be N integer labels "
                                "0..K-1, shape (N,)"]),
    ({"train__images": np.zeros((1, 6, 6, 3), np.uint8), "train__labels": np.int64(0)},
     ["dataset train/labels is a scalar (one value, 0), not an array; it should be N integer labels 0..K-1, shape (N,)"]),
    ({"train__labels": lambda f, name: f.create_dataset(name, data=h5py.Empty("i8"))},
     ["train/labels is a dataset with an empty dataspace (h5py.Empty, no values), not a dataset of values"]),
    ({"classes": "a,b"}, ["its 'classes' dataset is one value ('a,b'), not a list; it should be K class names, one per "
                          "label, as a list of strings"]),
    ({"classes": _group}, ["classes is a group, not a dataset of values; it should be K class names"]),
    ({"x": _classes_attr("ab")}, ["its 'classes' attribute is one value ('ab'), not a list"]),
])
def test_layouts_that_crashed_are_one_line(tmp_path, replace, fragments):
    path = _h5(tmp_path / "d.h5", **replace)
    assert_one_line_error(_extract(path, tmp_path / "s.zarr"), f"{path}: ", *fragments)
    assert not (tmp_path / "s.zarr").exists()


def test_an_external_link_to_a_missing_file_is_refused_by_the_inside_check(tmp_path):
    path = _h5(tmp_path / "d.h5", train__images=lambda f, name: f.__setitem__(name, h5py.ExternalLink("gone.h5", "/x")))
    assert_one_line_error(_extract(path, tmp_path / "s.zarr"),
                          f"{path}: dataset train/images is an external link to gone.h5:/x, not data stored in the file")


def test_a_list_of_classes_still_reads(tmp_path):
    path = _h5(tmp_path / "d.h5", classes=np.array([b"ant", b"bee"]))
    assert open_dataset("hdf5", path).classes == ["ant", "bee"]
    path = _h5(tmp_path / "e.h5", x=_classes_attr(["cow", "dog"]))
    assert open_dataset("hdf5", path).classes == ["cow", "dog"]


# -- 2: images without pixels -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(8, 0, 0, 3), (8, 0, 6, 3), (8, 6, 0, 3), (8, 3, 0, 6), (8, 6, 6, 0), (8, 0, 6)])
def test_images_without_pixels_are_refused_naming_the_shape(tmp_path, shape):
    path = _h5(tmp_path / "d.h5", train__images=np.zeros(shape, np.uint8))
    with pytest.raises(FoalPipeError, match=rf"dataset train/images has shape {re.escape(str(shape))}, images without "
                                            r"pixels \(a height, width or channel count of 0\)"):
        open_dataset("hdf5", path)
    assert h5_layout(shape) is None and h5_side(shape) is None
    assert_one_line_error(_extract(path, tmp_path / "s.zarr"), "images without pixels")
    assert not (tmp_path / "s.zarr").exists()


def test_shapes_with_pixels_keep_their_layout():
    assert [h5_layout(s) for s in [(0, 6, 6, 3), (2, 1, 1), (2, 3, 5, 7), (2, 5, 7, 4)]] == ["HWC", "HW", "CHW", "HWC"]
    assert [h5_side(s) for s in [(2, 6, 6, 3), (2, 3, 5, 5), (2, 5, 7)]] == [6, 5, None]


# -- 3: pixel values that are not pixels are refused before the store is written ----------------------------------
@pytest.mark.parametrize("images,first,bad,why", [
    (np.random.default_rng(1).random((8, 6, 6, 3), dtype=np.float32) * 255 + 2, 0, 8, "has float values"),
    (np.where(np.arange(8)[:, None, None, None] == 5, np.nan, np.full((8, 6, 6, 3), 0.5, np.float32)), 5, 1,
     "has NaN or inf pixel values"),
    (np.where(np.arange(8)[:, None, None, None] >= 6, 300, np.full((8, 6, 6, 3), 7, np.int16)).astype(np.int16), 6, 2,
     "has values 0..300, outside 0..255"),
])
def test_pixel_values_are_refused_before_a_store_is_written(tmp_path, images, first, bad, why):
    path, out = _h5(tmp_path / "d.h5", train__images=images), tmp_path / "s.zarr"
    more = f" and {bad - 1} more" if bad > 1 else ""
    assert_one_line_error(_extract(path, out), f"cannot read image {path}:train/images[{first}] (train/images[{first}] "
                          f"{why}", PIXELS, f"){more}; fix the image{'s' * (bad > 1)}, then re-run the same command")
    assert not out.exists() and not list(tmp_path.glob(".s.zarr*"))  # nothing written: fixing the file leaves no store


def test_a_fault_found_mid_run_says_overwrite_which_works(tmp_path, monkeypatch):
    """A file changed once the run began (the up-front look skipped here): resuming would compare the SHA-256."""
    images = np.full((8, 6, 6, 3), 0.5, np.float32)
    images[6, 0, 0, 0] = 2.0
    path, out = _h5(tmp_path / "d.h5", train__images=images), tmp_path / "s.zarr"
    monkeypatch.setattr(H5Source, "unreadable", lambda self: [])
    assert_one_line_error(_extract(path, out), f"cannot read image {path}:train/images[6]",
                          "; fix it and re-run with --overwrite (the store records the images' SHA-256, which a fix changes)")
    images[6, 0, 0, 0] = 1.0
    os.replace(_h5(tmp_path / "fixed.h5", train__images=images), path)  # the run's reader may still hold the old file
    assert_one_line_error(_extract(path, out), "was extracted from other data", "pass --overwrite")  # the advice's why
    assert _extract(path, out, "--overwrite").exit_code == 0
    fresh = tmp_path / "fresh.zarr"
    assert _extract(path, fresh).exit_code == 0
    assert store_files(out) == store_files(fresh)


def test_hashed_sources_and_the_advice_for_them(tmp_path):
    assert open_dataset("hdf5", _h5(tmp_path / "d.h5")).hashed
    data = open_dataset("hdf5", _h5(tmp_path / "e.h5"))
    data.test = TorchvisionSource([], np.zeros(0, np.int64), "cifar100 test")
    data.train = data.test
    assert data.hashed
    assert fix_images(2, hashed=True) == (f"fix them and re-run with {param('overwrite', True)} (the store records the "
                                          "images' SHA-256, which a fix changes)")
    assert fix_images(1).startswith("replace it with a readable image and re-run the same command to resume")


def test_valid_float_and_integer_images_still_extract_exactly(tmp_path):
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (8, 6, 6, 3), dtype=np.uint8)
    reference = tmp_path / "u8.zarr"
    assert _extract(_h5(tmp_path / "u8.h5", train__images=pixels), reference).exit_code == 0
    for dtype in (np.int16, np.uint16):
        out = tmp_path / f"{np.dtype(dtype).name}.zarr"
        assert _extract(_h5(tmp_path / f"{np.dtype(dtype).name}.h5", train__images=pixels.astype(dtype)), out).exit_code == 0
        a, b = (np.asarray(zarr.open_group(str(p), mode="r")["train/features"][:]) for p in (reference, out))
        np.testing.assert_array_equal(a, b)


# -- 4: Pillow's warnings while converting to RGB are notes naming the file -----------------------------------------
def _palette_png(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8), "L").convert("P")
    image.save(path, transparency=b"\x00" * 10)
    return path


NOTE = "Palette images with Transparency expressed in bytes should be converted to RGBA images; converted to RGB anyway"


def test_a_conversion_warning_is_one_note_naming_the_file(tmp_path, capfd):
    from PIL import Image

    path = _palette_png(tmp_path / "p.png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = to_rgb_array(open_image(path), 8)
    assert not caught, [str(w.message) for w in caught]
    assert capfd.readouterr().err == f"note: {path}: {NOTE}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.asarray(Image.open(path).convert("RGB")).transpose(2, 0, 1)
    np.testing.assert_array_equal(got, expected)  # the pixels as before


def test_extract_and_predict_images_give_the_note(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    tree = tmp_path / "tree"
    for split in ("train", "test"):
        for cls in ("a", "b"):
            for i in range(3):
                (tree / split / cls).mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tree / split / cls / f"i{i}.png")
    palette = _palette_png(tree / "train" / "a" / "p.png")
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, "--model", "pixels", "--out",
                    tmp_path / "s.zarr", "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert f"note: {palette}: {NOTE}\n" in result.stderr and "UserWarning" not in result.output, result.output
    result = invoke("learn", "--features", tmp_path / "s.zarr", "--out", tmp_path / "run", "--tasks", 1,
                    "--projection-dim", 16)
    assert result.exit_code == 0, result.output
    result = invoke("predict", "--model", tmp_path / "run" / "model.safetensors", "--images", palette.parent)
    assert result.exit_code == 0, result.output
    assert f"note: {palette}: {NOTE}\n" in result.stderr and "UserWarning" not in result.output, result.output
    assert len(list(csv.DictReader(io.StringIO(result.stdout)))) == 4
