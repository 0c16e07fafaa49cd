"""Issue 24's outside fault test, inputs family: images with more than 8 bits, seeds, deep class orders, devices,
checkpoints, gamma messages and unlabelled test rows.

Before: 16-bit and float images were clipped by PIL's `convert("RGB")` (a 16-bit PNG came out almost white, a
float TIFF in [0, 1] black) and trained on; `--seed -1` and a 200,000-deep class-order file were tracebacks;
`predict --images --device` took any name for a pixels model; a directory given as `--checkpoint` "did not
exist"; the gamma-resolution message of float64 sums suggested `--dtype float64`; test rows with label -1 were
silently counted against the last class.
"""

from __future__ import annotations

import csv
import io
import json
from functools import partial
from pathlib import Path

import helpers
import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.protocol.config import StreamConfig
from foal_pipe.store import open_store, write_store

runner = CliRunner()


assert_one_line_error = partial(helpers.assert_one_line_error, after_notes=True)


# -- images with more than 8 bits per pixel ----------------------------------------------------------------------
def _trees(root: Path) -> dict[str, Path]:
    """The same grey images as 8-bit PNGs, 16-bit PNGs (value x 257) and float TIFFs (value / 255)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    trees = {kind: root / kind for kind in ("8bit", "16bit", "float")}
    for split, count in (("train", 4), ("test", 2)):
        for cls in ("a", "b"):
            for i in range(count):
                pixels = rng.integers(0, 256, (10 + i, 12), dtype=np.uint8)
                for kind, tree in trees.items():
                    folder = tree / split / cls
                    folder.mkdir(parents=True, exist_ok=True)
                    if kind == "8bit":
                        Image.fromarray(pixels).save(folder / f"{i}.png")
                    elif kind == "16bit":
                        Image.fromarray(pixels.astype(np.uint16) * 257).save(folder / f"{i}.png")
                    else:
                        Image.fromarray(pixels.astype(np.float32) / 255).save(folder / f"{i}.tiff")
    return trees


def _extract(tree: Path, out: Path) -> np.ndarray:
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8, out=str(out),
                            device="cpu", workers=0, batch_size=4, chunk_rows=4))
    store = open_store(out)
    return np.concatenate([x for _, x in store.train.iter_chunks()] + [x for _, x in store.test.iter_chunks()])


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    return _trees(tmp_path_factory.mktemp("wide"))


def test_16_bit_and_float_images_are_scaled_not_clipped(trees, tmp_path):
    from PIL import Image

    assert Image.open(next((trees["16bit"] / "train" / "a").iterdir())).mode == "I;16"
    assert Image.open(next((trees["float"] / "train" / "a").iterdir())).mode == "F"
    reference = _extract(trees["8bit"], tmp_path / "8.zarr")
    np.testing.assert_array_equal(_extract(trees["16bit"], tmp_path / "16.zarr"), reference)
    np.testing.assert_array_equal(_extract(trees["float"], tmp_path / "f.zarr"), reference)


def test_predict_images_scales_them_as_extract_does(trees, tmp_path):
    store = tmp_path / "8.zarr"
    _extract(trees["8bit"], store)
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "1",
                                 "--projection-dim", "16"])
    assert result.exit_code == 0, result.output
    model = str(tmp_path / "run" / "model.safetensors")
    scores = {}
    for kind in ("8bit", "16bit", "float"):
        result = runner.invoke(app, ["predict", "--model", model, "--images", str(trees[kind] / "test")])
        assert result.exit_code == 0, result.output
        scores[kind] = [row["score"] for row in csv.DictReader(io.StringIO(result.stdout))]
    assert scores["16bit"] == scores["8bit"] and scores["float"] == scores["8bit"]


@pytest.mark.parametrize("pixels,mode,message", [
    (np.full((9, 9), 200.0, np.float32), "F", "float pixel values 200..200 lie outside 0..1"),
    (np.full((9, 9), 70000, np.int32), "I", "32-bit integer pixels (mode I) have no rule to 0..255"),
])
def test_pixels_without_a_rule_are_refused_by_name(tmp_path, pixels, mode, message):
    from PIL import Image

    for split in ("train", "test"):
        (tmp_path / "tree" / split / "a").mkdir(parents=True)
        Image.fromarray(pixels).save(tmp_path / "tree" / split / "a" / "x.tiff")
    assert Image.open(tmp_path / "tree" / "train" / "a" / "x.tiff").mode == mode
    result = runner.invoke(app, ["extract", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "tree"),
                                 "--model", "pixels", "--image-size", "8", "--out", str(tmp_path / "s.zarr"),
                                 "--workers", "0"])
    assert_one_line_error(result, "x.tiff", message)
    assert not (tmp_path / "s.zarr").exists() or not open_store_complete(tmp_path / "s.zarr")


def open_store_complete(path: Path) -> bool:
    return json.loads((path / "zarr.json").read_text())["attributes"].get("complete") is True


# -- seeds and class orders --------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    y = np.tile(np.arange(4), 30)
    x = (rng.normal(size=(120, 5)) + y[:, None]).astype(np.float32)
    return write_store(tmp_path / "s.zarr", (x[:100], y[:100]), (x[100:], y[100:]), list("abcd"), chunk_rows=32)


def _learn(store: Path, out: Path, *extra: str):
    return runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "2",
                               "--projection-dim", "8", *extra])


@pytest.mark.parametrize("option,value", [("--seed", "-1"), ("--order-seed", "-2"), ("--order-seeds", "1,-1")])
def test_a_negative_seed_is_refused_in_one_line(store, tmp_path, option, value):
    assert_one_line_error(_learn(store, tmp_path / "run", option, value), f"{option} must be a non-negative integer")
    assert not (tmp_path / "run").exists()
    sweep = runner.invoke(app, ["sweep", "--features", str(store), "--out", str(tmp_path / "sw"), "--tasks", "2",
                                "--projection-dim", "8", "--gammas", "1", option, value])
    assert_one_line_error(sweep, "must be a non-negative integer")


def test_seeds_in_the_python_api():
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(FoalPipeError, match="^seed must be a non-negative integer"):
            StreamConfig(seed=bad)
    with pytest.raises(FoalPipeError, match="^order_seed must be a non-negative integer"):
        StreamConfig(order_seed=-5)
    assert StreamConfig(seed=np.int64(7)).seed == 7


def test_a_deeply_nested_class_order_is_refused_in_one_line(store, tmp_path):
    order = tmp_path / "order.json"
    order.write_text("[" * 200_000 + "]" * 200_000)
    assert_one_line_error(_learn(store, tmp_path / "run", "--class-order", str(order)),
                          "class order file", "nests its lists too deeply to read")


def test_deeply_nested_store_attributes_are_one_line(store, tmp_path):
    (store / "zarr.json").write_text('{"attributes": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert_one_line_error(_learn(store, tmp_path / "run"), "is corrupt")


# -- minor: device, checkpoint, gamma message, unlabelled test rows ----------------------------------------------
def test_predict_images_refuses_an_unknown_device_for_a_pixels_model(trees, tmp_path):
    store = tmp_path / "8.zarr"
    _extract(trees["8bit"], store)
    assert _learn(store, tmp_path / "run").exit_code == 0
    result = runner.invoke(app, ["predict", "--model", str(tmp_path / "run" / "model.safetensors"), "--images",
                                 str(trees["8bit"] / "test"), "--device", "gpu7"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output  # a usage error: not in the set
    assert " ".join(result.output.split()).startswith("Error: Invalid value for '--device': 'gpu7' is not one of 'auto', "
                                                      "'cpu', 'cuda'"), result.output


def test_a_directory_as_checkpoint_is_named_a_directory(tmp_path):
    pytest.importorskip("timm")
    folder = tmp_path / "weights"
    folder.mkdir()
    result = runner.invoke(app, ["extract", "--dataset", "digits", "--model", "vit_tiny_patch16_224", "--checkpoint",
                                 str(folder), "--out", str(tmp_path / "s.zarr"), "--workers", "0"])
    assert_one_line_error(result, f"--checkpoint {folder} is a directory; pass the .safetensors or .pth")
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_gamma_resolution_message_suggests_float64_only_for_float32_sums(dtype):
    H = np.random.default_rng(0).random((50, 6))
    stats = RidgeStatistics.from_batch(H.astype(dtype), np.arange(50) % 3)
    for refuse in (lambda: stats.solve(1e-30), lambda: stats.gamma_path(vectors=False).gcv([1e-30]),
                   lambda: stats.eigen().gcv([1e-30])):
        with pytest.raises(FoalPipeError, match="below the resolution") as info:
            refuse()
        assert ("dtype='float64'" in str(info.value)) == (dtype == "float32"), str(info.value)


def test_unlabelled_test_rows_are_refused_with_their_count(tmp_path):
    rng = np.random.default_rng(0)
    y = np.tile(np.arange(4), 30)
    x = (rng.normal(size=(120, 5)) + y[:, None]).astype(np.float32)
    test_labels = y[100:].copy()
    test_labels[[1, 5, 7]] = -1
    path = write_store(tmp_path / "s.zarr", (x[:100], y[:100]), (x[100:], test_labels), list("abcd"), chunk_rows=32)
    assert_one_line_error(_learn(path, tmp_path / "run"), "has 3 unlabelled test rows (label -1)")
    assert not (tmp_path / "run").exists()
    result = runner.invoke(app, ["predict", "--model", str(_trained(tmp_path, x, y)), "--features", str(path)])
    assert result.exit_code == 0, result.output  # predict scores what it can and says how many it could


def _trained(tmp_path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    good = write_store(tmp_path / "good.zarr", (x[:100], y[:100]), (x[100:], y[100:]), list("abcd"), chunk_rows=32)
    assert _learn(good, tmp_path / "good-run").exit_code == 0
    return tmp_path / "good-run" / "model.safetensors"
