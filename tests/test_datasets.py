"""Datasets: the registry, each local loader on miniature files, preprocessing, and the missing-data errors."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import make_image_tree
from PIL import Image

from foal_pipe.datasets.loaders import FASHION_CLASSES
from foal_pipe.datasets.registry import DATASETS, open_dataset
from foal_pipe.datasets.sources import PreparedImages, to_rgb_array
from foal_pipe.errors import FoalPipeError

REQUIRED = ["digits", "fashion-mnist", "cifar100", "dtd", "dtd-trainval", "fgvc-aircraft", "fgvc-aircraft-trainval",
            "country211", "core50", "tiny-imagenet",
            "cub200", "imagenet-r", "imagenet-a", "objectnet", "omnibenchmark", "vtab",
            "imagefolder", "images", "hdf5"]


def test_registry_has_every_dataset_and_rejects_unknown_names():
    assert sorted(DATASETS) == sorted(REQUIRED)
    with pytest.raises(FoalPipeError, match="unknown dataset 'mnist'; choose one of: digits, "):
        open_dataset("mnist")


def test_digits_fixed_stratified_split():
    from sklearn.datasets import load_digits

    data = open_dataset("digits")
    bunch = load_digits()
    y = bunch.target
    assert data.classes == [str(k) for k in range(10)] and data.native_size == 8
    assert len(data.train) + len(data.test) == 1797
    assert set(data.train.index).isdisjoint(data.test.index)
    assert np.all(np.diff(data.train.index) > 0) and np.all(np.diff(data.test.index) > 0)  # dataset order
    np.testing.assert_array_equal(data.train.labels, y[data.train.index])
    for c in range(10):  # every 5th image of each class is a test image
        rows = np.flatnonzero(y == c)
        np.testing.assert_array_equal(np.sort(data.test.index[data.test.labels == c]), rows[4::5])
    img = data.train.load(0)  # 0..16 scaled to 0..255
    assert img.dtype == np.uint8 and img.shape == (8, 8)
    np.testing.assert_array_equal(img, np.rint(bunch.images[data.train.index[0]] * 255 / 16))
    again = open_dataset("digits")
    np.testing.assert_array_equal(again.test.index, data.test.index)


def test_imagefolder_classes_labels_and_order(image_tree):
    (image_tree / "test" / "fox").mkdir()  # a class seen only in test is refused (it would always be wrong) ...
    Image.new("RGB", (9, 9)).save(image_tree / "test" / "fox" / "a.png")
    with pytest.raises(FoalPipeError, match="class 'fox' has images in .*test/fox but none in .*train/fox"):
        open_dataset("imagefolder", image_tree)
    (image_tree / "train" / "fox").mkdir()  # ... and labelled once it has training images too
    Image.new("RGB", (9, 9)).save(image_tree / "train" / "fox" / "b.png")
    data = open_dataset("imagefolder", image_tree)
    assert data.classes == ["cat", "dog", "emu", "fox"]
    assert len(data.train) == 16 and len(data.test) == 7
    np.testing.assert_array_equal(data.train.labels, np.repeat([0, 1, 2, 3], [5, 5, 5, 1]))
    assert data.train.describe(0).endswith("train/cat/img000.png")
    assert data.test.describe(6).endswith("test/fox/a.png")


def test_prepared_images_are_rgb_squares_and_report_unreadable_files(image_tree):
    (image_tree / "train" / "dog" / "img002.png").write_bytes(b"not a png")
    data = open_dataset("imagefolder", image_tree)
    prepared = PreparedImages(data.train, 16, "bicubic")
    for i in range(4):  # RGB, L, RGBA and palette images
        pixels, label, error = prepared[i]
        assert pixels.shape == (3, 16, 16) and pixels.dtype == np.uint8 and label == 0 and error == ""
    gray = to_rgb_array(np.arange(64, dtype=np.uint8).reshape(8, 8), 8)
    assert gray.shape == (3, 8, 8) and (gray[0] == gray[1]).all() and (gray[0] == np.arange(64).reshape(8, 8)).all()
    pixels, label, error = prepared[7]
    assert "train/dog/img002.png" in error and label == -1 and not pixels.any()


def test_imagefolder_errors(tmp_path):
    with pytest.raises(FoalPipeError, match="needs data_dir='DIR'"):
        open_dataset("imagefolder")
    with pytest.raises(FoalPipeError, match=f"{tmp_path / 'nope' / 'train'} is not a folder"):
        open_dataset("imagefolder", tmp_path / "nope")
    make_image_tree(tmp_path / "t", {"a": 1})
    for f in (tmp_path / "t" / "test" / "a").iterdir():
        f.unlink()
    with pytest.raises(FoalPipeError, match="no images"):
        open_dataset("imagefolder", tmp_path / "t")


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_reads_idx_files(tmp_path):
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    train_x, test_x = rng.integers(0, 256, (7, 28, 28)), rng.integers(0, 256, (3, 28, 28))
    _write_idx(folder / "train-images-idx3-ubyte.gz", train_x)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(7) % 10)
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", test_x)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([9, 0, 1]))
    for data_dir in (tmp_path, folder):  # DIR/fashion-mnist or DIR itself
        data = open_dataset("fashion-mnist", data_dir)
        assert data.classes == FASHION_CLASSES and len(data.train) == 7 and len(data.test) == 3
        np.testing.assert_array_equal(data.test.labels, [9, 0, 1])
        np.testing.assert_array_equal(data.train.load(3), train_x[3])


def test_fashion_mnist_missing_names_paths_and_the_debian_package(tmp_path):
    with pytest.raises(FoalPipeError) as info:
        open_dataset("fashion-mnist", tmp_path)
    message = str(info.value)
    assert str(tmp_path / "fashion-mnist") in message and "apt-get install dataset-fashion-mnist" in message


def test_hdf5_is_read_lazily_and_pickles(tmp_path):
    import h5py

    path = tmp_path / "bench.h5"
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, (5, 10, 10, 3), dtype=np.uint8)
    test = rng.random((2, 3, 10, 10)).astype(np.float32)  # CHW floats in [0, 1]
    with h5py.File(path, "w") as f:
        f["train/images"], f["train/labels"] = train, np.array([0, 1, 2, 0, 1])
        f["test/images"], f["test/labels"] = test, np.array([2, 2])
        f.attrs["classes"] = ["ant", "bee", "cow"]
    data = open_dataset("hdf5", path)
    assert data.classes == ["ant", "bee", "cow"] and data.native_size == 10
    np.testing.assert_array_equal(data.train.load(4), train[4])
    copy = pickle.loads(pickle.dumps(data.test))  # as a worker receives it: no open handle travels
    np.testing.assert_array_equal(copy.load(1), np.rint(test[1].transpose(1, 2, 0) * 255).astype(np.uint8))
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f["train/images"] = train
    with pytest.raises(FoalPipeError, match="has no dataset train/labels"):
        open_dataset("hdf5", tmp_path / "bad.h5")
    with pytest.raises(FoalPipeError, match="is not a file"):
        open_dataset("hdf5", tmp_path / "none.h5")


def test_core50_layout(tmp_path):
    root = tmp_path / "core50_128x128"
    for s in range(1, 12):
        for o in range(1, 51):
            folder = root / f"s{s}" / f"o{o}"
            folder.mkdir(parents=True)
            for frame in (1, 2) if o in (1, 2, 10) else (1,):
                Image.new("RGB", (4, 4)).save(folder / f"C_{s:02d}_{o:02d}_{frame:03d}.png")
    data = open_dataset("core50", tmp_path)
    assert len(data.classes) == 50 and data.classes[9] == "o10"
    assert len(data.train) == 8 * 53 and len(data.test) == 3 * 53
    assert "/s3/" in data.test.describe(0) and set(data.test.labels) == set(range(50))
    assert np.bincount(data.test.labels).tolist() == [6 if c in (0, 1, 9) else 3 for c in range(50)]
    with pytest.raises(FoalPipeError, match="CORe50 not found: looked for the session folders"):
        open_dataset("core50", tmp_path / "empty")


def test_tiny_imagenet_layout(tmp_path):
    root = tmp_path / "tiny-imagenet-200"
    for wnid in ("n02", "n01"):
        (root / "train" / wnid / "images").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (6, 6)).save(root / "train" / wnid / "images" / f"{wnid}_{i}.JPEG")
    (root / "val" / "images").mkdir(parents=True)
    for i, _wnid in enumerate(["n02", "n01", "n02"]):
        Image.new("RGB", (6, 6)).save(root / "val" / "images" / f"val_{i}.JPEG")
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn02\t0\t0\t5\t5\nval_1.JPEG\tn01\t0\t0\t5\t5\n"
                                                       "val_2.JPEG\tn02\t0\t0\t5\t5\n")
    data = open_dataset("tiny-imagenet", tmp_path)
    assert data.classes == ["n01", "n02"] and len(data.train) == 6
    np.testing.assert_array_equal(data.test.labels, [1, 0, 1])
    with pytest.raises(FoalPipeError, match="Tiny-ImageNet not found"):
        open_dataset("tiny-imagenet", tmp_path / "x")


def test_torchvision_dataset_missing_without_download(tmp_path):
    with pytest.raises(FoalPipeError) as info:
        open_dataset("cifar100", tmp_path)
    message = str(info.value)
    assert str(tmp_path / "cifar-100-python") in message and "download=True" in message
    with pytest.raises(FoalPipeError, match=str(tmp_path / "dtd")):
        open_dataset("dtd", tmp_path)


def test_imagefolder_test_split_is_stratified_seeded_and_per_class(tmp_path):
    root = make_image_tree(tmp_path / "pets", {"cat": 8, "dog": 5, "emu": 2}, split=False)
    data = open_dataset("imagefolder", root, test_split=0.25)
    assert data.classes == ["cat", "dog", "emu"] and data.test_split == {"test_fraction": 0.25, "seed": 0}
    # round(0.25 * n), at least 1 and at most n - 1: cat 2 of 8, dog 1 of 5, emu 1 of 2
    assert np.bincount(data.test.labels, minlength=3).tolist() == [2, 1, 1]
    assert np.bincount(data.train.labels, minlength=3).tolist() == [6, 4, 1]
    files = set(data.train.paths) | set(data.test.paths)
    assert len(files) == 15 and set(data.train.paths).isdisjoint(data.test.paths)
    for split in (data.train, data.test):  # file order within each class
        assert split.paths == sorted(split.paths, key=lambda p: (Path(p).parent.name, Path(p).name))
    same = open_dataset("imagefolder", root, test_split=0.25)
    assert same.test.paths == data.test.paths
    draws = {tuple(open_dataset("imagefolder", root, test_split=0.25, split_seed=s).test.paths) for s in range(6)}
    assert len(draws) > 1  # the seed draws the split
    # a class's split depends on the seed and its own files only: adding a class leaves the others' as they were
    make_image_tree(tmp_path / "more", {"ant": 4}, split=False)
    (tmp_path / "more" / "ant").rename(root / "ant")
    grown = open_dataset("imagefolder", root, test_split=0.25)
    assert [p for p in grown.test.paths if Path(p).parent.name != "ant"] == data.test.paths


def test_test_split_errors(tmp_path, image_tree):
    with pytest.raises(FoalPipeError, match="already split into train/ and test/ folders; drop test_split"):
        open_dataset("imagefolder", image_tree, test_split=0.2)
    with pytest.raises(FoalPipeError, match="dataset='digits' comes with its own train and test splits; drop test_split"):
        open_dataset("digits", test_split=0.2)
    root = make_image_tree(tmp_path / "few", {"a": 3, "b": 1}, split=False)
    with pytest.raises(FoalPipeError, match=r"few/b has 1 image; test_split needs at least 2 per class"):
        open_dataset("imagefolder", root, test_split=0.5)
    with pytest.raises(FoalPipeError, match="or pass test_split='FRACTION'"):
        open_dataset("imagefolder", root)
