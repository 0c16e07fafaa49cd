"""Resizing on the encoder's device (``--resize-on device``): the same pixels as PIL in the workers, bit for bit,
so the same features and the same store bytes; where each applies, and the refusals.

Measured before the PIL-exact version: torch's ``interpolate(..., mode="bicubic", antialias=True)`` in one
float pass differs from PIL by up to 26 grey levels on random 32 px images upscaled to 224 (PIL rounds and
clips to 0..255 after each of its two passes); one pass per axis with round-and-clip still left 1-2 levels
on up to 24 % of pixels (PIL's 22-bit fixed-point coefficients). :func:`resize_on_device` is exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_identical_stores
from PIL import Image
from typer.testing import CliRunner

import foal_pipe.encoders.pixels as pixels_module
from foal_pipe.cli import app
from foal_pipe.datasets import to_rgb_array
from foal_pipe.encoders import resize_on_device, resolve_resize_on
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, open_inputs, run_extract
from foal_pipe.store import open_store, read_log

h5py = pytest.importorskip("h5py")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()
PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def _random_images(n: int, side: int, seed: int = 0) -> np.ndarray:
    """uint8 ``(n, side, side, 3)``: half uniform noise, half black and white only (the largest overshoot of
    bicubic resampling, which PIL clips after each pass)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    images[: n // 2] = np.where(images[: n // 2] > 127, 255, 0)
    return images


def _pil(images: np.ndarray, size: int, interpolation: str) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(im).resize((size, size), PIL_FILTERS[interpolation]))
                     for im in images])


def _on_device(images: np.ndarray, size: int, interpolation: str) -> np.ndarray:
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    return resize_on_device(x, size, interpolation).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("side,size", [(32, 224), (32, 64), (8, 32), (28, 224), (64, 224), (128, 224), (37, 224),
                                       (224, 32), (64, 32), (5, 3), (1, 7), (7, 1)])
def test_device_resize_gives_pils_pixels_exactly(side, size, interpolation):
    images = _random_images(6 if size > 100 else 20, side, seed=side * 1000 + size)
    got = _on_device(images, size, interpolation)
    assert got.dtype == np.float32 and got.shape == (len(images), size, size, 3)
    np.testing.assert_array_equal(got, _pil(images, size, interpolation))


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_device_resize_equals_pil_for_every_pair_of_small_sizes(interpolation):
    for side in range(1, 20):
        images = _random_images(4, side, seed=side)
        for size in range(1, 20):
            np.testing.assert_array_equal(_on_device(images, size, interpolation), _pil(images, size, interpolation),
                                          err_msg=f"{side} -> {size} px")


def test_device_resize_works_in_slices_and_keeps_the_batch_order(monkeypatch):
    import foal_pipe.encoders.resize as resize

    monkeypatch.setattr(resize, "SLICE", 3)  # 8 images: slices of 3, 3 and 2
    images = _random_images(8, 12, seed=5)
    np.testing.assert_array_equal(_on_device(images, 20, "bicubic"), _pil(images, 20, "bicubic"))


def test_the_plain_torch_resize_would_not_match_pil():
    """Why the device resize reimplements PIL: torch's own antialiased bicubic differs by many grey levels."""
    images = _random_images(6, 32)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    plain = torch.nn.functional.interpolate(x, size=(224, 224), mode="bicubic", antialias=True)
    plain = plain.round().clamp(0, 255).permute(0, 2, 3, 1).numpy()
    assert np.abs(plain - _pil(images, 224, "bicubic")).max() > 10


def _spec(out: Path, resize_on: str, **kw) -> ExtractSpec:
    base = dict(dataset="digits", model="pixels", image_size=32, out=str(out), chunk_rows=128, batch_size=50,
                workers=0, device="cpu", resize_on=resize_on)
    return ExtractSpec(**{**base, **kw})


def test_pixels_resized_on_the_device_give_the_same_store_bytes(tmp_path, monkeypatch):
    """digits 8 -> 32 px: the loader ships 8 px batches, the encoder resizes them; the store is identical."""
    shipped = []

    def spy(images, size, interpolation):
        shipped.append(tuple(images.shape[-2:]))
        return resize_on_device(images, size, interpolation)

    monkeypatch.setattr(pixels_module, "resize_on_device", spy)
    on_device, in_workers = tmp_path / "device.zarr", tmp_path / "workers.zarr"
    run_extract(_spec(on_device, "device"))
    assert shipped and set(shipped) == {(8, 8)}
    shipped.clear()
    run_extract(_spec(in_workers, "workers"))
    assert shipped == []
    assert_identical_stores(on_device, in_workers)
    assert read_log(on_device)["runs"][-1]["resize_on"] == "device"
    assert "resize_on" not in open_store(on_device).meta.encoder  # not a setting: it never changes the features


class Stop(Exception):
    pass


def test_a_store_resumes_across_resize_places(tmp_path, monkeypatch):
    """Half extracted in the workers, finished on the device: identical to an uninterrupted run."""
    from foal_pipe.store import FeatureWriter

    reference = tmp_path / "ref.zarr"
    run_extract(_spec(reference, "workers"))
    out = tmp_path / "mixed.zarr"
    real = FeatureWriter.write
    calls = []

    def stop_after_three(self, lo, block):
        if len(calls) == 3:
            raise Stop
        calls.append(lo)
        return real(self, lo, block)

    monkeypatch.setattr(FeatureWriter, "write", stop_after_three)
    with pytest.raises(Stop):
        run_extract(_spec(out, "workers"))
    monkeypatch.setattr(FeatureWriter, "write", real)
    report = run_extract(_spec(out, "device"))
    assert report.status == "resumed" and report.resumed_from["train"] == 3 * 128
    assert_identical_stores(out, reference)


def _write_h5(path: Path, n_train: int, n_test: int, side: int) -> Path:
    rng = np.random.default_rng(3)
    with h5py.File(path, "w") as f:
        for split, n in (("train", n_train), ("test", n_test)):
            f[f"{split}/images"] = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
            f[f"{split}/labels"] = rng.integers(0, 4, n)
    return path


def test_tiny_vit_on_32px_images_resized_to_64_is_the_same_on_the_device(tmp_path, tiny_vit_checkpoint):
    """The paper's case in small: 32 px uint8 images upscaled (CIFAR to 224 there) for a ViT, here to 64 px on
    the CPU; the same torch code runs on CUDA. Same model inputs, so the same features, bit for bit."""
    import timm
    from safetensors.torch import save_file

    kwargs = tuple((k, 64 if k == "img_size" else v) for k, v in TINY_VIT_KWARGS)
    torch.manual_seed(5)
    model = timm.create_model(TINY_VIT, pretrained=False, **dict(kwargs))
    checkpoint = tmp_path / "tiny64.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    data = _write_h5(tmp_path / "random32.h5", 70, 20, 32)
    stores = {}
    for where in ("device", "workers"):
        stores[where] = tmp_path / f"{where}.zarr"
        spec = ExtractSpec(dataset="hdf5", data_dir=str(data), model=TINY_VIT, checkpoint=str(checkpoint),
                           model_kwargs=kwargs, out=str(stores[where]), chunk_rows=32, batch_size=16, workers=0,
                           device="cpu", resize_on=where)
        assert open_inputs(spec).loaded_size == (32 if where == "device" else 64)
        run_extract(spec)
    assert_identical_stores(stores["device"], stores["workers"])
    features = np.asarray(open_store(stores["device"]).train.features[:])
    assert features.shape == (70, 32) and np.abs(features).max() > 0.1


def test_tiny_vit_features_of_device_resized_digits_equal_the_workers(tiny_vit_checkpoint):
    """digits 8 -> 32 px through the encoder's own resize, against PIL-resized inputs."""
    from foal_pipe.datasets import open_dataset
    from foal_pipe.encoders import EncoderConfig, build_encoder

    enc = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(tiny_vit_checkpoint), model_kwargs=TINY_VIT_KWARGS))
    enc.load("cpu")
    src = open_dataset("digits").test
    native = np.stack([to_rgb_array(src.load(i), 8) for i in range(64)])
    resized = np.stack([to_rgb_array(src.load(i), 32, "bicubic") for i in range(64)])
    assert native.shape[-1] == 8 and resized.shape[-1] == 32
    np.testing.assert_array_equal(enc.encode(native), enc.encode(resized))


@pytest.mark.parametrize("asked,native,device,interpolation,want", [
    ("auto", 8, "cuda", "bicubic", "device"),  # a native size on CUDA: the GPU resizes
    ("auto", 8, "cpu", "bicubic", "workers"),  # on the CPU the workers resize in parallel
    ("auto", None, "cuda", "bicubic", "workers"),  # images of many sizes (imagefolder)
    ("auto", 8, "cuda", "lanczos", "workers"),  # a filter the device resize does not reproduce
    ("auto", 32, "cuda", "bicubic", "workers"),  # already the model's size: nothing to resize
    ("device", 8, "cpu", "bilinear", "device"),
    ("device", 32, "cpu", "bicubic", "workers"),
    ("workers", 8, "cuda", "bicubic", "workers"),
])
def test_where_images_are_resized(asked, native, device, interpolation, want):
    assert resolve_resize_on(asked, native, 32, interpolation, device) == want


@pytest.mark.parametrize("native,interpolation,message", [
    (None, "bicubic", r"resize_on='device' needs a dataset whose images share one size .*; use resize_on='workers'"),
    (8, "lanczos", r"resize_on='device' reproduces PIL's bilinear and bicubic resampling only, not the model's "
                   r"'lanczos'; use resize_on='workers'"),
])
def test_the_device_resize_is_refused_where_it_cannot_apply(native, interpolation, message):
    with pytest.raises(FoalPipeError, match=message):
        resolve_resize_on("device", native, 32, interpolation, "cpu")


def test_cli_resize_on_device_for_an_imagefolder_is_one_line(tmp_path, image_tree):
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["extract", "--dataset", "imagefolder", "--data-dir", str(image_tree), "--model",
                                 "pixels", "--resize-on", "device", "--workers", "0", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().startswith("Error: --resize-on device needs a dataset whose images share one size")
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output and not out.exists()
    bad = runner.invoke(app, ["extract", "--model", "pixels", "--resize-on", "gpu", "--out", str(out)])
    assert bad.exit_code == 2 and "Invalid value for '--resize-on'" in bad.output  # outside --help's fixed set


def test_cli_resize_on_device_gives_the_workers_store(tmp_path):
    stores = []
    for where in ("device", "workers"):
        out = tmp_path / f"{where}.zarr"
        result = runner.invoke(app, ["extract", "--model", "pixels", "--image-size", "20", "--resize-on", where,
                                     "--workers", "0", "--chunk-rows", "256", "--out", str(out)])
        assert result.exit_code == 0, result.output
        stores.append(out)
    assert_identical_stores(*stores)
    shown = runner.invoke(app, ["info", str(stores[0])])
    assert "resize_on device" in shown.output
